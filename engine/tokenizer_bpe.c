/*
 * tokenizer_bpe.c - the BPE model: maps, UTF-8 scanning, and the merge loop.
 *
 * The merge loop follows Hugging Face's Word::merge_all (models/bpe/word.rs): a min-heap of
 * candidate merges keyed by (rank, position of the left symbol), symbols in a doubly linked
 * list over an array, stale heap entries skipped when popped. That is O(n log n) per word,
 * which matters because a SentencePiece-BPE "word" is a whole text segment.
 */
#include "engine/tokenizer_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/wk.h"

/* ---- growable buffers -------------------------------------------------------------------- */

int tok_ivec_push(struct tok_ivec *v, int x)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? 2 * v->cap : 64;
		int *p = realloc(v->v, cap * sizeof *p);
		if (!p)
			return WK_ENOMEM;
		v->v = p;
		v->cap = cap;
	}
	v->v[v->n++] = x;
	return WK_OK;
}

int tok_buf_add(struct tok_buf *b, const void *p, size_t n)
{
	if (b->cap - b->n < n + 1) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap - b->n < n + 1)
			cap *= 2;
		char *q = realloc(b->p, cap);
		if (!q)
			return WK_ENOMEM;
		b->p = q;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
	b->p[b->n] = 0;
	return WK_OK;
}

/* ---- maps -------------------------------------------------------------------------------- */

/* A prepared tokenizer stores these maps' slots as they are (tokenizer_prepared.c): a change
 * to the hashes, the probing or the growth rule needs a new version of its format. */

static uint64_t hash_bytes(const char *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then a final mix */
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	return k ^ (k >> 33);
}

static int strmap_grow(struct tok_strmap *m)
{
	size_t cap = m->cap ? 2 * m->cap : 64;
	struct tok_strslot *s = malloc(cap * sizeof *s);
	if (!s)
		return WK_ENOMEM;
	for (size_t i = 0; i < cap; i++)
		s[i].val = -1;
	for (size_t i = 0; i < m->cap; i++) {
		if (m->slots[i].val < 0)
			continue;
		size_t j = m->slots[i].hash & (cap - 1);
		while (s[j].val >= 0)
			j = (j + 1) & (cap - 1);
		s[j] = m->slots[i];
	}
	free(m->slots);
	m->slots = s;
	m->cap = cap;
	return WK_OK;
}

int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int val)
{
	if (len > UINT32_MAX || val < 0)
		return WK_EINVAL;
	if (2 * (m->count + 1) > m->cap && strmap_grow(m) != WK_OK)
		return WK_ENOMEM;
	uint64_t h = hash_bytes(key, len);
	size_t j = h & (m->cap - 1);
	for (; m->slots[j].val >= 0; j = (j + 1) & (m->cap - 1)) {
		struct tok_strslot *s = &m->slots[j];
		if (s->hash == h && s->len == len && !memcmp(m->keys + s->off, key, len)) {
			s->val = val;
			return WK_OK;
		}
	}
	size_t need = m->keys_len + len + 1;
	if (need > UINT32_MAX)
		return WK_ENOMEM;
	if (need > m->keys_cap) {
		size_t cap = m->keys_cap ? m->keys_cap : 4096;
		while (cap < need)
			cap *= 2;
		char *k = realloc(m->keys, cap);
		if (!k)
			return WK_ENOMEM;
		m->keys = k;
		m->keys_cap = cap;
	}
	memcpy(m->keys + m->keys_len, key, len);
	m->keys[m->keys_len + len] = 0;
	m->slots[j] = (struct tok_strslot){.hash = h, .off = (uint32_t)m->keys_len,
					   .len = (uint32_t)len, .val = val};
	m->keys_len = need;
	m->count++;
	return WK_OK;
}

int tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len)
{
	if (!m->cap)
		return -1;
	uint64_t h = hash_bytes(key, len);
	for (size_t j = h & (m->cap - 1); m->slots[j].val >= 0; j = (j + 1) & (m->cap - 1)) {
		const struct tok_strslot *s = &m->slots[j];
		if (s->hash == h && s->len == len && !memcmp(m->keys + s->off, key, len))
			return s->val;
	}
	return -1;
}

void tok_strmap_free(struct tok_strmap *m)
{
	free(m->slots);
	free(m->keys);
	memset(m, 0, sizeof *m);
}

