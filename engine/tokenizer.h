/*
 * tokenizer.h - encode and decode with a Hugging Face tokenizer.json.
 *
 * Kinds:
 *   - SentencePiece-BPE (Llama-2 style): normalizer Prepend("▁") + Replace(" ", "▁") (or the
 *     older Metaspace pre-tokenizer), model BPE with byte_fallback and fuse_unk, decoder
 *     Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0) (or Metaspace).
 *   - byte-level BPE (GPT-2, Llama-3, Qwen, GLM): normalizer NFC (or none), pre-tokenizer
 *     Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)] or a plain ByteLevel with
 *     its GPT-2 regex (add_prefix_space honoured), model BPE over the 256-character byte
 *     alphabet (ignore_merges honoured), decoder ByteLevel, post-processor ByteLevel and/or
 *     TemplateProcessing. The Split regex must be one of the GPT-2 or GPT-4/cl100k patterns
 *     that engine/tokenizer_int.h lists (Qwen2/3's, GLM-4/5's, Llama-3's); wick matches them
 *     by hand, with Unicode 16.0 \p{L}/\p{N} as in HF's Oniguruma. NFC uses Unicode 9.0
 *     data, as HF's normalizer crate does.
 *   tok_load refuses anything else with WK_EUNSUPPORTED and a message naming it (Unigram and
 *   WordPiece models, NFKC, other regexes, Split behaviours other than Isolated, BPE dropout,
 *   ...).
 *
 * Encoding matches Hugging Face tokenizers id for id on valid UTF-8 (tests/e2e/tokenizer_hf.sh,
 * tests/e2e/tokenizer_bytelevel.sh):
 * added tokens (the "added_tokens" list, e.g. "<s>") are split out of the raw text first,
 * leftmost-longest, and each remaining segment is normalized on its own (so Prepend("▁")
 * applies per segment, as in HF); BPE merges apply lowest rank first, leftmost on ties; a
 * character missing from the vocabulary becomes its <0xXX> byte tokens (byte_fallback), else
 * <unk> (consecutive ones fused with fuse_unk). The ids listed in added_tokens must be the
 * ones HF would assign (the model vocab's id, else the next free id), or tok_load refuses
 * the file. truncation and padding settings are ignored.
 *
 * Invalid UTF-8 in the input: the byte-level kind encodes every byte as it is (such a byte is
 * outside \p{L}, \p{N} and \s for the regex), so tok_decode(tok_encode(s)) == s for any bytes
 * s that contain no added token, are NFC (when the normalizer is) and start with a space
 * (with add_prefix_space). For SentencePiece-BPE,
 * each byte that is not part of a valid UTF-8 sequence is encoded
 * through byte fallback as its <0xXX> token (as <unk> when the vocabulary has no byte tokens),
 * so tok_decode(tok_encode(s)) == s for any bytes s that contain no added token and no "▁"
 * (as in HF: text after an added token is a new segment with its own "▁" prefix, which
 * decodes as a space, and a "▁" in the text decodes as a space).
 * Hugging Face's library only accepts valid Unicode strings; on valid UTF-8 the two agree.
 *
 * Decoding: tok_decode returns the exact bytes (a <0xXX> run, or byte-level tokens, that are
 * not valid UTF-8 stay as raw bytes, so text round-trips); tok_decode_utf8 returns what HF's
 * decode returns, always valid UTF-8 (such a <0xXX> run becomes one U+FFFD per byte; the
 * ByteLevel decoder follows Rust's from_utf8_lossy, one U+FFFD per maximal invalid
 * subsequence). They differ only on such bytes.
 *
 * A struct tok is immutable after load and safe to use from many threads.
 */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOK_MAX_FILE (64u << 20)   /* bytes of tokenizer.json */
#define TOK_MAX_VOCAB (1 << 22)    /* entries in the vocabulary */
#define TOK_MAX_PIECE 256          /* bytes in one vocabulary piece or added token */
#define TOK_MAX_TEXT (64u << 20)   /* bytes of text one tok_encode call takes */

struct tok; /* opaque */

/* Loads path (a tokenizer.json). Refuses an unsupported model/normalizer/decoder kind with
 * WK_EUNSUPPORTED and a message naming it. */
int tok_load(const char *path, struct tok **out, char *err, size_t errsz);
/* The same from len bytes of tokenizer.json at buf; path only names it in messages. */
int tok_load_buf(const char *path, const char *buf, size_t len, struct tok **out, char *err,
		 size_t errsz);
void tok_free(struct tok *t); /* NULL is fine */

/* The prepared form (tokenizer_prepared.c, which documents the format): a loaded tokenizer
 * as binary tables that load without JSON, tied to the tokenizer.json it came from.
 *
 * tok_prepare writes t's prepared form into a malloc'd *buf (*len bytes; caller frees);
 * json[0..json_len) is the tokenizer.json t was loaded from, whose size and hash it records.
 * WK_OK or WK_ENOMEM. */
int tok_prepare(const struct tok *t, const void *json, size_t json_len, char **buf,
		size_t *len, char *err, size_t errsz);
/* The prepared form of the tokenizer.json json[0..json_len) (path names it in messages):
 * tok_load_buf, tok_prepare, then the result read back by tok_load_prepared_mem, so that what
 * is returned is what a start will load. Errors as theirs; *buf NULL then. */
