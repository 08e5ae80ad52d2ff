/*
 * split.h - a chat's text, as it is made, cut into its reasoning and its content: GLM's
 * thinking (the text before "</think>" is reasoning; a "<think>" the model writes first, as
 * GLM-4.5 does, is left out; the marker is never emitted) and tool calls (with tools, the
 * content is held back from where a "<tool_call>" may begin, and the whitespace before it;
 * once one has begun, nothing more is content: the calls come whole with the result). So
 * the content emitted is a prefix of the result's text, and the reasoning of its
 * reasoning_content: of split_whole's cut, and of the content before the calls that
 * chat_tool_calls finds in its text (Python's rstrip: the whitespace before a call that may
 * come is held back, Unicode's spaces too). The fuzz target tests/fuzz/split.c checks it.
 * Pure; used by the OpenAI stream (http_api.c) and queue streams (worker.c).
 */
#ifndef SPLIT_H
#define SPLIT_H

#include <stdbool.h>
#include <stddef.h>

struct split {
	bool reasoning;  /* no "</think>" yet (thinking on) */
	bool opened;     /* past the point where a leading "<think>" could be */
	bool tools;      /* the request has tools: hold back what may be a call */
	bool in_calls;   /* a "<tool_call>" came (or the answer is one): no more content */
	char *held;      /* text not yet emitted (malloc'd) */
	size_t held_len;
	size_t sent, rsent; /* bytes of content and of reasoning emitted */
};

/* thinking: the text starts with reasoning; tools: hold back calls; call: the answer is a
 * call (tool_choice forced it), so no content at all. */
void split_init(struct split *s, bool thinking, bool tools, bool call);
void split_free(struct split *s);

/* Takes the next piece of the text; emit(ctx, reasoning, bytes, n) gets what became final,
 * in order. Out of memory, the piece is dropped (the result still has the whole text). */
void split_piece(struct split *s, const char *text, size_t len,
		 void (*emit)(void *ctx, bool reasoning, const char *bytes, size_t n), void *ctx);

/* The whole text's cut, which the stream's pieces are a prefix of: the reasoning (with
 * thinking: the text before the first "</think>", all of it when none came, and a leading
 * "<think>" after whitespace left out) and the text after it (without thinking: all). The
 * spans point into text. */
struct split_cut {
	const char *reasoning, *text;
	size_t reasoning_len, text_len;
};
void split_whole(const char *text, size_t len, bool thinking, struct split_cut *c);

#endif
