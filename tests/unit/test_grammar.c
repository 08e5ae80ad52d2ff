/* The structured-output recognizer: JSON Schema and json_object documents, its limits, what it
 * refuses to compile, and gram_allowed against a brute force over gram_feed. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/grammar.h"

#define S_NAME_AGE                                                                         \
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"            \
	"\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}"
#define S_ENUM "{\"enum\": [\"red\", \"green\", 3, null]}"
#define S_BOOLS                                                                            \
	"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}"
#define S_ANYOF                                                                            \
	"{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"object\",\"properties\":"          \
	"{\"a\":{\"const\":1}},\"required\":[\"a\"]}]}"
#define S_LEN "{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}"
#define S_AGE "{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}"
#define S_OBJ_RANGE                                                                        \
	"{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"minimum\":0,"      \
	"\"maximum\":150},\"name\":{\"type\":\"string\",\"maxLength\":3}},"                   \
	"\"required\":[\"age\",\"name\"]}"
#define S_UNIT "{\"type\":\"number\",\"minimum\":0,\"maximum\":1}"
#define S_SEVENS "{\"type\":\"integer\",\"minimum\":100,\"maximum\":110,\"multipleOf\":7}"
#define S_CENTS "{\"type\":\"number\",\"minimum\":0,\"multipleOf\":0.01}"
#define S_LIST                                                                             \
	"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"      \
	"\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}}," \
	"\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}"

static const char *label(const char *schema) { return schema ? schema : "(json_object)"; }

/* Compiles schema (NULL: json_object), which must succeed. */
static struct gram *comp(const char *schema)
{
	struct gram *g = NULL;
	char err[WK_ERRSZ] = "";
	int rc = gram_compile(schema, schema ? strlen(schema) : 0, &g, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "compile %s: %d (%s)", label(schema), rc, err);
	cr_assert_not_null(g, "compile %s: no grammar", label(schema));
	return g;
}

/* doc[0..n) in one gram_feed: accepted and complete. */
static bool whole(const struct gram *g, const char *doc, size_t n)
{
	struct gram_state s;
	gram_start(g, &s);
	if (!gram_feed(g, &s, doc, n))
		return false;
	return gram_complete(g, &s);
}

/* doc[0..n) one byte at a time: every byte accepted, complete at the end. */
static bool bytewise(const struct gram *g, const char *doc, size_t n)
{
	struct gram_state s;
	gram_start(g, &s);
	for (size_t i = 0; i < n; i++)
		if (!gram_feed(g, &s, doc + i, 1))
			return false;
	return gram_complete(g, &s);
}

/* Feeds a C string. */
static bool feeds(const struct gram *g, struct gram_state *s, const char *str)
{
	return gram_feed(g, s, str, strlen(str));
}

/* Both ways must give want. */
static void check_doc(const struct gram *g, const char *schema, const char *doc, size_t n,
		      bool want)
{
	bool w = whole(g, doc, n), b = bytewise(g, doc, n);
	cr_expect_eq(w, want, "schema %s, doc '%.*s' (whole): got %d, want %d", label(schema),
		     (int)n, doc, w, want);
	cr_expect_eq(b, want, "schema %s, doc '%.*s' (byte by byte): got %d, want %d",
		     label(schema), (int)n, doc, b, want);
}

struct doc_case {
	const char *schema; /* NULL: json_object */
	const char *doc;
	bool ok;
};

