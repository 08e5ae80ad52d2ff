/*
 * tokenizer_memo.c - long segments' ids kept, so that a conversation is not tokenized whole
 * at every turn.
 *
 * An agent's request carries its whole conversation, and every turn renders and encodes it
 * again: at GLM-5's context, 150,000 tokens or more, tens of milliseconds on the worker's
 * thread, between engine steps, for every turn of every session. The chat template puts
 * special tokens between the messages, and the encoder splits the text around them first
 * (split_added), encoding each piece between them alone. A piece's ids depend only on its
 * bytes and on whether it begins the text, so the memo keeps the ids of pieces of
 * TOK_MEMO_MIN bytes or more (a message, a tool's output) by a 128-bit hash of the two, and
 * the next turn encodes only its new messages. Bounded in bytes of ids; the least recently
 * used go first. One lock: the worker's thread and the HTTP server's share a tokenizer.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_int.h"

struct memo_ent {
	XXH128_hash_t key;
	int *ids;
	int n;
	struct wk_node lru;
	struct memo_ent *chain;       /* the bucket's next */
};

struct tok_memo {
	pthread_mutex_t mu;
	size_t max_bytes, bytes;
	struct memo_ent **bucket;
	size_t n_buckets, n;
	struct wk_lru lru; /* most recently used first */
	struct tok_memo_stats st;
};

static size_t ent_bytes(const struct memo_ent *e)
{
	return sizeof *e + (size_t)e->n * sizeof(int);
}

static void memo_clear(struct tok_memo *m)
{
	while (m->lru.head) {
		struct memo_ent *e = WK_OF(m->lru.head, struct memo_ent, lru);
		m->lru.head = e->lru.next;
		free(e->ids);
		free(e);
	}
	free(m->bucket);
}

int tok_memo_set(struct tok *t, size_t max_bytes)
{
	if (t->memo) {
		memo_clear(t->memo);
		pthread_mutex_destroy(&t->memo->mu);
		free(t->memo);
		t->memo = NULL;
	}
	if (!max_bytes)
		return WK_OK;
	struct tok_memo *m = calloc(1, sizeof *m);
	if (!m || !(m->bucket = calloc(m->n_buckets = 4096, sizeof *m->bucket))) {
		free(m);
		return WK_ENOMEM;
	}
	m->max_bytes = max_bytes;
	pthread_mutex_init(&m->mu, NULL);
	t->memo = m;
	return WK_OK;
}

void tok_memo_stats(const struct tok *t, struct tok_memo_stats *st)
{
	memset(st, 0, sizeof *st);
	if (!t->memo)
		return;
	pthread_mutex_lock(&t->memo->mu);
	*st = t->memo->st;
	st->entries = t->memo->n;
	st->bytes = t->memo->bytes;
	pthread_mutex_unlock(&t->memo->mu);
}

static XXH128_hash_t key_of(const char *s, size_t n, bool at_start)
{
	return XXH3_128bits_withSeed(s, n, at_start ? 1 : 0);
}

static struct memo_ent **slot_of(struct tok_memo *m, XXH128_hash_t k)
{
	struct memo_ent **p = &m->bucket[k.low64 % m->n_buckets];
	while (*p && !XXH128_isEqual((*p)->key, k))
		p = &(*p)->chain;
	return p;
}

int tok_memo_get(const struct tok *t, const char *s, size_t n, bool at_start,
		 struct tok_ivec *out)
{
	struct tok_memo *m = t->memo;
	if (!m || n < TOK_MEMO_MIN)
		return 0;
	XXH128_hash_t k = key_of(s, n, at_start);
	pthread_mutex_lock(&m->mu);
	struct memo_ent *e = *slot_of(m, k);
	int rc = 0;
	if (e) {
		wk_lru_unlink(&m->lru, &e->lru);
		wk_lru_push(&m->lru, &e->lru);
		rc = 1;
		for (int i = 0; i < e->n && rc == 1; i++)
			if (tok_ivec_push(out, e->ids[i]) != WK_OK)
				rc = WK_ENOMEM;
		m->st.hits++;
		m->st.hit_bytes += n;
	} else {
		m->st.misses++;
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

void tok_memo_put(const struct tok *t, const char *s, size_t n, bool at_start, const int *ids,
		  int n_ids)
{
	struct tok_memo *m = t->memo;
	if (!m || n < TOK_MEMO_MIN)
		return;
	struct memo_ent *e = calloc(1, sizeof *e);
	if (!e || !(e->ids = malloc(((size_t)n_ids + 1) * sizeof(int)))) {
		free(e);
		return; /* (out of memory: not kept) */
	}
	if (n_ids)
		memcpy(e->ids, ids, (size_t)n_ids * sizeof(int));
	e->n = n_ids;
	e->key = key_of(s, n, at_start);
	if (ent_bytes(e) > m->max_bytes) {
		free(e->ids);
		free(e);
		return;
	}
	pthread_mutex_lock(&m->mu);
	struct memo_ent **slot = slot_of(m, e->key);
	if (*slot) { /* (another thread encoded it meanwhile) */
		pthread_mutex_unlock(&m->mu);
		free(e->ids);
		free(e);
		return;
	}
	*slot = e;
	wk_lru_push(&m->lru, &e->lru);
	m->n++;
	m->bytes += ent_bytes(e);
	while (m->bytes > m->max_bytes && m->lru.tail != &e->lru) {
		struct memo_ent *old = WK_OF(m->lru.tail, struct memo_ent, lru);
		wk_lru_unlink(&m->lru, &old->lru);
		*slot_of(m, old->key) = old->chain;
		m->n--;
		m->bytes -= ent_bytes(old);
		m->st.evicted++;
		free(old->ids);
		free(old);
	}
	pthread_mutex_unlock(&m->mu);
}
