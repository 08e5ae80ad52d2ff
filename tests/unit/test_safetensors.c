/*
 * test_safetensors.c - the safetensors reader must reject every malformed image with a message
 * naming the file (and tensor), never crash, and read back what st_write wrote.
 *
 * Images are built in exactly-sized malloc'd buffers so that AddressSanitizer catches a read
 * one byte past the end.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coldstart/safetensors.h"
#include "common/wk.h"

/* ---- helpers ------------------------------------------------------------------------------ */

/* An image: 8-byte length of hdr, hdr, then data_len bytes of data (i & 0xff). */
static unsigned char *image(const char *hdr, size_t data_len, size_t *len)
{
	size_t h = strlen(hdr);
	*len = 8 + h + data_len;
	unsigned char *b = malloc(*len ? *len : 1);
	cr_assert_not_null(b);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)h >> (8 * i));
	memcpy(b + 8, hdr, h);
	for (size_t i = 0; i < data_len; i++)
		b[8 + h + i] = (unsigned char)i;
	return b;
}

static void set_len(unsigned char *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
}

/* Parses buf and expects failure with code (0 = any error) and a message containing want. */
static void expect_fail_buf(const unsigned char *b, size_t len, int code, const char *want)
{
	char err[WK_ERRSZ] = "";
	struct st_file *f = (struct st_file *)1;
	int rc = st_parse(b, len, "t.safetensors", &f, err, sizeof err);
	cr_assert_neq(rc, WK_OK, "expected failure containing '%s'", want);
	cr_assert_null(f);
	if (code)
		cr_assert_eq(rc, code, "rc %d (%s), want %d: %s", rc, wk_status_name(rc), code, err);
	cr_assert(strstr(err, "t.safetensors") != NULL, "message lacks the label: %s", err);
	cr_assert(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
}

static void expect_fail(const char *hdr, size_t data_len, int code, const char *want)
{
	size_t len;
	unsigned char *b = image(hdr, data_len, &len);
	expect_fail_buf(b, len, code, want);
	free(b);
}

static struct st_file *expect_ok(const unsigned char *b, size_t len)
{
	char err[WK_ERRSZ] = "";
	struct st_file *f = NULL;
	int rc = st_parse(b, len, "t.safetensors", &f, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "unexpected failure: %s", err);
	cr_assert_not_null(f);
	return f;
}

static char *tmpdir(void)
{
	char *d = strdup("/tmp/wick-st.XXXXXX");
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

/* ---- valid images ------------------------------------------------------------------------- */

Test(safetensors, valid_basic)
{
	/* Header order differs from offset order; st_at must follow offsets. */
	const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,24]},"
			"\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
			"\"s\":{\"dtype\":\"F8_E4M3\",\"shape\":[],\"data_offsets\":[24,25]},"
			"\"z\":{\"dtype\":\"F16\",\"shape\":[0,7],\"data_offsets\":[25,25]}}";
	size_t len;
	unsigned char *b = image(h, 25, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_eq(st_count(f), 4);
	cr_assert_str_eq(st_at(f, 0)->name, "a");
	cr_assert_str_eq(st_at(f, 1)->name, "b");
	cr_assert_str_eq(st_at(f, 2)->name, "s");
	cr_assert_str_eq(st_at(f, 3)->name, "z");
	cr_assert_null(st_at(f, 4));
	const struct st_tensor *t = st_find(f, "b");
	cr_assert_not_null(t);
	cr_assert_eq(t->dtype, DT_F32);
	cr_assert_eq(t->rank, 2);
	cr_assert_eq(t->numel, 4);
	cr_assert_eq(t->nbytes, 16);
	size_t hl = strlen(h);
	cr_assert_eq(t->offset, 8 + hl + 8);
	cr_assert_eq((const unsigned char *)t->data, b + 8 + hl + 8);
	t = st_find(f, "s");
	cr_assert_eq(t->rank, 0);
	cr_assert_eq(t->numel, 1);
	t = st_find(f, "z");
	cr_assert_eq(t->numel, 0);
	cr_assert_eq(t->nbytes, 0);
	cr_assert_null(st_find(f, "c"));
	cr_assert_null(st_find(f, "__metadata__"));
	cr_assert_str_eq(st_meta(f, "format"), "pt");
	cr_assert_null(st_meta(f, "nope"));
	cr_assert_str_eq(st_path(f), "t.safetensors");
	st_close(f);
	free(b);
}

Test(safetensors, valid_empty_and_padded)
{
	size_t len;
	unsigned char *b = image("{}", 0, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_eq(st_count(f), 0);
	cr_assert_null(st_find(f, "x"));
	st_close(f);
	free(b);
	b = image("  {\"__metadata__\":{}}     ", 3, &len);
	f = expect_ok(b, len);
	cr_assert_eq(st_count(f), 0);
	st_close(f);
	free(b);
}

Test(safetensors, find_many)
{
	/* 5000 tensors in reverse-name header order: every one found, absent ones not. */
	size_t n = 5000, cap = n * 96 + 16, o = 0;
	char *h = malloc(cap);
	o += (size_t)snprintf(h + o, cap - o, "{");
	for (size_t i = 0; i < n; i++)
		o += (size_t)snprintf(h + o, cap - o, "%s\"layer.%zu.w\":{\"dtype\":\"F32\","
				      "\"shape\":[1],\"data_offsets\":[%zu,%zu]}", i ? "," : "",
				      n - 1 - i, 4 * i, 4 * i + 4);
	snprintf(h + o, cap - o, "}");
	size_t len;
	unsigned char *b = image(h, 4 * n, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_eq(st_count(f), n);
	char name[64];
	for (size_t i = 0; i < n; i++) {
		snprintf(name, sizeof name, "layer.%zu.w", i);
		const struct st_tensor *t = st_find(f, name);
		cr_assert_not_null(t, "%s", name);
		cr_assert_str_eq(t->name, name);
		cr_assert_eq(t->offset - (8 + strlen(h)), 4 * (n - 1 - i));
	}
	cr_assert_null(st_find(f, "layer.5000.w"));
	cr_assert_null(st_find(f, ""));
	cr_assert_null(st_find(f, "layer."));
	st_close(f);
	free(b);
	free(h);
}

/* ---- malformed images --------------------------------------------------------------------- */

Test(safetensors, truncated_below_8)
{
	unsigned char b[8] = {2, 0, 0, 0, 0, 0, 0, 0};
	for (size_t n = 0; n < 8; n++) {
		unsigned char *c = malloc(n ? n : 1);
		memcpy(c, b, n);
		expect_fail_buf(c, n, WK_EFORMAT, "too short");
		free(c);
	}
}

Test(safetensors, header_cut_short)
{
	size_t len;
	const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
	unsigned char *b = image(h, 4, &len);
	/* Cut inside the header: the length now runs past the end. */
	for (size_t cut = 8; cut < 8 + strlen(h); cut += 7) {
		unsigned char *c = malloc(cut);
		memcpy(c, b, cut);
		expect_fail_buf(c, cut, WK_EFORMAT, "runs past the end");
		free(c);
	}
	/* Cut inside the data area: the tensor's offsets run past the end. */
	unsigned char *c = malloc(len - 2);
	memcpy(c, b, len - 2);
	expect_fail_buf(c, len - 2, WK_EFORMAT, "tensor 'a': data_offsets [0, 4] run past the end");
	free(c);
	free(b);
}

Test(safetensors, header_length_past_end)
{
	size_t len;
	unsigned char *b = image("{}", 0, &len);
	set_len(b, 3);
	expect_fail_buf(b, len, WK_EFORMAT, "runs past the end");
	set_len(b, ST_MAX_HEADER);
	expect_fail_buf(b, len, WK_EFORMAT, "runs past the end");
	free(b);
}

Test(safetensors, header_length_over_cap)
{
	size_t len;
	unsigned char *b = image("{}", 0, &len);
	set_len(b, (uint64_t)ST_MAX_HEADER + 1);
	expect_fail_buf(b, len, WK_ELIMIT, "over the limit");
	set_len(b, UINT64_MAX);
	expect_fail_buf(b, len, WK_ELIMIT, "over the limit");
	set_len(b, (uint64_t)1 << 63);
	expect_fail_buf(b, len, WK_ELIMIT, "over the limit");
	free(b);
}

Test(safetensors, not_json)
{
	expect_fail("", 0, WK_EFORMAT, "does not start with '{'");
	expect_fail("    ", 0, WK_EFORMAT, "does not start with '{'");
	expect_fail("[1,2]", 0, WK_EFORMAT, "does not start with '{'");
	expect_fail("{not json}", 0, WK_EFORMAT, "not valid JSON");
	expect_fail("{\"a\":", 0, WK_EFORMAT, "not valid JSON");
	expect_fail("{} trailing", 0, WK_EFORMAT, "not valid JSON");
	expect_fail("{\"a\":1}", 0, WK_EFORMAT, "tensor 'a': entry is not a JSON object");
	/* A NUL in a name would make C strings lie about it. */
	expect_fail("{\"a\\u0000b\":{}}", 0, WK_EFORMAT, "not valid JSON");
	/* Duplicate names. */
	expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
		    WK_EFORMAT, "not valid JSON");
}

Test(safetensors, nesting_too_deep)
{
	char h[4096];
	size_t o = 0;
	o += (size_t)snprintf(h, sizeof h, "{\"__metadata__\":");
	for (int i = 0; i < 1000; i++)
		h[o++] = '[';
	h[o] = 0;
	expect_fail(h, 0, WK_ELIMIT, "nests deeper");
	/* Brackets inside strings do not count. */
	expect_fail("{\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\":{\"dtype\":\"F32\",\"shape\":[1],"
		    "\"data_offsets\":[0,5]}}", 8, WK_EFORMAT, "hold 5 bytes");
}

Test(safetensors, overlapping_offsets)
{
	expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
		    WK_EFORMAT, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
	/* Identical ranges, listed in the other order. */
	expect_fail("{\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
		    "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "overlap");
	/* Contained range. */
	expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		    "\"b\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[6,8]}}", 16,
		    WK_EFORMAT, "overlap");
}

Test(safetensors, offsets_past_end)
{
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]}}", 16,
		    WK_EFORMAT, "tensor 'w': data_offsets [4, 20] run past the end of the 16-byte");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":"
		    "[9223372036854775800,9223372036854775804]}}", 16, WK_EFORMAT,
		    "run past the end");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":"
		    "[0,99999999999999999999999]}}", 16, WK_EFORMAT, "not valid JSON");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[-4,0]}}", 16,
		    WK_EFORMAT, "data_offsets is not [begin, end]");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4,8]}}", 16,
		    WK_EFORMAT, "data_offsets is not [begin, end]");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0.0,4]}}", 16,
		    WK_EFORMAT, "data_offsets is not [begin, end]");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":\"0,4\"}}", 16,
		    WK_EFORMAT, "data_offsets is not [begin, end]");
}