static int pairmap_grow(struct tok_pairmap *m)
{
	size_t cap = m->cap ? 2 * m->cap : 64;
	struct tok_pairslot *s = malloc(cap * sizeof *s);
	if (!s)
		return WK_ENOMEM;
	for (size_t i = 0; i < cap; i++)
		s[i].key = UINT64_MAX;
	for (size_t i = 0; i < m->cap; i++) {
		if (m->slots[i].key == UINT64_MAX)
			continue;
		size_t j = hash_pair(m->slots[i].key) & (cap - 1);
		while (s[j].key != UINT64_MAX)
			j = (j + 1) & (cap - 1);
		s[j] = m->slots[i];
	}
	free(m->slots);
	m->slots = s;
	m->cap = cap;
	return WK_OK;
}

int tok_pairmap_put(struct tok_pairmap *m, int a, int b, uint32_t rank, int id)
{
	if (2 * (m->count + 1) > m->cap && pairmap_grow(m) != WK_OK)
		return WK_ENOMEM;
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	size_t j = hash_pair(k) & (m->cap - 1);
	while (m->slots[j].key != UINT64_MAX && m->slots[j].key != k)
		j = (j + 1) & (m->cap - 1);
	if (m->slots[j].key == UINT64_MAX)
		m->count++;
	m->slots[j] = (struct tok_pairslot){.key = k, .rank = rank, .id = id};
	return WK_OK;
}

bool tok_pairmap_get(const struct tok_pairmap *m, int a, int b, uint32_t *rank, int *id)
{
	if (!m->cap)
		return false;
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t j = hash_pair(k) & (m->cap - 1); m->slots[j].key != UINT64_MAX;
	     j = (j + 1) & (m->cap - 1)) {
		if (m->slots[j].key == k) {
			*rank = m->slots[j].rank;
			*id = m->slots[j].id;
			return true;
		}
	}
	return false;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
	free(m->slots);
	memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

size_t tok_utf8_len(const unsigned char *p, size_t n)
{
	unsigned c = p[0];
	if (c < 0x80)
		return 1;
	size_t len;
	unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		if (c == 0xE0)
			lo = 0xA0; /* overlong */
		else if (c == 0xED)
			hi = 0x9F; /* surrogates */
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		if (c == 0xF0)
			lo = 0x90; /* overlong */
		else if (c == 0xF4)
			hi = 0x8F; /* past U+10FFFF */
	} else {
		return 0;
	}
	if (n < len || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if ((p[i] & 0xC0) != 0x80)
			return 0;
	return len;
}

/* ---- the merge loop ---------------------------------------------------------------------- */

void tok_scratch_free(struct tok_scratch *s)
{
	free(s->sym);
	free(s->heap);
	memset(s, 0, sizeof *s);
}

static bool heap_less(const struct tok_heap_ent *a, const struct tok_heap_ent *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(struct tok_scratch *s, uint32_t rank, uint32_t pos, int id)
{
	if (s->heap_n == s->heap_cap) {
		size_t cap = s->heap_cap ? 2 * s->heap_cap : 256;
		struct tok_heap_ent *h = realloc(s->heap, cap * sizeof *h);
		if (!h)
			return WK_ENOMEM;
		s->heap = h;
		s->heap_cap = cap;
	}
	struct tok_heap_ent e = {.rank = rank, .pos = pos, .id = id};
	size_t i = s->heap_n++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		if (!heap_less(&e, &s->heap[parent]))
			break;
		s->heap[i] = s->heap[parent];
		i = parent;
	}
	s->heap[i] = e;
	return WK_OK;
}

static struct tok_heap_ent heap_pop(struct tok_scratch *s)
{
	struct tok_heap_ent top = s->heap[0];
	struct tok_heap_ent last = s->heap[--s->heap_n];
	size_t i = 0, n = s->heap_n;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && heap_less(&s->heap[c + 1], &s->heap[c]))
			c++;
		if (!heap_less(&s->heap[c], &last))
			break;
		s->heap[i] = s->heap[c];
		i = c;
	}
	if (n)
		s->heap[i] = last;
	return top;
}

static int sym_add(struct tok_scratch *s, size_t *n, int c, uint32_t len)
{
	if (*n == s->sym_cap) {
		size_t cap = s->sym_cap ? 2 * s->sym_cap : 256;
		struct tok_sym *p = realloc(s->sym, cap * sizeof *p);
		if (!p)
			return WK_ENOMEM;
		s->sym = p;
		s->sym_cap = cap;
	}
	int i = (int)*n;
	s->sym[i] = (struct tok_sym){.c = c, .prev = i - 1, .next = -1, .len = len};
	if (i > 0)
		s->sym[i - 1].next = i;
	(*n)++;
	return WK_OK;
}

