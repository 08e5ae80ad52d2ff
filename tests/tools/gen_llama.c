/*
 * gen_llama.c - writes a randomly initialised Hugging Face Llama checkpoint, for tests and
 * benchmarks that need a model of a given size but not a trained one.
 *
 *   gen_llama -o DIR [--hidden H] [--intermediate I] [--layers L] [--heads NH]
 *             [--kv-heads NKV] [--vocab V] [--max-pos P] [--dtype bf16|f16|f32] [--seed S]
 *
 * DIR gets config.json (LlamaForCausalLM) and model.safetensors with the HF tensor names.
 * Linear weights and embeddings are ~N(0, 0.02) (Irwin-Hall from xorshift64*, deterministic
 * for a seed); norm weights are 1. No tokenizer is written: callers feed token ids.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coldstart/safetensors.h"
#include "common/dtype.h"
#include "common/wk.h"

struct dims {
	int hidden, intermediate, layers, heads, kv_heads, vocab, max_pos;
	enum dt_type dtype;
	uint64_t seed;
};

static uint64_t rng;

static uint64_t next_u64(void) /* xorshift64* */
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545F4914F6CDD1Dull;
}

/* Approximately N(0, std): the sum of four 16-bit uniforms has mean 2 and variance 1/3. */
static float gauss(float std)
{
	uint64_t r = next_u64();
	float s = 0.0f;
	for (int i = 0; i < 4; i++)
		s += (float)((r >> (16 * i)) & 0xffff) * (1.0f / 65536.0f);
	return (s - 2.0f) * 1.7320508f * std;
}

/* A [rows][cols] tensor (cols == 0: a vector of rows) in dtype: random, or all `fill`. */
static void *make_tensor(enum dt_type dt, int64_t rows, int64_t cols, bool random, float fill)
{
	size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
	void *p = malloc(n * dt_size(dt));
	if (!p)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		float f = random ? gauss(0.02f) : fill;
		if (dt == DT_F32)
			((float *)p)[i] = f;
		else if (dt == DT_BF16)
			((uint16_t *)p)[i] = dt_f32_to_bf16(f);
		else
			((uint16_t *)p)[i] = dt_f32_to_f16(f);
	}
	return p;
}

static int add(struct st_out *t, size_t *n, enum dt_type dt, const char *name, int64_t rows,
	       int64_t cols, bool random)
{
	struct st_out *o = &t[*n];
	o->name = strdup(name);
	o->dtype = dt;
	o->rank = cols ? 2 : 1;
	o->shape[0] = rows;
	o->shape[1] = cols;
	o->data = make_tensor(dt, rows, cols, random, 1.0f);
	(*n)++;
	return o->name && o->data ? 0 : -1;
}

static int write_config(const char *dir, const struct dims *d)
{
	const char *tdtype = d->dtype == DT_BF16 ? "bfloat16"
			     : d->dtype == DT_F16 ? "float16" : "float32";
	json_t *c = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i,"
			      " s:i, s:s, s:s}",
			      "architectures", "LlamaForCausalLM", "model_type", "llama",
			      "hidden_size", d->hidden, "intermediate_size", d->intermediate,
			      "num_hidden_layers", d->layers, "num_attention_heads", d->heads,
			      "num_key_value_heads", d->kv_heads, "vocab_size", d->vocab,
			      "max_position_embeddings", d->max_pos, "rms_norm_eps", 1e-5,
			      "rope_theta", 10000.0, "tie_word_embeddings", 0, "bos_token_id", 1,
			      "eos_token_id", 2, "torch_dtype", tdtype, "hidden_act", "silu");
	if (!c)
		return -1;
	char *s = json_dumps(c, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
	json_decref(c);
	if (!s)
		return -1;
	char path[4096], err[WK_ERRSZ];
	snprintf(path, sizeof path, "%s/config.json", dir);
	int rc = wk_write_file(path, s, strlen(s), err, sizeof err);
	free(s);
	if (rc)
		fprintf(stderr, "gen_llama: %s\n", err);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gen_llama -o DIR [--hidden H] [--intermediate I] [--layers L] "
		   "[--heads NH] [--kv-heads NKV]\n"
		   "                 [--vocab V] [--max-pos P] [--dtype bf16|f16|f32] [--seed S]\n"
		   "defaults: hidden 64, intermediate 172, layers 2, heads 4, kv-heads 2, vocab 256,\n"
		   "          max-pos 256, dtype bf16, seed 1\n");
}

