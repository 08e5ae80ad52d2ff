/*
 * tokenizer_prepared.c - a loaded tokenizer written out in wick's own binary form, and read
 * back without JSON: `wick snapshot` stores one beside tokenizer.json, so that a cold start
 * does not parse a 150k-token tokenizer.json again (most of a second on a small host, the
 * larger part of a small model's start-up; see engine_open.c's tok_loader).
 *
 * ---- Format, version 1 (all integers little-endian) ---------------------------------------
 *
 *   header, 48 bytes: "WICKTOKN" magic, u32 version, u32 zero, u64 the size and u64 the
 *                     XXH3_64bits of the tokenizer.json it was made from, u64 the payload's
 *                     size and u64 its XXH3_64bits
 *   payload:          struct tok's tables, field by field in the order tok_prepare writes
 *                     them: scalars, byte_id[256], the id tables (strings, offsets, flags),
 *                     the vocabulary map, the merges map, the added tokens and their map,
 *                     the normalizer,
 *                     pre-tokenizer and decoder steps, the post-processor's ids.
 *   A string is a u32 length and its bytes. A map is its capacity, count and keys, then each
 *   occupied slot's index and contents, so loading places the entries without hashing or
 *   probing: the file depends on tokenizer_bpe.c's hash functions and probing, and a change
 *   to them needs a new version. The added-token matchers are rebuilt; everything else is
 *   taken as written. A different version is WK_EUNSUPPORTED: the caller reads
 *   tokenizer.json instead.
 *
 * Every count is held to tokenizer.json's limits and every offset, id and enum is checked
 * before use, so a damaged or hostile file is refused (WK_EFORMAT), never followed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_int.h"

#define HDR 48
#define VERSION 1
#define MAX_STR (64u << 10) /* bytes of an added token's text or normalized pattern */
static const char magic[8] = "WICKTOKN";

/* ---- writing ------------------------------------------------------------------------------ */

struct wr {
	struct tok_buf b;
	bool oom;
};

static void put(struct wr *w, const void *p, size_t n)
{
	if (!w->oom && tok_buf_add(&w->b, p, n) != WK_OK)
		w->oom = true;
}

static void put_u64(struct wr *w, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	put(w, b, 8);
}

static void put_u32(struct wr *w, uint32_t v)
{
	unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
			      (unsigned char)(v >> 24)};
	put(w, b, 4);
}

static void put_i32(struct wr *w, int v)
{
	put_u32(w, (uint32_t)v);
}

static void put_u8(struct wr *w, unsigned v)
{
	unsigned char c = (unsigned char)v;
	put(w, &c, 1);
}

static void put_str(struct wr *w, const char *p, size_t n)
{
	put_u32(w, (uint32_t)n);
	put(w, p, n);
}

/* A map as its slot array: capacity, keys, then each occupied slot with its index, so that
 * loading places the entries where they were, without hashing or probing. */
static void put_map(struct wr *w, const struct tok_strmap *m)
{
	put_u64(w, m->cap);
	put_u64(w, m->count);
	put_u64(w, m->keys_len);
	put(w, m->keys, m->keys_len);
	for (size_t s = 0; s < m->cap; s++)
		if (m->slots[s].val >= 0) {
			put_u32(w, (uint32_t)s);
			put_u64(w, m->slots[s].hash);
			put_u32(w, m->slots[s].off);
			put_u32(w, m->slots[s].len);
			put_i32(w, m->slots[s].val);
		}
}

static void put_merges(struct wr *w, const struct tok_pairmap *m)
{
	put_u64(w, m->cap);
	put_u64(w, m->count);
	for (size_t s = 0; s < m->cap; s++)
		if (m->slots[s].key != UINT64_MAX) {
			put_u32(w, (uint32_t)s);
			put_u64(w, m->slots[s].key);
			put_u32(w, m->slots[s].rank);
			put_i32(w, m->slots[s].id);
		}
}

