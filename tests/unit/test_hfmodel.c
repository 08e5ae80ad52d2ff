/*
 * test_hfmodel.c - Hugging Face directories: single file, sharded index, and the ways a
 * directory can be broken (each error names the file at fault).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/hfmodel.h"
#include "common/wk.h"

static char *mkdir_tmp(void)
{
	char *d = strdup("/tmp/wick-hf.XXXXXX");
	cr_assert_not_null(mkdtemp(d));
	return d;
}

static void rmtree(char *d)
{
	DIR *dp = opendir(d);
	struct dirent *e;
	char p[4096];
	while (dp && (e = readdir(dp))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", d, e->d_name);
		unlink(p);
	}
	if (dp)
		closedir(dp);
	rmdir(d);
	free(d);
}

static void put(const char *dir, const char *name, const char *text)
{
	char p[4096], err[WK_ERRSZ];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	cr_assert_eq(wk_write_file(p, text, strlen(text), err, sizeof err), WK_OK, "%s", err);
}

static const float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};

/* Writes a shard holding the given names, each an F32 tensor of shape [2]. */
static void shard(const char *dir, const char *file, const char *const *names, size_t n)
{
	char p[4096], err[WK_ERRSZ];
	struct st_out o[8];
	cr_assert(n <= 8);
	for (size_t i = 0; i < n; i++) {
		memset(&o[i], 0, sizeof o[i]);
		o[i].name = names[i];
		o[i].dtype = DT_F32;
		o[i].rank = 1;
		o[i].shape[0] = 2;
		o[i].data = vals + 2 * (i % 4);
	}
	snprintf(p, sizeof p, "%s/%s", dir, file);
	cr_assert_eq(st_write(p, o, n, "{\"format\":\"pt\"}", err, sizeof err), WK_OK, "%s", err);
}

static const char *config = "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
			    "\"hidden_size\":2}";

static void sharded_dir(const char *d)
{
	static const char *const a[] = {"model.embed_tokens.weight", "model.layers.0.w"};
	static const char *const b[] = {"model.layers.1.w", "model.norm.weight", "lm_head.weight"};
	put(d, "config.json", config);
	shard(d, "model-00001-of-00002.safetensors", a, 2);
	shard(d, "model-00002-of-00002.safetensors", b, 3);
}

static const char *index_ok =
	"{\"metadata\":{\"total_size\":40},\"weight_map\":{"
	"\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
	"\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
	"\"model.layers.0.w\":\"model-00001-of-00002.safetensors\","
	"\"model.layers.1.w\":\"model-00002-of-00002.safetensors\","
	"\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}";

static void expect_fail(const char *d, int code, const char *want1, const char *want2)
{
	char err[WK_ERRSZ] = "";
	struct hf_model *m = (struct hf_model *)1;
	int rc = hf_open(d, &m, err, sizeof err);
	cr_assert_neq(rc, WK_OK, "expected failure with '%s'", want1);
	cr_assert_null(m);
	if (code)
		cr_assert_eq(rc, code, "rc %d: %s", rc, err);
	cr_assert(strstr(err, want1), "'%s' lacks '%s'", err, want1);
	if (want2)
		cr_assert(strstr(err, want2), "'%s' lacks '%s'", err, want2);
}

Test(hfmodel, single_file)
{
	char *d = mkdir_tmp(), err[WK_ERRSZ];
	static const char *const names[] = {"b", "a", "c"};
	put(d, "config.json", config);
	shard(d, "model.safetensors", names, 3);
	struct hf_model *m;
	cr_assert_eq(hf_open(d, &m, err, sizeof err), WK_OK, "%s", err);
	cr_assert_str_eq(hf_dir(m), d);
	cr_assert_eq(hf_shard_count(m), 1);
	cr_assert_eq(hf_tensor_count(m), 3);
	cr_assert_str_eq(hf_tensor_at(m, 0)->name, "b");
	cr_assert_null(hf_tensor_at(m, 3));
	const struct st_tensor *t = hf_tensor(m, "c");
	cr_assert_not_null(t);
	cr_assert_eq(((const float *)t->data)[1], 6.0f);
	cr_assert_null(hf_tensor(m, "d"));
	json_t *c = hf_config(m);
	cr_assert_eq(json_integer_value(json_object_get(c, "hidden_size")), 2);
	cr_assert_str_eq(st_meta(hf_shard(m, 0), "format"), "pt");
	cr_assert_null(hf_shard(m, 1));
	hf_close(m);
	hf_close(NULL);
	rmtree(d);
}

