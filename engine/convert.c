#include "engine/convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coldstart/safetensors.h"
#include "common/wk.h"
#include "engine/tokenizer.h"

struct l2c_config {
	int dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len;
	int shared;
};

/* llama2.c stores each head's q/k rows as interleaved RoPE pairs (2j, 2j+1); Hugging Face
 * rotates (j, j + head_dim/2). Row 2j+p of a head moves to row p*head_dim/2 + j, which is
 * what transformers' convert_llama_weights_to_hf.py permute() does. */
static void permute_rows(float *dst, const float *src, int n_heads, int head_dim, int cols)
{
	int half = head_dim / 2;
	for (int h = 0; h < n_heads; h++)
		for (int j = 0; j < half; j++)
			for (int p = 0; p < 2; p++) {
				const float *s = src + ((size_t)h * head_dim + 2 * j + p) * cols;
				float *d = dst + ((size_t)h * head_dim + p * half + j) * cols;
				memcpy(d, s, (size_t)cols * sizeof(float));
			}
}

static int write_json(const char *dir, const char *name, json_t *j, char *err, size_t errsz)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	size_t len = strlen(s);
	s[len] = 0;
	char *t = realloc(s, len + 2);
	if (!t) {
		free(s);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	t[len] = '\n';
	int rc = wk_write_file(path, t, len + 1, err, errsz);
	free(t);
	return rc;
}

static int write_configs(const char *dir, const struct l2c_config *c, char *err, size_t errsz)
{
	json_t *cfg = json_pack(
		"{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:i, s:b, s:s, s:s, s:b}",
		"architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", c->dim,
		"intermediate_size", c->hidden, "num_hidden_layers", c->n_layers,
		"num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv, "vocab_size",
		c->vocab, "max_position_embeddings", c->seq_len, "rms_norm_eps", 1e-5, "rope_theta",
		10000.0, "bos_token_id", 1, "eos_token_id", 2, "tie_word_embeddings", c->shared,
		"hidden_act", "silu", "torch_dtype", "float32", "attention_bias", 0);
	int rc = write_json(dir, "config.json", cfg, err, errsz);
	if (rc)
		return rc;
	json_t *gen = json_pack("{s:i, s:i}", "bos_token_id", 1, "eos_token_id", 2);
	if ((rc = write_json(dir, "generation_config.json", gen, err, errsz)))
		return rc;
	json_t *tc = json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:i}", "tokenizer_class",
			       "LlamaTokenizerFast", "bos_token", "<s>", "eos_token", "</s>",
			       "unk_token", "<unk>", "add_bos_token", 1, "add_eos_token", 0,
			       "model_max_length", c->seq_len);
	return write_json(dir, "tokenizer_config.json", tc, err, errsz);
}

/* The files a conversion writes, for cleaning up a failed one. */
static const char *const conv_files[] = {"model.safetensors", "config.json",
					 "generation_config.json", "tokenizer_config.json",
					 "tokenizer.json"};

/* WK_OK when dir does not exist or is an empty directory; else why not. */
static int fresh_dir(const char *dir, char *err, size_t errsz)
{
	DIR *d = opendir(dir);
	if (!d) {
		if (errno == ENOENT)
			return WK_OK;
		return wk_errf(err, errsz, errno == ENOTDIR ? WK_EINVAL : WK_EIO, "%s: %s", dir,
			       strerror(errno));
	}
	struct dirent *de;
	bool empty = true;
	while (empty && (de = readdir(d)))
		empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
	closedir(d);
	return empty ? WK_OK
		     : wk_errf(err, errsz, WK_EINVAL, "%s exists and is not empty (wick convert "
						      "writes a new directory)", dir);
}

/* Converts into out_dir through a sibling directory renamed into place once every file is
 * written, so a failed conversion leaves nothing that looks like a model (before, a truncated
 * tokenizer left config.json and model.safetensors without tokenizer.json, and `wick
 * generate` ran it printing ids). out_dir must not exist or be empty. */
