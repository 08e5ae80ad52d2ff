/*
 * tokenizer.c - tokenizer.json loading, and the public tok_* API.
 *
 * Loading turns the JSON into the flat tables of struct tok (tokenizer_int.h); every
 * component kind wick does not implement is refused here, by name, so that encode and decode
 * never meet one. A pre-tokenizer ending in ByteLevel makes the byte-level kind
 * (tokenizer_bytelevel.c). Encoding and decoding follow the Hugging Face pipeline described in
 * tokenizer_int.h; the BPE model itself is in tokenizer_bpe.c.
 */
#include "engine/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/tokenizer_int.h"

/* ---- loading: helpers -------------------------------------------------------------------- */

struct ld {
	const char *path;
	char *err;
	size_t errsz;
};

#define LD_ERR(l, code, ...) wk_errf((l)->err, (l)->errsz, (code), __VA_ARGS__)

static const char *type_of(json_t *o)
{
	json_t *ty = json_object_get(o, "type");
	return json_is_string(ty) ? json_string_value(ty) : NULL;
}

/* A JSON string of exactly one UTF-8 character, copied into out (NUL-terminated). */
static int one_char(struct ld *l, json_t *v, const char *what, char *out, size_t *outlen)
{
	if (!json_is_string(v))
		return LD_ERR(l, WK_EFORMAT, "%s: %s: expected a one-character string", l->path, what);
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);
	if (n == 0 || n > 4 || tok_utf8_len((const unsigned char *)s, n) != n)
		return LD_ERR(l, WK_EFORMAT, "%s: %s: expected a one-character string", l->path, what);
	memcpy(out, s, n);
	out[n] = 0;
	*outlen = n;
	return WK_OK;
}

static int dup_str(struct ld *l, json_t *v, const char *what, char **out, size_t *outlen)
{
	if (!json_is_string(v))
		return LD_ERR(l, WK_EFORMAT, "%s: %s: expected a string", l->path, what);
	size_t n = json_string_length(v);
	if (n > TOK_MAX_PIECE)
		return LD_ERR(l, WK_ELIMIT, "%s: %s: %zu bytes, more than %d", l->path, what, n,
			      TOK_MAX_PIECE);
	char *p = malloc(n + 1);
	if (!p)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	memcpy(p, json_string_value(v), n);
	p[n] = 0;
	*out = p;
	*outlen = n;
	return WK_OK;
}

static bool opt_bool(json_t *o, const char *key, bool dflt)
{
	json_t *v = json_object_get(o, key);
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* Appends a step to steps[*n]; the caller fills it. NULL when there are too many. */
static struct tok_step *new_step(struct ld *l, struct tok_step *steps, int *n, const char *what)
{
	if (*n == TOK_MAX_STEPS) {
		LD_ERR(l, WK_ELIMIT, "%s: %s: more than %d steps", l->path, what, TOK_MAX_STEPS);
		return NULL;
	}
	struct tok_step *s = &steps[(*n)++];
	memset(s, 0, sizeof *s);
	return s;
}

/* Replace's {"pattern": {"String": s}, "content": c}; a Regex pattern is refused. */
static int parse_replace(struct ld *l, json_t *o, struct tok_step *s, const char *what)
{
	json_t *pat = json_object_get(o, "pattern");
	if (json_is_object(pat) && json_object_get(pat, "Regex"))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: %s Replace with a Regex pattern is not "
			      "supported", l->path, what);
	s->type = TOK_STEP_REPLACE;
	int rc = dup_str(l, json_object_get(pat, "String"), "Replace.pattern.String", &s->s1,
			 &s->n1);
	if (rc == WK_OK)
		rc = dup_str(l, json_object_get(o, "content"), "Replace.content", &s->s2, &s->n2);
	if (rc == WK_OK && s->n1 == 0)
		rc = LD_ERR(l, WK_EFORMAT, "%s: %s Replace: empty pattern", l->path, what);
	return rc;
}

/* Metaspace's prepend scheme: prepend_scheme wins; add_prefix_space false means never. */
static int parse_scheme(struct ld *l, json_t *o, enum tok_prepend_scheme *out)
{
	json_t *ps = json_object_get(o, "prepend_scheme");
	*out = TOK_PREPEND_ALWAYS;
	if (json_is_string(ps)) {
		const char *v = json_string_value(ps);
		if (!strcmp(v, "always"))
			*out = TOK_PREPEND_ALWAYS;
		else if (!strcmp(v, "first"))
			*out = TOK_PREPEND_FIRST;
		else if (!strcmp(v, "never"))
			*out = TOK_PREPEND_NEVER;
		else
			return LD_ERR(l, WK_EFORMAT, "%s: Metaspace: unknown prepend_scheme '%s'",
				      l->path, v);
	} else if (!opt_bool(o, "add_prefix_space", true)) {
		*out = TOK_PREPEND_NEVER;
	}
	return WK_OK;
}