Test(safetensors, begin_after_end)
{
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16,
		    WK_EFORMAT, "tensor 'w': data_offsets [8, 4] has begin > end");
}

Test(safetensors, unknown_dtype)
{
	expect_fail("{\"w\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "tensor 'w': unknown dtype 'F99'");
	expect_fail("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "unknown dtype");
	expect_fail("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, WK_EFORMAT,
		    "dtype is not a string");
	expect_fail("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		    WK_EUNSUPPORTED, "tensor 'w': dtype I64 is not supported");
}

Test(safetensors, shape_bytes_mismatch)
{
	expect_fail("{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[64],"
		    "\"data_offsets\":[0,12]}}", 12, WK_EFORMAT,
		    "t.safetensors: tensor 'model.norm.weight': data_offsets [0, 12] hold 12 bytes "
		    "but shape [64] of F32 needs 256");
	expect_fail("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,6]}}", 12,
		    WK_EFORMAT, "shape [2, 3] of BF16 needs 12");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "needs 0");
}

Test(safetensors, bad_dims)
{
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "tensor 'w': shape[0] is not a non-negative integer");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "shape[1] is not");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "shape[0] is not");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "shape is not an array");
	/* Element count overflows int64. */
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
		    "\"data_offsets\":[0,4]}}", 4, WK_EFORMAT, "overflows 64 bits");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[65536,65536,65536,65536],"
		    "\"data_offsets\":[0,4]}}", 4, WK_EFORMAT, "overflows 64 bits");
	/* Element count fits, byte count does not. */
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807],"
		    "\"data_offsets\":[0,4]}}", 4, WK_EFORMAT, "overflows 64 bits");
	/* Byte count fits in 64 bits but is far past the file. */
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776],"
		    "\"data_offsets\":[0,4]}}", 4, WK_EFORMAT, "needs 4398046511104");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
		    "\"data_offsets\":[0,4]}}", 4, WK_EFORMAT, "not valid JSON");
	/* A huge product with a zero dim is an empty tensor, not an overflow. */
	size_t len;
	unsigned char *b = image("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4,0],"
				 "\"data_offsets\":[0,0]}}", 0, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_eq(st_find(f, "w")->numel, 0);
	st_close(f);
	free(b);
}

