/* split.c - see split.h. */
#include "worker/split.h"

#include <stdlib.h>
#include <string.h>

#include "engine/chat.h"

void split_init(struct split *s, bool thinking, bool tools, bool call)
{
	*s = (struct split){.reasoning = thinking, .tools = tools, .in_calls = call};
}

void split_free(struct split *s)
{
	free(s->held);
	s->held = NULL;
	s->held_len = 0;
}

/* Where in the held text tag begins (*hit), or else the bytes before the longest tail that
 * could begin it. */
static size_t before_tag(const struct split *s, const char *tag, bool *hit)
{
	size_t tl = strlen(tag);
	const char *at = memmem(s->held, s->held_len, tag, tl);
	*hit = at != NULL;
	if (at)
		return (size_t)(at - s->held);
	for (size_t k = tl - 1; k > 0; k--)
		if (k <= s->held_len && !memcmp(s->held + s->held_len - k, tag, k))
			return s->held_len - k;
	return s->held_len;
}

/* Emits the held text's first n bytes (as reasoning or content) and drops them and skip
 * bytes more. */
static void send(struct split *s, size_t n, size_t skip, bool reasoning,
		 void (*emit)(void *, bool, const char *, size_t), void *ctx)
{
	if (n)
		emit(ctx, reasoning, s->held, n);
	*(reasoning ? &s->rsent : &s->sent) += n;
	memmove(s->held, s->held + n + skip, s->held_len - n - skip);
	s->held_len -= n + skip;
}

/* n less the bytes of a UTF-8 sequence that s[0..n) ends inside of (it may be whitespace). */
static size_t whole_chars(const char *s, size_t n)
{
	for (size_t k = 1; k <= 3 && k <= n; k++) {
		unsigned char c = (unsigned char)s[n - k];
		if ((c & 0xC0) != 0x80) {
			size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
			return need > k ? n - k : n;
		}
	}
	return n;
}

void split_piece(struct split *s, const char *text, size_t len,
		 void (*emit)(void *ctx, bool reasoning, const char *bytes, size_t n), void *ctx)
{
	if ((s->in_calls && !s->reasoning) || !len)
		return;
	char *p = realloc(s->held, s->held_len + len);
	if (!p)
		return;
	memcpy(p + s->held_len, text, len);
	s->held = p;
	s->held_len += len;
	bool hit;
	if (s->reasoning && !s->opened) { /* as the worker's reasoning: a leading <think> out */
		size_t k = 0;
		while (k < s->held_len && (s->held[k] == ' ' || s->held[k] == '\n'))
			k++;
		size_t m = s->held_len - k < 7 ? s->held_len - k : 7;
		if (m < 7 && !memcmp(s->held + k, "<think>", m))
			return; /* (it may still be one) */
		if (m == 7 && !memcmp(s->held + k, "<think>", 7))
			send(s, 0, k + 7, true, emit, ctx);
		s->opened = true;
	}
	if (s->reasoning) {
		size_t n = before_tag(s, "</think>", &hit);
		send(s, n, hit ? 8 : 0, true, emit, ctx);
		if (!hit)
			return;
		s->reasoning = false;
	}
	if (s->in_calls)
		return;
	size_t n = s->tools ? before_tag(s, "<tool_call>", &hit) : s->held_len;
	s->in_calls = s->tools && hit;
	if (s->tools) /* whitespace before a call is not content (chat_tool_calls' rstrip) */
		n = chat_rstrip_len(s->held, whole_chars(s->held, n));
	send(s, n, 0, false, emit, ctx);
}

void split_whole(const char *text, size_t len, bool thinking, struct split_cut *c)
{
	*c = (struct split_cut){.text = text, .text_len = len};
	if (!thinking)
		return;
	const char *end = memmem(text, len, "</think>", 8);
	c->reasoning = text;
	c->reasoning_len = end ? (size_t)(end - text) : len;
	size_t k = 0; /* GLM-4.5's prompt ends before <think>: the model writes it */
	while (k < c->reasoning_len && (text[k] == ' ' || text[k] == '\n'))
		k++;
	if (c->reasoning_len - k >= 7 && !memcmp(text + k, "<think>", 7)) {
		c->reasoning += k + 7;
		c->reasoning_len -= k + 7;
	}
	c->text = end ? end + 8 : "";
	c->text_len = end ? len - (size_t)(end - text) - 8 : 0;
}
