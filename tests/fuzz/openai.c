/* Fuzz target: an OpenAI request body through oai_to_job (chat and completion) and through
 * the Responses and Messages APIs' translations (then oai_to_job), the API keys file
 * parser, and the response builders on a result (logprobs in both shapes, echo's, several
 * choices', a response object and its stream's events): no crash, no leak; a request that is
 * accepted always yields job documents (one a choice) that job_decode accepts, and every error
 * has a message. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "tests/fuzz/fuzz.h"
#include "worker/http_int.h"
#include "worker/job.h"

/* msgs as the Responses API's items (what input_items lists), read back as a request's
 * input: NULL where that is refused. */
static json_t *items_back(const json_t *msgs)
{
	json_t *body = json_object(), *chat = NULL, *skel = NULL;
	struct oai_err e;
	char *text = NULL;
	if (!body || json_object_set_new(body, "input", oai_messages_items(msgs, SIZE_MAX, NULL)) ||
	    !(text = json_dumps(body, 0)) ||
	    oai_responses_to_chat(text, strlen(text), &chat, &skel, &e))
		chat = NULL;
	json_t *back = json_incref(json_object_get(chat, "messages"));
	json_decref(chat);
	json_decref(skel);
	free(text);
	json_decref(body);
	return back;
}

/* The body as a POST /v1/responses or /v1/messages: accepted, its chat request runs as one
 * job; a response's messages (where it has any: an input of reasoning items alone has none),
 * listed as items (as input_items lists them) and read back as input, are the same
 * messages. */
static json_t *api_request(const struct oai_api *api, const uint8_t *data, size_t size)
{
	json_t *chat, *skel;
	struct oai_err e;
	int st = api->to_chat((const char *)data, size, &chat, &skel, &e);
	if (st) {
		if (chat || skel || st < 400 || st > 599 || !e.message[0])
			abort();
		return NULL;
	}
	if (api == &oai_responses_api && json_array_size(json_object_get(chat, "messages"))) {
		json_t *back = items_back(json_object_get(chat, "messages"));
		if (!back || !json_equal(back, json_object_get(chat, "messages")))
			abort();
		json_decref(back);
	}
	char *body = json_dumps(chat, JSON_COMPACT);
	json_decref(chat);
	struct oai_req r;
	st = body ? oai_to_job(OAI_CHAT, body, strlen(body), "m", "resp_1", "t", 64, &r, &e) : 500;
	free(body);
	if (st) {
		api->err(&e);
		json_decref(api->error(&e));
		if (!e.message[0])
			abort();
		return skel;
	}
	struct job j;
	char err[WK_ERRSZ];
	if (r.n_choices != 1 || job_decode(r.jobs[0], r.job_lens[0], NULL, &j, err, sizeof err))
		abort();
	job_free(&j);
	oai_req_free(&r);
	return skel;
}

/* A result in an API's shape, whole and streamed (its text in two pieces, its reasoning
 * first). */