Test(safetensors, rank_too_high)
{
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
		    "\"data_offsets\":[0,4]}}", 4, WK_ELIMIT, "tensor 'w': rank 9 is over the limit");
	size_t len;
	unsigned char *b = image("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],"
				 "\"data_offsets\":[0,8]}}", 8, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_eq(st_find(f, "w")->rank, 8);
	st_close(f);
	free(b);
}

Test(safetensors, name_too_long)
{
	char h[2048], name[ST_MAX_NAME + 2];
	memset(name, 'n', sizeof name - 1);
	name[ST_MAX_NAME + 1] = 0;
	snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 name);
	expect_fail(h, 4, WK_ELIMIT, "name is 513 bytes, over the limit of 512");
	expect_fail(h, 4, WK_ELIMIT, "tensor 'nnnn"); /* quoted, but cut short */
	name[ST_MAX_NAME] = 0;
	snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
		 name);
	size_t len;
	unsigned char *b = image(h, 4, &len);
	struct st_file *f = expect_ok(b, len);
	cr_assert_not_null(st_find(f, name));
	st_close(f);
	free(b);
	expect_fail("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		    WK_EFORMAT, "empty name");
}

Test(safetensors, bad_metadata)
{
	expect_fail("{\"__metadata__\":[1]}", 0, WK_EFORMAT, "__metadata__ is not a JSON object");
	expect_fail("{\"__metadata__\":\"pt\"}", 0, WK_EFORMAT, "__metadata__ is not");
	expect_fail("{\"__metadata__\":{\"format\":1}}", 0, WK_EFORMAT,
		    "__metadata__ value of 'format' is not a string");
	expect_fail("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, WK_EFORMAT, "not a string");
}

Test(safetensors, bad_entry_keys)
{
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
		    WK_EFORMAT, "tensor 'w': unknown key 'x'");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, WK_EFORMAT,
		    "tensor 'w': missing 'data_offsets'");
	expect_fail("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, WK_EFORMAT,
		    "missing 'dtype'");
	expect_fail("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, WK_EFORMAT,
		    "missing 'shape'");
}

