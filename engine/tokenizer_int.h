/*
 * tokenizer_int.h - internals of the tokenizer module, shared by engine/tokenizer*.c only.
 *
 * The pipeline mirrors Hugging Face tokenizers, stage by stage, so that each stage can be
 * checked against its Rust counterpart:
 *
 *   raw text -> split out non-normalized added tokens        (added_vocabulary.rs)
 *            -> normalize each remaining segment              (normalizers/)
 *            -> split out normalized added tokens
 *            -> pre-tokenize into words                       (pre_tokenizers/metaspace.rs)
 *            -> model: word -> initial symbols -> BPE merges  (models/bpe/{model,word}.rs)
 *            -> post-process: template prefix/suffix          (processors/template.rs)
 *
 * The kind-specific step is "word -> initial symbols": SentencePiece-BPE looks up each UTF-8
 * character and falls back to <0xXX> byte tokens. A byte-level kind (GPT-2/GLM) would add a
 * regex pre-tokenizer and map bytes to its printable alphabet there; the merge loop
 * (tok_bpe_merge) and the maps below are shared.
 */
#ifndef TOKENIZER_INT_H
#define TOKENIZER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer.h"

#define TOK_MAX_ADDED 65536       /* entries in added_tokens */
#define TOK_MAX_MERGES (1 << 23)  /* entries in model.merges */
#define TOK_MAX_STEPS 16          /* normalizer or decoder steps */

enum tok_kind {
	TOK_KIND_SPM_BPE, /* SentencePiece-style BPE over characters with byte fallback */
	/* TOK_KIND_BYTE_LEVEL_BPE: GPT-2/GLM; refused at load for now. */
};

/* ---- maps -------------------------------------------------------------------------------- */

/* String -> non-negative int, open addressing, keys copied into the map. */
struct tok_strmap {
	struct tok_strslot {
		uint64_t hash;
		uint32_t off, len; /* key bytes at keys + off */
		int32_t val;       /* -1: empty slot */
	} *slots;
	size_t cap, count; /* cap is a power of two, or 0 */
	char *keys;
	size_t keys_len, keys_cap;
};

/* Inserts or overwrites. WK_OK or WK_ENOMEM. */
int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int val);
/* The value, or -1 when absent. */
int tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len);
void tok_strmap_free(struct tok_strmap *m);

/* (left id, right id) -> (rank, merged id). */
struct tok_pairmap {
	struct tok_pairslot {
		uint64_t key; /* UINT64_MAX: empty */
		uint32_t rank;
		int32_t id;
	} *slots;
	size_t cap, count;
};

/* Inserts or overwrites (a later duplicate merge takes the later rank, as in HF). */
int tok_pairmap_put(struct tok_pairmap *m, int a, int b, uint32_t rank, int id);
/* Returns true and fills rank/id when (a, b) is a merge. */
bool tok_pairmap_get(const struct tok_pairmap *m, int a, int b, uint32_t *rank, int *id);
void tok_pairmap_free(struct tok_pairmap *m);

/* ---- growable buffers -------------------------------------------------------------------- */

struct tok_ivec {
	int *v;
	size_t n, cap;
};
int tok_ivec_push(struct tok_ivec *v, int x); /* WK_OK or WK_ENOMEM */

struct tok_buf {
	char *p;
	size_t n, cap;
};
int tok_buf_add(struct tok_buf *b, const void *p, size_t n); /* WK_OK or WK_ENOMEM */

/* ---- the tokenizer ------------------------------------------------------------------------ */

enum tok_step_type {
	TOK_STEP_PREPEND,       /* normalizer: prepend s1 to a non-empty segment */
	TOK_STEP_REPLACE,       /* normalizer or decoder: replace every s1 by s2 */
	TOK_STEP_BYTE_FALLBACK, /* decoder: <0xXX> runs -> bytes */
	TOK_STEP_FUSE,          /* decoder: join all tokens into one */
	TOK_STEP_STRIP,         /* decoder: strip up to start/stop chars s1 from each token */
	TOK_STEP_METASPACE,     /* decoder: s1 -> ' ', dropped in token 0 unless scheme never */
};

