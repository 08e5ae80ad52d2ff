/*
 * grammar_re.h - the regular expressions of structured output (a string's "pattern", and the
 * "format"s written as one), compiled to a position automaton (Glushkov's) over code points.
 *
 * Pure, no allocation. The subset of ECMAScript's syntax JSON Schema uses: literals (UTF-8
 * text), ".", the escapes \d \D \w \W \s \S \t \n \r \f \v \0 \xHH \uHHHH and any escaped
 * punctuation, classes [...] and [^...] with ranges and those escapes, groups (...), (?:...)
 * and (?<name>...), "|", and the quantifiers * + ? {n} {n,} {n,m} (lazy or not: the same
 * strings). "^" may only begin the pattern and "$" only end it; without them it matches
 * anywhere in the string, as JSON Schema reads a pattern. Lookaround, backreferences, \b and
 * flags are refused by name. At most GRE_POS_MAX positions (a character class each, a bounded
 * repetition's copies counted).
 *
 * What a class allows beyond ASCII is kept to a subset where the syntax means more: ".", the
 * negated escapes and negated classes allow every non-ASCII code point but Unicode's spaces and
 * line terminators, and a class lists at most GRE_RANGES_MAX non-ASCII ranges. A string the
 * automaton accepts always matches the pattern; some that match are not accepted.
 */
#ifndef GRAMMAR_RE_H
#define GRAMMAR_RE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRE_POS_MAX 63
#define GRE_RANGES_MAX 4
#define GRE_START (1ull << 63) /* the state before the first code point */

enum { GRE_WIDE_NONE, GRE_WIDE_ALL, GRE_WIDE_RANGES };

struct gre_cls {
	uint64_t ascii[2];   /* code points 0..127 */
	uint8_t wide;        /* beyond ASCII: none, all (but spaces), or the ranges */
	uint8_t n_ranges;
	uint32_t lo[GRE_RANGES_MAX], hi[GRE_RANGES_MAX];
};

struct gre {
	int n;                            /* positions */
	struct gre_cls cls[GRE_POS_MAX];  /* each position's class */
	uint64_t first, last;             /* positions that may begin, and end, a match */
	uint64_t follow[GRE_POS_MAX];     /* positions that may follow each */
	bool nullable;                    /* the empty string matches */
};

/* pat[0..len): the pattern's UTF-8 text. WK_OK, or WK_EINVAL with a message naming what is
 * not supported. */
int gre_compile(const char *pat, size_t len, struct gre *r, char *err, size_t errsz);

/* The state after code point cp from state set (GRE_START to begin); 0: cp cannot come. */
uint64_t gre_step(const struct gre *r, uint64_t set, uint32_t cp);
/* Whether some code point in [lo, hi] may come next. */
bool gre_may(const struct gre *r, uint64_t set, uint32_t lo, uint32_t hi);
/* Whether the code points so far make a match. */
bool gre_accepts(const struct gre *r, uint64_t set);

#endif
