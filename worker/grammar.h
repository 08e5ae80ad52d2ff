/*
 * grammar.h - structured output: a JSON Schema, or "any JSON object", as a recognizer of the
 * output's bytes, and the tokens of a vocabulary that may come next.
 *
 * Pure: no I/O, no globals. A compiled grammar is read-only (share it); a state is a plain
 * value (copy it with =).
 *
 * What is generated always validates against the schema; it need not reach every document
 * the schema allows. So:
 *   - "type": "object" with "properties": only those keys, each at most once, in any order,
 *     and every "required" one before "}" ("additionalProperties" is read as false). Without
 *     "properties": any keys, any values.
 *   - "string" (any text; \uXXXX and the other JSON escapes) with "minLength" and "maxLength"
 *     (characters: code points, an escape one, a surrogate pair's two \u one), and "pattern"
 *     (grammar_re.h's subset of ECMAScript regular expressions, matched on the decoded code
 *     points as they come; such a string takes no \u escape of a surrogate) or "format" (date,
 *     time, date-time, uuid, email, ipv4: written as patterns; a date's day within its month,
 *     February to the 28th), "number" with the same four bounds (then a decimal without an
 *     exponent, at most 18 digits before its point and 17 after, compared as a validator
 *     compares it: the double nearest the decimal against the bounds' doubles) and
 *     "multipleOf" 10^-k (k 1..9: at most k digits after the point) or a positive integer
 *     (its multiples, written as integers), "integer" with "minimum", "maximum",
 *     "exclusiveMinimum", "exclusiveMaximum" and "multipleOf" a positive integer (int64;
 *     each digit only where some multiple in range still begins with the digits), "boolean",
 *     "null"; "enum" and "const" (any JSON values: their compact JSON text, byte for byte);
 *     "array" with "items" (absent: any values), "minItems", "maxItems"; "type" as a list of
 *     types; "anyOf" / "oneOf" whose alternatives begin with different characters (a type
 *     each: an object and a string, a number and null, ...); "$ref" to "#/$defs/NAME" or
 *     "#/definitions/NAME" (recursion included); {} or true: any value.
 *   - Annotations are ignored (title, description, default, examples, $schema, $id, $comment,
 *     strict, readOnly, ...). Any other keyword (another multipleOf, another format, uniqueItems,
 *     allOf, not, if, patternProperties, prefixItems, ...) is refused by name, rather than
 *     generating documents that would not validate; so are the bounds and patterns where no
 *     "type" says what they bound, or beside enum, const, anyOf, oneOf or $ref, and a
 *     pattern with a format.
 * Whitespace between JSON tokens: none, one space or tab, or a newline and then at most
 * GRAM_WS_MAX spaces or tabs (llama.cpp's JSON grammar's rule: a document may be indented,
 * but a model cannot loop on blank lines or spaces); none after the whole document.
 * Numbers: at most GRAM_NUM_MAX bytes.
 * Nesting: GRAM_DEPTH levels.
 */
#ifndef GRAMMAR_H
#define GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAM_DEPTH 32
#define GRAM_WS_MAX 20
#define GRAM_NUM_MAX 32
#define GRAM_LEN_MAX 1000000 /* minLength and maxLength */
#define GRAM_ALTS_MAX 64 /* properties of one object, values of one enum */

struct gram;

struct gram_frame {
	uint16_t node;
	uint8_t kind, phase;
	uint16_t pos;
	uint8_t ws;
	int16_t aux;
	uint64_t seen, cand;
};

/* Where a document stands: the frames of the values it is inside. */
struct gram_state {
	int depth;
	bool done; /* the whole document is there: nothing more may follow */
	struct gram_frame f[GRAM_DEPTH];
};

/* schema[0..len): a JSON Schema's text (response_format json_schema), or NULL: any JSON
 * object (json_object). WK_OK, or WK_EINVAL with a message naming what is not supported
 * (and where: a JSON pointer), or WK_ENOMEM. */
int gram_compile(const char *schema, size_t len, struct gram **out, char *err, size_t errsz);
void gram_free(struct gram *g); /* NULL is fine */

/* The state before the first byte. */
void gram_start(const struct gram *g, struct gram_state *s);
/* Feeds bytes[0..n): true when they continue a document the grammar accepts (s advanced),
 * false when not (s is then unspecified). */
bool gram_feed(const struct gram *g, struct gram_state *s, const char *bytes, size_t n);
/* Whether the bytes so far are a whole document (done, or a number or literal at the top
 * level that may end here). */
bool gram_complete(const struct gram *g, const struct gram_state *s);

/* A vocabulary: each token's bytes (pieces[id][0..lens[id]); lens[id] 0 or pieces[id] NULL:
 * never allowed, as a special token), as a trie. */
struct gram_vocab;
int gram_vocab_new(const char *const *pieces, const size_t *lens, int n,
		   struct gram_vocab **out);
void gram_vocab_free(struct gram_vocab *v);
/* allowed[id] = 1 for each token whose bytes continue s, else 0 (allowed [n]). Returns how
 * many are allowed. Inside a string the tokens without '"', '\\' or control bytes are taken
 * whole (those that fit its maxLength) and the others tried; inside a string with a pattern,
 * which of those plain tokens the automaton's state takes is found by a walk of the trie with
 * the string's frame alone, and kept in v for the GRAM_RE_CACHE states used last (so v is
 * written: one thread at a time); elsewhere the trie is walked, each branch as far as its
 * bytes are accepted. */
#define GRAM_RE_CACHE 8
int gram_allowed(const struct gram *g, struct gram_vocab *v, const struct gram_state *s,
		 unsigned char *allowed);

#endif