/* ---- loading: components ----------------------------------------------------------------- */

static int parse_normalizer(struct ld *l, struct tok *t, json_t *o)
{
	if (!o || json_is_null(o))
		return WK_OK;
	const char *ty = type_of(o);
	if (!ty)
		return LD_ERR(l, WK_EFORMAT, "%s: normalizer: no type", l->path);
	if (!strcmp(ty, "Sequence")) {
		json_t *list = json_object_get(o, "normalizers");
		if (!json_is_array(list))
			return LD_ERR(l, WK_EFORMAT, "%s: normalizer Sequence: no normalizers list",
				      l->path);
		size_t i;
		json_t *v;
		json_array_foreach(list, i, v) {
			int rc = parse_normalizer(l, t, v);
			if (rc != WK_OK)
				return rc;
		}
		return WK_OK;
	}
	if (!strcmp(ty, "Prepend")) {
		struct tok_step *s = new_step(l, t->norm, &t->n_norm, "normalizer");
		if (!s)
			return WK_ELIMIT;
		s->type = TOK_STEP_PREPEND;
		return dup_str(l, json_object_get(o, "prepend"), "Prepend.prepend", &s->s1, &s->n1);
	}
	if (!strcmp(ty, "Replace")) {
		struct tok_step *s = new_step(l, t->norm, &t->n_norm, "normalizer");
		return s ? parse_replace(l, o, s, "normalizer") : WK_ELIMIT;
	}
	if (!strcmp(ty, "NFC")) {
		struct tok_step *s = new_step(l, t->norm, &t->n_norm, "normalizer");
		if (!s)
			return WK_ELIMIT;
		s->type = TOK_STEP_NFC;
		return WK_OK;
	}
	return LD_ERR(l, WK_EUNSUPPORTED, "%s: normalizer %s is not supported", l->path, ty);
}

/* Split and ByteLevel, alone or in a Sequence (any nesting), ByteLevel last. */
static int parse_pre_step(struct ld *l, struct tok *t, json_t *o, int depth)
{
	const char *ty = type_of(o);
	if (!ty)
		return LD_ERR(l, WK_EFORMAT, "%s: pre_tokenizer: no type", l->path);
	if (t->n_pre && t->pre[t->n_pre - 1].type == TOK_PRE_BYTE_LEVEL)
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer %s after ByteLevel is not "
			      "supported", l->path, ty);
	if (!strcmp(ty, "Sequence") && depth < 4) {
		json_t *list = json_object_get(o, "pretokenizers");
		if (!json_is_array(list))
			return LD_ERR(l, WK_EFORMAT, "%s: pre_tokenizer Sequence: no pretokenizers "
				      "list", l->path);
		size_t i;
		json_t *v;
		json_array_foreach(list, i, v) {
			int rc = parse_pre_step(l, t, v, depth + 1);
			if (rc != WK_OK)
				return rc;
		}
		return WK_OK;
	}
	if (strcmp(ty, "Split") && strcmp(ty, "ByteLevel"))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer %s is not supported%s", l->path,
			      ty, depth ? " in a Sequence" : "");
	if (t->n_pre == TOK_MAX_STEPS)
		return LD_ERR(l, WK_ELIMIT, "%s: pre_tokenizer: more than %d steps", l->path,
			      TOK_MAX_STEPS);
	struct tok_pre *p = &t->pre[t->n_pre++];
	memset(p, 0, sizeof *p);
	if (!strcmp(ty, "ByteLevel")) {
		/* trim_offsets only changes offsets, which wick does not report */
		p->type = TOK_PRE_BYTE_LEVEL;
		p->prefix_space = opt_bool(o, "add_prefix_space", true);
		p->use_regex = opt_bool(o, "use_regex", true);
		p->re = (struct tok_regex){.family = TOK_RE_GPT2, .contractions = TOK_RE_CASE_EXACT};
		return WK_OK;
	}
	p->type = TOK_PRE_SPLIT;
	json_t *pat = json_object_get(o, "pattern");
	json_t *rx = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
	const char *beh = json_string_value(json_object_get(o, "behavior"));
	if (!json_is_object(pat) || !beh)
		return LD_ERR(l, WK_EFORMAT, "%s: pre_tokenizer Split: needs a pattern and a "
			      "behavior", l->path);
	if (!json_is_string(rx))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer Split: only Regex patterns "
			      "are supported", l->path);
	if (strcmp(beh, "Isolated"))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer Split: behavior %s is not "
			      "supported (only Isolated)", l->path, beh);
	if (opt_bool(o, "invert", false))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer Split: invert is not "
			      "supported", l->path);
	if (!tok_regex_parse(json_string_value(rx), &p->re))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: pre_tokenizer Split: the regex '%.300s' is "
			      "not supported (wick implements the GPT-2 and GPT-4/cl100k patterns, "
			      "see engine/tokenizer_int.h)", l->path, json_string_value(rx));
	return WK_OK;
}