static void put_steps(struct wr *w, const struct tok_step *st, int n)
{
	put_i32(w, n);
	for (int i = 0; i < n; i++) {
		put_u8(w, st[i].type);
		put_str(w, st[i].s1 ? st[i].s1 : "", st[i].s1 ? st[i].n1 : 0);
		put_u8(w, st[i].s2 != NULL);
		put_str(w, st[i].s2 ? st[i].s2 : "", st[i].s2 ? st[i].n2 : 0);
		put_i32(w, st[i].start);
		put_i32(w, st[i].stop);
		put_u8(w, st[i].prepend_never);
	}
}

int tok_prepare(const struct tok *t, const void *json, size_t json_len, char **buf,
		size_t *len, char *err, size_t errsz)
{
	struct wr w = {0};
	*buf = NULL;
	*len = 0;
	put(&w, magic, 8);
	put_u32(&w, VERSION);
	put_u32(&w, 0);
	put_u64(&w, json_len);
	put_u64(&w, XXH3_64bits(json, json_len));
	put_u64(&w, 0); /* payload size and hash, filled in below */
	put_u64(&w, 0);

	put_u8(&w, t->kind);
	put_i32(&w, t->n_ids);
	put_i32(&w, t->unk_id);
	put_u8(&w, t->byte_fallback);
	put_u8(&w, t->fuse_unk);
	put_u8(&w, t->ignore_merges);
	for (int i = 0; i < 256; i++)
		put_i32(&w, t->byte_id[i]);

	put_str(&w, t->strs.p ? t->strs.p : "", t->strs.n);
	for (int i = 0; i < t->n_ids; i++) {
		put_u32(&w, t->piece_off[i]);
		put_u32(&w, t->piece_len[i]);
		put_u32(&w, t->dec_off[i]);
		put_u32(&w, t->dec_len[i]);
		put_u8(&w, t->flags[i]);
	}
	put_map(&w, &t->vocab);
	put_merges(&w, &t->merges);

	put_i32(&w, t->n_added);
	for (int i = 0; i < t->n_added; i++) {
		const struct tok_added *a = &t->added[i];
		put_str(&w, a->content, a->len);
		/* pattern: 0 none, 1 the content itself, 2 a string of its own */
		unsigned mode = !a->pattern ? 0 : a->pattern == a->content ? 1 : 2;
		put_u8(&w, mode);
		if (mode == 2)
			put_str(&w, a->pattern, a->plen);
		put_i32(&w, a->id);
		put_u8(&w, a->special | a->normalized << 1 | a->lstrip << 2 | a->rstrip << 3 |
			       a->single_word << 4);
	}
	put_map(&w, &t->added_map);

	put_steps(&w, t->norm, t->n_norm);
	put_u8(&w, t->metaspace);
	put_str(&w, t->meta_repl, t->meta_repl_len);
	put_u8(&w, t->meta_scheme);
	put_u8(&w, t->meta_split);
	put_i32(&w, t->n_pre);
	for (int i = 0; i < t->n_pre; i++) {
		const struct tok_pre *p = &t->pre[i];
		put_u8(&w, p->type);
		put_u8(&w, p->re.family);
		put_u8(&w, p->re.contractions);
		put_i32(&w, p->re.max_digits);
		put_u8(&w, p->use_regex);
		put_u8(&w, p->prefix_space);
	}
	put_u8(&w, t->bl_len['!'] != 0); /* the byte alphabet was made (tok_bl_alphabet) */
	put_steps(&w, t->dec, t->n_dec);
	put_u8(&w, t->has_decoder);
	put_i32(&w, t->n_prefix);
	for (int i = 0; i < t->n_prefix; i++)
		put_i32(&w, t->prefix[i]);
	put_i32(&w, t->n_suffix);
	for (int i = 0; i < t->n_suffix; i++)
		put_i32(&w, t->suffix[i]);
	put_i32(&w, t->bos);
	put_i32(&w, t->eos);
	if (w.oom) {
		free(w.b.p);
		return wk_errf(err, errsz, WK_ENOMEM, "tokenizer: out of memory");
	}
	size_t body = w.b.n - HDR;
	uint64_t h = XXH3_64bits(w.b.p + HDR, body);
	for (int i = 0; i < 8; i++) {
		w.b.p[32 + i] = (char)(unsigned char)((uint64_t)body >> (8 * i));
		w.b.p[40 + i] = (char)(unsigned char)(h >> (8 * i));
	}
	*buf = w.b.p;
	*len = w.b.n;
	return WK_OK;
}