struct tok_step {
	enum tok_step_type type;
	char *s1, *s2; /* NUL-terminated, malloc'd; s2 may be NULL */
	size_t n1, n2;
	int start, stop;     /* STRIP */
	bool prepend_never;  /* METASPACE */
};

enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_added {
	char *content;  /* the token's text */
	size_t len;
	char *pattern;  /* what is matched: content, or its normalized form when normalized */
	size_t plen;
	int id;
	bool special, normalized, lstrip, rstrip, single_word;
};

/* The added tokens matched against one kind of text (raw or normalized). */
struct tok_matcher {
	int *order;  /* indexes into tok.added, grouped by first byte, longest pattern first */
	int first[257]; /* order[first[b] .. first[b+1]) start with byte b */
};

struct tok {
	enum tok_kind kind;

	/* ids: 0 .. n_ids-1. Strings live in strs (each NUL-terminated) at the given offsets;
	 * piece_off[id] == TOK_NO_PIECE marks a hole in the id space. */
	int n_ids;
	struct tok_buf strs;
	uint32_t *piece_off, *piece_len; /* vocabulary string (an added token's content wins) */
	uint32_t *dec_off, *dec_len;     /* what the decoder sees (HF: normalized added content) */
	uint8_t *flags;                  /* TOK_F_* */

	/* model: BPE */
	struct tok_strmap vocab; /* model vocabulary only */
	struct tok_pairmap merges;
	int unk_id;              /* -1: none */
	bool byte_fallback, fuse_unk, ignore_merges;
	int byte_id[256];        /* id of "<0xXX>" in the model vocabulary, or -1 */

	/* added tokens */
	struct tok_added *added;
	int n_added;
	struct tok_strmap added_map; /* content -> id */
	struct tok_matcher raw_match, norm_match;
	bool has_raw, has_norm;

	/* normalizer and pre-tokenizer */
	struct tok_step norm[TOK_MAX_STEPS];
	int n_norm;
	bool metaspace;
	char meta_repl[8];
	size_t meta_repl_len;
	enum tok_prepend_scheme meta_scheme;
	bool meta_split;

	/* decoder: NULL decoder joins tokens with " " as HF does */
	struct tok_step dec[TOK_MAX_STEPS];
	int n_dec;
	bool has_decoder;

	/* post-processor */
	int *prefix, *suffix;
	int n_prefix, n_suffix;
	int bos, eos;
};

#define TOK_NO_PIECE UINT32_MAX
#define TOK_F_ADDED 1    /* an added token */
#define TOK_F_SPECIAL 2  /* an added token marked special */
#define TOK_F_SKIP 4     /* dropped by decode with skip_special (HF: its string is special) */

/* Scratch space for one encode call. Not shared between threads. */
struct tok_scratch {
	struct tok_sym {
		int c;
		int prev, next;
		uint32_t len; /* bytes; 0 once merged into its left neighbour */
	} *sym;
	size_t sym_cap;
	struct tok_heap_ent {
		uint32_t rank;
		uint32_t pos;
		int id;
	} *heap;
	size_t heap_n, heap_cap;
};
void tok_scratch_free(struct tok_scratch *s);

/* Length of the valid UTF-8 sequence at p[0..n), or 0 when p[0] starts no valid sequence
 * (overlong forms, surrogates and values past U+10FFFF are invalid). n >= 1. */
size_t tok_utf8_len(const unsigned char *p, size_t n);

/* Applies the normalizer steps to s[0..n) into out (cleared first); tmp is scratch.
 * WK_OK or WK_ENOMEM. */
int tok_normalize(const struct tok *t, const char *s, size_t n, struct tok_buf *out,
		  struct tok_buf *tmp);

/* Whether code point c (>= 0) is matched by Rust's regex \w (tokenizer_unicode.c). */
bool tok_unicode_is_word(long c);

/* Appends the ids of one word (already normalized and pre-tokenized) to out: initial
 * symbols per the SentencePiece-BPE rules (vocabulary char, else <0xXX> bytes, else unk),
 * then the BPE merges. WK_OK or WK_ENOMEM. */
int tok_bpe_word(const struct tok *t, const char *w, size_t n, struct tok_scratch *s,
		 struct tok_ivec *out);

#endif