Test(safetensors, control_chars_in_messages)
{
	char err[WK_ERRSZ];
	struct st_file *f;
	size_t len;
	unsigned char *b = image("{\"a\\nb\\u001b[31m\":{\"dtype\":\"F99\",\"shape\":[1],"
				 "\"data_offsets\":[0,4]}}", 4, &len);
	cr_assert_neq(st_parse(b, len, "x", &f, err, sizeof err), WK_OK);
	cr_assert_null(strchr(err, '\n'), "%s", err);
	cr_assert_null(strchr(err, 0x1b), "%s", err);
	free(b);
}

/* ---- st_open ------------------------------------------------------------------------------ */

Test(safetensors, open_errors)
{
	char err[WK_ERRSZ];
	struct st_file *f;
	char *d = tmpdir(), p[4096];
	snprintf(p, sizeof p, "%s/missing.safetensors", d);
	cr_assert_eq(st_open(p, &f, err, sizeof err), WK_ENOTFOUND);
	cr_assert(strstr(err, p), "%s", err);
	cr_assert_eq(st_open(d, &f, err, sizeof err), WK_EIO);
	cr_assert(strstr(err, d), "%s", err);
	snprintf(p, sizeof p, "%s/short.safetensors", d);
	cr_assert_eq(wk_write_file(p, "abc", 3, err, sizeof err), WK_OK);
	cr_assert_eq(st_open(p, &f, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, p) && strstr(err, "too short"), "%s", err);
	cr_assert_eq(wk_write_file(p, "", 0, err, sizeof err), WK_OK);
	cr_assert_eq(st_open(p, &f, err, sizeof err), WK_EFORMAT);
	size_t len;
	unsigned char *b = image("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
				 4, &len);
	cr_assert_eq(wk_write_file(p, b, len, err, sizeof err), WK_OK);
	cr_assert_eq(st_open(p, &f, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, p) && strstr(err, "tensor 'w'"), "%s", err);
	free(b);
	rmtree(d);
}