int tok_prepare_json(const char *path, const char *json, size_t json_len, char **buf,
		     size_t *len, char *err, size_t errsz)
{
	struct tok *t;
	*buf = NULL;
	int rc = tok_load_buf(path, json, json_len, &t, err, errsz);
	if (rc == WK_OK)
		rc = tok_prepare(t, json, json_len, buf, len, err, errsz);
	tok_free(t);
	if (rc != WK_OK)
		return rc;
	/* read back as a start will read it: a table the loader refuses must not be written
	 * (a snapshot with it could not start) */
	char why[WK_ERRSZ];
	if ((rc = tok_load_prepared_mem(*buf, *len, json, json_len, &t, why, sizeof why))) {
		free(*buf);
		*buf = NULL;
		return wk_errf(err, errsz, rc, "%s: its prepared form does not read back: %s", path,
			       why);
	}
	tok_free(t);
	return WK_OK;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* A cursor over the payload; any read past its end sets bad and returns zeros. */
struct rd {
	const unsigned char *p;
	size_t n, at;
	bool bad;
};

static const unsigned char *take(struct rd *r, size_t n)
{
	if (r->bad || r->n - r->at < n) {
		r->bad = true;
		return NULL;
	}
	const unsigned char *q = r->p + r->at;
	r->at += n;
	return q;
}

static uint64_t get_u64(struct rd *r)
{
	const unsigned char *q = take(r, 8);
	uint64_t v = 0;
	for (int i = 0; q && i < 8; i++)
		v |= (uint64_t)q[i] << (8 * i);
	return v;
}

static uint32_t get_u32(struct rd *r)
{
	const unsigned char *q = take(r, 4);
	return q ? (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
			   (uint32_t)q[3] << 24
		 : 0;
}

static int get_i32(struct rd *r)
{
	return (int)get_u32(r);
}

static unsigned get_u8(struct rd *r)
{
	const unsigned char *q = take(r, 1);
	return q ? q[0] : 0;
}

/* A string of at most max bytes; NULL (and r->bad) past the end or the limit. */
static const char *get_str(struct rd *r, size_t max, size_t *n)
{
	uint32_t len = get_u32(r);
	if (len > max)
		r->bad = true;
	*n = r->bad ? 0 : len;
	return r->bad ? NULL : (const char *)take(r, len);
}

/* A malloc'd NUL-terminated copy of a string of at most max bytes (never NULL on success). */
static char *get_dup(struct rd *r, size_t max, size_t *n)
{
	const char *s = get_str(r, max, n);
	if (!s)
		return NULL;
	char *d = malloc(*n + 1);
	if (d) {
		memcpy(d, s, *n);
		d[*n] = 0;
	}
	return d;
}

/* Whether p[0..n) is valid UTF-8 (NULs included): what jansson guarantees of every string
 * from tokenizer.json, and tok_decode_utf8's promise rests on. */
static bool utf8_ok(const char *p, size_t n)
{
	for (size_t i = 0, l; i < n; i += l)
		if (!(l = tok_utf8_len((const unsigned char *)p + i, n - i)))
			return false;
	return true;
}

/* One UTF-8 character, as the JSON loader's one_char takes. */
static bool one_char(const char *p, size_t n)
{
	return n > 0 && n <= 4 && tok_utf8_len((const unsigned char *)p, n) == n;
}

static bool id_ok(const struct tok *t, int id)
{
	return id >= 0 && id < t->n_ids;
}

/* A capacity and count as tok_*map_put leave them: a power of two from 64, at most half
 * full (so every probe meets an empty slot), count at most max. A map doubles only when
 * 2 * (count + 1) > cap (before it knows whether the key is new), so past 64 its capacity is
 * under 4 * (count + 1): a file cannot have slots allocated that its entries do not need. */
static bool map_shape_ok(uint64_t cap, uint64_t count, uint32_t max)
{
	return cap == 0 ? count == 0
			: cap >= 64 && cap <= 4 * (uint64_t)max && !(cap & (cap - 1)) &&
				  2 * count <= cap && count <= max &&
				  (cap == 64 || cap < 4 * (count + 1));
}

/* Whether the rest of the payload can hold n entries of size bytes: checked before the
 * entries' tables are allocated, so that a short file cannot make the loader allocate much. */
static bool room_for(const struct rd *r, uint64_t n, size_t size)
{
	return !r->bad && n <= (r->n - r->at) / size;
}

/* WK_OK, WK_EFORMAT (bad set) or WK_ENOMEM. */
static int get_map(struct rd *r, const struct tok *t, struct tok_strmap *m, uint32_t max)
{
	uint64_t cap = get_u64(r), count = get_u64(r), klen = get_u64(r);
	if (r->bad || !map_shape_ok(cap, count, max) || klen > (uint64_t)max * (TOK_MAX_PIECE + 1))
		return r->bad = true, WK_EFORMAT;
	const unsigned char *keys = take(r, klen);
	if (!keys || !room_for(r, count, 24)) /* a slot: u32 index, u64 hash, u32 off, len, val */
		return r->bad = true, WK_EFORMAT;
	if (!cap)
		return WK_OK;
	m->slots = malloc(cap * sizeof *m->slots);
	m->keys = malloc(klen ? klen : 1);
	if (!m->slots || !m->keys)
		return WK_ENOMEM;
	memcpy(m->keys, keys, klen);
	m->cap = cap;
	m->keys_len = m->keys_cap = klen;
	for (size_t i = 0; i < cap; i++)
		m->slots[i].val = -1;
	for (uint64_t i = 0; i < count; i++) {
		uint32_t at = get_u32(r);
		uint64_t h = get_u64(r);
		uint32_t off = get_u32(r), len = get_u32(r);
		int val = get_i32(r);
		/* a key lies in the keys, NUL after it; a hash that is not its key's only makes
		 * lookups miss */
		if (r->bad || at >= cap || m->slots[at].val >= 0 || !id_ok(t, val) || off > klen ||
		    len >= klen - off || keys[off + len])
			return r->bad = true, WK_EFORMAT;
		m->slots[at] = (struct tok_strslot){.hash = h, .off = off, .len = len, .val = val};
	}
	m->count = count;
	return WK_OK;
}

static int get_merges(struct rd *r, const struct tok *t, struct tok_pairmap *m)
{
	uint64_t cap = get_u64(r), count = get_u64(r);
	if (r->bad || !map_shape_ok(cap, count, TOK_MAX_MERGES) ||
	    !room_for(r, count, 20)) /* a slot: u32 index, u64 key, u32 rank, i32 id */
		return r->bad = true, WK_EFORMAT;
	if (!cap)
		return WK_OK;
	if (!(m->slots = malloc(cap * sizeof *m->slots)))
		return WK_ENOMEM;
	m->cap = cap;
	for (size_t i = 0; i < cap; i++)
		m->slots[i].key = UINT64_MAX;
	for (uint64_t i = 0; i < count; i++) {
		uint32_t at = get_u32(r);
		uint64_t key = get_u64(r);
		uint32_t rank = get_u32(r);
		int id = get_i32(r);
		if (r->bad || at >= cap || m->slots[at].key != UINT64_MAX ||
		    !id_ok(t, (int)(key >> 32)) || !id_ok(t, (int)(uint32_t)key) || !id_ok(t, id))
			return r->bad = true, WK_EFORMAT;
		m->slots[at] = (struct tok_pairslot){.key = key, .rank = rank, .id = id};
	}
	m->count = count;
	return WK_OK;
}

static int get_steps(struct rd *r, struct tok_step *st, int *n, bool decoder)
{
	int cnt = get_i32(r);
	if (cnt < 0 || cnt > TOK_MAX_STEPS)
		return r->bad = true, WK_EFORMAT;
	for (int i = 0; i < cnt && !r->bad; i++) {
		struct tok_step *s = &st[(*n)++]; /* counted first, so tok_free frees it */
		unsigned ty = get_u8(r);
		s->s1 = get_dup(r, TOK_MAX_PIECE, &s->n1);
		if (!s->s1 && !r->bad)
			return WK_ENOMEM;
		bool has2 = get_u8(r);
		size_t n2;
		char *s2 = get_dup(r, TOK_MAX_PIECE, &n2);
		if (!s2 && !r->bad)
			return WK_ENOMEM;
		if (has2) {
			s->s2 = s2;
			s->n2 = n2;
		} else {
			free(s2);
		}
		s->start = get_i32(r);
		s->stop = get_i32(r);
		s->prepend_never = get_u8(r);
		/* what parsing guarantees: the step types of its place, and a non-empty pattern
		 * where encode or decode walk one */
		bool norm_ty = ty == TOK_STEP_PREPEND || ty == TOK_STEP_REPLACE || ty == TOK_STEP_NFC;
		bool dec_ty = ty == TOK_STEP_REPLACE || ty == TOK_STEP_BYTE_FALLBACK ||
			      ty == TOK_STEP_FUSE || ty == TOK_STEP_STRIP ||
			      ty == TOK_STEP_METASPACE || ty == TOK_STEP_BYTE_LEVEL;
		bool one = ty == TOK_STEP_STRIP || ty == TOK_STEP_METASPACE;
		if (r->bad || !(decoder ? dec_ty : norm_ty) || (one && !one_char(s->s1, s->n1)) ||
		    (ty == TOK_STEP_REPLACE && (s->n1 == 0 || !s->s2)) || !utf8_ok(s->s1, s->n1) ||
		    (s->s2 && !utf8_ok(s->s2, s->n2)) || s->start < 0 || s->stop < 0 ||
		    s->start > 1 << 20 || s->stop > 1 << 20)
			return r->bad = true, WK_EFORMAT;
		s->type = (enum tok_step_type)ty;
	}
	return r->bad ? WK_EFORMAT : WK_OK;
}

static int get_ids(struct rd *r, const struct tok *t, int **v, int *n)
{
	int cnt = get_i32(r);
	if (cnt < 0 || cnt > TOK_MAX_TEMPLATE)
		return r->bad = true, WK_EFORMAT;
	*v = malloc(((size_t)cnt + 1) * sizeof **v);
	if (!*v)
		return WK_ENOMEM;
	for (int i = 0; i < cnt; i++)
		if (!id_ok(t, (*v)[i] = get_i32(r)))
			r->bad = true;
	*n = cnt;
	return r->bad ? WK_EFORMAT : WK_OK;
}

/* The body: fills t, or returns WK_EFORMAT (r->bad) or WK_ENOMEM. */
static int read_body(struct rd *r, struct tok *t)
{
	int rc;
	unsigned kind = get_u8(r);
	t->n_ids = get_i32(r);
	t->unk_id = get_i32(r);
	t->byte_fallback = get_u8(r);
	t->fuse_unk = get_u8(r);
	t->ignore_merges = get_u8(r);
	if (r->bad || kind > TOK_KIND_BYTE_LEVEL_BPE || t->n_ids < 0 || t->n_ids > TOK_MAX_VOCAB ||
	    (t->unk_id != -1 && !id_ok(t, t->unk_id)))
		return r->bad = true, WK_EFORMAT;
	t->kind = (enum tok_kind)kind;
	for (int i = 0; i < 256; i++)
		if ((t->byte_id[i] = get_i32(r)) != -1 && !id_ok(t, t->byte_id[i]))
			return r->bad = true, WK_EFORMAT;

	size_t sn;
	const char *s = get_str(r, (size_t)TOK_MAX_FILE * 2, &sn);
	if (!s || (sn && s[sn - 1]) || !utf8_ok(s, sn))
		return r->bad = true, WK_EFORMAT;
	if (!room_for(r, (uint64_t)t->n_ids, 17)) /* an id: u32 offsets and lengths, u8 flags */
		return r->bad = true, WK_EFORMAT;
	if (tok_buf_add(&t->strs, s, sn) != WK_OK)
		return WK_ENOMEM;
	size_t n = t->n_ids ? (size_t)t->n_ids : 1;
	t->piece_off = malloc(n * sizeof *t->piece_off);
	t->piece_len = malloc(n * sizeof *t->piece_len);
	t->dec_off = malloc(n * sizeof *t->dec_off);
	t->dec_len = malloc(n * sizeof *t->dec_len);
	t->flags = malloc(n);
	if (!t->piece_off || !t->piece_len || !t->dec_off || !t->dec_len || !t->flags)
		return WK_ENOMEM;
	/* an offset is a hole (TOK_NO_PIECE, length 0) or a NUL-terminated string in strs that
	 * starts on a character (strs being valid UTF-8, so is the string) */
#define PIECE_OK(off, len)                                                                  \
	((off) == TOK_NO_PIECE ? (len) == 0                                                 \
			       : (off) < sn && (len) < sn - (off) && !s[(off) + (len)] &&   \
					 ((unsigned char)s[off] & 0xC0) != 0x80)
	for (int i = 0; i < t->n_ids; i++) {
		uint32_t po = t->piece_off[i] = get_u32(r), pl = t->piece_len[i] = get_u32(r);
		uint32_t dof = t->dec_off[i] = get_u32(r), dl = t->dec_len[i] = get_u32(r);
		t->flags[i] = (uint8_t)get_u8(r);
		if (r->bad || !PIECE_OK(po, pl) || !PIECE_OK(dof, dl) ||
		    (t->flags[i] & ~(TOK_F_ADDED | TOK_F_SPECIAL | TOK_F_SKIP)))
			return r->bad = true, WK_EFORMAT;
	}
#undef PIECE_OK
	if ((rc = get_map(r, t, &t->vocab, TOK_MAX_VOCAB)))
		return rc;
	if ((rc = get_merges(r, t, &t->merges)))
		return rc;

	int na = get_i32(r);
	if (r->bad || na < 0 || na > TOK_MAX_ADDED)
		return r->bad = true, WK_EFORMAT;
	t->added = calloc(na ? (size_t)na : 1, sizeof *t->added);
	if (!t->added)
		return WK_ENOMEM;
	for (int i = 0; i < na; i++) {
		struct tok_added *a = &t->added[t->n_added++]; /* counted first: tok_free frees */
		if (!(a->content = get_dup(r, MAX_STR, &a->len)))
			return r->bad ? WK_EFORMAT : WK_ENOMEM;
		if (!utf8_ok(a->content, a->len))
			return r->bad = true, WK_EFORMAT;
		unsigned mode = get_u8(r);
		if (mode == 1) {
			a->pattern = a->content;
			a->plen = a->len;
		} else if (mode == 2) {
			if (!(a->pattern = get_dup(r, MAX_STR, &a->plen)))
				return r->bad ? WK_EFORMAT : WK_ENOMEM;
			if (!utf8_ok(a->pattern, a->plen))
				return r->bad = true, WK_EFORMAT;
		} else if (mode != 0) {
			r->bad = true;
		}
		a->id = get_i32(r);
		unsigned f = get_u8(r);
		if (r->bad || !id_ok(t, a->id) || f > 31)
			return r->bad = true, WK_EFORMAT;
		a->special = f & 1;
		a->normalized = f >> 1 & 1;
		a->lstrip = f >> 2 & 1;
		a->rstrip = f >> 3 & 1;
		a->single_word = f >> 4 & 1;
	}
	if ((rc = get_map(r, t, &t->added_map, TOK_MAX_ADDED)))
		return rc;
	int nr = tok_build_matcher(t, &t->raw_match, false);
	int nn = nr < 0 ? nr : tok_build_matcher(t, &t->norm_match, true);
	if (nr < 0 || nn < 0)
		return WK_ENOMEM;
	t->has_raw = nr > 0;
	t->has_norm = nn > 0;

	if ((rc = get_steps(r, t->norm, &t->n_norm, false)))
		return rc;
	t->metaspace = get_u8(r);
	const char *mr = get_str(r, sizeof t->meta_repl - 1, &t->meta_repl_len);
	if (mr)
		memcpy(t->meta_repl, mr, t->meta_repl_len);
	if (mr && t->meta_repl_len && !one_char(mr, t->meta_repl_len)) /* "" without Metaspace */
		r->bad = true;
	unsigned scheme = get_u8(r);
	t->meta_split = get_u8(r);
	int np = get_i32(r);
	if (r->bad || scheme > TOK_PREPEND_NEVER || np < 0 || np > TOK_MAX_STEPS)
		return r->bad = true, WK_EFORMAT;
	t->meta_scheme = (enum tok_prepend_scheme)scheme;
	for (int i = 0; i < np; i++) {
		struct tok_pre *p = &t->pre[t->n_pre++];
		unsigned ty = get_u8(r), fam = get_u8(r), cs = get_u8(r);
		p->re.max_digits = get_i32(r);
		p->use_regex = get_u8(r);
		p->prefix_space = get_u8(r);
		/* ByteLevel, when present, is the last step, and makes the byte-level kind */
		if (r->bad || ty > TOK_PRE_BYTE_LEVEL || fam > TOK_RE_GPT4 || cs > TOK_RE_CASE_ASCII ||
		    p->re.max_digits < 0 || (ty == TOK_PRE_BYTE_LEVEL && i != np - 1))
			return r->bad = true, WK_EFORMAT;
		p->type = (enum tok_pre_type)ty;
		p->re.family = (enum tok_re_family)fam;
		p->re.contractions = (enum tok_re_case)cs;
	}
	if ((t->kind == TOK_KIND_BYTE_LEVEL_BPE) !=
	    (np > 0 && t->pre[np - 1].type == TOK_PRE_BYTE_LEVEL))
		return r->bad = true, WK_EFORMAT;
	if (get_u8(r) || t->kind == TOK_KIND_BYTE_LEVEL_BPE)
		tok_bl_alphabet(t);
	if ((rc = get_steps(r, t->dec, &t->n_dec, true)))
		return rc;
	t->has_decoder = get_u8(r);
	if ((rc = get_ids(r, t, &t->prefix, &t->n_prefix)) ||
	    (rc = get_ids(r, t, &t->suffix, &t->n_suffix)))
		return rc;
	t->bos = get_i32(r);
	t->eos = get_i32(r);
	if (r->bad || (t->bos != -1 && !id_ok(t, t->bos)) || (t->eos != -1 && !id_ok(t, t->eos)))
		return r->bad = true, WK_EFORMAT;
	if (r->at != r->n) /* bytes after the last field */
		return r->bad = true, WK_EFORMAT;
	return WK_OK;
}

int tok_load_prepared_mem(const void *buf, size_t len, const void *json, size_t json_len,
			  struct tok **out, char *err, size_t errsz)
{
	const unsigned char *p = buf;
	*out = NULL;
	struct rd h = {.p = p, .n = len};
	const unsigned char *m = take(&h, 8);
	if (!m || memcmp(m, magic, 8))
		return wk_errf(err, errsz, WK_EFORMAT, "not a prepared tokenizer (no WICKTOKN "
			       "magic)");
	uint32_t ver = get_u32(&h);
	get_u32(&h);
	uint64_t src_len = get_u64(&h), src_hash = get_u64(&h);
	uint64_t body = get_u64(&h), body_hash = get_u64(&h);
	if (h.bad)
		return wk_errf(err, errsz, WK_EFORMAT, "prepared tokenizer: %zu bytes, shorter than "
			       "its %d-byte header", len, HDR);
	if (ver != VERSION)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "prepared tokenizer: version %u, this "
			       "wick reads version %d", ver, VERSION);
	if (body != len - HDR)
		return wk_errf(err, errsz, WK_EFORMAT, "prepared tokenizer: %zu bytes of payload, "
			       "its header says %llu (truncated?)", len - HDR,
			       (unsigned long long)body);
	if (XXH3_64bits(p + HDR, len - HDR) != body_hash)
		return wk_errf(err, errsz, WK_EFORMAT, "prepared tokenizer: the payload's checksum "
			       "does not match (damaged)");
	if (json && (src_len != json_len || XXH3_64bits(json, json_len) != src_hash))
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "prepared tokenizer: made from another "
			       "tokenizer.json than the one beside it (stale)");
	struct tok *t = calloc(1, sizeof *t);
	if (!t)
		return wk_errf(err, errsz, WK_ENOMEM, "prepared tokenizer: out of memory");
	struct rd r = {.p = p + HDR, .n = len - HDR};
	int rc = read_body(&r, t);
	if (rc != WK_OK) {
		tok_free(t);
		return rc == WK_ENOMEM ? wk_errf(err, errsz, WK_ENOMEM, "prepared tokenizer: out "
						 "of memory")
				       : wk_errf(err, errsz, WK_EFORMAT, "prepared tokenizer: a "
						 "bad field at payload byte %zu", r.at);
	}
	*out = t;
	return WK_OK;
}