Test(hfmodel, sharded_index)
{
	char *d = mkdir_tmp(), err[WK_ERRSZ];
	sharded_dir(d);
	put(d, "model.safetensors.index.json", index_ok);
	struct hf_model *m;
	cr_assert_eq(hf_open(d, &m, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(hf_shard_count(m), 2);
	cr_assert_eq(hf_tensor_count(m), 5);
	cr_assert(strstr(st_path(hf_shard(m, 0)), "model-00001-of-00002"));
	cr_assert(strstr(st_path(hf_shard(m, 1)), "model-00002-of-00002"));
	/* Shard order, then offset order. */
	cr_assert_str_eq(hf_tensor_at(m, 0)->name, "model.embed_tokens.weight");
	cr_assert_str_eq(hf_tensor_at(m, 2)->name, "model.layers.1.w");
	cr_assert_str_eq(hf_tensor_at(m, 4)->name, "lm_head.weight");
	static const char *const all[] = {"model.embed_tokens.weight", "model.layers.0.w",
					  "model.layers.1.w", "model.norm.weight",
					  "lm_head.weight"};
	for (size_t i = 0; i < 5; i++) {
		const struct st_tensor *t = hf_tensor(m, all[i]);
		cr_assert_not_null(t, "%s", all[i]);
		cr_assert_str_eq(t->name, all[i]);
	}
	cr_assert_null(hf_tensor(m, "model.layers.2.w"));
	hf_close(m);
	rmtree(d);
}

Test(hfmodel, index_names_missing_tensor)
{
	char *d = mkdir_tmp();
	sharded_dir(d);
	put(d, "model.safetensors.index.json",
	    "{\"weight_map\":{\"model.layers.0.w\":\"model-00001-of-00002.safetensors\","
	    "\"model.layers.9.w\":\"model-00002-of-00002.safetensors\"}}");
	expect_fail(d, WK_ENOTFOUND, "model.safetensors.index.json: tensor 'model.layers.9.w'",
		    "model-00002-of-00002.safetensors");
	/* Listed in the wrong shard. */
	put(d, "model.safetensors.index.json",
	    "{\"weight_map\":{\"model.layers.0.w\":\"model-00002-of-00002.safetensors\"}}");
	expect_fail(d, WK_ENOTFOUND, "tensor 'model.layers.0.w'", NULL);
	rmtree(d);
}

Test(hfmodel, shard_missing)
{
	char *d = mkdir_tmp();
	sharded_dir(d);
	put(d, "model.safetensors.index.json",
	    "{\"weight_map\":{\"model.layers.0.w\":\"model-00001-of-00002.safetensors\","
	    "\"x\":\"model-00003-of-00003.safetensors\"}}");
	expect_fail(d, WK_ENOTFOUND, "model-00003-of-00003.safetensors", "missing");
	rmtree(d);
}

Test(hfmodel, shard_malformed)
{
	char *d = mkdir_tmp();
	sharded_dir(d);
	put(d, "model.safetensors.index.json", index_ok);
	char p[4096], err[WK_ERRSZ];
	snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
	cr_assert_eq(wk_write_file(p, "\x04\0\0\0\0\0\0\0{}", 10, err, sizeof err), WK_OK);
	expect_fail(d, WK_EFORMAT, "model-00002-of-00002.safetensors", "runs past the end");
	rmtree(d);
}

Test(hfmodel, bad_shard_names)
{
	char *d = mkdir_tmp();
	sharded_dir(d);
	put(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../model.safetensors\"}}");
	expect_fail(d, WK_EFORMAT, "weight_map['a'] is not a plain file name", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"..\"}}");
	expect_fail(d, WK_EFORMAT, "not a plain file name", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"\"}}");
	expect_fail(d, WK_EFORMAT, "not a plain file name", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":{\"a\":3}}");
	expect_fail(d, WK_EFORMAT, "not a plain file name", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":[]}");
	expect_fail(d, WK_EFORMAT, "no \"weight_map\" object", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":{}}");
	expect_fail(d, WK_EFORMAT, "weight_map is empty", NULL);
	put(d, "model.safetensors.index.json", "{\"weight_map\":");
	expect_fail(d, WK_EFORMAT, "model.safetensors.index.json: not valid JSON", NULL);
	rmtree(d);
}

Test(hfmodel, duplicate_across_shards)
{
	char *d = mkdir_tmp();
	static const char *const a[] = {"x", "dup"};
	static const char *const b[] = {"dup", "y"};
	put(d, "config.json", config);
	shard(d, "s1.safetensors", a, 2);
	shard(d, "s2.safetensors", b, 2);
	put(d, "model.safetensors.index.json",
	    "{\"weight_map\":{\"x\":\"s1.safetensors\",\"dup\":\"s1.safetensors\","
	    "\"y\":\"s2.safetensors\"}}");
	expect_fail(d, WK_EFORMAT, "tensor 'dup' appears in both", "s2.safetensors");
	rmtree(d);
}

Test(hfmodel, no_weights)
{
	char *d = mkdir_tmp();
	put(d, "config.json", config);
	expect_fail(d, WK_ENOTFOUND, "model.safetensors", "model.safetensors.index.json");
	rmtree(d);
}

Test(hfmodel, bad_config)
{
	char *d = mkdir_tmp();
	static const char *const a[] = {"x"};
	shard(d, "model.safetensors", a, 1);
	expect_fail(d, WK_ENOTFOUND, "config.json", NULL);
	put(d, "config.json", "{\"hidden_size\": 2,");
	expect_fail(d, WK_EFORMAT, "config.json: not valid JSON", NULL);
	put(d, "config.json", "[1, 2]");
	expect_fail(d, WK_EFORMAT, "config.json: not a JSON object", NULL);
	put(d, "config.json", "{\"a\":1,\"a\":2}");
	expect_fail(d, WK_EFORMAT, "config.json", NULL);
	/* Over HF_MAX_CONFIG. */
	size_t big = HF_MAX_CONFIG + 16;
	char *t = malloc(big + 1);
	memset(t, ' ', big);
	t[0] = '{';
	t[big - 1] = '}';
	t[big] = 0;
	put(d, "config.json", t);
	free(t);
	expect_fail(d, WK_ELIMIT, "config.json", "limit");
	rmtree(d);
	expect_fail("/nonexistent/wick/dir", 0, "/nonexistent/wick/dir", NULL);
}