/* ---- st_write round trip ------------------------------------------------------------------ */

Test(safetensors, roundtrip_every_dtype)
{
	char err[WK_ERRSZ], *d = tmpdir(), p[4096];
	snprintf(p, sizeof p, "%s/m.safetensors", d);
	enum { N = DT_COUNT * 3 };
	struct st_out out[N];
	unsigned char *bufs[N];
	char names[N][32];
	for (int i = 0; i < N; i++) {
		enum dt_type dt = (enum dt_type)(i % DT_COUNT);
		int kind = i / DT_COUNT; /* 0: rank 3 odd sizes, 1: scalar, 2: empty */
		struct st_out *o = &out[i];
		memset(o, 0, sizeof *o);
		snprintf(names[i], sizeof names[i], "t%02d.%s", N - i, dt_name(dt));
		o->name = names[i];
		o->dtype = dt;
		if (kind == 0) {
			o->rank = 3;
			o->shape[0] = 3;
			o->shape[1] = 5;
			o->shape[2] = 7 + i;
		} else if (kind == 1) {
			o->rank = 0;
		} else {
			o->rank = 2;
			o->shape[0] = 4;
			o->shape[1] = 0;
		}
		size_t nb = dt_size(dt);
		for (int k = 0; k < o->rank; k++)
			nb *= (size_t)o->shape[k];
		bufs[i] = malloc(nb ? nb : 1);
		for (size_t k = 0; k < nb; k++)
			bufs[i][k] = (unsigned char)(k * 31 + (size_t)i);
		o->data = nb ? bufs[i] : NULL;
	}
	int rc = st_write(p, out, N, "{\"format\":\"pt\",\"source\":\"wick test\"}", err,
			  sizeof err);
	cr_assert_eq(rc, WK_OK, "%s", err);
	char tmp[4200];
	snprintf(tmp, sizeof tmp, "%s.tmp", p);
	cr_assert_neq(access(tmp, F_OK), 0, "temp file left behind");

	struct st_file *f;
	rc = st_open(p, &f, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "%s", err);
	cr_assert_eq(st_count(f), N);
	cr_assert_str_eq(st_meta(f, "format"), "pt");
	cr_assert_str_eq(st_meta(f, "source"), "wick test");
	uint64_t data0 = st_at(f, 0)->offset;
	cr_assert_eq(data0 % 8, 0, "data area starts at %llu", (unsigned long long)data0);
	uint64_t next = data0;
	size_t ord = 0;
	for (int i = 0; i < N; i++) {
		const struct st_tensor *t = st_find(f, names[i]);
		cr_assert_not_null(t, "%s", names[i]);
		cr_assert_eq(t->dtype, out[i].dtype);
		cr_assert_eq(t->rank, out[i].rank);
		for (int k = 0; k < t->rank; k++)
			cr_assert_eq(t->shape[k], out[i].shape[k]);
		cr_assert_eq(t->offset, next, "%s packed without gaps", names[i]);
		next += t->nbytes;
		if (t->nbytes)
			cr_assert_eq(memcmp(t->data, bufs[i], t->nbytes), 0, "%s data", names[i]);
		/* Non-empty tensors keep the given order in offset order too. */
		if (t->nbytes) {
			while (st_at(f, ord)->nbytes == 0)
				ord++;
			cr_assert_str_eq(st_at(f, ord)->name, names[i]);
			ord++;
		}
	}
	/* Header keys are in the given order, __metadata__ first. */
	FILE *fp = fopen(p, "rb");
	unsigned char lb[8];
	cr_assert_eq(fread(lb, 1, 8, fp), 8);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = (hl << 8) | lb[i];
	cr_assert_eq(8 + hl, data0);
	char *h = malloc(hl);
	cr_assert_eq(fread(h, 1, hl, fp), hl);
	fclose(fp);
	json_t *j = json_loadb(h, hl, 0, NULL);
	cr_assert_not_null(j);
	const char *k;
	json_t *v;
	int idx = -1;
	json_object_foreach(j, k, v) {
		if (idx < 0)
			cr_assert_str_eq(k, "__metadata__");
		else
			cr_assert_str_eq(k, names[idx]);
		idx++;
	}
	cr_assert_eq(idx, N);
	json_decref(j);
	free(h);
	st_close(f);
	for (int i = 0; i < N; i++)
		free(bufs[i]);
	rmtree(d);
}