/* Maps path read-only (*p NULL for an empty file); WK_ENOTFOUND when it does not exist. */
static int map_file(const char *path, size_t max, void **p, size_t *len, char *err,
		    size_t errsz)
{
	*p = NULL;
	*len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return wk_errf(err, errsz, errno == ENOENT ? WK_ENOTFOUND : WK_EIO, "%s: %s", path,
			       strerror(errno));
	struct stat st;
	int rc = WK_OK;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		rc = wk_errf(err, errsz, WK_EIO, "%s: not a regular file", path);
	else if ((uint64_t)st.st_size > max)
		rc = wk_errf(err, errsz, WK_ELIMIT, "%s: %lld bytes, more than the limit of %zu",
			     path, (long long)st.st_size, max);
	else if (st.st_size > 0 &&
		 (*p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
		rc = wk_errf(err, errsz, WK_EIO, "%s: mmap: %s", path, strerror(errno));
	if (rc == WK_OK)
		*len = (size_t)st.st_size;
	else
		*p = NULL;
	close(fd);
	return rc;
}

int tok_load_prepared(const char *path, const char *json_path, struct tok **out, char *err,
		      size_t errsz)
{
	void *buf = NULL, *json = NULL;
	size_t len = 0, jlen = 0;
	*out = NULL;
	/* mapped, not read: the bytes are taken from the page cache once, not copied first */
	int rc = map_file(path, (size_t)TOK_MAX_FILE * 4, &buf, &len, err, errsz);
	if (rc == WK_OK && json_path)
		rc = map_file(json_path, TOK_MAX_FILE, &json, &jlen, err, errsz);
	if (rc == WK_OK) {
		char e[WK_ERRSZ];
		rc = tok_load_prepared_mem(buf ? buf : "", len, json_path ? (json ? json : "") : NULL,
					   jlen, out, e, sizeof e);
		if (rc != WK_OK)
			wk_errf(err, errsz, rc, "%s: %s", path, e);
	}
	if (buf)
		munmap(buf, len);
	if (json)
		munmap(json, jlen);
	return rc;
}

/* ---- choosing ------------------------------------------------------------------------------ */

int tok_load_dir(const char *dir, struct tok **out, bool *prepared, char *err, size_t errsz)
{
	char json[4096], prep[4096];
	*out = NULL;
	*prepared = false;
	if (snprintf(json, sizeof json, "%s/tokenizer.json", dir) >= (int)sizeof json ||
	    snprintf(prep, sizeof prep, "%s/tokenizer.prepared", dir) >= (int)sizeof prep)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", dir);
	int rc = tok_load_prepared(prep, json, out, err, errsz);
	*prepared = rc == WK_OK;
	/* no prepared file, or one of another version or another tokenizer.json: the JSON */
	if (rc == WK_ENOTFOUND || rc == WK_EUNSUPPORTED)
		rc = tok_load(json, out, err, errsz);
	return rc;
}

int tok_load_any(const char *path, struct tok **out, char *err, size_t errsz)
{
	char head[8] = {0};
	FILE *f = fopen(path, "rb");
	size_t n = f ? fread(head, 1, sizeof head, f) : 0;
	if (f)
		fclose(f);
	if (n == sizeof head && !memcmp(head, magic, sizeof head))
		return tok_load_prepared(path, NULL, out, err, errsz);
	return tok_load(path, out, err, errsz);
}
