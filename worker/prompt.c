/*
 * prompt.c - a job's prompt as the model reads it (worker/prompt.h).
 */
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/prompt.h"

int job_prompt(const struct job_model *md, const struct job *j, bool add_generation_prompt,
	       int **ids, int *n, char *err, size_t errsz)
{
	if (j->prompt_ids) { /* the model's input as it is */
		int V = md->vocab;
		for (int k = 0; k < j->n_prompt_ids; k++)
			if (j->prompt_ids[k] >= V)
				return wk_errf(err, errsz, WK_EINVAL, "input.prompt[%d]: token id %d "
					       "is outside the vocabulary (ids 0 to %d)", k,
					       j->prompt_ids[k], V - 1);
		if (!(*ids = malloc((size_t)j->n_prompt_ids * sizeof **ids)))
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		memcpy(*ids, j->prompt_ids, (size_t)j->n_prompt_ids * sizeof **ids);
		*n = j->n_prompt_ids;
		return WK_OK;
	}
	if (!md->tok)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "the model has no tokenizer.json");
	if (j->prompt)
		return tok_encode(md->tok, j->prompt, strlen(j->prompt), true, ids, n, err, errsz);
	if (j->tools && md->chat == CHAT_PLAIN)
		return wk_errf(err, errsz, WK_EINVAL, "input.tools: this model's chat format (%s) "
			       "has no tool calls", chat_format_name(md->chat));
	if (j->thinking && md->chat == CHAT_PLAIN)
		return wk_errf(err, errsz, WK_EINVAL, "input.thinking: this model's chat format "
			       "(%s) has no thinking", chat_format_name(md->chat));
	int n_calls = 0;
	for (int i = 0; i < j->n_messages; i++)
		n_calls += j->messages[i].n_calls;
	struct chat_msg *m = calloc((size_t)j->n_messages, sizeof *m);
	struct chat_call *calls = calloc((size_t)n_calls + 1, sizeof *calls);
	int rc = m && calls ? WK_OK : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0, c = 0; i < j->n_messages && rc == WK_OK; i++) {
		const struct job_message *jm = &j->messages[i];
		rc = chat_role_parse(jm->role, &m[i].role, err, errsz);
		m[i].content = jm->content;
		m[i].len = strlen(jm->content);
		m[i].calls = jm->n_calls ? calls + c : NULL;
		m[i].n_calls = (size_t)jm->n_calls;
		for (int k = 0; k < jm->n_calls; k++, c++)
			calls[c] = (struct chat_call){
				.name = jm->calls[k].name, .name_len = strlen(jm->calls[k].name),
				.args = jm->calls[k].arguments,
				.args_len = strlen(jm->calls[k].arguments)};
	}
	char *text = NULL;
	size_t len = 0;
	if (rc == WK_OK) /* (a forced call: thinking off, the answer opening with the call) */
		rc = chat_render_tools(md->chat, m, (size_t)j->n_messages, j->tools,
				       j->tools ? strlen(j->tools) : 0,
				       add_generation_prompt && !j->continue_final,
				       j->thinking && !j->forced, &text, &len, err, errsz);
	if (rc == WK_OK && j->forced) {
		size_t fl = strlen(j->forced);
		char *t = realloc(text, len + 11 + fl + 1);
		if (t) {
			memcpy(t + len, "<tool_call>", 11);
			memcpy(t + len + 11, j->forced, fl + 1);
			len += 11 + fl;
			text = t;
		} else {
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		}
	}
	if (rc == WK_EFORMAT) /* (a call's arguments, checked by job_decode: not expected) */
		rc = WK_EINVAL;
	free(m);
	free(calls);
	if (rc == WK_OK)
		rc = tok_encode(md->tok, text, len, md->chat == CHAT_PLAIN, ids, n, err, errsz);
	free(text);
	return rc;
}
