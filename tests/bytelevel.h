/*
 * bytelevel.h - the tests' own ByteLevel alphabet (GPT-2's, which GLM's and Qwen's
 * tokenizer.json files use), written from its definition and not from engine/tokenizer.c,
 * so that the tests that build byte-level vocabularies check the tokenizer against it.
 */
#ifndef WICK_TESTS_BYTELEVEL_H
#define WICK_TESTS_BYTELEVEL_H

#include <stdbool.h>

/* The alphabet's character for byte b (printable bytes stand for themselves, the others for
 * 256 + their rank), as UTF-8 into out. */
static inline void bl_char(int b, char out[3])
{
	int c = b, next = 256;
	for (int x = 0; x <= b; x++) {
		bool printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
		c = printable ? x : next++;
	}
	out[0] = c < 0x80 ? (char)c : (char)(0xC0 | c >> 6);
	out[1] = c < 0x80 ? 0 : (char)(0x80 | (c & 0x3F));
	out[2] = 0;
}

#endif