/* Pushes the merge of the pair starting at symbol i, if there is one. */
static int push_pair(const struct tok *t, struct tok_scratch *s, int i)
{
	int j = s->sym[i].next;
	uint32_t rank;
	int id;
	if (j < 0 || !tok_pairmap_get(&t->merges, s->sym[i].c, s->sym[j].c, &rank, &id))
		return WK_OK;
	return heap_push(s, rank, (uint32_t)i, id);
}

static int merge_all(const struct tok *t, struct tok_scratch *s, size_t n)
{
	s->heap_n = 0;
	for (size_t i = 0; i + 1 < n; i++)
		if (push_pair(t, s, (int)i) != WK_OK)
			return WK_ENOMEM;
	while (s->heap_n) {
		struct tok_heap_ent top = heap_pop(s);
		struct tok_sym *left = &s->sym[top.pos];
		if (left->len == 0 || left->next < 0)
			continue;
		struct tok_sym *right = &s->sym[left->next];
		uint32_t rank;
		int id;
		/* A stale entry: the pair at pos changed since it was pushed. */
		if (!tok_pairmap_get(&t->merges, left->c, right->c, &rank, &id) || id != top.id)
			continue;
		left->c = top.id;
		left->len += right->len;
		left->next = right->next;
		right->len = 0;
		if (left->next >= 0)
			s->sym[left->next].prev = (int)top.pos;
		if (left->prev >= 0 && push_pair(t, s, left->prev) != WK_OK)
			return WK_ENOMEM;
		if (push_pair(t, s, (int)top.pos) != WK_OK)
			return WK_ENOMEM;
	}
	return WK_OK;
}

int tok_bpe_word(const struct tok *t, const char *w, size_t n, struct tok_scratch *s,
		 struct tok_ivec *out)
{
	if (n == 0)
		return WK_OK;
	if (t->ignore_merges) {
		int id = tok_strmap_get(&t->vocab, w, n);
		if (id >= 0)
			return tok_ivec_push(out, id);
	}
	const unsigned char *p = (const unsigned char *)w;
	size_t nsym = 0;
	int unk = -1;        /* a pending unk symbol (HF holds it back to fuse neighbours) */
	uint32_t unk_len = 0;
	for (size_t i = 0; i < n;) {
		size_t cl = tok_utf8_len(p + i, n - i);
		bool valid = cl > 0;
		if (!valid)
			cl = 1;
		int id = valid ? tok_strmap_get(&t->vocab, w + i, cl) : -1;
		if (id >= 0) {
			if (unk >= 0 && sym_add(s, &nsym, unk, unk_len) != WK_OK)
				return WK_ENOMEM;
			unk = -1;
			if (sym_add(s, &nsym, id, (uint32_t)cl) != WK_OK)
				return WK_ENOMEM;
			i += cl;
			continue;
		}
		if (t->byte_fallback) {
			bool all = true;
			for (size_t k = 0; k < cl; k++)
				all = all && t->byte_id[p[i + k]] >= 0;
			if (all) {
				/* As in HF, byte tokens do not flush a pending unk. */
				for (size_t k = 0; k < cl; k++)
					if (sym_add(s, &nsym, t->byte_id[p[i + k]], 1) != WK_OK)
						return WK_ENOMEM;
				i += cl;
				continue;
			}
		}
		if (t->unk_id >= 0) {
			if (unk >= 0 && t->fuse_unk) {
				unk_len += (uint32_t)cl;
			} else {
				if (unk >= 0 && sym_add(s, &nsym, unk, unk_len) != WK_OK)
					return WK_ENOMEM;
				unk = t->unk_id;
				unk_len = (uint32_t)cl;
			}
		}
		/* With no unk token the character is dropped, as in HF. */
		i += cl;
	}
	if (unk >= 0 && sym_add(s, &nsym, unk, unk_len) != WK_OK)
		return WK_ENOMEM;
	if (merge_all(t, s, nsym) != WK_OK)
		return WK_ENOMEM;
	for (size_t i = 0; i < nsym; i++)
		if (s->sym[i].len && tok_ivec_push(out, s->sym[i].c) != WK_OK)
			return WK_ENOMEM;
	return WK_OK;
}
