/*
 * tokenizer.h - encode and decode with a Hugging Face tokenizer.json.
 *
 * Kinds:
 *   - SentencePiece-BPE (Llama-2 style): normalizer Prepend("▁") + Replace(" ", "▁") (or the
 *     older Metaspace pre-tokenizer), model BPE with byte_fallback and fuse_unk, decoder
 *     Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0).
 *   - byte-level BPE (GPT-2/GLM style) is designed to fit beside it (a later issue).
 *
 * Added tokens (the tokenizer.json "added_tokens" list, e.g. "<s>") are split out of the input
 * text before the model runs, as Hugging Face tokenizers does by default.
 *
 * Invalid UTF-8 in the input: each byte that is not part of a valid UTF-8 sequence is encoded
 * through byte fallback as its <0xXX> token, so decode(encode(s)) == s for any bytes s.
 * (Hugging Face's library only accepts valid Unicode strings; on valid UTF-8 the two agree.)
 *
 * A struct tok is immutable after load and safe to use from many threads.
 */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>

#define TOK_MAX_FILE (64u << 20)   /* bytes of tokenizer.json */
#define TOK_MAX_VOCAB (1 << 22)    /* entries in the vocabulary */
#define TOK_MAX_PIECE 256          /* bytes in one vocabulary piece */

struct tok; /* opaque */

/* Loads path (a tokenizer.json). Refuses an unsupported model/normalizer/decoder kind with
 * WK_EUNSUPPORTED and a message naming it. */
int tok_load(const char *path, struct tok **out, char *err, size_t errsz);
void tok_free(struct tok *t); /* NULL is fine */

int tok_vocab_size(const struct tok *t);      /* highest id + 1, added tokens included */
const char *tok_piece(const struct tok *t, int id); /* the vocabulary string, or NULL */
int tok_id(const struct tok *t, const char *piece); /* -1 when absent */
bool tok_is_special(const struct tok *t, int id);   /* an added token marked special */
int tok_bos(const struct tok *t); /* id of the BOS the post-processor adds, or -1 */
int tok_eos(const struct tok *t); /* id of "</s>" or the equivalent, or -1 */

/* Encodes len bytes of text. With add_special, prepends what the post-processor template
 * adds (BOS for Llama). *ids is malloc'd (caller frees), *n its length.
 * Returns WK_OK, or WK_ENOMEM / WK_ELIMIT. */
int tok_encode(const struct tok *t, const char *text, size_t len, bool add_special,
	       int **ids, int *n, char *err, size_t errsz);

/* Decodes n ids through the tokenizer's decoder into a malloc'd NUL-terminated string
 * (*text, length *len; caller frees). With skip_special, special added tokens are dropped.
 * An id outside the vocabulary is WK_EINVAL. */
int tok_decode(const struct tok *t, const int *ids, int n, bool skip_special,
	       char **text, size_t *len, char *err, size_t errsz);

/* Writes a Llama-2 style SentencePiece-BPE tokenizer.json for a llama2.c tokenizer file
 * (tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len, bytes).
 * vocab_size is the model's. Merges are derived from the pieces and ordered by the score of
 * the merged piece, which is the order SentencePiece's BPE applies them in. */
int tok_convert_llama2c(const char *tokenizer_bin, int vocab_size, const char *out_json,
			char *err, size_t errsz);

#endif