static int parse_pre_tokenizer(struct ld *l, struct tok *t, json_t *o)
{
	if (!o || json_is_null(o))
		return WK_OK;
	const char *ty = type_of(o);
	if (!ty)
		return LD_ERR(l, WK_EFORMAT, "%s: pre_tokenizer: no type", l->path);
	if (!strcmp(ty, "Metaspace")) {
		t->metaspace = true;
		t->meta_split = opt_bool(o, "split", true);
		int rc = one_char(l, json_object_get(o, "replacement"), "Metaspace.replacement",
				  t->meta_repl, &t->meta_repl_len);
		return rc == WK_OK ? parse_scheme(l, o, &t->meta_scheme) : rc;
	}
	int rc = parse_pre_step(l, t, o, 0);
	if (rc == WK_OK && t->n_pre && t->pre[t->n_pre - 1].type == TOK_PRE_BYTE_LEVEL) {
		t->kind = TOK_KIND_BYTE_LEVEL_BPE;
		tok_bl_alphabet(t);
	}
	return rc;
}

static int parse_decoder(struct ld *l, struct tok *t, json_t *o, int depth)
{
	if (!o || json_is_null(o))
		return WK_OK;
	t->has_decoder = true;
	const char *ty = type_of(o);
	if (!ty)
		return LD_ERR(l, WK_EFORMAT, "%s: decoder: no type", l->path);
	if (!strcmp(ty, "Sequence") && depth < 4) {
		json_t *list = json_object_get(o, "decoders");
		if (!json_is_array(list))
			return LD_ERR(l, WK_EFORMAT, "%s: decoder Sequence: no decoders list",
				      l->path);
		size_t i;
		json_t *v;
		json_array_foreach(list, i, v) {
			int rc = parse_decoder(l, t, v, depth + 1);
			if (rc != WK_OK)
				return rc;
		}
		return WK_OK;
	}
	struct tok_step *s = NULL;
	if (!strcmp(ty, "Replace") || !strcmp(ty, "ByteFallback") || !strcmp(ty, "Fuse") ||
	    !strcmp(ty, "Strip") || !strcmp(ty, "Metaspace") || !strcmp(ty, "ByteLevel")) {
		s = new_step(l, t->dec, &t->n_dec, "decoder");
		if (!s)
			return WK_ELIMIT;
	}
	if (!strcmp(ty, "Replace"))
		return parse_replace(l, o, s, "decoder");
	if (!strcmp(ty, "ByteFallback")) {
		s->type = TOK_STEP_BYTE_FALLBACK;
		return WK_OK;
	}
	if (!strcmp(ty, "Fuse")) {
		s->type = TOK_STEP_FUSE;
		return WK_OK;
	}
	if (!strcmp(ty, "ByteLevel")) {
		/* its add_prefix_space/trim_offsets/use_regex do not change decoding */
		s->type = TOK_STEP_BYTE_LEVEL;
		tok_bl_alphabet(t);
		return WK_OK;
	}
	if (!strcmp(ty, "Strip")) {
		s->type = TOK_STEP_STRIP;
		json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
		if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
		    json_integer_value(b) < 0 || json_integer_value(a) > 1 << 20 ||
		    json_integer_value(b) > 1 << 20)
			return LD_ERR(l, WK_EFORMAT, "%s: decoder Strip: bad start/stop", l->path);
		s->start = (int)json_integer_value(a);
		s->stop = (int)json_integer_value(b);
		s->s1 = malloc(8);
		if (!s->s1)
			return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
		return one_char(l, json_object_get(o, "content"), "Strip.content", s->s1, &s->n1);
	}
	if (!strcmp(ty, "Metaspace")) {
		s->type = TOK_STEP_METASPACE;
		s->s1 = malloc(8);
		if (!s->s1)
			return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
		enum tok_prepend_scheme sch = TOK_PREPEND_ALWAYS;
		int rc = one_char(l, json_object_get(o, "replacement"), "Metaspace.replacement",
				  s->s1, &s->n1);
		if (rc == WK_OK)
			rc = parse_scheme(l, o, &sch);
		s->prepend_never = sch == TOK_PREPEND_NEVER;
		return rc;
	}
	return LD_ERR(l, WK_EUNSUPPORTED, "%s: decoder %s is not supported", l->path, ty);
}

