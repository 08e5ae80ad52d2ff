/* Fuzz target: chat messages rendered into prompts, by the two paths that take them: a job's
 * "messages" as the worker admits it (job_decode, chat_role_parse, chat_render) and a
 * messages file as `wick tokenize --chat` reads it (chat_parse_json_tools, with its tools and
 * tool calls, chat_render_tools). Each list that parses is rendered in every format, with and
 * without the generation prompt and thinking, and its GLM renderings read back for tool calls
 * (chat_tool_calls). No crash, and every rendering ends in a NUL at its length, GLM's starts
 * with its prefix, a plain one is exactly the contents one after another, and the content
 * before any calls is within the text. */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/chat.h"
#include "tests/fuzz/fuzz.h"
#include "worker/job.h"

static void render_all(const struct chat_msg *m, size_t n, const char *tools, size_t tools_len)
{
	static const enum chat_format fmts[] = {CHAT_PLAIN, CHAT_GLM, CHAT_GLM45};
	size_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += m[i].len;
	for (size_t f = 0; f < sizeof fmts / sizeof *fmts; f++)
		for (int k = 0; k < 4; k++) {
			char err[WK_ERRSZ], *out = NULL;
			size_t len = 0;
			if (chat_render_tools(fmts[f], m, n, tools, tools_len, k & 1, k & 2, &out, &len,
					      err, sizeof err) != WK_OK) {
				free(out);
				continue;
			}
			if (!out || out[len] || len > CHAT_MAX_TEXT)
				abort();
			if (fmts[f] == CHAT_PLAIN && len != sum)
				abort(); /* plain adds nothing, drops nothing */
			if (fmts[f] == CHAT_GLM && strncmp(out, "[gMASK]<sop>", 12))
				abort();
			char *calls = NULL;
			size_t content = 0;
			if (chat_tool_calls(fmts[f], out, len, tools, tools_len, k, &content, &calls, err,
					    sizeof err) == WK_OK && content > len)
				abort();
			free(calls);
			free(out);
		}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[WK_ERRSZ];
	struct chat_msg *m = NULL;
	size_t n = 0, tools_len = 0;
	char *tools = NULL;
	if (chat_parse_json_tools((const char *)data, size, &m, &n, &tools, &tools_len, err,
				  sizeof err) == WK_OK)
		render_all(m, n, tools, tools_len);
	free(m);
	free(tools);

	struct job j;
	if (job_decode((const char *)data, size, NULL, &j, err, sizeof err) == JOB_OK &&
	    j.n_messages > 0 && (m = calloc((size_t)j.n_messages, sizeof *m))) {
		int rc = WK_OK;
		for (int i = 0; i < j.n_messages && rc == WK_OK; i++) {
			rc = chat_role_parse(j.messages[i].role, &m[i].role, err, sizeof err);
			m[i].content = j.messages[i].content;
			m[i].len = strlen(j.messages[i].content);
		}
		if (rc == WK_OK)
			render_all(m, (size_t)j.n_messages, NULL, 0);
		free(m);
	}
	job_free(&j);
	return 0;
}