static const struct doc_case doc_cases[] = {
	/* json_object */
	{NULL, "{}", true},
	{NULL, "{\"a\": [1, 2.5e-3, \"x\", true, null, {\"b\": {}}]}", true},
	{NULL, "{ \"k\" : \"v\" }", true},
	{NULL, "{\"k\": \"v\"} ", false}, /* nothing after the whole document */
	{NULL, "{\"a\":1}", true},
	{NULL, "{\"a\": -0.5E+10, \"b\": 0, \"c\": 10, \"d\": -0}", true},
	{NULL, "[1]", false},		/* must be an object */
	{NULL, "\"s\"", false},
	{NULL, "1", false},
	{NULL, "", false},
	{NULL, "{\"a\": 01}", false},	/* leading zero */
	{NULL, "{\"a\": -}", false},
	{NULL, "{\"a\": 1.}", false},
	{NULL, "{\"a\": .5}", false},
	{NULL, "{\"a\": 1e}", false},
	{NULL, "{\"a\": +1}", false},
	{NULL, "{\"a\": \"\\u00e9\\n\"}", true},
	{NULL, "{\"a\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}", true},
	{NULL, "{\"a\": \"\xc3\xa9\"}", true}, /* raw UTF-8 */
	{NULL, "{\"a\": \"\\x\"}", false},	   /* no such escape */
	{NULL, "{\"a\": \"\\u12G4\"}", false},
	{NULL, "{\"a\": \"x\x01y\"}", false}, /* raw control byte */
	{NULL, "{\"a\": \"x\ny\"}", false},
	{NULL, "{\"a\" 1}", false},
	{NULL, "{\"a\": 1,}", false},
	{NULL, "{,}", false},
	{NULL, "{1: 2}", false},
	{NULL, "{'a': 1}", false},
	{NULL, "{\"a\": tru}", false},
	{NULL, "{\"a\": truex}", false},
	{NULL, "{\"a\": nul}", false},
	{NULL, "{\"a\": [1 2]}", false},
	{NULL, "{\"a\": [,]}", false},
	{NULL, "{\"a\": [1,]}", false},
	{NULL, "{\"a\": [1}", false},
	{NULL, "{\"a\": \"x\"", false}, /* not finished */
	{NULL, "{\"a\": 1}{}", false},
	/* an object with properties, two required */
	{S_NAME_AGE, "{\"name\": \"Bo\", \"age\": 7}", true},
	{S_NAME_AGE, "{\"age\": 7, \"name\": \"Bo\"}", true},
	{S_NAME_AGE, "{\"name\":\"a\\\"b\",\"age\":-3}", true},
	{S_NAME_AGE, "{\"name\": \"Bo\"}", false}, /* "age" is required */
	{S_NAME_AGE, "{}", false},
	{S_NAME_AGE, "{\"name\": \"Bo\", \"age\": 7.5}", false},
	{S_NAME_AGE, "{\"name\": 1, \"age\": 7}", false},
	{S_NAME_AGE, "{\"name\": \"Bo\", \"age\": 7, \"x\": 1}", false},
	{S_NAME_AGE, "{\"nam\": \"Bo\", \"age\": 7}", false},
	{S_NAME_AGE, "{\"names\": \"Bo\", \"age\": 7}", false},
	{S_NAME_AGE, "{\"name\": \"a\", \"name\": \"b\", \"age\": 1}", false},
	{S_NAME_AGE, "[]", false},
	/* optional properties */
	{"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
	 "\"b\":{\"type\":\"boolean\"}}}", "{}", true},
	{"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
	 "\"b\":{\"type\":\"boolean\"}}}", "{\"b\": false}", true},
	{"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
	 "\"b\":{\"type\":\"boolean\"}}}", "{\"b\": 1}", false},
	/* an object without properties: any keys, any values */
	{"{\"type\":\"object\"}", "{\"x\": [1, {\"y\": null}], \"z\": \"w\"}", true},
	{"{\"type\":\"object\"}", "[]", false},
	/* enum and const */
	{S_ENUM, "\"red\"", true},
	{S_ENUM, "\"green\"", true},
	{S_ENUM, "3", true},
	{S_ENUM, "null", true},
	{S_ENUM, "\"blue\"", false},
	{S_ENUM, "\"re\"", false},
	{S_ENUM, "\"redd\"", false},
	{S_ENUM, "30", false},
	{S_ENUM, "3.0", false},
	{S_ENUM, "true", false},
	{"{\"enum\": [{\"a\": [1, 2]}, \"x\"]}", "{\"a\":[1,2]}", true},
	{"{\"enum\": [{\"a\": [1, 2]}, \"x\"]}", "{\"a\":[1,3]}", false},
	{"{\"const\": \"hi\"}", "\"hi\"", true},
	{"{\"const\": \"hi\"}", "\"ho\"", false},
	/* arrays */
	{S_BOOLS, "[true]", true},
	{S_BOOLS, "[true, false]", true},
	{S_BOOLS, "[]", false},
	{S_BOOLS, "[true, true, true]", false},
	{S_BOOLS, "[1]", false},
	{"{\"type\":\"array\"}", "[1, \"a\", {}, []]", true},
	{"{\"type\":\"array\"}", "[]", true},
	{"{\"type\":\"array\"}", "{}", false},
	/* scalars */
	{"{\"type\":\"string\"}", "\"a\\\"b\\\\c\\/\\b\\f\\n\\r\\t\\u0041\"", true},
	{"{\"type\":\"string\"}", "\"x\" ", false},
	{"{\"type\":\"string\"}", "3", false},
	{"{\"type\":\"number\"}", "-1.5e3", true},
	{"{\"type\":\"number\"}", "12 ", false},
	{"{\"type\":\"integer\"}", "42", true},
	{"{\"type\":\"integer\"}", "4.2", false},
	{"{\"type\":\"boolean\"}", "false", true},
	{"{\"type\":\"boolean\"}", "fals", false},
	{"{\"type\":\"null\"}", "null", true},
	{"{\"type\":\"null\"}", "0", false},
	/* a list of types */
	{"{\"type\": [\"string\", \"null\"]}", "\"x\"", true},
	{"{\"type\": [\"string\", \"null\"]}", "null", true},
	{"{\"type\": [\"string\", \"null\"]}", "1", false},
	{"{\"type\": [\"string\", \"null\"]}", "true", false},
	/* anyOf / oneOf */
	{S_ANYOF, "2.5", true},
	{S_ANYOF, "{\"a\": 1}", true},
	{S_ANYOF, "{\"a\": 2}", false},
	{S_ANYOF, "{}", false},
	{S_ANYOF, "\"s\"", false},
	{"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", "\"s\"", true},
	{"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", "null", true},
	{"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}", "0", false},
	/* $ref, recursive */
	{S_LIST, "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", true},
	{S_LIST, "{\"v\": 1, \"next\": null}", true},
	{S_LIST, "{\"v\": 1, \"next\": {\"v\": 2}}", false},
	{S_LIST, "{\"v\": 1, \"next\": 3}", false},
	{"{\"definitions\":{\"b\":{\"type\":\"boolean\"}},\"type\":\"array\","
	 "\"items\":{\"$ref\":\"#/definitions/b\"}}", "[true, false]", true},
	{"{\"definitions\":{\"b\":{\"type\":\"boolean\"}},\"type\":\"array\","
	 "\"items\":{\"$ref\":\"#/definitions/b\"}}", "[1]", false},
	/* {} and true: any value */
	{"{}", "[1, {\"a\": null}]", true},
	{"{}", "\"s\"", true},
	{"{}", "12", true},
	{"{}", "[1,]", false},
	{"true", "{\"x\": 1}", true},
	/* minLength and maxLength: characters (code points), an escape one, a surrogate pair's
	 * two \u escapes one, raw UTF-8 one a sequence */
	{S_LEN, "\"ab\"", true},
	{S_LEN, "\"a\"", false},
	{S_LEN, "\"\"", false},
	{S_LEN, "\"abcd\"", true},
	{S_LEN, "\"abcde\"", false},
	{S_LEN, "\"\\u00e9\\n\"", true},
	{S_LEN, "\"\xc3\xa9\"", false},
	{S_LEN, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", true},
	{S_LEN, "\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"", false},
	{S_LEN, "\"\\ud83d\\ude00x\"", true},
	{S_LEN, "\"\xf0\x9f\x98\x80\"", false},
	{S_LEN, "\"\\\\\\\"\\/\\t\"", true},
	{S_LEN, "\"\\\\\\\"\\/\\t\\n\"", false},
	{"{\"type\":\"string\",\"maxLength\":0}", "\"\"", true},
	{"{\"type\":\"string\",\"maxLength\":0}", "\"a\"", false},
	/* minimum and maximum on an integer, and their exclusive forms (draft 4's too) */
	{S_AGE, "0", true},
	{S_AGE, "-5", true},
	{S_AGE, "-0", true},
	{S_AGE, "120", true},
	{S_AGE, "12", true},
	{S_AGE, "121", false},
	{S_AGE, "-6", false},
	{S_AGE, "1000", false},
	{S_AGE, "-", false},
	{S_AGE, "-50", false},
	{"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "0", false},
	{"{\"type\":\"integer\",\"exclusiveMinimum\":0}", "1", true},
	{"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true}", "0", false},
	{"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true}", "7", true},
	{"{\"type\":\"integer\",\"minimum\":1.5,\"exclusiveMaximum\":3}", "1", false},
	{"{\"type\":\"integer\",\"minimum\":1.5,\"exclusiveMaximum\":3}", "2", true},
	{"{\"type\":\"integer\",\"minimum\":1.5,\"exclusiveMaximum\":3}", "3", false},
	{"{\"type\":\"integer\",\"maximum\":-10}", "-10", true},
	{"{\"type\":\"integer\",\"maximum\":-10}", "-9", false},
	{"{\"type\":\"integer\",\"maximum\":-10}", "-123456789012345678", true},
	{"{\"type\":\"integer\",\"minimum\":10}", "10", true},
	{"{\"type\":\"integer\",\"minimum\":10}", "9", false},
	{"{\"type\":\"integer\",\"minimum\":10}", "9223372036854775807", true},
	{"{\"type\":\"integer\",\"minimum\":10}", "9223372036854775808", false},
	/* multipleOf: an integer's, a number's as an integer's, a number's 10^-k as its
	 * digits after the point (a number's multiples of 3 as integers only: "9.0" is one, but
	 * not one this grammar writes) */
	{"{\"type\":\"integer\",\"multipleOf\":5}", "15", true},
	{"{\"type\":\"integer\",\"multipleOf\":5}", "17", false},
	{"{\"type\":\"integer\",\"multipleOf\":5}", "-10", true},
	{"{\"type\":\"integer\",\"multipleOf\":5}", "0", true},
	{"{\"type\":\"integer\",\"multipleOf\":5}", "9223372036854775805", true},
	{"{\"type\":\"integer\",\"multipleOf\":5}", "9223372036854775807", false},
	{"{\"type\":\"integer\",\"minimum\":1,\"maximum\":12,\"multipleOf\":5}", "10", true},
	{"{\"type\":\"integer\",\"minimum\":1,\"maximum\":12,\"multipleOf\":5}", "0", false},
	{"{\"type\":\"integer\",\"minimum\":1,\"maximum\":12,\"multipleOf\":5}", "15", false},
	{"{\"type\":\"integer\",\"multipleOf\":0.01}", "7", true},
	{"{\"type\":\"number\",\"multipleOf\":3}", "-9", true},
	{"{\"type\":\"number\",\"multipleOf\":3}", "10", false},
	{"{\"type\":\"number\",\"multipleOf\":3}", "9.0", false},
	{"{\"type\":\"number\",\"multipleOf\":1,\"minimum\":0.5}", "1", true},
	{"{\"type\":\"number\",\"multipleOf\":1,\"minimum\":0.5}", "0", false},
	{"{\"type\":\"number\",\"multipleOf\":0.01}", "1.25", true},
	{"{\"type\":\"number\",\"multipleOf\":0.01}", "-0.07", true},
	{"{\"type\":\"number\",\"multipleOf\":0.01}", "3", true},
	{"{\"type\":\"number\",\"multipleOf\":0.01}", "1.255", false},
	{"{\"type\":\"number\",\"multipleOf\":0.01}", "1e2", false},
	{"{\"type\":\"number\",\"multipleOf\":0.1,\"maximum\":1}", "0.9", true},
	{"{\"type\":\"number\",\"multipleOf\":0.1,\"maximum\":1}", "1.1", false},
	{"{\"type\":[\"integer\",\"null\"],\"minimum\":3}", "null", true},
	{"{\"type\":[\"integer\",\"null\"],\"minimum\":3}", "2", false},
	{S_OBJ_RANGE, "{\"age\": 42, \"name\": \"Bob\"}", true},
	{S_OBJ_RANGE, "{\"age\": 151, \"name\": \"Bob\"}", false},
	{S_OBJ_RANGE, "{\"age\": -1, \"name\": \"Bob\"}", false},
	{S_OBJ_RANGE, "{\"name\": \"Bobby\", \"age\": 1}", false},
	/* a number's range: decimals without an exponent, compared as a validator's doubles */
	{S_UNIT, "0.5", true},
	{S_UNIT, "1", true},
	{S_UNIT, "1.000", true},
	{S_UNIT, "0", true},
	{S_UNIT, "-0", true},
	{S_UNIT, "-0.0", true},
	{S_UNIT, "1.0001", false},
	{S_UNIT, "-0.01", false},
	{S_UNIT, "2", false},
	{S_UNIT, "1e0", false},
	{S_UNIT, "0.123456789012345678", false},
	{"{\"type\":\"number\",\"maximum\":0.3}", "0.3", true},
	{"{\"type\":\"number\",\"maximum\":0.3}", "0.30000000000000004", false},
	{"{\"type\":\"number\",\"exclusiveMaximum\":0.3}", "0.3", false},
	{"{\"type\":\"number\",\"exclusiveMaximum\":0.3}", "0.29999", true},
	{"{\"type\":\"number\",\"exclusiveMinimum\":0.1}", "0.10000000000000001", false},
	{"{\"type\":\"number\",\"exclusiveMinimum\":0.1}", "0.100000000000001", true},
	{"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-2.5", true},
	{"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-2.51", false},
	{"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-1", true},
	{"{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":-1}", "-0.5", false},
	{"{\"type\":\"number\",\"minimum\":100}", "12345.5", true},
	{"{\"type\":\"number\",\"minimum\":100}", "99.99", false},
	{"{\"type\":\"number\"}", "1e300", true}, /* unbounded: exponents as before */
};

Test(grammar, accepts_and_refuses_documents)
{
	size_t n = sizeof doc_cases / sizeof doc_cases[0];
	for (size_t i = 0; i < n; i++) {
		const struct doc_case *c = &doc_cases[i];
		struct gram *g = comp(c->schema);
		check_doc(g, c->schema, c->doc, strlen(c->doc), c->ok);
		gram_free(g);
	}
	gram_free(NULL);
}

Test(grammar, top_level_number_is_complete_but_open)
{
	struct gram *g = comp("{\"type\":\"number\"}");
	struct gram_state s, t;
	gram_start(g, &s);
	cr_expect(!gram_complete(g, &s), "complete before any byte");
	cr_assert(feeds(g, &s, "12"));
	cr_expect(gram_complete(g, &s), "\"12\" is a whole number");
	cr_expect(!s.done, "\"12\" may go on, so it is not done");
	t = s;
	cr_expect(feeds(g, &t, "3"), "\"12\" then \"3\"");
	cr_expect(gram_complete(g, &t), "\"123\" is a whole number");
	t = s;
	cr_assert(feeds(g, &t, "."), "\"12.\"");
	cr_expect(!gram_complete(g, &t), "\"12.\" is not a whole number");
	cr_expect(feeds(g, &t, "5"), "\"12.5\"");
	cr_expect(gram_complete(g, &t), "\"12.5\" is a whole number");
	t = s;
	cr_assert(feeds(g, &t, "e"), "\"12e\"");
	cr_expect(!gram_complete(g, &t), "\"12e\" is not a whole number");
	t = s;
	cr_expect(!feeds(g, &t, "x"), "\"12x\"");
	gram_free(g);

	/* a literal at the top level: done at its last byte */
	g = comp("{\"type\":\"boolean\"}");
	gram_start(g, &s);
	cr_assert(feeds(g, &s, "tru"));
	cr_expect(!gram_complete(g, &s), "\"tru\"");
	cr_assert(feeds(g, &s, "e"));
	cr_expect(gram_complete(g, &s), "\"true\"");
	t = s;
	cr_expect(!feeds(g, &t, " "), "a space after \"true\"");
	gram_free(g);
}

/* "{" or "{\"a\":" (pre), then n bytes of c, then post. */
static char *build(const char *pre, char c, size_t n, const char *post)
{
	size_t a = strlen(pre), b = strlen(post);
	char *s = malloc(a + n + b + 1);
	cr_assert_not_null(s);
	memcpy(s, pre, a);
	memset(s + a, c, n);
	memcpy(s + a + n, post, b + 1);
	return s;
}

Test(grammar, whitespace_is_bounded)
{
	struct gram *g = comp(NULL);
	struct {
		const char *pre;
		char c;
		size_t n;
		const char *post;
		bool ok;
	} cases[] = {
		{"{", ' ', 1, "}", true},
		{"{", ' ', 2, "}", false},   /* one space, or a newline and an indent */
		{"{", '\n', 2, "}", false},  /* no blank line */
		{"{\n", ' ', GRAM_WS_MAX, "}", true},
		{"{\n", ' ', GRAM_WS_MAX + 1, "}", false},
		{"{\"a\":\n", '\t', GRAM_WS_MAX, "1}", true},
		{"{\"a\":\n", '\t', GRAM_WS_MAX + 1, "1}", false},
		{"{\"a\":", '\t', 1, "1}", true},
		{"{\"a\":", '\r', 1, "1}", false},
		{"{\"a\": ", '1', GRAM_NUM_MAX, "}", true},
		{"{\"a\": ", '1', GRAM_NUM_MAX + 1, "}", false},
		{"{\"a\": 0.", '5', GRAM_NUM_MAX - 2, "}", true},
		{"{\"a\": 0.", '5', GRAM_NUM_MAX - 1, "}", false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *doc = build(cases[i].pre, cases[i].c, cases[i].n, cases[i].post);
		check_doc(g, NULL, doc, strlen(doc), cases[i].ok);
		free(doc);
	}
	gram_free(g);

	/* a top-level number: the limit with no closing byte */
	g = comp("{\"type\":\"integer\"}");
	char *num = build("", '7', GRAM_NUM_MAX + 1, "");
	cr_expect(whole(g, num, GRAM_NUM_MAX), "a number of GRAM_NUM_MAX bytes");
	cr_expect(!whole(g, num, GRAM_NUM_MAX + 1), "a number of GRAM_NUM_MAX + 1 bytes");
	cr_expect(!bytewise(g, num, GRAM_NUM_MAX + 1), "a number of GRAM_NUM_MAX + 1 bytes");
	free(num);
	gram_free(g);
}

Test(grammar, nesting_is_bounded)
{
	struct gram *g = comp(NULL);
	/* 10 arrays inside the root object */
	char *open = build("{\"a\":", '[', 10, "1"), *close = build("", ']', 10, "}");
	size_t a = strlen(open), b = strlen(close);
	char *doc = malloc(a + b + 1);
	cr_assert_not_null(doc);
	memcpy(doc, open, a);
	memcpy(doc + a, close, b + 1);
	check_doc(g, NULL, doc, a + b, true);
	free(doc);
	free(open);
	free(close);

	/* far past GRAM_DEPTH: refused at some byte */
	struct gram_state s;
	gram_start(g, &s);
	cr_assert(feeds(g, &s, "{\"a\":"));
	bool refused = false;
	for (int i = 0; i < GRAM_DEPTH + 1 && !refused; i++)
		refused = !feeds(g, &s, "[");
	cr_expect(refused, "%d nested arrays accepted", GRAM_DEPTH + 1);

	gram_start(g, &s);
	refused = false;
	for (int i = 0; i < GRAM_DEPTH + 1 && !refused; i++)
		refused = !feeds(g, &s, "{\"a\":");
	cr_expect(refused, "%d nested objects accepted", GRAM_DEPTH + 1);
	gram_free(g);

	/* any value: half the depth is fine at the top level */
	g = comp("{}");
	open = build("", '[', GRAM_DEPTH / 2, "");
	close = build("", ']', GRAM_DEPTH / 2, "");
	gram_start(g, &s);
	cr_expect(gram_feed(g, &s, open, strlen(open)) && gram_feed(g, &s, close, strlen(close)) &&
			  gram_complete(g, &s),
		  "%d nested arrays", GRAM_DEPTH / 2);
	free(open);
	free(close);
	gram_free(g);
}

/* Compiling schema fails with WK_EINVAL and a message that contains word. */
static void refuse(const char *schema, const char *word)
{
	struct gram *g = NULL;
	char err[WK_ERRSZ] = "";
	int rc = gram_compile(schema, strlen(schema), &g, err, sizeof err);
	cr_expect_eq(rc, WK_EINVAL, "compile %s: %d, want WK_EINVAL", schema, rc);
	if (rc == WK_OK) {
		gram_free(g);
		return;
	}
	cr_expect_neq(err[0], 0, "no message for %s", schema);
	if (word)
		cr_expect_not_null(strstr(err, word), "compile %s: message '%s' lacks '%s'", schema,
				   err, word);
}

/* {"type":"object","properties":{"p0":{},...}} with n properties, or an enum of n ints. */
static char *many(int n, bool is_enum)
{
	size_t cap = 64 + (size_t)n * 16;
	char *s = malloc(cap);
	cr_assert_not_null(s);
	const char *head = is_enum ? "{\"enum\":[" : "{\"type\":\"object\",\"properties\":{";
	size_t off = (size_t)snprintf(s, cap, "%s", head);
	for (int i = 0; i < n; i++)
		off += (size_t)snprintf(s + off, cap - off, is_enum ? "%s%d" : "%s\"p%d\":{}",
					i ? "," : "", i);
	snprintf(s + off, cap - off, "%s", is_enum ? "]}" : "}}");
	return s;
}

Test(grammar, refuses_what_it_cannot_honour)
{
	refuse("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
	refuse("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreference");
	refuse("{\"type\":\"string\",\"pattern\":\"a\\\\bc\"}", "\\b");
	refuse("{\"type\":\"string\",\"pattern\":\"a^b\"}", "^");
	refuse("{\"type\":\"string\",\"pattern\":\"a{3\"}", "}");
	refuse("{\"type\":\"string\",\"pattern\":\"[^\u00e9]\"}", "negated");
	refuse("{\"type\":\"string\",\"pattern\":\"a{64}\"}", "63");
	refuse("{\"type\":\"string\",\"pattern\":\"(a\"}", ")");
	refuse("{\"type\":\"string\",\"pattern\":\"a)\"}", ")");
	refuse("{\"type\":\"string\",\"pattern\":\"*a\"}", "nothing to repeat");
	refuse("{\"type\":\"string\",\"pattern\":7}", "pattern");
	refuse("{\"type\":\"string\",\"format\":\"uri\"}", "\"uri\"");
	refuse("{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"a\"}", "together");
	refuse("{\"pattern\":\"a\"}", "pattern");
	refuse("{\"minLength\":1}", "minLength"); /* no type says what it bounds */
	refuse("{\"enum\":[\"a\"],\"type\":\"string\",\"minLength\":2}", "minLength");
	refuse("{\"type\":\"string\",\"minLength\":-1}", "minLength");
	refuse("{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "maxLength");
	refuse("{\"type\":\"string\",\"maxLength\":\"2\"}", "maxLength");
	refuse("{\"type\":\"number\",\"minimum\":1,\"maximum\":0.5}", "no number");
	refuse("{\"type\":\"number\",\"minimum\":1,\"exclusiveMaximum\":1}", "no number");
	refuse("{\"type\":\"number\",\"maximum\":\"1\"}", "maximum");
	refuse("{\"type\":\"number\",\"exclusiveMaximum\":false}", "exclusive");
	refuse("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer");
	refuse("{\"type\":\"integer\",\"minimum\":1.2,\"maximum\":1.8}", "no integer");
	refuse("{\"type\":\"integer\",\"minimum\":\"0\"}", "minimum");
	refuse("{\"type\":\"integer\",\"exclusiveMinimum\":true}", "exclusive");
	refuse("{\"type\":\"integer\",\"multipleOf\":2.5}", "multipleOf");
	refuse("{\"type\":\"integer\",\"multipleOf\":0}", "multipleOf");
	refuse("{\"type\":\"integer\",\"multipleOf\":\"2\"}", "multipleOf");
	refuse("{\"type\":\"number\",\"multipleOf\":0.3}", "multipleOf");
	refuse("{\"type\":\"integer\",\"minimum\":1,\"maximum\":4,\"multipleOf\":5}",
	       "multiple");
	refuse("{\"multipleOf\":2}", "multipleOf");
	refuse("{\"allOf\":[{\"type\":\"string\"}]}", "allOf");
	refuse("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
	refuse("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"}]}", "prefixItems");
	refuse("{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}", "patternProperties");
	refuse("{\"not\":{\"type\":\"string\"}}", "not");
	refuse("{\"if\":{\"type\":\"string\"},\"then\":{}}", "if");
	/* where: a JSON pointer */
	refuse("{\"type\":\"object\",\"properties\":"
	       "{\"x\":{\"type\":\"string\",\"pattern\":\"(?!a)\"}}}",
	       "/properties/x");
	/* alternatives that begin with the same character */
	refuse("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{}}},"
	       "{\"type\":\"object\",\"properties\":{\"b\":{}}}]}",
	       "anyOf");
	refuse("{\"anyOf\":[{\"type\":\"string\"},{\"const\":\"x\"}]}", "anyOf");
	refuse("{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", "oneOf");
	/* a $ref to nothing */
	refuse("{\"$ref\":\"#/$defs/missing\"}", "missing");
	refuse("{\"$defs\":{\"a\":{}},\"$ref\":\"#/$defs/missing\"}", "missing");
	/* not JSON */
	refuse("{\"type\": ", NULL);
	refuse("not json", NULL);
	refuse("{\"type\": \"string\"} x", NULL);
	refuse("[1, 2]", NULL);
	refuse("{\"type\":\"strung\"}", "strung");

	/* GRAM_ALTS_MAX properties, and enum values */
	char *s = many(GRAM_ALTS_MAX + 1, false);
	refuse(s, NULL);
	free(s);
	s = many(GRAM_ALTS_MAX + 1, true);
	refuse(s, NULL);
	free(s);
	s = many(GRAM_ALTS_MAX, false);
	struct gram *g = comp(s);
	char last[64];
	snprintf(last, sizeof last, "{\"p%d\": 1, \"p0\": [2]}", GRAM_ALTS_MAX - 1);
	check_doc(g, s, last, strlen(last), true);
	snprintf(last, sizeof last, "{\"p%d\": 1}", GRAM_ALTS_MAX);
	check_doc(g, s, last, strlen(last), false);
	gram_free(g);
	free(s);
	s = many(GRAM_ALTS_MAX, true);
	g = comp(s);
	snprintf(last, sizeof last, "%d", GRAM_ALTS_MAX - 1);
	check_doc(g, s, last, strlen(last), true);
	snprintf(last, sizeof last, "%d", GRAM_ALTS_MAX);
	check_doc(g, s, last, strlen(last), false);
	gram_free(g);
	free(s);

	/* annotations are ignored */
	const char *ann = "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\","
			  "\"$id\":\"x\",\"$comment\":\"c\",\"title\":\"T\",\"description\":\"D\","
			  "\"type\":\"object\",\"default\":{\"a\":1},\"examples\":[{\"a\":2}],"
			  "\"properties\":{\"a\":{\"type\":\"integer\",\"description\":\"an a\","
			  "\"title\":\"A\",\"default\":0,\"readOnly\":true}},\"strict\":true,"
			  "\"required\":[\"a\"],\"additionalProperties\":false}";
	g = comp(ann);
	const char *ok = "{\"a\": 5}", *bad = "{\"b\": 5}";
	check_doc(g, ann, ok, strlen(ok), true);
	check_doc(g, ann, bad, strlen(bad), false);
	gram_free(g);
}

/* Tokens for gram_allowed: JSON punctuation, pieces of keys and values, escapes, UTF-8, and
 * three that must never be allowed (NULL, "", NULL with a length). */
static const char *const pieces[] = {
	"{", "}", "\"", "{\"", "\":", "\": \"", "\",", ", \"", "name", "age", "\"name", "\"age",
	" ", "\n", "  ", "\t", "1", "12", "7.", "5", "0", "00", ".5", "e", "e+", "E-", "-", "true",
	"tr", "ue", "false", "null", "\"}", "\\\"", "\\\\", "\\u00e9", "\\u", "\\x", "abc", "a\"b",
	"\xc3\xa9", "\xc3", "]", "[", ",", ":", "\x01", "\"\n", "red", "\"red\"", "3", "Bo",
	" \"", "\"age\": ", "}}", "1}", "\"v\"", "next", NULL, "", NULL,
};

/* At every prefix of doc: gram_allowed agrees with feeding each piece to a copy. */
static void walk(const struct gram *g, struct gram_vocab *v, const size_t *lens, int n,
		 const char *schema, const char *doc)
{
	unsigned char allowed[sizeof pieces / sizeof pieces[0]];
	size_t len = strlen(doc);
	struct gram_state s;
	gram_start(g, &s);
	for (size_t i = 0; i <= len; i++) {
		memset(allowed, 0xAA, sizeof allowed);
		int count = gram_allowed(g, v, &s, allowed);
		int ones = 0;
		for (int id = 0; id < n; id++) {
			bool want = false;
			if (pieces[id] && lens[id]) {
				struct gram_state t = s;
				want = gram_feed(g, &t, pieces[id], lens[id]);
			}
			cr_expect(allowed[id] == 0 || allowed[id] == 1,
				  "schema %s after '%.*s': allowed[%d] = %d", label(schema),
				  (int)i, doc, id, allowed[id]);
			const char *p = pieces[id] ? pieces[id] : "(null)";
			cr_expect_eq(allowed[id], want,
				     "schema %s after '%.*s': piece %d '%s' allowed %d, fed %d",
				     label(schema), (int)i, doc, id, p, allowed[id], want);
			ones += allowed[id] == 1;
		}
		cr_expect_eq(count, ones, "schema %s after '%.*s': returned %d, %d set",
			     label(schema), (int)i, doc, count, ones);
		if (i < len)
			cr_assert(gram_feed(g, &s, doc + i, 1), "schema %s: '%.*s' refused",
				  label(schema), (int)i + 1, doc);
	}
	cr_expect(gram_complete(g, &s), "schema %s: '%s' not complete", label(schema), doc);
}

Test(grammar, allowed_matches_brute_force)
{
	enum { N = sizeof pieces / sizeof pieces[0] };
	size_t lens[N];
	for (int i = 0; i < N; i++)
		lens[i] = pieces[i] ? strlen(pieces[i]) : 0;
	lens[N - 1] = 3; /* NULL with a length: still never allowed */
	struct gram_vocab *v = NULL;
	cr_assert_eq(gram_vocab_new(pieces, lens, N, &v), WK_OK);
	cr_assert_not_null(v);

	static const struct {
		const char *schema, *doc;
	} walks[] = {
		{NULL, "{\"name\": \"a\\\"b\\u00e9 \xc3\xa9\\\\\", "
		       "\"n\": [1, -2.5e+3, 12, true, null, false],\n  \"o\": {}, \"p\": 0.5E-1}"},
		{NULL, "{}"},
		{S_NAME_AGE, "{\"age\": 12, \"name\": \"Bo \\\"x\\\"\"}"},
		{S_NAME_AGE, "{\"name\":\"abc\",\"age\":-5}"},
		{S_ENUM, "\"red\""},
		{S_ENUM, "\"green\""},
		{S_ENUM, "3"},
		{S_ENUM, "null"},
		{S_ANYOF, "{\"a\": 1}"},
		{S_ANYOF, "2.5"},
		{S_BOOLS, "[true, false]"},
		{S_LIST, "{\"v\": 1, \"next\": {\"next\": null, \"v\": 2}}"},
		{"{\"type\": [\"string\", \"null\"]}", "\"a\\u00e9\""},
		{S_LEN, "\"abc\""},
		{S_LEN, "\"\\u00e9\xc3\xa9\\\"r\""},
		{S_AGE, "-5"},
		{S_AGE, "120"},
		{S_AGE, "7"},
		{S_OBJ_RANGE, "{\"name\": \"Bo\", \"age\": 12}"},
		{"{\"type\":\"string\",\"pattern\":\"^[a-z]{2}\\\\d+$\"}", "\"ab12\""},
		{"{\"type\":\"string\",\"pattern\":\"e\"}", "\"r\\u00e9e\""},
		{"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-01-05\""},
		{S_UNIT, "0.75"},
		{S_SEVENS, "105"},
		{S_CENTS, "12.5"},
		{"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":3}}",
		 "[12, -3, 0]"},
		{"{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-3,"
		 "\"exclusiveMaximum\":12.5}}", "[-3, 12, 0.5, 12.49]"},
	};
	for (size_t w = 0; w < sizeof walks / sizeof walks[0]; w++) {
		struct gram *g = comp(walks[w].schema);
		walk(g, v, lens, N, walks[w].schema, walks[w].doc);
		gram_free(g);
	}
	gram_vocab_free(v);
	gram_vocab_free(NULL);
}

Test(grammar, state_is_a_value)
{
	struct gram *g = comp(NULL);
	struct gram_state s, t, u;
	gram_start(g, &s);
	cr_assert(feeds(g, &s, "{\"a\": "));
	t = s;
	u = s;
	cr_expect(!feeds(g, &u, "}"), "'{\"a\": }'");
	cr_expect(feeds(g, &t, "\"x\"}"), "'{\"a\": \"x\"}'");
	cr_expect(gram_complete(g, &t));
	/* the original did not move */
	cr_expect(!gram_complete(g, &s));
	cr_expect(!s.done);
	cr_assert(feeds(g, &s, "1"), "'{\"a\": 1'");
	cr_expect(!gram_complete(g, &s));
	t = s;
	cr_expect(feeds(g, &t, "}"));
	cr_expect(gram_complete(g, &t));
	cr_expect(t.done);
	cr_expect(!feeds(g, &t, "}"), "a second '}'");
	/* the original still inside the number and the object */
	cr_expect(!gram_complete(g, &s));
	cr_expect(feeds(g, &s, "2, \"b\": [true]}"));
	cr_expect(gram_complete(g, &s));
	gram_free(g);

	/* one grammar, two states at once */
	g = comp(S_NAME_AGE);
	gram_start(g, &s);
	gram_start(g, &t);
	cr_assert(feeds(g, &s, "{\"name\": \"x\", "));
	cr_assert(feeds(g, &t, "{\"age\": 1, "));
	u = s;
	cr_expect(!feeds(g, &u, "\"name\""), "name twice");
	u = t;
	cr_expect(!feeds(g, &u, "\"age\""), "age twice");
	cr_expect(feeds(g, &s, "\"age\": 2}"));
	cr_expect(feeds(g, &t, "\"name\": \"y\"}"));
	cr_expect(gram_complete(g, &s) && gram_complete(g, &t));
	gram_free(g);
}

static uint64_t lcg(uint64_t *x)
{
	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	return *x >> 33;
}

Test(grammar, no_crash_on_garbage)
{
	static const char alpha[] = "{}[]\":,  \n0123456789.-+eEtrufalsn\\u\"abc\x01\xc3\xa9";
	const char *schemas[] = {NULL, S_NAME_AGE, S_LIST, "{}"};
	uint64_t x = 12345;
	char buf[64];
	for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
		struct gram *g = comp(schemas[k]);
		for (int r = 0; r < 400; r++) {
			size_t n = lcg(&x) % sizeof buf;
			/* most strings start like a document, so that they get somewhere */
			size_t i = 0;
			if (n && lcg(&x) % 4)
				buf[i++] = '{';
			for (; i < n; i++)
				buf[i] = lcg(&x) % 8 ? alpha[lcg(&x) % (sizeof alpha - 1)]
						     : (char)(lcg(&x) & 0xff);
			struct gram_state s, t;
			gram_start(g, &s);
			gram_start(g, &t);
			bool w = gram_feed(g, &s, buf, n), b = true;
			for (i = 0; i < n && b; i++)
				b = gram_feed(g, &t, buf + i, 1);
			cr_expect_eq(w, b, "schema %s, '%.*s': whole %d, byte by byte %d",
				     label(schemas[k]), (int)n, buf, w, b);
			if (w && b)
				cr_expect_eq(gram_complete(g, &s), gram_complete(g, &t),
					     "schema %s, '%.*s'", label(schemas[k]), (int)n, buf);
		}
		gram_free(g);
	}

	/* schemas with one byte changed: compile or refuse, never crash */
	const char *base = S_LIST;
	size_t len = strlen(base);
	char *mut = malloc(len + 1);
	cr_assert_not_null(mut);
	for (int r = 0; r < 300; r++) {
		memcpy(mut, base, len + 1);
		mut[lcg(&x) % len] = alpha[lcg(&x) % (sizeof alpha - 1)];
		struct gram *g = NULL;
		char err[WK_ERRSZ] = "";
		int rc = gram_compile(mut, len, &g, err, sizeof err);
		cr_expect(rc == WK_OK || rc == WK_EINVAL, "compile %s: %d", mut, rc);
		if (rc != WK_OK) {
			cr_expect_neq(err[0], 0, "no message for %s", mut);
			continue;
		}
		struct gram_state s;
		gram_start(g, &s);
		if (feeds(g, &s, "{\"v\": 1, \"next\": null}"))
			(void)gram_complete(g, &s);
		gram_free(g);
	}
	free(mut);
}

/* schema takes prefix or not (fed), and then is whole or not (complete; -1: either). */
static void expect_prefix(const char *schema, const char *prefix, bool fed, int complete)
{
	struct gram *g = comp(schema);
	struct gram_state s;
	gram_start(g, &s);
	bool took = feeds(g, &s, prefix);
	cr_expect_eq(took, fed, "%s: '%s' fed %d", schema, prefix, took);
	if (took && complete >= 0)
		cr_expect_eq(gram_complete(g, &s), complete, "%s: '%s' complete", schema, prefix);
	gram_free(g);
}

/* A bounded integer takes a digit only where some integer in range still begins with the
 * digits, so a model is never led into a number it cannot finish; and its end (or its
 * completeness at the top level) needs the value in range. */
Test(grammar, integer_digits_stay_in_range)
{
	static const struct {
		const char *schema, *prefix;
		bool fed, complete;
	} cases[] = {
		{S_AGE, "12", true, true},       {S_AGE, "120", true, true},
		{S_AGE, "121", false, false},    {S_AGE, "130", false, false},
		{S_AGE, "-5", true, true},       {S_AGE, "-6", false, false},
		{S_AGE, "-", true, false},       {S_AGE, "00", false, false},
		{S_AGE, "1000", false, false},
		{"{\"type\":\"integer\",\"minimum\":10}", "9", true, false},
		{"{\"type\":\"integer\",\"minimum\":10}", "90", true, true},
		{"{\"type\":\"integer\",\"minimum\":10}", "0", false, false},
		{"{\"type\":\"integer\",\"minimum\":10}", "-", false, false},
		{"{\"type\":\"integer\",\"maximum\":-10}", "-1", true, false},
		{"{\"type\":\"integer\",\"maximum\":-10}", "-0", false, false},
		{"{\"type\":\"integer\",\"minimum\":0,\"maximum\":0}", "-0", true, true},
		/* numbers: a digit only where the decimal may still land in range */
		{S_UNIT, "0.", true, false},
		{S_UNIT, "1.", true, false},
		{S_UNIT, "1.0", true, true},
		{S_UNIT, "1.1", false, false},
		{S_UNIT, "10", false, false},
		{S_UNIT, "-", true, false},
		{S_UNIT, "-1", false, false},
		{S_UNIT, "0.5e", false, false},
		{"{\"type\":\"number\",\"minimum\":100}", "9", true, false},
		{"{\"type\":\"number\",\"minimum\":100}", "9.", false, false},
		{"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-", true, false},
		{"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-0", true, false},
		{"{\"type\":\"number\",\"exclusiveMaximum\":0}", "-0.001", true, true},
		{"{\"type\":\"number\",\"exclusiveMaximum\":0}", "0", false, false},
		/* multipleOf: a digit only where a multiple may still follow */
		{S_SEVENS, "10", true, false},  {S_SEVENS, "105", true, true},
		{S_SEVENS, "101", false, false}, {S_SEVENS, "11", false, false},
		{S_SEVENS, "1", true, false},   {S_SEVENS, "2", false, false},
		{S_SEVENS, "-", false, false},
		{"{\"type\":\"integer\",\"maximum\":0,\"multipleOf\":4}", "-", true, false},
		{"{\"type\":\"integer\",\"maximum\":-1,\"multipleOf\":4}", "-3", true, false},
		{"{\"type\":\"integer\",\"maximum\":-1,\"multipleOf\":4}", "-4", true, true},
		{"{\"type\":\"integer\",\"maximum\":-1,\"multipleOf\":4}", "-0", false, false},
		{S_CENTS, "1.2", true, true},   {S_CENTS, "1.23", true, true},
		{S_CENTS, "1.234", false, false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		expect_prefix(cases[i].schema, cases[i].prefix, cases[i].fed, cases[i].complete);
	/* in an object: "1" then "5" then "1" is 151, past 150 */
	struct gram *g = comp(S_OBJ_RANGE);
	struct gram_state s;
	gram_start(g, &s);
	cr_expect(feeds(g, &s, "{\"age\": 15"));
	struct gram_state t = s;
	cr_expect(!feeds(g, &t, "1"), "151 taken");
	t = s;
	cr_expect(feeds(g, &t, "0, \"name\": \"abc\"}") && gram_complete(g, &t));
	t = s;
	cr_expect(!feeds(g, &t, "0, \"name\": \"abcd"), "a 4th character past maxLength 3");
	gram_free(g);
}

/* A pattern's strings: a UTF-8 sequence is taken byte by byte only where some code point it
 * may still become can come, so no lead byte is taken where no character can follow. */
Test(grammar, pattern_takes_no_byte_that_leads_nowhere)
{
	static const struct {
		const char *schema, *prefix;
		bool fed;
	} cases[] = {
		{"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", "\"ab", true},
		{"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", "\"\xc3", false},
		{"{\"type\":\"string\",\"pattern\":\"^[\\u00e0-\\u00ff]+$\"}", "\"\xc3", true},
		{"{\"type\":\"string\",\"pattern\":\"^[\\u00e0-\\u00ff]+$\"}", "\"\xc3\x80", false},
		{"{\"type\":\"string\",\"pattern\":\"^[\\u00e0-\\u00ff]+$\"}", "\"\xc4", false},
		{"{\"type\":\"string\",\"pattern\":\"^[\\u00e0-\\u00ff]+$\"}", "\"\xc3\xa9", true},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xe2\x80\xa8", false},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xf0\x9f\x98\x80", true},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\xed\xa0", false},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\ud83d", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"12", true},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"12\"", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"1234", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\u0031", true},
		/* a \u escape's digits as they come: U+0030..U+0039 are digits, U+01xx none */
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\", true},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\u00", true},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\u003", true},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\u01", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\u004", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"\\ua", false},
		{"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}", "\"123\\", false},
		{"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", "\"a\\u006", true},
		{"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"}", "\"a\\u007b", false},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\ud", true},
		{"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\ud8", false},
		{"{\"type\":\"string\",\"format\":\"date\"}", "\"2023-02-29", false},
		{"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-04-30", true},
		{"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-04-31", false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		expect_prefix(cases[i].schema, cases[i].prefix, cases[i].fed, -1);
}