Test(safetensors, write_rejects_bad_input)
{
	char err[WK_ERRSZ], *d = tmpdir(), p[4096], tmp[4200];
	snprintf(p, sizeof p, "%s/bad.safetensors", d);
	snprintf(tmp, sizeof tmp, "%s.tmp", p);
	float x[4] = {1, 2, 3, 4};
	char longname[ST_MAX_NAME + 2];
	memset(longname, 'a', sizeof longname - 1);
	longname[sizeof longname - 1] = 0;
	struct st_out ok = {.name = "a", .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x};
	struct st_out bad[] = {
		{.name = "a", .dtype = DT_INVALID, .rank = 1, .shape = {4}, .data = x},
		{.name = "a", .dtype = (enum dt_type)99, .rank = 1, .shape = {4}, .data = x},
		{.name = longname, .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x},
		{.name = "", .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x},
		{.name = NULL, .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x},
		{.name = "__metadata__", .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = 9, .shape = {4}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = -1, .shape = {4}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = 1, .shape = {-4}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = 2, .shape = {INT64_MAX, 2}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = 1, .shape = {INT64_MAX / 2}, .data = x},
		{.name = "a", .dtype = DT_F32, .rank = 1, .shape = {4}, .data = NULL},
		{.name = "\xff\xfe", .dtype = DT_F32, .rank = 1, .shape = {4}, .data = x},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct st_out two[2] = {ok, bad[i]};
		if (two[1].name && !strcmp(two[1].name, "a"))
			two[1].name = "b";
		err[0] = 0;
		cr_assert_neq(st_write(p, two, 2, NULL, err, sizeof err), WK_OK, "case %zu", i);
		cr_assert(err[0], "case %zu: empty message", i);
		cr_assert_neq(access(p, F_OK), 0, "case %zu wrote a file", i);
		cr_assert_neq(access(tmp, F_OK), 0, "case %zu left a temp file", i);
	}
	struct st_out dup[2] = {ok, ok};
	cr_assert_neq(st_write(p, dup, 2, NULL, err, sizeof err), WK_OK);
	cr_assert(strstr(err, "twice"), "%s", err);
	cr_assert_neq(st_write(p, &ok, 1, "[1]", err, sizeof err), WK_OK);
	cr_assert_neq(st_write(p, &ok, 1, "{\"a\":1}", err, sizeof err), WK_OK);
	cr_assert_neq(st_write(p, &ok, 1, "{bad", err, sizeof err), WK_OK);
	cr_assert_neq(access(p, F_OK), 0);
	/* Zero tensors is a valid (empty) file. */
	cr_assert_eq(st_write(p, NULL, 0, NULL, err, sizeof err), WK_OK, "%s", err);
	struct st_file *f;
	cr_assert_eq(st_open(p, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(st_count(f), 0);
	st_close(f);
	rmtree(d);
}

/* ---- random mutations --------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64*: reproducible across platforms. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static size_t rndn(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* Checks the invariants every successful parse must give. */
static void check_ok(const struct st_file *f, const unsigned char *b, size_t len)
{
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = (hl << 8) | b[i];
	uint64_t prev_end = 8 + hl;
	for (size_t i = 0; i < st_count(f); i++) {
		const struct st_tensor *t = st_at(f, i);
		cr_assert(t->offset >= 8 + hl && t->offset <= len && t->nbytes <= len - t->offset,
			  "tensor '%s' [%llu, +%llu) outside a %zu-byte buffer", t->name,
			  (unsigned long long)t->offset, (unsigned long long)t->nbytes, len);
		cr_assert_eq((const unsigned char *)t->data, b + t->offset);
		cr_assert(t->offset >= prev_end, "overlap at '%s'", t->name);
		prev_end = t->offset + t->nbytes;
		cr_assert_eq(st_find(f, t->name), t);
		cr_assert(dt_size(t->dtype) > 0 && t->rank >= 0 && t->rank <= ST_MAX_RANK);
		cr_assert(strlen(t->name) <= ST_MAX_NAME);
		if (t->nbytes)
			(void)((const volatile unsigned char *)t->data)[t->nbytes - 1];
	}
}

Test(safetensors, mutations_10k, .timeout = 120)
{
	const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
			"\"model.embed.weight\":{\"dtype\":\"BF16\",\"shape\":[4,3],"
			"\"data_offsets\":[0,24]},"
			"\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[3],"
			"\"data_offsets\":[24,36]},"
			"\"l.0.w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2,2],\"data_offsets\":[36,44]},"
			"\"l.0.w_scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1],"
			"\"data_offsets\":[44,48]},"
			"\"l.1.w\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[48,50]},"
			"\"e\":{\"dtype\":\"F8_E5M2\",\"shape\":[0],\"data_offsets\":[50,50]},"
			"\"tail\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[56,64]}}";
	static const char interesting[] = "0123456789-[]{}\",:.eE \\ux";
	size_t base_len;
	unsigned char *base = image(h, 64, &base_len);
	size_t hlen = strlen(h);
	struct st_file *f = expect_ok(base, base_len);
	st_close(f);

	rng_state = 0x5eed5afe7e25ull;
	int n = 10000, ok = 0;
	double t0 = wk_now();
	unsigned char *work = malloc(base_len * 2 + 64);
	for (int iter = 0; iter < n; iter++) {
		size_t len = base_len, hl = hlen;
		memcpy(work, base, base_len);
		int muts = 1 + (int)rndn(3), fix_len = (int)rndn(4) != 0;
		for (int m = 0; m < muts && len >= 8; m++) {
			size_t at = 8 + rndn(hl ? hl : 1);
			switch (rndn(9)) {
			case 0: /* flip a bit */
				if (hl)
					work[at] ^= (unsigned char)(1u << rndn(8));
				break;
			case 1: /* random byte */
				if (hl)
					work[at] = (unsigned char)rnd();
				break;
			case 2: /* interesting char */
			case 3:
				if (hl)
					work[at] = (unsigned char)interesting[rndn(sizeof interesting - 1)];
				break;
			case 4: /* insert */
				if (len < base_len * 2 + 60) {
					memmove(work + at + 1, work + at, len - at);
					work[at] = rndn(2) ? (unsigned char)interesting[rndn(
						sizeof interesting - 1)] : (unsigned char)rnd();
					len++;
					hl++;
				}
				break;
			case 5: /* delete a run */
				if (hl) {
					size_t k = 1 + rndn(hl < 8 ? hl : 8);
					if (at + k > 8 + hl)
						k = 8 + hl - at;
					memmove(work + at, work + at + k, len - at - k);
					len -= k;
					hl -= k;
				}
				break;
			case 6: /* change the length prefix */
				fix_len = 0;
				set_len(work, rndn(2) ? (uint64_t)hl + rndn(17) - 8 : rnd() >>
					rndn(64));
				break;
			case 8: /* another digit: JSON stays valid, shapes and offsets change */
				for (size_t k = 0; k < hl; k++) {
					size_t q = 8 + (at - 8 + k) % hl;
					if (work[q] >= '0' && work[q] <= '9') {
						work[q] = (unsigned char)('0' + rndn(10));
						break;
					}
				}
				break;
			case 7: /* truncate */
				len = rndn(len + 1);
				if (hl + 8 > len)
					hl = len >= 8 ? len - 8 : 0;
				break;
			}
		}
		if (fix_len && len >= 8)
			set_len(work, hl);
		/* Exact-size copy so a read past the end is an ASan error. */
		unsigned char *img = malloc(len ? len : 1);
		memcpy(img, work, len);
		char err[WK_ERRSZ];
		err[0] = 0;
		struct st_file *g = NULL;
		int rc = st_parse(img, len, "fuzz", &g, err, sizeof err);
		if (rc == WK_OK) {
			ok++;
			check_ok(g, img, len);
			st_close(g);
		} else {
			cr_assert_null(g);
			cr_assert(rc < 0, "iter %d: rc %d", iter, rc);
			cr_assert(err[0] != 0, "iter %d: empty message", iter);
			cr_assert(strstr(err, "fuzz") != NULL, "iter %d: '%s'", iter, err);
		}
		free(img);
	}
	double dt = wk_now() - t0;
	cr_log_info("mutations: %d parsed, %d valid, %.2f s", n, ok, dt);
	/* The fuzzer must reach past the JSON parser: some mutants stay valid. */
	cr_assert(ok > n / 50, "only %d of %d mutants parsed", ok, n);
	free(work);
	free(base);
}
