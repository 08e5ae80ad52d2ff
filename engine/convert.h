/*
 * convert.h - turn other checkpoint formats into Hugging Face model directories.
 */
#ifndef CONVERT_H
#define CONVERT_H

#include <stddef.h>

/* Converts a llama2.c checkpoint (version 0: a header of seven int32 — dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size (negative when the classifier is not shared),
 * seq_len — then f32 weights) and its tokenizer.bin into out_dir (created if needed):
 * config.json, model.safetensors (f32, Hugging Face names, q/k rows permuted from llama2.c's
 * interleaved RoPE pairs to rotate_half), tokenizer.json, tokenizer_config.json and
 * generation_config.json. Sizes are checked against the file before any read. */
int conv_llama2c(const char *model_bin, const char *tokenizer_bin, const char *out_dir,
		 char *err, size_t errsz);

#endif