/* One merge: "a b" (exactly one space, as HF requires) or ["a", "b"]. */
static int merge_parts(json_t *m, const char **a, size_t *na, const char **b, size_t *nb)
{
	if (json_is_string(m)) {
		const char *s = json_string_value(m);
		size_t n = json_string_length(m);
		const char *sp = memchr(s, ' ', n);
		if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
			return -1;
		*a = s;
		*na = (size_t)(sp - s);
		*b = sp + 1;
		*nb = n - *na - 1;
		return 0;
	}
	if (json_is_array(m) && json_array_size(m) == 2 &&
	    json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
		*a = json_string_value(json_array_get(m, 0));
		*na = json_string_length(json_array_get(m, 0));
		*b = json_string_value(json_array_get(m, 1));
		*nb = json_string_length(json_array_get(m, 1));
		return 0;
	}
	return -1;
}

static int parse_model(struct ld *l, struct tok *t, json_t *o)
{
	if (!json_is_object(o))
		return LD_ERR(l, WK_EFORMAT, "%s: no model object", l->path);
	const char *ty = type_of(o);
	if (ty && strcmp(ty, "BPE"))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: model type %s is not supported (only BPE)",
			      l->path, ty);
	json_t *vocab = json_object_get(o, "vocab"), *merges = json_object_get(o, "merges");
	if (!json_is_object(vocab) || !json_is_array(merges))
		return LD_ERR(l, WK_EFORMAT, "%s: model: BPE needs a vocab object and a merges "
			      "array", l->path);
	json_t *dropout = json_object_get(o, "dropout");
	if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: model: BPE dropout is not supported",
			      l->path);
	const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
	for (int i = 0; i < 2; i++) {
		json_t *v = json_object_get(o, affix[i]);
		if (json_is_string(v) && json_string_length(v) > 0)
			return LD_ERR(l, WK_EUNSUPPORTED, "%s: model: BPE %s is not supported",
				      l->path, affix[i]);
	}
	t->fuse_unk = opt_bool(o, "fuse_unk", false);
	t->byte_fallback = opt_bool(o, "byte_fallback", false);
	t->ignore_merges = opt_bool(o, "ignore_merges", false);
	if (json_object_size(vocab) > TOK_MAX_VOCAB)
		return LD_ERR(l, WK_ELIMIT, "%s: model.vocab: %zu entries, more than %d", l->path,
			      json_object_size(vocab), TOK_MAX_VOCAB);

	const char *key;
	size_t klen;
	json_t *v;
	json_object_keylen_foreach(vocab, key, klen, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= TOK_MAX_VOCAB)
			return LD_ERR(l, json_integer_value(v) > 0 ? WK_ELIMIT : WK_EFORMAT,
				      "%s: model.vocab['%.40s']: expected an id in 0..%d", l->path,
				      key, TOK_MAX_VOCAB - 1);
		if (klen > TOK_MAX_PIECE)
			return LD_ERR(l, WK_ELIMIT, "%s: model.vocab: a %zu-byte piece, more than %d",
				      l->path, klen, TOK_MAX_PIECE);
		int id = (int)json_integer_value(v);
		if (tok_strmap_put(&t->vocab, key, klen, id) != WK_OK)
			return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
		if (id >= t->n_ids)
			t->n_ids = id + 1;
	}
	/* Byte fallback looks up the upper-case form, as HF's format!("<{b:#04X}>") does. */
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof name, "<0x%02X>", b);
		t->byte_id[b] = tok_strmap_get(&t->vocab, name, 6);
	}

	json_t *unk = json_object_get(o, "unk_token");
	if (json_is_string(unk)) {
		t->unk_id = tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
		if (t->unk_id < 0)
			return LD_ERR(l, WK_EFORMAT, "%s: model.unk_token '%.40s' is not in the vocab",
				      l->path, json_string_value(unk));
	}

	size_t nm = json_array_size(merges);
	if (nm > TOK_MAX_MERGES)
		return LD_ERR(l, WK_ELIMIT, "%s: model.merges: %zu entries, more than %d", l->path,
			      nm, TOK_MAX_MERGES);
	char buf[2 * TOK_MAX_PIECE];
	uint32_t rank = 0;
	for (size_t i = 0; i < nm; i++) {
		json_t *m = json_array_get(merges, i);
		const char *a, *b;
		size_t na, nb;
		if (merge_parts(m, &a, &na, &b, &nb) != 0)
			return LD_ERR(l, WK_EFORMAT, "%s: model.merges[%zu]: expected \"a b\" or "
				      "[\"a\", \"b\"]", l->path, i);
		if (json_is_string(m) && na >= 8 && !memcmp(a, "#version", 8))
			continue; /* HF skips a merges.txt header line */
		int ia = tok_strmap_get(&t->vocab, a, na), ib = tok_strmap_get(&t->vocab, b, nb);
		int ic = -1;
		if (ia >= 0 && ib >= 0 && na + nb <= sizeof buf) {
			memcpy(buf, a, na);
			memcpy(buf + na, b, nb);
			ic = tok_strmap_get(&t->vocab, buf, na + nb);
		}
		if (ic < 0)
			return LD_ERR(l, WK_EFORMAT, "%s: model.merges[%zu]: '%.*s' + '%.*s' is not "
				      "in the vocab", l->path, i, (int)(na > 40 ? 40 : na), a,
				      (int)(nb > 40 ? 40 : nb), b);
		if (tok_pairmap_put(&t->merges, ia, ib, rank++, ic) != WK_OK)
			return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	}
	return WK_OK;
}