int tok_prepare_json(const char *path, const char *json, size_t json_len, char **buf,
		     size_t *len, char *err, size_t errsz);
/* Loads a prepared tokenizer from buf. With json non-NULL, it must be the tokenizer.json the
 * file was made from (same size and hash). Returns WK_OK; WK_EUNSUPPORTED when the file is of
 * another format version or was made from another tokenizer.json (the caller should load that
 * tokenizer.json instead); WK_EFORMAT when it is not a prepared tokenizer, or is damaged
 * (a checksum covers it) or malformed; WK_ENOMEM. */
int tok_load_prepared_mem(const void *buf, size_t len, const void *json, size_t json_len,
			  struct tok **out, char *err, size_t errsz);
/* The same from the file path; json_path (may be NULL: no check) is read and checked as
 * above. Messages name path. */
int tok_load_prepared(const char *path, const char *json_path, struct tok **out, char *err,
		      size_t errsz);
/* The tokenizer of a model or snapshot directory: dir/tokenizer.prepared where it is of this
 * format version and was made from dir/tokenizer.json, else dir/tokenizer.json (*prepared
 * says which). A damaged prepared file is an error, as a damaged tokenizer.json is;
 * WK_ENOTFOUND when dir has neither. */
int tok_load_dir(const char *dir, struct tok **out, bool *prepared, char *err, size_t errsz);
/* path as a prepared tokenizer where it starts with the prepared form's magic (unchecked
 * against any tokenizer.json), else as a tokenizer.json. */
int tok_load_any(const char *path, struct tok **out, char *err, size_t errsz);

int tok_vocab_size(const struct tok *t);      /* highest id + 1, added tokens included */
const char *tok_piece(const struct tok *t, int id); /* the vocabulary string, or NULL */
int tok_id(const struct tok *t, const char *piece); /* -1 when absent */
bool tok_is_special(const struct tok *t, int id);   /* an added token marked special */
/* A "<0xXX>" byte token that the decoder's ByteFallback step turns into its byte. */
bool tok_is_byte_fallback(const struct tok *t, int id);
/* A token that decoding with skip_special drops (HF: a special added token), so that the
 * decoder's steps never see it: a run of byte tokens goes on across it. */
bool tok_is_skipped(const struct tok *t, int id);
int tok_bos(const struct tok *t); /* id of the BOS the post-processor adds, or -1 */
/* id of the first added or vocabulary token among "</s>", "<|endoftext|>", "<eos>",
 * "<|end_of_text|>"; or -1 */
int tok_eos(const struct tok *t);

/* Encodes len bytes of text (any bytes; see above for invalid UTF-8). With add_special,
 * adds what the post-processor template adds (BOS for Llama). *ids is malloc'd (caller
 * frees; non-NULL even when *n is 0), *n its length. Returns WK_OK, or WK_ENOMEM, or
 * WK_ELIMIT when len > TOK_MAX_TEXT. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_special,
	       int **ids, int *n, char *err, size_t errsz);

/* Keeps the ids of segments of TOK_MEMO_MIN bytes or more (the text between two added tokens:
 * a chat's message, a tool's output), within max_bytes (0: none kept, the memo dropped), the
 * least recently used going first: a conversation encoded again at its next turn then costs
 * its new messages (tokenizer_memo.c). tok_encode's ids are the same either way. Call it
 * before the tokenizer is shared between threads. WK_OK or WK_ENOMEM. */
#define TOK_MEMO_MIN 1024
int tok_memo_set(struct tok *t, size_t max_bytes);
struct tok_memo_stats {
	uint64_t hits, misses, evicted, hit_bytes; /* segments, and the bytes the hits held */
	size_t entries, bytes;
};
void tok_memo_stats(const struct tok *t, struct tok_memo_stats *st);

/* Decodes n ids through the tokenizer's decoder into a malloc'd NUL-terminated string
 * (*text, length *len; caller frees). With skip_special, special added tokens are dropped.
 * Byte-fallback runs become their exact bytes, which may not be valid UTF-8: this is the
 * inverse of tok_encode. An id outside the vocabulary is WK_EINVAL; else WK_OK or WK_ENOMEM. */
int tok_decode(const struct tok *t, const int *ids, int n, bool skip_special,
	       char **text, size_t *len, char *err, size_t errsz);

/* As tok_decode, but exactly Hugging Face's decode: always valid UTF-8, a byte-fallback run
 * that is not valid UTF-8 becomes one U+FFFD per byte. For text shown to users or put in
 * JSON. */
int tok_decode_utf8(const struct tok *t, const int *ids, int n, bool skip_special,
		    char **text, size_t *len, char *err, size_t errsz);

/* Writes a Llama-2 style SentencePiece-BPE tokenizer.json for a llama2.c tokenizer file
 * (tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len, bytes).
 * vocab_size is the model's. Merges are derived from the pieces and ordered by the score of
 * the merged piece, which is the order SentencePiece's BPE applies them in. */
int tok_convert_llama2c(const char *tokenizer_bin, int vocab_size, const char *out_json,
			char *err, size_t errsz);

#endif
