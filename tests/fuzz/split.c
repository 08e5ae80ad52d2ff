/* Fuzz target: a chat's text streamed through split_piece in arbitrary pieces, against the
 * whole text's cut as the worker makes the result (split_whole, then chat_tool_calls' content
 * before the calls, GLM's form). What the stream emits must be a prefix of the result's
 * reasoning and of its content, since the stream's end sends the rest from there
 * (worker.c, http_api.c); with the reasoning's end seen it is all the reasoning, and without
 * tools all the content. Input: a flags byte (thinking, tools, a forced call), a seed for
 * the pieces' lengths (1 to 16 bytes), then the text. */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "tests/fuzz/fuzz.h"
#include "worker/split.h"

struct out {
	char *r, *c;
	size_t rn, cn;
};

static void emit(void *ctx, bool reasoning, const char *bytes, size_t n)
{
	struct out *o = ctx;
	char **dst = reasoning ? &o->r : &o->c;
	size_t *len = reasoning ? &o->rn : &o->cn;
	char *p = realloc(*dst, *len + n);
	if (!p)
		abort();
	memcpy(p + *len, bytes, n);
	*dst = p;
	*len += n;
}

static bool prefix(const char *a, size_t an, const char *b, size_t bn)
{
	return an <= bn && (!an || !memcmp(a, b, an));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	bool thinking = data[0] & 1, tools = data[0] & 2, call = data[0] & 4;
	uint32_t seed = data[1] * 2654435761u + 1;
	const char *text = (const char *)data + 2;
	size_t len = size - 2;

	struct split s;
	struct out o = {0};
	split_init(&s, thinking, tools, call);
	for (size_t at = 0; at < len;) {
		seed = seed * 1103515245u + 12345u;
		size_t k = 1 + (seed >> 16) % 16;
		k = k < len - at ? k : len - at;
		split_piece(&s, text + at, k, emit, &o);
		at += k;
	}
	if (s.sent != o.cn || s.rsent != o.rn)
		abort();

	struct split_cut cut;
	split_whole(text, len, thinking, &cut);
	size_t content = cut.text_len;
	char *calls = NULL;
	if (tools && !call &&
	    chat_tool_calls(CHAT_GLM, cut.text, cut.text_len, NULL, 0, 0, &content, &calls, NULL,
			    0) != WK_OK)
		abort(); /* (out of memory) */
	free(calls);
	if (!prefix(o.r, o.rn, cut.reasoning, cut.reasoning_len) ||
	    !prefix(o.c, o.cn, cut.text, content))
		abort();
	bool ended = !thinking || memmem(text, len, "</think>", 8);
	if (thinking && ended && o.rn != cut.reasoning_len)
		abort(); /* the reasoning's end came: all of it was emitted */
	if (ended && !tools && !call && o.cn != content)
		abort(); /* no calls to wait for: all the content was emitted */
	if (call && o.cn)
		abort(); /* a forced call has no content */
	split_free(&s);
	free(o.r);
	free(o.c);
	return 0;
}