static int cmp_added_len(const void *a, const void *b, void *ctx)
{
	const struct tok *t = ctx;
	const struct tok_added *x = &t->added[*(const int *)a], *y = &t->added[*(const int *)b];
	unsigned char bx = (unsigned char)x->pattern[0], by = (unsigned char)y->pattern[0];
	if (bx != by)
		return bx < by ? -1 : 1;
	if (x->plen != y->plen)
		return x->plen > y->plen ? -1 : 1;
	return *(const int *)a - *(const int *)b;
}

int tok_build_matcher(struct tok *t, struct tok_matcher *m, bool normalized)
{
	int cnt = 0;
	for (int i = 0; i < t->n_added; i++)
		cnt += t->added[i].normalized == normalized && t->added[i].plen > 0;
	m->order = malloc(((size_t)cnt + 1) * sizeof *m->order);
	if (!m->order)
		return WK_ENOMEM;
	int k = 0;
	for (int i = 0; i < t->n_added; i++)
		if (t->added[i].normalized == normalized && t->added[i].plen > 0)
			m->order[k++] = i;
	qsort_r(m->order, (size_t)cnt, sizeof *m->order, cmp_added_len, t);
	k = 0;
	for (int b = 0; b < 256; b++) {
		m->first[b] = k;
		while (k < cnt && (unsigned char)t->added[m->order[k]].pattern[0] == b)
			k++;
	}
	m->first[256] = cnt;
	return cnt;
}

static int parse_added(struct ld *l, struct tok *t, json_t *list)
{
	if (!list || json_is_null(list))
		return WK_OK;
	if (!json_is_array(list))
		return LD_ERR(l, WK_EFORMAT, "%s: added_tokens: expected a list", l->path);
	size_t n = json_array_size(list);
	if (n > TOK_MAX_ADDED)
		return LD_ERR(l, WK_ELIMIT, "%s: added_tokens: %zu entries, more than %d", l->path,
			      n, TOK_MAX_ADDED);
	t->added = calloc(n ? n : 1, sizeof *t->added);
	if (!t->added)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	/* HF ignores the listed ids: a token takes its model vocab id, else the next id from
	 * the model's vocab size. wick refuses a file where the two disagree. */
	int next_id = (int)t->vocab.count;
	struct tok_buf nb = {0}, tmp = {0};
	int rc = WK_OK;
	for (size_t i = 0; i < n && rc == WK_OK; i++) {
		json_t *o = json_array_get(list, i), *jid = json_object_get(o, "id");
		struct tok_added *a = &t->added[t->n_added];
		if (!json_is_integer(jid)) {
			rc = LD_ERR(l, WK_EFORMAT, "%s: added_tokens[%zu]: no id", l->path, i);
			break;
		}
		rc = dup_str(l, json_object_get(o, "content"), "added_tokens.content", &a->content,
			     &a->len);
		if (rc != WK_OK)
			break;
		t->n_added++;
		if (a->len == 0)
			continue; /* HF ignores an empty added token */
		a->special = opt_bool(o, "special", false);
		a->normalized = opt_bool(o, "normalized", !a->special);
		a->lstrip = opt_bool(o, "lstrip", false);
		a->rstrip = opt_bool(o, "rstrip", false);
		a->single_word = opt_bool(o, "single_word", false);
		int id = tok_strmap_get(&t->added_map, a->content, a->len);
		if (id < 0)
			id = tok_strmap_get(&t->vocab, a->content, a->len);
		if (id < 0)
			id = next_id++;
		if (json_integer_value(jid) != id) {
			rc = LD_ERR(l, WK_EFORMAT, "%s: added_tokens[%zu] '%.40s' has id %lld, but "
				    "the vocabulary gives it %d", l->path, i, a->content,
				    (long long)json_integer_value(jid), id);
			break;
		}
		if (id >= TOK_MAX_VOCAB) {
			rc = LD_ERR(l, WK_ELIMIT, "%s: added_tokens: id %d past the limit %d", l->path,
				    id, TOK_MAX_VOCAB);
			break;
		}
		a->id = id;
		if (id >= t->n_ids)
			t->n_ids = id + 1;
		if (tok_strmap_put(&t->added_map, a->content, a->len, id) != WK_OK) {
			rc = LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
			break;
		}
		if (a->normalized) {
			int nrc = tok_normalize(t, a->content, a->len, &nb, &tmp);
			if (nrc != WK_OK) {
				rc = nrc == WK_ELIMIT
					     ? LD_ERR(l, nrc, "%s: added_tokens[%zu]: the normalizer "
						      "grows it past %d times its size", l->path, i,
						      TOK_NORM_GROWTH)
					     : LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
				break;
			}
			a->pattern = malloc(nb.n + 1);
			if (!a->pattern) {
				rc = LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
				break;
			}
			memcpy(a->pattern, nb.p, nb.n);
			a->pattern[nb.n] = 0;
			a->plen = nb.n;
		}
	}
	free(nb.p);
	free(tmp.p);
	if (rc != WK_OK)
		return rc;
	/* A later duplicate of the same content replaces the earlier one (as in HF). */
	struct tok_strmap seen = {0};
	for (int i = t->n_added - 1; i >= 0 && rc == WK_OK; i--) {
		struct tok_added *a = &t->added[i];
		if (a->len == 0)
			continue;
		if (tok_strmap_get(&seen, a->content, a->len) >= 0) {
			a->len = a->plen = 0;
			continue;
		}
		rc = tok_strmap_put(&seen, a->content, a->len, i);
		if (!a->normalized) {
			a->pattern = a->content;
			a->plen = a->len;
		}
	}
	tok_strmap_free(&seen);
	if (rc != WK_OK)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	int nr = tok_build_matcher(t, &t->raw_match, false);
	int nn = nr < 0 ? nr : tok_build_matcher(t, &t->norm_match, true);
	if (nr < 0 || nn < 0)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	t->has_raw = nr > 0;
	t->has_norm = nn > 0;
	return WK_OK;
}