int conv_llama2c(const char *model_bin, const char *tokenizer_bin, const char *out_dir,
		 char *err, size_t errsz)
{
	int rc = WK_OK, fd = -1;
	void *map = MAP_FAILED;
	size_t size = 0;
	float *qperm = NULL, *kperm = NULL;
	struct st_out *outs = NULL;
	char (*names)[96] = NULL;
	char tmp_dir[4096];
	bool made = false;
	snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp-%ld", out_dir, (long)getpid());
	if ((rc = fresh_dir(out_dir, err, errsz)) != WK_OK)
		return rc;

	fd = open(model_bin, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", model_bin, strerror(errno));
		goto out;
	}
	size = (size_t)st.st_size;
	if (size < 7 * sizeof(int32_t)) {
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: %zu bytes, too short for a llama2.c header",
			     model_bin, size);
		goto out;
	}
	map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: mmap: %s", model_bin, strerror(errno));
		goto out;
	}
	int32_t h[7];
	memcpy(h, map, sizeof h);
	struct l2c_config c = {h[0], h[1], h[2], h[3], h[4], h[5] < 0 ? -h[5] : h[5], h[6],
			       h[5] > 0};
	if (c.dim <= 0 || c.hidden <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv <= 0 ||
	    c.vocab <= 0 || c.seq_len <= 0 || c.dim % c.n_heads || c.n_heads % c.n_kv ||
	    (c.dim / c.n_heads) % 2 || c.dim > 65536 || c.hidden > (1 << 20) ||
	    c.n_layers > 4096 || c.vocab > (1 << 24) || c.seq_len > (1 << 24)) {
		rc = wk_errf(err, errsz, WK_EFORMAT,
			     "%s: implausible llama2.c header (dim %d, hidden %d, layers %d, heads %d, "
			     "kv heads %d, vocab %d, seq_len %d)", model_bin, c.dim, c.hidden,
			     c.n_layers, c.n_heads, c.n_kv, c.vocab, c.seq_len);
		goto out;
	}
	int hd = c.dim / c.n_heads, kvd = c.n_kv * hd;
	uint64_t L = (uint64_t)c.n_layers, D = (uint64_t)c.dim, H = (uint64_t)c.hidden;
	/* element counts, in file order */
	uint64_t n_emb = (uint64_t)c.vocab * D, n_rms = L * D, n_wq = L * D * D,
		 n_wk = L * kvd * D, n_wo = L * D * D, n_w13 = L * H * D, n_w2 = L * D * H,
		 n_freq = (uint64_t)c.seq_len * hd / 2;
	uint64_t need = n_emb + 2 * n_rms + n_wq + 2 * n_wk + n_wo + 2 * n_w13 + n_w2 + D +
			2 * n_freq + (c.shared ? 0 : n_emb);
	if (need * 4 + 28 != size) {
		rc = wk_errf(err, errsz, WK_EFORMAT,
			     "%s: the header implies %llu bytes of weights but the file holds %zu",
			     model_bin, (unsigned long long)(need * 4), size - 28);
		goto out;
	}
	const float *p = (const float *)((const char *)map + 28);
	const float *emb = p;
	p += n_emb;
	const float *rms_att = p;
	p += n_rms;
	const float *wq = p;
	p += n_wq;
	const float *wk = p;
	p += n_wk;
	const float *wv = p;
	p += n_wk;
	const float *wo = p;
	p += n_wo;
	const float *rms_ffn = p;
	p += n_rms;
	const float *w1 = p;
	p += n_w13;
	const float *w2 = p;
	p += n_w2;
	const float *w3 = p;
	p += n_w13;
	const float *rms_final = p;
	p += D + 2 * n_freq;
	const float *wcls = c.shared ? NULL : p;

	if (mkdir(tmp_dir, 0755) != 0) {
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", tmp_dir, strerror(errno));
		goto out;
	}
	made = true;
	qperm = malloc(n_wq * sizeof(float));
	kperm = malloc(n_wk * sizeof(float));
	size_t nt = 3 + 9 * L;
	outs = calloc(nt, sizeof *outs);
	names = calloc(nt, sizeof *names);
	if (!qperm || !kperm || !outs || !names) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto out;
	}
	size_t k = 0;