static void response_of(const struct oai_api *api, const uint8_t *data, size_t size,
			const struct oai_result *res)
{
	json_t *skel = json_object();
	json_decref(api->object(skel, "resp_1", 1, "m", res));
	struct oai_rstream s;
	if (oai_rstream_init(&s, skel, "resp_1", 1, "m", data[0] & 1) == WK_OK) {
		json_decref(api->start(&s));
		if (res->reasoning)
			json_decref(api->text(&s, true, res->reasoning, res->reasoning_len, NULL));
		size_t cut = res->text_len ? data[size - 1] % (res->text_len + 1) : 0;
		json_decref(api->text(&s, false, res->text, cut, res->logprobs));
		json_decref(api->text(&s, false, res->text + cut, res->text_len - cut, NULL));
		json_decref(api->end(&s, res));
		struct oai_err e;
		oai_errf(&e, 500, "server_error", NULL, NULL, "x");
		json_decref(api->fail(&s, &e));
	}
	oai_rstream_free(&s);
	json_decref(skel);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_decref(api_request(&oai_responses_api, data, size));
	json_decref(api_request(&oai_messages_api, data, size));
	for (int k = 0; k < 2; k++) {
		struct oai_req r;
		struct oai_err e;
		int st = oai_to_job(k ? OAI_COMPLETION : OAI_CHAT, (const char *)data, size,
				    k ? "m" : "m\nclaude-*\ngpt-[0-9]?*", "chatcmpl-1", "t", 64, &r,
				    &e); /* (chat: with --model-alias globs) */
		if (st) {
			if (r.jobs || st < 400 || st > 599 || !e.message[0])
				abort();
			json_decref(oai_error_json(&e));
			continue;
		}
		if (r.n_choices < 1 || r.n_choices > OAI_CHOICES_MAX || r.per_prompt < 1 ||
		    r.n_choices % r.per_prompt)
			abort();
		for (int c = 0; c < r.n_choices; c++) { /* every choice's job, not only those checked */
			struct job j;
			char err[WK_ERRSZ];
			if (job_decode(r.jobs[c], r.job_lens[c], NULL, &j, err, sizeof err) != JOB_OK)
				abort();
			job_free(&j);
		}
		oai_req_free(&r);
	}
	struct http_key *keys = NULL;
	int n = 0;
	char err[WK_ERRSZ];
	http_keys_parse((const char *)data, size, "fuzz", &keys, &n, err, sizeof err);
	for (int i = 0; i < n; i++)
		free(keys[i].key);
	free(keys);
	struct oai_result res;
	if (oai_result_parse((const char *)data, size, &res) == WK_OK) {
		json_decref(oai_response(OAI_CHAT, "x", 1, "m", &res));
		json_decref(oai_chunk(OAI_COMPLETION, "x", 1, "m", res.text, res.text_len, false, NULL));
		json_decref(oai_usage_chunk(OAI_CHAT, "x", 1, "m", &res));
		if (res.tool_calls)
			json_decref(oai_calls_chunk("x", 1, "m", &res));
		if (res.reasoning)
			json_decref(oai_reasoning_chunk("x", 1, "m", res.reasoning, res.reasoning_len));
		if (res.logprobs) { /* the legacy shape, and a chunk's */
			json_decref(oai_response(OAI_COMPLETION, "x", 1, "m", &res));
			size_t at = 0;
			json_t *c = oai_chunk(OAI_CHAT, "x", 1, "m", "", 0, false, NULL);
			json_t *l = oai_logprobs(OAI_COMPLETION, res.logprobs, &at);
			oai_chunk_logprobs(c, l);
			json_decref(l);
			json_decref(c);
		}
		struct oai_result three[3] = {res, res, res}; /* several choices, usage summed */
		json_decref(oai_response_n(OAI_COMPLETION, "x", 1, "m", three, 3, 2));
		struct oai_result sum;
		if (oai_usage_sum(three, 3, 1, &sum) == WK_OK)
			json_decref(oai_usage_chunk(OAI_COMPLETION, "x", 1, "m", &sum));
		oai_result_free(&sum);
		if (res.prompt_logprobs) { /* echo: the prompt first, whole and a stream's */
			res.echo = true;
			json_decref(oai_response(OAI_COMPLETION, "x", 1, "m", &res));
			size_t at = 0;
			json_decref(oai_echo_chunk("x", 1, "m", res.prompt_logprobs, true, &at));
			res.plp = true; /* vLLM's prompt_logprobs, a completion's and a chat's */
			res.plp_top = data[0] % 4;
			res.echo_top = data[size - 1] % 3;
			json_decref(oai_response(OAI_COMPLETION, "x", 1, "m", &res));
			json_decref(oai_response(OAI_CHAT, "x", 1, "m", &res));
		}
		response_of(&oai_responses_api, data, size, &res);
		response_of(&oai_messages_api, data, size, &res);
		struct oai_err e;
		oai_result_error(&res, &e);
		oai_result_free(&res);
	}
	return 0;
}
