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
 * The kind-specific steps are the pre-tokenizer and "word -> initial symbols":
 * SentencePiece-BPE (Metaspace or none) looks up each UTF-8 character and falls back to
 * <0xXX> byte tokens; byte-level BPE (GPT-2/Qwen/GLM) splits with a regex (Split, or
 * ByteLevel's own; tokenizer_bytelevel.c) and maps each byte of a word to its printable
 * alphabet, so every initial symbol is a vocabulary piece. The merge loop (tok_bpe_word)
 * and the maps below are shared.
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
#define TOK_MAX_TEMPLATE 64       /* special ids the post-processor's template adds */

enum tok_kind {
	TOK_KIND_SPM_BPE,        /* SentencePiece-style BPE over characters with byte fallback */
	TOK_KIND_BYTE_LEVEL_BPE, /* GPT-2/Qwen/GLM: a ByteLevel pre-tokenizer */
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
	TOK_STEP_NFC,           /* normalizer: Unicode NFC (tokenizer_nfc.c) */
	TOK_STEP_BYTE_LEVEL,    /* decoder: byte-alphabet characters -> bytes, all tokens fused */
};

struct tok_step {
	enum tok_step_type type;
	char *s1, *s2; /* NUL-terminated, malloc'd; s2 may be NULL */
	size_t n1, n2;
	int start, stop;     /* STRIP */
	bool prepend_never;  /* METASPACE */
};

enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

/* The pre-tokenizer regexes wick implements, by hand (tokenizer_bytelevel.c). Both families
 * start with the English contractions:
 *   GPT-2 (ByteLevel's own regex):
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   GPT-4 / cl100k (Llama-3, Qwen2/3 with \p{N}, GLM-4/5 with \p{N}{1,3}):
 *     CONTRACTIONS|[^\r\n\p{L}\p{N}]?\p{L}+|DIGITS| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
 *     \s+(?!\S)|\s+
 * with CONTRACTIONS (?i:'s|'t|'re|'ve|'m|'ll|'d) or llama.cpp's (?:'[sS]|'[tT]|...) form, and
 * DIGITS \p{N}, \p{N}{1,3} or \p{N}+. */
enum tok_re_family { TOK_RE_GPT2, TOK_RE_GPT4 };
enum tok_re_case {
	TOK_RE_CASE_EXACT, /* 's|'t|... lower case only */
	TOK_RE_CASE_FOLD,  /* (?i:...): Unicode simple case folding, so 's also matches 'S, 'ſ */
	TOK_RE_CASE_ASCII, /* '[sS]|'[tT]|...: ASCII case only */
};

struct tok_regex {
	enum tok_re_family family;
	enum tok_re_case contractions;
	int max_digits; /* longest \p{N} run in one match; 0: unbounded */
};

enum tok_pre_type {
	TOK_PRE_SPLIT,      /* Split(Regex, Isolated): every match and gap is a piece */
	TOK_PRE_BYTE_LEVEL, /* ByteLevel: optional prefix space and GPT-2 regex, then the byte
			     * alphabet; always the last step */
};

struct tok_pre {
	enum tok_pre_type type;
	struct tok_regex re; /* SPLIT, and BYTE_LEVEL with use_regex */
	bool use_regex;      /* BYTE_LEVEL */
	bool prefix_space;   /* BYTE_LEVEL: add_prefix_space */
};

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
	struct tok_pre pre[TOK_MAX_STEPS]; /* byte-level kind: Split* then ByteLevel */
	int n_pre;

	/* the byte-level alphabet: byte b is the character bl_cp[b] (U+0021..U+0143), whose
	 * UTF-8 form is bl_utf8[b][0..bl_len[b]); bl_byte[c] inverts it (-1: not in it) */
	uint16_t bl_cp[256];
	char bl_utf8[256][2];
	uint8_t bl_len[256];
	int16_t bl_byte[0x144];

	/* decoder: NULL decoder joins tokens with " " as HF does */
	struct tok_step dec[TOK_MAX_STEPS];
	int n_dec;
	bool has_decoder;

	/* post-processor */
	int *prefix, *suffix;
	int n_prefix, n_suffix;
	int bos, eos;

	struct tok_memo *memo; /* tok_memo_set: long segments' ids kept (NULL: none) */
};

/* The memo (tokenizer_memo.c): a raw segment's ids (s[0..n), beginning the text or not),
 * appended to out: 1 when kept, 0 when not (or no memo, or a short segment), WK_ENOMEM.
 * tok_memo_put keeps them. Any thread. */