/* The "ids" list of a template item {"SpecialToken": {"id": NAME}}, or NULL. */
static json_t *special_ids(json_t *specials, json_t *item, const char **name)
{
	const char *n = json_string_value(json_object_get(json_object_get(item, "SpecialToken"),
							  "id"));
	if (name)
		*name = n;
	return n ? json_object_get(json_object_get(specials, n), "ids") : NULL;
}

static int parse_template(struct ld *l, struct tok *t, json_t *o);

/* TemplateProcessing; ByteLevel, which changes only offsets; a Sequence of those. */
static int parse_post(struct ld *l, struct tok *t, json_t *o)
{
	if (!o || json_is_null(o))
		return WK_OK;
	const char *ty = type_of(o);
	if (ty && !strcmp(ty, "ByteLevel"))
		return WK_OK;
	if (ty && !strcmp(ty, "Sequence")) {
		json_t *list = json_object_get(o, "processors");
		if (!json_is_array(list))
			return LD_ERR(l, WK_EFORMAT, "%s: post_processor Sequence: no processors list",
				      l->path);
		size_t i;
		json_t *v;
		json_array_foreach(list, i, v) {
			const char *vt = type_of(v);
			if (vt && !strcmp(vt, "Sequence"))
				return LD_ERR(l, WK_EUNSUPPORTED, "%s: post_processor: nested Sequence "
					      "is not supported", l->path);
			if (vt && !strcmp(vt, "TemplateProcessing") && t->prefix)
				return LD_ERR(l, WK_EUNSUPPORTED, "%s: post_processor: two "
					      "TemplateProcessing steps are not supported", l->path);
			int rc = parse_post(l, t, v);
			if (rc != WK_OK)
				return rc;
		}
		return WK_OK;
	}
	if (!ty || strcmp(ty, "TemplateProcessing"))
		return LD_ERR(l, WK_EUNSUPPORTED, "%s: post_processor %s is not supported", l->path,
			      ty ? ty : "(no type)");
	return parse_template(l, t, o);
}

