/*
 * split.h: a chat's text cut into reasoning and content as it comes, whatever the pieces.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "worker/split.h"

struct out {
	char reasoning[256], content[256];
	size_t rn, cn;
};

static void emit(void *ctx, bool reasoning, const char *bytes, size_t n)
{
	struct out *o = ctx;
	char *dst = reasoning ? o->reasoning : o->content;
	size_t *len = reasoning ? &o->rn : &o->cn;
	cr_assert_lt(*len + n, sizeof o->content);
	memcpy(dst + *len, bytes, n);
	*len += n;
	dst[*len] = 0;
}

/* Feeds text in pieces of k bytes (every k from 1 to its length): the same cut each time. */
static void expect_cut(const char *text, bool thinking, bool tools, bool call,
		       const char *reasoning, const char *content)
{
	size_t n = strlen(text);
	for (size_t k = 1; k <= n; k++) {
		struct split s;
		struct out o = {0};
		split_init(&s, thinking, tools, call);
		for (size_t at = 0; at < n; at += k)
			split_piece(&s, text + at, at + k <= n ? k : n - at, emit, &o);
		cr_expect_str_eq(o.reasoning, reasoning, "%s, pieces of %zu", text, k);
		cr_expect_str_eq(o.content, content, "%s, pieces of %zu", text, k);
		cr_expect_eq(s.sent, strlen(content));
		cr_expect_eq(s.rsent, strlen(reasoning));
		split_free(&s);
	}
}

Test(split, reasoning_content_and_calls)
{
	expect_cut("Let me see</think>Sure.", true, false, false, "Let me see", "Sure.");
	expect_cut(" <think>Let me see</think>Sure.", true, false, false, "Let me see", "Sure.");
	expect_cut("Let me see", true, false, false, "Let me see", "");
	expect_cut("a</thin", true, false, false, "a", ""); /* (a marker may still come) */
	expect_cut("Sure. <tool_call>get<arg_key>c</arg_key></tool_call>", false, true, false, "",
		   "Sure.");
	expect_cut("Sure. <tool_ca", false, true, false, "", "Sure."); /* held: may be a call */
	expect_cut("x</think>y <tool_call>f</tool_call> z", true, true, false, "x", "y");
	expect_cut("a <b> c", false, true, false, "", "a <b> c");
	expect_cut("get_weather<arg_key>c</arg_key>", false, true, true, "", "");
	expect_cut("no tools <tool_call>", false, false, false, "", "no tools <tool_call>");
	/* Python's whitespace before a call, as chat_tool_calls strips it: Unicode's spaces
	 * (U+3000, U+00A0) and \f too, even cut inside a character */
	expect_cut("Sure.\xE3\x80\x80\xC2\xA0\f<tool_call>f</tool_call>", false, true, false, "",
		   "Sure.");
	expect_cut("Sure.\xE3\x80\x80 ok", false, true, false, "", "Sure.\xE3\x80\x80 ok");
}