int tok_memo_get(const struct tok *t, const char *s, size_t n, bool at_start,
		 struct tok_ivec *out);
void tok_memo_put(const struct tok *t, const char *s, size_t n, bool at_start, const int *ids,
		  int n_ids);

/* Fills m with the added tokens whose normalized flag is normalized and whose pattern is not
 * empty, grouped by first byte and longest first. Returns their count, or WK_ENOMEM. */
int tok_build_matcher(struct tok *t, struct tok_matcher *m, bool normalized);

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
 * WK_OK, WK_ENOMEM, or WK_ELIMIT when a step's output passes TOK_NORM_GROWTH times n plus
 * 64 KiB: real normalizers grow text by 3x at most (a space to "▁"), but Replace steps whose
 * content is longer than their pattern multiply it, step after step (16 steps of 256 bytes
 * each could turn a byte into 256^16), so a tokenizer.json could otherwise exhaust memory. */
#define TOK_NORM_GROWTH 16
int tok_normalize(const struct tok *t, const char *s, size_t n, struct tok_buf *out,
		  struct tok_buf *tmp);

/* Whether code point c (>= 0) is matched by Rust's regex \w (tokenizer_unicode.c). */
bool tok_unicode_is_word(long c);

/* Character classes of the pre-tokenizer regexes (tokenizer_unicode.c): \p{L}, \p{N}, and
 * \s (Unicode White_Space, as in Oniguruma and Rust's regex). c < 0 (a byte that is not valid
 * UTF-8) is TOK_UC_OTHER. */
enum tok_uclass { TOK_UC_OTHER, TOK_UC_LETTER, TOK_UC_NUMBER, TOK_UC_SPACE };
enum tok_uclass tok_unicode_class(long c);
bool tok_unicode_is_space(long c);

/* The code point of the valid UTF-8 character at p[0..n) and its length in *len; for a
 * byte that starts no valid sequence, -1 - byte and *len 1. n >= 1. */
long tok_utf8_decode(const unsigned char *p, size_t n, size_t *len);

/* Generated tables (tokenizer_ucd.c, tokenizer_nfc_data.c; see scripts/gen_unicode_*). */
extern const uint32_t tok_ucd_letter[][2], tok_ucd_number[][2];
extern const size_t tok_ucd_letter_n, tok_ucd_number_n;
extern const uint32_t tok_nfc_ccc[][3], tok_nfc_decomp[][3], tok_nfc_comp[][3], tok_nfc_pool[];
extern const size_t tok_nfc_ccc_n, tok_nfc_decomp_n, tok_nfc_comp_n;

/* Appends the NFC form of s[0..n) to out (tokenizer_nfc.c). Bytes that are not valid UTF-8
 * pass through unchanged and block composition across them. WK_OK or WK_ENOMEM. */
int tok_nfc(const char *s, size_t n, struct tok_buf *out);

/* Byte-level kind (tokenizer_bytelevel.c). */
void tok_bl_alphabet(struct tok *t); /* fills bl_cp, bl_utf8, bl_len, bl_byte */
/* Parses a Split/ByteLevel regex; false when it is not one of the families above. */
bool tok_regex_parse(const char *pattern, struct tok_regex *re);
/* End of the regex match that starts at s[pos] (pos < n): the patterns match at every
 * position, so a find_iter over s is a walk from match end to match end. */
size_t tok_regex_next(const struct tok_regex *re, const unsigned char *s, size_t n, size_t pos);
/* Pre-tokenizes one normalized segment with t->pre and appends the BPE ids of each word to
 * out. pre and map are scratch; s must not point into them. WK_OK or WK_ENOMEM. */
int tok_bl_segment(const struct tok *t, const char *s, size_t n, struct tok_scratch *sc,
		   struct tok_buf *pre, struct tok_buf *map, struct tok_ivec *out);
/* The ByteLevel decoder's bytes for one token string: its characters mapped back to bytes
 * when all are in the alphabet, else the string itself (as HF). WK_OK or WK_ENOMEM. */
int tok_bl_decode_token(const struct tok *t, const char *p, size_t n, struct tok_buf *out);

/* Appends the ids of one word (already normalized and pre-tokenized) to out: initial
 * symbols per the SentencePiece-BPE rules (vocabulary char, else <0xXX> bytes, else unk),
 * then the BPE merges. WK_OK or WK_ENOMEM. */
int tok_bpe_word(const struct tok *t, const char *w, size_t n, struct tok_scratch *s,
		 struct tok_ivec *out);

#endif