static int parse_template(struct ld *l, struct tok *t, json_t *o)
{
	json_t *single = json_object_get(o, "single"), *specials = json_object_get(o,
										  "special_tokens");
	if (!json_is_array(single))
		return LD_ERR(l, WK_EFORMAT, "%s: post_processor: no single template", l->path);
	size_t cap = 0, i;
	json_t *item;
	json_array_foreach(single, i, item)
		cap += json_array_size(special_ids(specials, item, NULL));
	if (cap > TOK_MAX_TEMPLATE)
		return LD_ERR(l, WK_ELIMIT, "%s: post_processor: the single template adds %zu "
			      "special ids, more than %d", l->path, cap, TOK_MAX_TEMPLATE);
	t->prefix = malloc((cap + 1) * sizeof *t->prefix);
	t->suffix = malloc((cap + 1) * sizeof *t->suffix);
	if (!t->prefix || !t->suffix)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	int seen_a = 0;
	json_array_foreach(single, i, item) {
		json_t *seq = json_object_get(item, "Sequence");
		json_t *sp = json_object_get(item, "SpecialToken");
		if (seq) {
			const char *sid = json_string_value(json_object_get(seq, "id"));
			if (!sid || strcmp(sid, "A") || seen_a++)
				return LD_ERR(l, WK_EFORMAT, "%s: post_processor: the single template "
					      "must hold sequence A once", l->path);
			continue;
		}
		const char *name;
		json_t *ids = special_ids(specials, item, &name);
		if (!sp || !name || !json_is_array(ids))
			return LD_ERR(l, WK_EFORMAT, "%s: post_processor: special token '%.40s' is "
				      "not defined", l->path, name ? name : "?");
		size_t k;
		json_t *jid;
		json_array_foreach(ids, k, jid) {
			if (!json_is_integer(jid) || json_integer_value(jid) < 0 ||
			    json_integer_value(jid) >= t->n_ids)
				return LD_ERR(l, WK_EFORMAT, "%s: post_processor: special token "
					      "'%.40s' has an id outside the vocabulary", l->path, name);
			int id = (int)json_integer_value(jid);
			if (seen_a)
				t->suffix[t->n_suffix++] = id;
			else
				t->prefix[t->n_prefix++] = id;
		}
	}
	if (!seen_a)
		return LD_ERR(l, WK_EFORMAT, "%s: post_processor: the single template has no "
			      "sequence A", l->path);
	return WK_OK;
}

/* Fills the per-id tables once the vocabulary and added tokens are known. */
static int build_ids(struct ld *l, struct tok *t)
{
	size_t n = (size_t)t->n_ids ? (size_t)t->n_ids : 1;
	t->piece_off = malloc(n * sizeof *t->piece_off);
	t->piece_len = calloc(n, sizeof *t->piece_len);
	t->dec_off = malloc(n * sizeof *t->dec_off);
	t->dec_len = calloc(n, sizeof *t->dec_len);
	t->flags = calloc(n, 1);
	if (!t->piece_off || !t->piece_len || !t->dec_off || !t->dec_len || !t->flags)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	for (size_t i = 0; i < n; i++)
		t->piece_off[i] = t->dec_off[i] = TOK_NO_PIECE;
	/* Model vocabulary; the first piece seen for an id wins. */
	for (size_t s = 0; s < t->vocab.cap; s++) {
		const struct tok_strslot *sl = &t->vocab.slots[s];
		if (sl->val < 0 || t->piece_off[sl->val] != TOK_NO_PIECE)
			continue;
		uint32_t off = (uint32_t)t->strs.n;
		if (tok_buf_add(&t->strs, t->vocab.keys + sl->off, sl->len) != WK_OK ||
		    tok_buf_add(&t->strs, "", 1) != WK_OK)
			return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
		t->piece_off[sl->val] = t->dec_off[sl->val] = off;
		t->piece_len[sl->val] = t->dec_len[sl->val] = sl->len;
	}
	struct tok_strmap special = {0};
	int rc = WK_OK;
	for (int i = 0; i < t->n_added && rc == WK_OK; i++) {
		const struct tok_added *a = &t->added[i];
		if (a->len == 0)
			continue;
		uint32_t off = (uint32_t)t->strs.n;
		if (tok_buf_add(&t->strs, a->content, a->len) != WK_OK ||
		    tok_buf_add(&t->strs, "", 1) != WK_OK) {
			rc = WK_ENOMEM;
			break;
		}
		t->piece_off[a->id] = t->dec_off[a->id] = off;
		t->piece_len[a->id] = t->dec_len[a->id] = (uint32_t)a->len;
		if (a->normalized) {
			off = (uint32_t)t->strs.n;
			if (tok_buf_add(&t->strs, a->pattern, a->plen) != WK_OK ||
			    tok_buf_add(&t->strs, "", 1) != WK_OK) {
				rc = WK_ENOMEM;
				break;
			}
			t->dec_off[a->id] = off;
			t->dec_len[a->id] = (uint32_t)a->plen;
		}
		t->flags[a->id] = TOK_F_ADDED | (a->special ? TOK_F_SPECIAL : 0);
		if (a->special)
			rc = tok_strmap_put(&special, a->content, a->len, a->id);
	}
	/* HF skips a token on decode when its string is a special token's content. */
	for (int id = 0; id < t->n_ids && rc == WK_OK; id++)
		if (t->dec_off[id] != TOK_NO_PIECE &&
		    tok_strmap_get(&special, t->strs.p + t->dec_off[id], t->dec_len[id]) >= 0)
			t->flags[id] |= TOK_F_SKIP;
	tok_strmap_free(&special);
	if (rc != WK_OK)
		return LD_ERR(l, WK_ENOMEM, "%s: out of memory", l->path);
	return WK_OK;
}