#define ADD1(nm, ptr, d0) (snprintf(names[k], sizeof names[k], "%s", nm), \
	outs[k] = (struct st_out){names[k], DT_F32, 1, {d0}, ptr}, k++)
#define ADD2(ptr, d0, d1, ...) (snprintf(names[k], sizeof names[k], __VA_ARGS__), \
	outs[k] = (struct st_out){names[k], DT_F32, 2, {d0, d1}, ptr}, k++)
	ADD2(emb, c.vocab, c.dim, "model.embed_tokens.weight");
	for (int l = 0; l < c.n_layers; l++) {
		permute_rows(qperm + l * D * D, wq + l * D * D, c.n_heads, hd, c.dim);
		permute_rows(kperm + l * kvd * D, wk + l * kvd * D, c.n_kv, hd, c.dim);
		ADD2(rms_att + l * D, c.dim, 0, "model.layers.%d.input_layernorm.weight", l);
		outs[k - 1].rank = 1;
		ADD2(qperm + l * D * D, c.dim, c.dim, "model.layers.%d.self_attn.q_proj.weight", l);
		ADD2(kperm + l * kvd * D, kvd, c.dim, "model.layers.%d.self_attn.k_proj.weight", l);
		ADD2(wv + l * kvd * D, kvd, c.dim, "model.layers.%d.self_attn.v_proj.weight", l);
		ADD2(wo + l * D * D, c.dim, c.dim, "model.layers.%d.self_attn.o_proj.weight", l);
		ADD2(rms_ffn + l * D, c.dim, 0, "model.layers.%d.post_attention_layernorm.weight", l);
		outs[k - 1].rank = 1;
		ADD2(w1 + l * H * D, c.hidden, c.dim, "model.layers.%d.mlp.gate_proj.weight", l);
		ADD2(w2 + l * D * H, c.dim, c.hidden, "model.layers.%d.mlp.down_proj.weight", l);
		ADD2(w3 + l * H * D, c.hidden, c.dim, "model.layers.%d.mlp.up_proj.weight", l);
	}
	ADD1("model.norm.weight", rms_final, c.dim);
	if (wcls)
		ADD2(wcls, c.vocab, c.dim, "lm_head.weight");
#undef ADD1
#undef ADD2
	char path[4200];
	snprintf(path, sizeof path, "%s/model.safetensors", tmp_dir);
	rc = st_write(path, outs, k, "{\"format\": \"pt\", \"converted_by\": \"wick convert llama2c\"}",
		      err, errsz);
	if (rc)
		goto out;
	if ((rc = write_configs(tmp_dir, &c, err, errsz)))
		goto out;
	snprintf(path, sizeof path, "%s/tokenizer.json", tmp_dir);
	rc = tok_convert_llama2c(tokenizer_bin, c.vocab, path, err, errsz);
	if (rc == WK_OK && rename(tmp_dir, out_dir) != 0) /* replaces an empty out_dir */
		rc = wk_errf(err, errsz, WK_EIO, "%s: %s", out_dir, strerror(errno));
out:
	if (rc != WK_OK && made) {
		for (size_t i = 0; i < sizeof conv_files / sizeof conv_files[0]; i++) {
			char p[4200];
			snprintf(p, sizeof p, "%s/%s", tmp_dir, conv_files[i]);
			unlink(p);
		}
		rmdir(tmp_dir);
	}
	free(names);
	free(outs);
	free(qperm);
	free(kperm);
	if (map != MAP_FAILED)
		munmap(map, size);
	if (fd >= 0)
		close(fd);
	return rc;
}