static int parse_pos(const char *s, const char *what, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v <= 0 || v > (1 << 24)) {
		fprintf(stderr, "gen_llama: --%s wants a positive integer, not '%s'\n", what, s);
		return -1;
	}
	*out = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	struct dims d = {64, 172, 2, 4, 2, 256, 256, DT_BF16, 1};
	const char *dir = NULL;
	static const struct option opts[] = {
		{"out", required_argument, NULL, 'o'},     {"hidden", required_argument, NULL, 'H'},
		{"intermediate", required_argument, NULL, 'I'},
		{"layers", required_argument, NULL, 'L'},  {"heads", required_argument, NULL, 'N'},
		{"kv-heads", required_argument, NULL, 'K'}, {"vocab", required_argument, NULL, 'V'},
		{"max-pos", required_argument, NULL, 'P'}, {"dtype", required_argument, NULL, 'd'},
		{"seed", required_argument, NULL, 's'},    {"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int c, bad = 0;
	while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o': dir = optarg; break;
		case 'H': bad |= parse_pos(optarg, "hidden", &d.hidden); break;
		case 'I': bad |= parse_pos(optarg, "intermediate", &d.intermediate); break;
		case 'L': bad |= parse_pos(optarg, "layers", &d.layers); break;
		case 'N': bad |= parse_pos(optarg, "heads", &d.heads); break;
		case 'K': bad |= parse_pos(optarg, "kv-heads", &d.kv_heads); break;
		case 'V': bad |= parse_pos(optarg, "vocab", &d.vocab); break;
		case 'P': bad |= parse_pos(optarg, "max-pos", &d.max_pos); break;
		case 's': d.seed = strtoull(optarg, NULL, 10); break;
		case 'd':
			d.dtype = !strcmp(optarg, "bf16") ? DT_BF16
				  : !strcmp(optarg, "f16") ? DT_F16
				  : !strcmp(optarg, "f32") ? DT_F32 : DT_INVALID;
			if (d.dtype == DT_INVALID) {
				fprintf(stderr, "gen_llama: --dtype is bf16, f16 or f32\n");
				bad = 1;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (bad)
		return 2;
	if (!dir || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (d.hidden % d.heads || d.heads % d.kv_heads || (d.hidden / d.heads) % 2) {
		fprintf(stderr, "gen_llama: hidden must split into heads of even size, and heads "
				"into kv-heads\n");
		return 2;
	}
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "gen_llama: mkdir %s: %s\n", dir, strerror(errno));
		return 1;
	}

	rng = d.seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
	int64_t hd = d.hidden / d.heads, kv = hd * d.kv_heads;
	size_t cap = 3 + 9 * (size_t)d.layers, n = 0;
	struct st_out *t = calloc(cap, sizeof *t);
	int rc = t ? 0 : -1;
	char name[256];
	enum dt_type dt = d.dtype;
	if (!rc)
		rc = add(t, &n, dt, "model.embed_tokens.weight", d.vocab, d.hidden, true);
	for (int l = 0; l < d.layers && !rc; l++) {
		const struct {
			const char *suffix;
			int64_t rows, cols;
			bool random;
		} ts[] = {
			{"input_layernorm.weight", d.hidden, 0, false},
			{"self_attn.q_proj.weight", d.hidden, d.hidden, true},
			{"self_attn.k_proj.weight", kv, d.hidden, true},
			{"self_attn.v_proj.weight", kv, d.hidden, true},
			{"self_attn.o_proj.weight", d.hidden, d.hidden, true},
			{"post_attention_layernorm.weight", d.hidden, 0, false},
			{"mlp.gate_proj.weight", d.intermediate, d.hidden, true},
			{"mlp.up_proj.weight", d.intermediate, d.hidden, true},
			{"mlp.down_proj.weight", d.hidden, d.intermediate, true},
		};
		for (size_t i = 0; i < sizeof ts / sizeof ts[0] && !rc; i++) {
			snprintf(name, sizeof name, "model.layers.%d.%s", l, ts[i].suffix);
			rc = add(t, &n, dt, name, ts[i].rows, ts[i].cols, ts[i].random);
		}
	}
	if (!rc)
		rc = add(t, &n, dt, "model.norm.weight", d.hidden, 0, false);
	if (!rc)
		rc = add(t, &n, dt, "lm_head.weight", d.vocab, d.hidden, true);
	if (rc) {
		fprintf(stderr, "gen_llama: out of memory\n");
	} else {
		char path[4096], err[WK_ERRSZ];
		snprintf(path, sizeof path, "%s/model.safetensors", dir);
		rc = st_write(path, t, n, "{\"format\":\"pt\"}", err, sizeof err);
		if (rc)
			fprintf(stderr, "gen_llama: %s\n", err);
		else
			rc = write_config(dir, &d);
	}
	for (size_t i = 0; t && i < n; i++) {
		free((void *)t[i].name);
		free((void *)t[i].data);
	}
	free(t);
	return rc ? 1 : 0;
}