static void find_eos(struct tok *t)
{
	static const char *const names[] = {"</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>"};
	t->bos = t->n_prefix ? t->prefix[0] : -1;
	t->eos = -1;
	for (size_t i = 0; i < sizeof names / sizeof names[0] && t->eos < 0; i++)
		t->eos = tok_id(t, names[i]);
}

int tok_load(const char *path, struct tok **out, char *err, size_t errsz)
{
	*out = NULL;
	char *buf;
	size_t len;
	int rc = wk_read_file(path, TOK_MAX_FILE, &buf, &len, err, errsz);
	if (rc != WK_OK)
		return rc;
	rc = tok_load_buf(path, buf, len, out, err, errsz);
	free(buf);
	return rc;
}

int tok_load_buf(const char *path, const char *buf, size_t len, struct tok **out, char *err,
		 size_t errsz)
{
	*out = NULL;
	int rc = WK_OK;
	if (len > TOK_MAX_FILE)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: %zu bytes, more than %u", path, len,
			       TOK_MAX_FILE);
	json_error_t jerr;
	json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);
	if (!root)
		return wk_errf(err, errsz, WK_EFORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column,
			       jerr.text);
	struct ld l = {.path = path, .err = err, .errsz = errsz};
	struct tok *t = calloc(1, sizeof *t);
	if (!t) {
		json_decref(root);
		return wk_errf(err, errsz, WK_ENOMEM, "%s: out of memory", path);
	}
	t->kind = TOK_KIND_SPM_BPE;
	t->unk_id = t->bos = t->eos = -1;
	for (int i = 0; i < 256; i++)
		t->byte_id[i] = -1;
	if (!json_is_object(root))
		rc = LD_ERR(&l, WK_EFORMAT, "%s: not a JSON object", path);
	/* The pre-tokenizer first: it decides the kind (byte-level or not). */
	if (rc == WK_OK)
		rc = parse_pre_tokenizer(&l, t, json_object_get(root, "pre_tokenizer"));
	if (rc == WK_OK)
		rc = parse_model(&l, t, json_object_get(root, "model"));
	if (rc == WK_OK)
		rc = parse_normalizer(&l, t, json_object_get(root, "normalizer"));
	if (rc == WK_OK)
		rc = parse_added(&l, t, json_object_get(root, "added_tokens"));
	if (rc == WK_OK)
		rc = parse_decoder(&l, t, json_object_get(root, "decoder"), 0);
	if (rc == WK_OK)
		rc = parse_post(&l, t, json_object_get(root, "post_processor"));
	if (rc == WK_OK)
		rc = build_ids(&l, t);
	json_decref(root);
	if (rc != WK_OK) {
		tok_free(t);
		return rc;
	}
	find_eos(t);
	*out = t;
	return WK_OK;
}

void tok_free(struct tok *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->n_added; i++) {
		if (t->added[i].pattern != t->added[i].content)
			free(t->added[i].pattern);
		free(t->added[i].content);
	}
	free(t->added);
	free(t->raw_match.order);
	free(t->norm_match.order);
	for (int i = 0; i < t->n_norm; i++) {
		free(t->norm[i].s1);
		free(t->norm[i].s2);
	}
	for (int i = 0; i < t->n_dec; i++) {
		free(t->dec[i].s1);
		free(t->dec[i].s2);
	}
	tok_strmap_free(&t->vocab);
	tok_strmap_free(&t->added_map);
	tok_pairmap_free(&t->merges);
	free(t->strs.p);
	free(t->piece_off);
	free(t->piece_len);
	free(t->dec_off);
	free(t->dec_len);
	free(t->flags);
	free(t->prefix);
	free(t->suffix);
	tok_memo_set(t, 0);
	free(t);
}

/* ---- lookups ----------------------------------------------------------------------------- */

int tok_vocab_size(const struct tok *t)
{
	return t->n_ids;
}

const char *tok_piece(const struct tok *t, int id)
{
	if (id < 0 || id >= t->n_ids || t->piece_off[id] == TOK_NO_PIECE)
		return NULL;
	return t->strs.p + t->piece_off[id];
}

int tok_id(const struct tok *t, const char *piece)
{
	size_t n = strlen(piece);
	int id = tok_strmap_get(&t->added_map, piece, n);
	return id >= 0 ? id : tok_strmap_get(&t->vocab, piece, n);
}

bool tok_is_special(const struct tok *t, int id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_F_SPECIAL);
}

int tok_bos(const struct tok *t)
{
	return t->bos;
}

int tok_eos(const struct tok *t)
{
	return t->eos;
}
