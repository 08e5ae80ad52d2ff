/*
 * The HTTP endpoint's pure parts (worker/http_openai.c): OpenAI requests into job documents,
 * errors in OpenAI's shape, results into responses, and the API keys file.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/convert.h"
#include "engine/tokenizer.h"
#include "worker/http_int.h"
#include "worker/job.h"
#include "worker/prompt.h"
#include "worker/sched.h"

static json_t *job_of(enum oai_kind k, const char *body, struct oai_req *r)
{
	struct oai_err e;
	int st = oai_to_job(k, body, strlen(body), "stories260K", "chatcmpl-1", "team-a", 100, r, &e);
	cr_assert_eq(st, 0, "%d %s", st, e.message);
	json_t *j = json_loads(r->jobs[0], 0, NULL);
	cr_assert_not_null(j);
	return j;
}

static struct oai_err err_of(enum oai_kind k, const char *body)
{
	struct oai_req r;
	struct oai_err e;
	int st = oai_to_job(k, body, strlen(body), "stories260K", "chatcmpl-1", "team-a", 100, &r, &e);
	cr_assert_neq(st, 0, "accepted: %s", body);
	cr_assert_eq(st, e.status);
	cr_assert_null(r.jobs);
	return e;
}

Test(http, chat_becomes_a_job)
{
	struct oai_req r;
	json_t *j = job_of(OAI_CHAT,
			   "{\"model\": \"stories260K\", \"stream\": true, \"stream_options\": "
			   "{\"include_usage\": true}, \"temperature\": 0.5, \"stop\": [\"x\"], "
			   "\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
			   "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Once \"}, "
			   "{\"type\": \"text\", \"text\": \"upon\"}]}, {\"role\": \"assistant\", "
			   "\"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": "
			   "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}], "
			   "\"user\": \"ignored\", \"presence_penalty\": 0}",
			   &r);
	cr_expect(r.stream);
	cr_expect(r.include_usage);
	cr_expect_str_eq(json_string_value(json_object_get(j, "id")), "chatcmpl-1");
	cr_expect_str_eq(json_string_value(json_object_get(j, "tenant")), "team-a");
	json_t *in = json_object_get(j, "input");
	json_t *m = json_object_get(in, "messages");
	cr_assert_eq(json_array_size(m), 3);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "content")),
			 "Once upon");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "content")), "");
	cr_expect_eq(json_integer_value(json_object_get(in, "max_tokens")), 100,
		     "no max_tokens means the server's limit");
	cr_expect_eq(json_real_value(json_object_get(in, "temperature")), 0.5);
	cr_expect_str_eq(json_string_value(json_array_get(json_object_get(in, "stop"), 0)), "x");
	cr_expect_null(json_object_get(in, "user"));
	json_decref(j);
	oai_req_free(&r);
}

/* OpenAI answers 400 for a message without content; only an assistant message that carries
 * tool_calls (or function_call) may have none. */
Test(http, chat_content_is_required)
{
	static const struct {
		const char *messages, *message;
	} bad[] = {
		{"[{\"role\": \"user\"}]", "messages[0].content: missing (role user)"},
		{"[{\"role\": \"user\", \"content\": null}]", "messages[0].content: null (role user)"},
		{"[{\"role\": \"system\", \"content\": null}, {\"role\": \"user\", \"content\": \"a\"}]",
		 "messages[0].content: null (role system)"},
		{"[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\"}]",
		 "messages[1].content: missing (role assistant)"},
		{"[{\"role\": \"tool\", \"content\": null}]", "messages[0].content: null (role tool)"},
		{"[{\"role\": \"user\", \"content\": null, \"tool_calls\": [{}]}]",
		 "messages[0].content: null (role user)"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char body[512];
		snprintf(body, sizeof body, "{\"messages\": %s}", bad[i].messages);
		struct oai_err e = err_of(OAI_CHAT, body);
		cr_expect_eq(e.status, 400, "%s", body);
		cr_expect_str_eq(e.code, "invalid_input", "%s", body);
		cr_expect_str_eq(e.param, "messages", "%s", body);
		cr_expect(strstr(e.message, bad[i].message) == e.message, "%s: %s", body, e.message);
		cr_expect(strstr(e.message, "a string or a list of text parts") != NULL, "%s",
			  e.message);
	}
	struct oai_req r;
	json_t *j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
				     "{\"role\": \"assistant\", \"function_call\": {\"name\": \"f\", "
				     "\"arguments\": \"{}\"}}, {\"role\": \"user\", \"content\": \"\"}]}",
			   &r);
	json_t *m = json_object_get(json_object_get(j, "input"), "messages");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 1), "content")), "");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(m, 2), "content")), "",
			 "an empty string is content");
	json_decref(j);
	oai_req_free(&r);
}

Test(http, completion_becomes_a_job)
{
	struct oai_req r;
	json_t *j = job_of(OAI_COMPLETION, "{\"prompt\": [\"Once\"], \"max_tokens\": 7, \"seed\": 3}",
			   &r);
	json_t *in = json_object_get(j, "input");
	cr_expect_str_eq(json_string_value(json_object_get(in, "prompt")), "Once");
	cr_expect_eq(json_integer_value(json_object_get(in, "max_tokens")), 7);
	cr_expect_eq(json_integer_value(json_object_get(in, "seed")), 3);
	cr_expect(!r.stream);
	json_decref(j);
	oai_req_free(&r);
	/* chat's max_completion_tokens is honoured on completions too, not ignored */
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"Once\", \"max_completion_tokens\": 2}", &r);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "input"), "max_tokens")), 2);
	json_decref(j);
	oai_req_free(&r);
	/* a predicted output becomes input.prediction, text parts joined; a bad one is refused */
	j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
			     "\"prediction\": {\"type\": \"content\", \"content\": [{\"type\": "
			     "\"text\", \"text\": \"def f():\"}, {\"type\": \"text\", \"text\": "
			     "\" pass\"}]}}", &r);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "input"),
							   "prediction")), "def f(): pass");
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"Once\", \"prediction\": {\"type\": "
				   "\"content\", \"content\": \"upon a time\"}}", &r);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "input"),
							   "prediction")), "upon a time");
	json_decref(j);
	oai_req_free(&r);
	static const char *const bad_pred[] = {
		"\"prediction\": \"text\"", "\"prediction\": {\"type\": \"text\", \"content\": \"x\"}",
		"\"prediction\": {\"type\": \"content\"}",
		"\"prediction\": {\"type\": \"content\", \"content\": 5}",
		"\"prediction\": {\"type\": \"content\", \"content\": [{\"type\": \"image\"}]}"};
	for (size_t i = 0; i < sizeof bad_pred / sizeof bad_pred[0]; i++) {
		char body[256];
		snprintf(body, sizeof body, "{\"prompt\": \"a\", %s}", bad_pred[i]);
		struct oai_err pe = err_of(OAI_COMPLETION, body);
		cr_expect_eq(pe.status, 400, "%s", body);
		cr_expect_str_eq(pe.param, "prediction", "%s", body);
	}
	/* max_completion_tokens wins over max_tokens for chat */
	j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
			     "\"max_tokens\": 50, \"max_completion_tokens\": 9}", &r);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "input"), "max_tokens")), 9);
	json_decref(j);
	oai_req_free(&r);
}

/* --model-alias: the served name exactly, or an alias's glob; the error names the served one */
Test(http, a_model_alias_is_a_glob)
{
	const char *names = "glm-5\nclaude-*\ngpt-4?";
	static const char *const ok[] = {"glm-5", "claude-sonnet-4-5-20250929", "claude-", "gpt-4o"};
	static const char *const no[] = {"glm", "glm-5x", "glm-5\nclaude-x", "gpt-4", "gpt-4oo",
					 "Claude-x", ""};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		cr_expect(oai_model_ok(names, ok[i]), "%s", ok[i]);
	for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
		cr_expect_not(oai_model_ok(names, no[i]), "%s", no[i]);
	cr_expect(oai_model_ok("m\n*", "anything/at-all:1"));
	cr_expect_not(oai_model_ok("m", "*"));
	struct oai_req r;
	struct oai_err e;
	const char *body = "{\"model\": \"claude-haiku\", \"messages\": [{\"role\": \"user\", "
			   "\"content\": \"a\"}]}";
	cr_expect_eq(oai_to_job(OAI_CHAT, body, strlen(body), names, "c-1", "t", 100, &r, &e), 0);
	oai_req_free(&r);
	body = "{\"model\": \"llama\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}";
	cr_expect_eq(oai_to_job(OAI_CHAT, body, strlen(body), names, "c-1", "t", 100, &r, &e), 404);
	cr_expect(strstr(e.message, "serves 'glm-5'") && !strstr(e.message, "claude"), "%s",
		  e.message);
}

Test(http, errors_are_openai_shaped)
{
	struct oai_err e = err_of(OAI_CHAT, "{nope");
	cr_expect_eq(e.status, 400);
	cr_expect_str_eq(e.code, "invalid_json");
	e = err_of(OAI_CHAT, "{\"model\": \"gpt-4o\", \"messages\": []}");
	cr_expect_eq(e.status, 404);
	cr_expect_str_eq(e.code, "model_not_found");
	cr_expect_str_eq(e.param, "model");
	e = err_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
			     "\"max_completion_tokens\": 101}");
	cr_expect_str_eq(e.code, "max_tokens_range");
	cr_expect_str_eq(e.param, "max_completion_tokens");
	cr_expect(strstr(e.message, "1 to 100") != NULL, "%s", e.message);
	static const char *const bad_n[] = {"0", "129", "\"2\"", "1.5", "-1"};
	for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
		char body[200];
		snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": "
			 "\"a\"}], \"n\": %s}", bad_n[i]);
		e = err_of(OAI_CHAT, body);
		cr_expect_str_eq(e.param, "n", "%s", body);
		cr_expect(strstr(e.message, "1 to 128") != NULL, "%s", e.message);
	}
	/* what sampling cannot honour, or a value out of range, is refused by name, not
	 * ignored; neutral values pass */
	static const char *const refused[][2] = {
		{"\"presence_penalty\": 2.5", "presence_penalty"},
		{"\"frequency_penalty\": \"x\"", "frequency_penalty"},
		{"\"repetition_penalty\": 0", "repetition_penalty"},
		{"\"logit_bias\": {\"a\": -100}", "logit_bias"},
		{"\"logit_bias\": {\"50\": -101}", "logit_bias"},
		{"\"response_format\": {\"type\": \"xml\"}", "response_format"},
		{"\"response_format\": \"json\"", "response_format"},
		{"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
		 "{\"type\": \"string\", \"pattern\": \"(?=a)\"}}}", "response_format"},
		{"\"functions\": [{\"name\": \"f\"}]", "functions"},
		{"\"function_call\": {\"name\": \"f\"}", "function_call"},
		{"\"tool_choice\": \"required\"", "tool_choice"},
		{"\"top_logprobs\": 3", "top_logprobs"}, /* (without logprobs true) */
		{"\"logprobs\": true, \"top_logprobs\": 21", "top_logprobs"},
		{"\"logprobs\": 1", "logprobs"},
		{"\"stream_options\": {\"include_usage\": true}", "stream_options"}};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		char body[512];
		snprintf(body, sizeof body,
			 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], %s}",
			 refused[i][0]);
		e = err_of(OAI_CHAT, body);
		cr_expect_eq(e.status, 400, "%s", body);
		cr_expect_str_eq(e.param, refused[i][1], "%s", body);
	}
	struct oai_req r;
	json_t *ok = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
				      "\"presence_penalty\": 0, \"frequency_penalty\": 0.0, "
				      "\"logit_bias\": {}, \"response_format\": {\"type\": \"text\"}, "
				      "\"functions\": [], \"tool_choice\": \"none\", \"function_call\": "
				      "\"auto\", \"top_logprobs\": 0}",
			    &r);
	json_decref(ok);
	oai_req_free(&r);
	e = err_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
			     "\"top_p\": 7}");
	cr_expect_str_eq(e.code, "invalid_input");
	cr_expect(strstr(e.message, "top_p") == e.message, "the job's \"input.\" is dropped: %s",
		  e.message);
	cr_expect_str_eq(e.param, "top_p", "a job error names its parameter");
	e = err_of(OAI_COMPLETION, "{\"prompt\": [1, \"a\"]}");
	cr_expect_str_eq(e.param, "prompt");
	cr_expect(strstr(e.message, "prompt[1] must be a token id") == e.message, "%s", e.message);
	e = err_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"stream\": \"yes\"}");
	cr_expect_str_eq(e.param, "stream");
	e = err_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
			     "\"image_url\"}]}]}");
	cr_expect_eq(e.status, 400);
	json_t *j = oai_error_json(&e);
	json_t *o = json_object_get(j, "error");
	cr_expect(json_is_string(json_object_get(o, "message")));
	cr_expect_str_eq(json_string_value(json_object_get(o, "type")), "invalid_request_error");
	cr_expect(json_is_string(json_object_get(o, "code")));
	cr_expect(json_is_string(json_object_get(o, "param")));
	json_decref(j);
}

Test(http, results_become_responses)
{
	const char *ok = "{\"id\": \"chatcmpl-1\", \"status\": \"COMPLETED\", \"output\": {\"text\": "
			 "\"Lily\", \"token_ids\": [1], \"finish_reason\": \"length\"}, \"usage\": "
			 "{\"prompt_tokens\": 3, \"completion_tokens\": 1, \"queue_seconds\": 0.1, "
			 "\"gpu_seconds\": 0.2, \"cost_usd\": 0.000002, \"cost_micro_usd\": 2}}";
	struct oai_result r;
	cr_assert_eq(oai_result_parse(ok, strlen(ok), &r), WK_OK);
	cr_expect(r.completed);
	json_t *j = oai_response(OAI_CHAT, "chatcmpl-1", 5, "m", &r);
	json_t *c = json_array_get(json_object_get(j, "choices"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c, "message"), "content")),
			 "Lily");
	cr_expect_str_eq(json_string_value(json_object_get(c, "finish_reason")), "length");
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 4);
	cr_expect_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
	json_decref(j);
	j = oai_chunk(OAI_COMPLETION, "cmpl-1", 5, "m", "ab", 2, false, NULL);
	c = json_array_get(json_object_get(j, "choices"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(c, "text")), "ab");
	cr_expect(json_is_null(json_object_get(c, "finish_reason")));
	json_decref(j);
	cr_expect_null(oai_chunk(OAI_CHAT, "x", 5, "m", "\xff", 1, false, NULL), "invalid UTF-8");
	oai_result_free(&r);

	static const struct { const char *code; int status; } map[] = {
		{"prompt_too_long", 400}, {"invalid_input", 400}, {"timeout", 504},
		{"cancelled", 503}, {"engine_error", 500}, {"internal", 500}};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
		char doc[256];
		snprintf(doc, sizeof doc, "{\"status\": \"FAILED\", \"error\": {\"code\": \"%s\", "
					  "\"message\": \"m\"}}", map[i].code);
		cr_assert_eq(oai_result_parse(doc, strlen(doc), &r), WK_OK);
		cr_expect(!r.completed);
		struct oai_err e;
		oai_result_error(&r, &e);
		cr_expect_eq(e.status, map[i].status, "%s", map[i].code);
		cr_expect_str_eq(e.code, map[i].code);
		oai_result_free(&r);
	}
	cr_expect_eq(oai_result_parse("[", 1, &r), WK_EFORMAT);
}

/* A model can emit a NUL byte (a byte-fallback token <0x00>): the result carries it as
 * \u0000 and the response must carry it too, not fail as "unreadable". */
Test(http, a_result_with_a_nul_byte_is_served)
{
	size_t len;
	char *json = job_encode_result(&(struct job_result){.id = "cmpl-1", .status = JOB_COMPLETED,
							    .text = "a\0b", .text_len = 3,
							    .worker = "w", .attempt = 1},
				       &len);
	cr_assert_not_null(json);
	cr_expect_not_null(strstr(json, "a\\u0000b"), "%s", json);
	struct oai_result r;
	cr_assert_eq(oai_result_parse(json, len, &r), WK_OK, "%s", json);
	cr_expect(r.completed);
	cr_expect_eq(r.text_len, 3);
	cr_expect_eq(memcmp(r.text, "a\0b", 3), 0);
	json_t *j = oai_response(OAI_COMPLETION, "cmpl-1", 5, "m", &r);
	const json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
	cr_expect_eq(json_string_length(t), 3);
	json_decref(j);
	oai_result_free(&r);
	free(json);
}

static void free_keys(struct http_key *k, int n)
{
	for (int i = 0; i < n; i++)
		free(k[i].key);
	free(k);
}

Test(http, keys_file)
{
	const char *good = "# comment\n\nsk-alpha team-a\r\n  sk-beta\tteam-b  \n";
	struct http_key *k = NULL;
	int n = 0;
	char err[WK_ERRSZ];
	cr_assert_eq(http_keys_parse(good, strlen(good), "keys", &k, &n, err, sizeof err), WK_OK, "%s",
		     err);
	cr_assert_eq(n, 2);
	cr_expect_str_eq(http_keys_find(k, n, "sk-beta", 7), "team-b");
	cr_expect_str_eq(http_keys_find(k, n, "sk-alpha", 8), "team-a");
	cr_expect_null(http_keys_find(k, n, "sk-alph", 7));
	cr_expect_null(http_keys_find(k, n, "sk-alphaa", 9));
	cr_expect_null(http_keys_find(k, n, "", 0));
	free_keys(k, n);

	static const char *const bad[] = {"sk-1 t1\nsk-2\n", "sk-1 t1 x\n", "sk-1 t/1\n",
					  "sk-1 t1\nsk-1 t2\n"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		k = NULL;
		n = 0;
		cr_expect_neq(http_keys_parse(bad[i], strlen(bad[i]), "keys", &k, &n, err, sizeof err),
			      WK_OK, "%s", bad[i]);
		cr_expect(strstr(err, "keys: line ") == err, "%s", err);
		cr_expect(strstr(err, "sk-") == NULL, "a key in the message: %s", err);
		free_keys(k, n);
	}
}

/* ---- the server itself, with the test standing in for the worker thread ---- */

#include <curl/curl.h>
#include <pthread.h>
#include <unistd.h>

#include "common/wk.h"
#include "worker/http_api.h"

struct call {
	char url[512];
	const char *body;      /* NULL: GET */
	const char *key;
	const char *x_api_key; /* sent as Anthropic's clients send a key */
	int abort_after;       /* >0: drop the connection after this many bytes */
	long timeout_ms;       /* >0: drop it after this long (20 s otherwise) */
	long status;
	char out[8192];
	size_t len;
};

static size_t on_data(char *p, size_t sz, size_t n, void *arg)
{
	struct call *c = arg;
	size_t k = sz * n;
	if (c->len + k >= sizeof c->out)
		k = sizeof c->out - 1 - c->len;
	memcpy(c->out + c->len, p, k);
	c->len += k;
	c->out[c->len] = 0;
	return c->abort_after && c->len >= (size_t)c->abort_after ? 0 : sz * n;
}

static void *do_call(void *arg)
{
	struct call *c = arg;
	CURL *h = curl_easy_init();
	struct curl_slist *hd = NULL;
	char auth[300];
	if (c->key) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->key);
		hd = curl_slist_append(hd, auth);
	}
	if (c->x_api_key) {
		snprintf(auth, sizeof auth, "x-api-key: %s", c->x_api_key);
		hd = curl_slist_append(hd, auth);
	}
	curl_easy_setopt(h, CURLOPT_URL, c->url);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	if (c->body)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
	if (c->timeout_ms > 0)
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, c->timeout_ms);
	else
		curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
	curl_easy_perform(h);
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
	curl_slist_free_all(hd);
	curl_easy_cleanup(h);
	return NULL;
}

static struct http_api *srv;
static char base[160];

/* The suite's server makes every completion request into its jobs on a parser thread, beside
 * its own (a_model_alias_is_served's on its own thread). */
static void start_server(void)
{
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .max_tokens_limit = 50, .parse_threads = 1, .parse_min = 1};
	char bound[100], err[WK_ERRSZ];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	snprintf(base, sizeof base, "http://%s", bound);
}

static void stop_server(void)
{
	http_api_stop(srv);
	srv = NULL;
}

TestSuite(http_server, .init = start_server, .fini = stop_server);

static long get(const char *path, const char *key, char *out, size_t n)
{
	struct call c = {.key = key};
	snprintf(c.url, sizeof c.url, "%s%s", base, path);
	do_call(&c);
	snprintf(out, n, "%s", c.out);
	return c.status;
}

Test(http_server, health_follows_the_state)
{
	char out[8192];
	cr_expect_eq(get("/health", NULL, out, sizeof out), 503);
	cr_expect(strstr(out, "\"STARTING\"") != NULL, "%s", out);
	http_api_set_state(srv, "READY");
	cr_expect_eq(get("/health", NULL, out, sizeof out), 200);
	http_api_set_state(srv, "BUSY");
	cr_expect_eq(get("/health", NULL, out, sizeof out), 200);
	cr_expect_eq(get("/v1/models", NULL, out, sizeof out), 401);
	cr_expect_eq(get("/v1/models", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "\"tiny\"") != NULL, "%s", out);
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_state{state=\"BUSY\"} 1") != NULL, "%s", out);
	struct sched_cache_stats pc = {.hits = 5, .copies = 2, .misses = 7, .hit_tokens = 90,
				       .waits = 1, .evicted = 3, .entries = 4, .tokens = 60};
	http_api_set_cache_stats(srv, &pc);
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	static const char *const lines[] = {
		"wick_prefix_cache_admissions_total{result=\"taken\"} 3\n",
		"wick_prefix_cache_admissions_total{result=\"copied\"} 2\n",
		"wick_prefix_cache_admissions_total{result=\"miss\"} 7\n",
		"wick_prefix_cache_tokens_total 90\n", "wick_prefix_cache_waits_total 1\n",
		"wick_prefix_cache_evictions_total 3\n", "wick_prefix_cache_entries 4\n",
		"wick_prefix_cache_entry_tokens 60\n"};
	for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
		cr_expect(strstr(out, lines[i]), "%s not in %s", lines[i], out);
	http_api_set_state(srv, "DRAINING");
	cr_expect_eq(get("/health", NULL, out, sizeof out), 503);
}

static long post(const char *path, const char *body, char *out, size_t n)
{
	struct call c = {.key = "k-123", .body = body};
	snprintf(c.url, sizeof c.url, "%s%s", base, path);
	do_call(&c);
	snprintf(out, n, "%s", c.out);
	return c.status;
}

/* vLLM's /tokenize and /detokenize, with stories260K's tokenizer: 503 until the worker gives
 * the model; a prompt's ids (BOS added unless add_special_tokens is false) and their strings;
 * a chat's the tokens its completion request runs (a GLM format: with the assistant's header
 * unless add_generation_prompt is false); ids back into text; the refusals. */
Test(http_server, tokenize_and_detokenize)
{
	char out[8192], err[WK_ERRSZ], bin[512], tk[512];
	http_api_set_state(srv, "READY");
	cr_expect_eq(post("/tokenize", "{\"prompt\": \"a\"}", out, sizeof out), 503, "%s", out);
	cr_expect(strstr(out, "still loading"), "%s", out);
	const char *sh = getenv("WICK_SHARED") ? getenv("WICK_SHARED") : "../shared";
	snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", sh);
	snprintf(tk, sizeof tk, "%s/models/stories260K/tok512.bin", sh);
	char dir[] = "/tmp/wick-tok-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char conv[600];
	snprintf(conv, sizeof conv, "%s/m", dir);
	cr_assert_eq(conv_llama2c(bin, tk, conv, err, sizeof err), WK_OK, "%s", err);
	struct tok *t;
	bool prepared;
	cr_assert_eq(tok_load_dir(conv, &t, &prepared, err, sizeof err), WK_OK, "%s", err);
	struct job_model jm = {t, CHAT_GLM, 512};
	cr_expect_eq(get("/v1/models", "k-123", out, sizeof out), 200, "%s", out);
	cr_expect_null(strstr(out, "max_model_len"), "before the model: %s", out);
	http_api_set_model(srv, &jm, 256);
	cr_expect_eq(get("/v1/models/tiny", "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"max_model_len\":256"), "the model card: %s", out);
	cr_expect_eq(post("/tokenize", "{\"prompt\": \"Once upon a time\", "
			  "\"return_token_strs\": true}", out, sizeof out), 200, "%s", out);
	cr_expect_str_eq(out, "{\"count\":5,\"max_model_len\":256,\"tokens\":[1,403,407,261,378],"
			 "\"token_strs\":[\"<s>\",\"\u2581Once\",\"\u2581upon\",\"\u2581a\","
			 "\"\u2581time\"]}\n");
	cr_expect_eq(post("/tokenize", "{\"prompt\": \"Once upon a time\", \"add_special_tokens\": "
			  "false}", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"count\":4,") && strstr(out, "\"token_strs\":null"), "%s", out);
	/* a chat: what its completion request would run */
	const char *msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}]";
	char body[512], gen[8192];
	snprintf(body, sizeof body, "{%s}", msgs);
	cr_expect_eq(post("/tokenize", body, gen, sizeof gen), 200, "%s", gen);
	struct job j = {0};
	j.n_messages = 1;
	struct job_message m = {.role = "user", .content = "Once upon a time"};
	j.messages = &m;
	int *ids, n;
	cr_assert_eq(job_prompt(&jm, &j, true, &ids, &n, err, sizeof err), WK_OK, "%s", err);
	char want[64];
	snprintf(want, sizeof want, "{\"count\":%d,", n);
	cr_expect(strstr(gen, want) == gen, "%s against %d", gen, n);
	/* the Responses API's count of the same: its own route, not a kept response's */
	cr_expect_eq(post("/v1/responses/input_tokens", "{\"input\": \"Once upon a time\", "
			  "\"max_output_tokens\": 9999, \"stream\": true}", out, sizeof out), 200,
		     "%s", out);
	snprintf(want, sizeof want, "{\"object\":\"response.input_tokens\",\"input_tokens\":%d}", n);
	cr_expect(strstr(out, want) == out, "%s against %d", out, n);
	cr_expect_eq(get("/v1/responses/input_tokens", "k-123", out, sizeof out), 405, "%s", out);
	cr_expect(strstr(out, "wants POST"), "%s", out);
	cr_expect_eq(post("/v1/responses/input_tokens", "{\"input\": \"x\", "
			  "\"previous_response_id\": \"resp_none\"}", out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "previous_response_not_found"), "%s", out);
	free(ids);
	/* continue_final_message (a prefill): the assistant's start ends the prompt, no
	 * generation prompt after it, as rendering without one; not so without the flag */
	struct job_message two[2] = {{.role = "user", .content = "Once upon a time"},
				     {.role = "assistant", .content = "there was"}};
	struct job jc = {.messages = two, .n_messages = 2, .continue_final = true};
	int *cids, cn, *nids, nn;
	cr_assert_eq(job_prompt(&jm, &jc, true, &cids, &cn, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(job_prompt(&jm, &jc, false, &nids, &nn, err, sizeof err), WK_OK, "%s", err);
	cr_expect(cn == nn && !memcmp(cids, nids, (size_t)cn * sizeof *cids), "%d against %d", cn,
		  nn);
	free(nids);
	jc.continue_final = false;
	cr_assert_eq(job_prompt(&jm, &jc, true, &nids, &nn, err, sizeof err), WK_OK, "%s", err);
	cr_expect_gt(nn, cn, "a generation prompt after the assistant's turn");
	free(nids);
	free(cids);
	snprintf(body, sizeof body, "{%s, \"add_generation_prompt\": false}", msgs);
	cr_expect_eq(post("/tokenize", body, out, sizeof out), 200, "%s", out);
	cr_expect(atoi(out + 9) < atoi(gen + 9), "no assistant header: %s against %s", out, gen);
	cr_expect_eq(post("/detokenize", "{\"tokens\": [1, 403, 407, 261, 378]}", out, sizeof out),
		     200, "%s", out);
	cr_expect_str_eq(out, "{\"prompt\":\"<s> Once upon a time\"}\n");
	static const char *const bad[][3] = {
		{"/tokenize", "{}", "a prompt"},
		{"/tokenize", "{\"prompt\": \"a\", \"messages\": []}", "a prompt"},
		{"/tokenize", "{\"prompt\": 5}", "a prompt"},
		{"/tokenize", "{\"prompt\": \"a\", \"add_special_tokens\": 1}", "add_special_tokens"},
		{"/tokenize", "{\"messages\": [{\"role\": \"x\", \"content\": \"a\"}]}", "role"},
		{"/tokenize", "[1]", "JSON object"},
		{"/detokenize", "{\"tokens\": [1, 512]}", "token id"},
		{"/detokenize", "{\"tokens\": \"a\"}", "a list"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_expect_eq(post(bad[i][0], bad[i][1], out, sizeof out), 400, "%s: %s", bad[i][1],
			     out);
		cr_expect(strstr(out, bad[i][2]), "%s: %s", bad[i][1], out);
	}
	cr_expect_eq(post("/tokenize", "{\"prompt\": \"a\", \"model\": \"other\"}", out, sizeof out),
		     404, "%s", out);
	cr_expect_eq(get("/tokenize", "k-123", out, sizeof out), 405, "%s", out);
	cr_expect_eq(get("/tokenize", NULL, out, sizeof out), 401, "%s", out);
	http_api_stop(srv); /* (before the tokenizer it reads goes) */
	srv = NULL;
	start_server();
	tok_free(t);
	snprintf(conv, sizeof conv, "rm -rf '%s'", dir);
	cr_expect_eq(system(conv), 0);
}

/* A 404 names the path as the client sent it: evhttp's URI parser alone would read
 * "//v1/completions" as the host "v1" and the path "/completions". */
Test(http_server, an_unknown_path_is_named_as_sent)
{
	http_api_set_state(srv, "READY");
	static const char *const paths[] = {"//v1/completions", "/v1//chat/completions",
					    "//v1/models?x=1"};
	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		struct call c = {.key = "k-123", .body = "{\"prompt\": \"hi\"}"};
		snprintf(c.url, sizeof c.url, "%s%s", base, paths[i]);
		do_call(&c);
		char want[100];
		snprintf(want, sizeof want, "\"no route %.*s ", (int)strcspn(paths[i], "?"), paths[i]);
		cr_expect_eq(c.status, 404, "%s: %s", paths[i], c.out);
		cr_expect(strstr(c.out, want) != NULL, "%s: %s", paths[i], c.out);
	}
	char out[8192];
	cr_expect_eq(get("/v1/models?x=1", "k-123", out, sizeof out), 200, "the query is no part of "
		     "the route: %s", out);
}

/* A body over the limit gets the JSON error every other refusal gets (libevent's own 413 is
 * an HTML page, which OpenAI's clients show as the message). */
Test(http_server, a_body_over_the_limit_is_a_json_413)
{
	http_api_set_state(srv, "READY");
	size_t n = (4u << 20) + (1u << 19);
	char *body = malloc(n + 1);
	cr_assert_not_null(body);
	memset(body, 'x', n);
	body[n] = 0;
	memcpy(body, "{\"prompt\": \"", 12);
	struct call c = {.key = "k-123", .body = body};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	do_call(&c);
	free(body);
	cr_expect_eq(c.status, 413, "%s", c.out);
	cr_expect(strstr(c.out, "{\"error\":{\"message\":\"the request body is 4718592 bytes; the "
			 "limit is 4194304\"") == c.out, "%s", c.out);
	cr_expect(strstr(c.out, "\"code\":\"request_too_large\"") != NULL, "%s", c.out);
}

/* Takes one flight, waiting up to 5 s. */
static struct http_flight *take_one(struct queue_job *j)
{
	struct http_flight *f = NULL;
	for (int i = 0; i < 50 && !http_api_take(srv, &f, 1, 0.1); i++)
		;
	cr_assert_not_null(f, "no request reached the inbox");
	http_flight_job(f, j);
	return f;
}

Test(http_server, a_request_round_trip)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123",
			 .body = "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", "
				 "\"content\": \"hi\"}], \"max_tokens\": 5}"};
	snprintf(c.url, sizeof c.url, "%s/v1/chat/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct queue_job j;
	struct http_flight *f = take_one(&j);
	cr_expect(strncmp(j.id, "chatcmpl-", 9) == 0, "%s", j.id);
	cr_expect(strstr(j.body, "\"tenant\":\"default\"") != NULL, "%s", j.body);
	cr_expect(strstr(j.body, "\"max_tokens\":5") != NULL, "%s", j.body);
	http_api_token(srv, f, 1, "ignored: not streamed", 21);
	char res[512];
	snprintf(res, sizeof res, "{\"id\": \"%s\", \"status\": \"COMPLETED\", \"output\": {\"text\": "
				  "\"Hello!\", \"token_ids\": [1, 2], \"finish_reason\": \"stop\"}, "
				  "\"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 2}}", j.id);
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	free(j.body);
	cr_expect_eq(c.status, 200, "%s", c.out);
	cr_expect(strstr(c.out, "\"content\":\"Hello!\"") != NULL, "%s", c.out);
	cr_expect(strstr(c.out, "\"total_tokens\":4") != NULL, "%s", c.out);
}

Test(http_server, a_client_that_leaves_mid_stream_is_reported)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123", .abort_after = 1,
			 .body = "{\"prompt\": \"hi\", \"stream\": true}"};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct queue_job j;
	struct http_flight *f = take_one(&j);
	cr_expect(strstr(j.body, "\"max_tokens\":16") != NULL,
		  "OpenAI's 16 is the completions default (the limit is 50): %s", j.body);
	http_api_token(srv, f, 1, "Once", 4);
	pthread_join(t, NULL); /* the client read the first bytes and hung up */
	cr_expect(strstr(c.out, "data: ") == c.out, "%s", c.out);
	struct http_flight *gone = NULL;
	for (int i = 0; i < 100 && !http_api_cancelled(srv, &gone, 1); i++) {
		http_api_token(srv, f, 2 + i, " more", 5); /* writing is what reveals the close */
		usleep(20000);
	}
	cr_expect_eq(gone, f, "the disconnect was not reported");
	const char *res = "{\"status\": \"CANCELLED\", \"error\": {\"code\": \"cancelled\", "
			  "\"message\": \"cancelled\"}}";
	http_api_finish(srv, f, res, strlen(res));
	free(j.body);
	char out[8192];
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_requests_total{code=\"499\"} 1") != NULL, "%s", out);
}

/* Nothing is written to a client waiting for a reply not streamed, so only the server's own
 * watch on its socket can see it leave: the worker must hear of it without a token. */
Test(http_server, a_client_that_leaves_before_its_reply_is_reported)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123", .timeout_ms = 300,
			 .body = "{\"prompt\": \"hi\", \"max_tokens\": 50}"};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct queue_job j;
	struct http_flight *f = take_one(&j);
	pthread_join(t, NULL); /* the client gave up and closed */
	struct http_flight *gone = NULL;
	for (int i = 0; i < 100 && !http_api_cancelled(srv, &gone, 1); i++)
		usleep(20000);
	cr_expect_eq(gone, f, "the disconnect was not reported");
	const char *res = "{\"status\": \"CANCELLED\", \"error\": {\"code\": \"cancelled\", "
			  "\"message\": \"cancelled\"}}";
	http_api_finish(srv, f, res, strlen(res));
	free(j.body);
	char out[8192];
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_requests_total{code=\"499\"} 1") != NULL, "%s", out);
	cr_expect(strstr(out, "wick_http_requests_in_flight 0") != NULL, "%s", out);
}

/* logprobs: chat's (logprobs, top_logprobs) and the legacy completions' (an integer) become
 * the job's; the result's entries become chat's logprobs.content, or the legacy shape. */
Test(http, logprobs)
{
	struct oai_req r;
	json_t *j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
				     "\"logprobs\": true, \"top_logprobs\": 3}", &r);
	json_t *in = json_object_get(j, "input");
	cr_expect(json_is_true(json_object_get(in, "logprobs")));
	cr_expect_eq(json_integer_value(json_object_get(in, "top_logprobs")), 3);
	cr_expect(r.logprobs);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 0}", &r);
	in = json_object_get(j, "input");
	cr_expect(json_is_true(json_object_get(in, "logprobs")), "an integer, 0 too, asks for them");
	cr_expect_eq(json_integer_value(json_object_get(in, "top_logprobs")), 0);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": null}", &r);
	cr_expect_null(json_object_get(json_object_get(j, "input"), "logprobs"));
	cr_expect(!r.logprobs);
	json_decref(j);
	oai_req_free(&r);
	cr_expect_str_eq(err_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 21}").param,
			 "logprobs");
	cr_expect_str_eq(err_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": true}").param,
			 "logprobs");

	const char *doc = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \" h\\u00e9\", "
			  "\"token_ids\": [1, 2], \"finish_reason\": \"length\", \"logprobs\": "
			  "{\"content\": [{\"token\": \" h\", \"logprob\": -0.5, \"bytes\": [32, 104], "
			  "\"top_logprobs\": [{\"token\": \" h\", \"logprob\": -0.5, \"bytes\": [32, "
			  "104]}, {\"token\": \"x\", \"logprob\": -2, \"bytes\": [120]}]}, "
			  "{\"token\": \"\\u00e9\", \"logprob\": -1, \"bytes\": [195, 169], "
			  "\"top_logprobs\": []}]}}, \"usage\": {}}";
	struct oai_result res;
	cr_assert_eq(oai_result_parse(doc, strlen(doc), &res), WK_OK);
	j = oai_response(OAI_CHAT, "c", 5, "m", &res);
	json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
	json_t *c = json_object_get(lp, "content");
	cr_assert_eq(json_array_size(c), 2);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(c, 1), "token")), "\xc3\xa9");
	json_decref(j);
	j = oai_response(OAI_COMPLETION, "c", 5, "m", &res);
	lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
	cr_expect_str_eq(json_string_value(json_array_get(json_object_get(lp, "tokens"), 1)),
			 "\xc3\xa9");
	cr_expect_float_eq(json_number_value(json_array_get(json_object_get(lp, "token_logprobs"),
							    0)), -0.5, 1e-9);
	json_t *top0 = json_array_get(json_object_get(lp, "top_logprobs"), 0);
	cr_expect_eq(json_object_size(top0), 2);
	cr_expect_float_eq(json_number_value(json_object_get(top0, "x")), -2, 1e-9);
	json_t *off = json_object_get(lp, "text_offset");
	cr_expect_eq(json_integer_value(json_array_get(off, 0)), 0);
	cr_expect_eq(json_integer_value(json_array_get(off, 1)), 2, "offsets in characters");
	json_decref(j);
	/* a chunk's: its own copy (the caller's array may change after) */
	json_t *pending = json_deep_copy(res.logprobs);
	size_t at = 0;
	json_t *chunk = oai_chunk(OAI_CHAT, "c", 5, "m", "x", 1, false, NULL);
	json_t *l = oai_logprobs(OAI_CHAT, pending, &at);
	oai_chunk_logprobs(chunk, l);
	json_decref(l);
	json_array_clear(pending);
	c = json_object_get(json_object_get(json_array_get(json_object_get(chunk, "choices"), 0),
					    "logprobs"), "content");
	cr_expect_eq(json_array_size(c), 2);
	json_decref(chunk);
	json_decref(pending);
	oai_result_free(&res);
}

/* Token-id prompts, and echo: the prompt's entries first in the text and the logprobs. */
/* vLLM's prompt_logprobs: the prompt scored (input.prompt_logprobs, the larger of it and echo's
 * logprobs), and in the response each position's token (its rank) and its likeliest tokens,
 * keyed by id; a completion's on each choice, a chat's beside the choices. */
Test(http, vllm_prompt_logprobs)
{
	struct oai_req r;
	json_t *j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"prompt_logprobs\": 3, "
			   "\"max_tokens\": 0}", &r);
	json_t *in = json_object_get(j, "input");
	cr_expect_eq(json_integer_value(json_object_get(in, "prompt_logprobs")), 3);
	cr_expect_eq(json_integer_value(json_object_get(in, "max_tokens")), 0);
	cr_expect(r.plp_top == 3 && !r.echo);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"echo\": true, \"logprobs\": 4, "
		   "\"prompt_logprobs\": 1}", &r);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "input"),
							 "prompt_logprobs")), 4);
	cr_expect(r.plp_top == 1 && r.echo_top == 4);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
		   "\"prompt_logprobs\": 0}", &r);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "input"),
							 "prompt_logprobs")), 0);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
		   "\"prompt_logprobs\": null}", &r);
	cr_expect_null(json_object_get(json_object_get(j, "input"), "prompt_logprobs"));
	cr_expect_eq(r.plp_top, -1);
	json_decref(j);
	oai_req_free(&r);
	static const char *const bad[] = {
		"{\"prompt\": \"a\", \"prompt_logprobs\": 21}",
		"{\"prompt\": \"a\", \"prompt_logprobs\": -1}",
		"{\"prompt\": \"a\", \"prompt_logprobs\": true}",
		"{\"prompt\": \"a\", \"prompt_logprobs\": 2, \"stream\": true}"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct oai_err e = err_of(OAI_COMPLETION, bad[i]);
		cr_expect_eq(e.status, 400, "%s", bad[i]);
		cr_expect_str_eq(e.param, "prompt_logprobs", "%s: %s", bad[i], e.message);
	}
	cr_expect(strstr(err_of(OAI_COMPLETION, bad[3]).message, "stream"));
	/* the response: position 1's token (id 5) ranks 3rd; its two likeliest, ids 120 and 7 */
	const char *doc =
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \" d\", \"token_ids\": [9], "
		"\"finish_reason\": \"length\", \"prompt_logprobs\": [{\"token\": \"\", \"logprob\": "
		"null, \"bytes\": [], \"top_logprobs\": []}, {\"token\": \"\u00e9\", \"logprob\": -2, "
		"\"bytes\": [195, 169], \"rank\": 3, \"top_logprobs\": [{\"token\": \"x\", "
		"\"logprob\": -1, \"bytes\": [120], \"id\": 120}, {\"token\": \"y\", \"logprob\": "
		"-1.5, \"bytes\": [121], \"id\": 7}]}, {\"token\": \"z\", \"logprob\": -0.5, \"bytes\": "
		"[122], \"rank\": 1, \"top_logprobs\": [{\"token\": \"z\", \"logprob\": -0.5, "
		"\"bytes\": [122], \"id\": 8}, {\"token\": \"w\", \"logprob\": -3, \"bytes\": [119], "
		"\"id\": 2}]}], \"prompt_token_ids\": [1, 5, 8]}, \"usage\": {\"prompt_tokens\": 3, "
		"\"completion_tokens\": 1}}";
	for (int kind = 0; kind < 2; kind++) {
		struct oai_result res;
		cr_assert_eq(oai_result_parse(doc, strlen(doc), &res), WK_OK);
		res.plp = true;
		res.plp_top = 2;
		j = oai_response(kind ? OAI_CHAT : OAI_COMPLETION, "c", 5, "m", &res);
		json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
		json_t *pl = json_object_get(kind ? j : ch, "prompt_logprobs");
		cr_assert_eq(json_array_size(pl), 3, "%s", json_dumps(j, 0));
		cr_expect(json_is_null(json_array_get(pl, 0)));
		json_t *p1 = json_array_get(pl, 1), *p2 = json_array_get(pl, 2);
		cr_expect_eq(json_object_size(p1), 3, "the token, then its 2 likeliest");
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(p1, "5"), "rank")), 3);
		cr_expect_float_eq(json_number_value(json_object_get(json_object_get(p1, "5"),
								     "logprob")), -2, 1e-9);
		cr_expect_str_eq(json_string_value(json_object_get(json_object_get(p1, "5"),
								    "decoded_token")), "\xc3\xa9");
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(p1, "7"), "rank")), 2);
		cr_expect_str_eq(json_string_value(json_object_get(json_object_get(p1, "120"),
								    "decoded_token")), "x");
		cr_expect_eq(json_object_size(p2), 2, "the token is the likeliest: once");
		cr_expect_eq(json_integer_value(json_object_get(json_object_get(p2, "8"), "rank")), 1);
		cr_expect_null(json_object_get(kind ? ch : j, "prompt_logprobs"));
		json_decref(j);
		/* one alternative asked: the token and the likeliest only */
		res.plp_top = 1;
		res.echo = !kind;
		res.echo_top = 0;
		j = oai_response(kind ? OAI_CHAT : OAI_COMPLETION, "c", 5, "m", &res);
		ch = json_array_get(json_object_get(j, "choices"), 0);
		pl = json_object_get(kind ? j : ch, "prompt_logprobs");
		cr_expect_eq(json_object_size(json_array_get(pl, 1)), 2);
		cr_expect_eq(json_object_size(json_array_get(pl, 2)), 1);
		if (!kind) /* echo with no logprobs asked: the text only */
			cr_expect_str_eq(json_string_value(json_object_get(ch, "text")),
					 "\xc3\xa9z d");
		json_decref(j);
		oai_result_free(&res);
	}
}

Test(http, echo_and_token_ids)
{
	struct oai_req r;
	json_t *j = job_of(OAI_COMPLETION, "{\"prompt\": [[1, 403, 7]], \"echo\": true, "
					   "\"max_tokens\": 0, \"logprobs\": 2}", &r);
	json_t *in = json_object_get(j, "input");
	json_t *p = json_object_get(in, "prompt");
	cr_expect(json_array_size(p) == 3 && json_integer_value(json_array_get(p, 1)) == 403);
	cr_expect_eq(json_integer_value(json_object_get(in, "prompt_logprobs")), 2);
	cr_expect_eq(json_integer_value(json_object_get(in, "top_logprobs")), 2);
	cr_expect_eq(json_integer_value(json_object_get(in, "max_tokens")), 0);
	cr_expect(r.echo && r.logprobs);
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"echo\": true}", &r);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "input"),
							 "prompt_logprobs")), 0,
		     "echo without logprobs: the prompt's text from its entries");
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"echo\": false}", &r);
	cr_expect_null(json_object_get(json_object_get(j, "input"), "prompt_logprobs"));
	cr_expect(!r.echo);
	json_decref(j);
	oai_req_free(&r);
	static const char *const bad[][2] = {
		{"{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens"},
		{"{\"prompt\": \"a\", \"echo\": \"yes\"}", "echo"},
		{"{\"prompt\": [\"a\", 7]}", "prompt"},
		{"{\"prompt\": [[1], []]}", "prompt"},
		{"{\"prompt\": [[1], [\"a\"]]}", "prompt"},
		{"{\"prompt\": [\"a\", \"b\"], \"n\": 65}", "n"},
		{"{\"prompt\": []}", "prompt"},
		{"{\"prompt\": [-1]}", "prompt"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct oai_err e = err_of(OAI_COMPLETION, bad[i][0]);
		cr_expect_eq(e.status, 400, "%s", bad[i][0]);
		cr_expect_str_eq(e.param, bad[i][1], "%s: %s", bad[i][0], e.message);
	}
	/* the response: the prompt's text, then the output's; the logprobs of both */
	const char *doc =
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \" d\", \"token_ids\": [9], "
		"\"finish_reason\": \"length\", \"logprobs\": {\"content\": [{\"token\": \" d\", "
		"\"logprob\": -0.5, \"bytes\": [32, 100], \"top_logprobs\": [{\"token\": \" d\", "
		"\"logprob\": -0.5, \"bytes\": [32, 100]}]}]}, \"prompt_logprobs\": [{\"token\": "
		"\"\", \"logprob\": null, \"bytes\": [], \"top_logprobs\": []}, {\"token\": "
		"\"\u00e9\", \"logprob\": -2, \"bytes\": [195, 169], \"top_logprobs\": "
		"[{\"token\": \"x\", \"logprob\": -1, \"bytes\": [120]}]}], \"prompt_token_ids\": "
		"[1, 5]}, \"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 1}}";
	struct oai_result res;
	cr_assert_eq(oai_result_parse(doc, strlen(doc), &res), WK_OK);
	res.echo = true;
	j = oai_response(OAI_COMPLETION, "c", 5, "m", &res);
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(ch, "text")), "\xc3\xa9 d");
	json_t *lp = json_object_get(ch, "logprobs");
	json_t *lps = json_object_get(lp, "token_logprobs"), *tops = json_object_get(lp,
										     "top_logprobs");
	cr_assert_eq(json_array_size(lps), 3);
	cr_expect(json_is_null(json_array_get(lps, 0)) && json_is_null(json_array_get(tops, 0)));
	cr_expect_float_eq(json_number_value(json_array_get(lps, 1)), -2, 1e-9);
	cr_expect_float_eq(json_number_value(json_object_get(json_array_get(tops, 1), "x")), -1,
			   1e-9);
	cr_expect_str_eq(json_string_value(json_array_get(json_object_get(lp, "tokens"), 2)), " d");
	json_t *off = json_object_get(lp, "text_offset");
	cr_expect(json_integer_value(json_array_get(off, 1)) == 0 &&
		  json_integer_value(json_array_get(off, 2)) == 1, "offsets in characters");
	json_decref(j);
	res.echo = false; /* not asked: the output alone */
	j = oai_response(OAI_COMPLETION, "c", 5, "m", &res);
	ch = json_array_get(json_object_get(j, "choices"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(ch, "text")), " d");
	json_decref(j);
	/* a stream's first chunk */
	size_t at = 0;
	json_t *c = oai_echo_chunk("c", 5, "m", res.prompt_logprobs, true, &at);
	ch = json_array_get(json_object_get(c, "choices"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(ch, "text")), "\xc3\xa9");
	cr_expect_eq(json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens")), 2);
	cr_expect_eq(at, 1, "the stream's offset advances past the prompt");
	json_decref(c);
	oai_result_free(&res);
}

/* OpenAI's penalties and logit_bias, and vLLM's repetition_penalty, go into the job. */
Test(http, penalties_and_bias)
{
	struct oai_req r;
	json_t *j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
				     "\"presence_penalty\": 0.5, \"frequency_penalty\": -1, "
				     "\"repetition_penalty\": 1.2, \"logit_bias\": {\"50\": -100}}", &r);
	json_t *in = json_object_get(j, "input");
	cr_expect_float_eq(json_number_value(json_object_get(in, "presence_penalty")), 0.5, 1e-9);
	cr_expect_float_eq(json_number_value(json_object_get(in, "frequency_penalty")), -1, 1e-9);
	cr_expect_float_eq(json_number_value(json_object_get(in, "repetition_penalty")), 1.2, 1e-9);
	cr_expect_float_eq(json_number_value(json_object_get(json_object_get(in, "logit_bias"),
							     "50")), -100, 1e-9);
	json_decref(j);
	oai_req_free(&r);
}

/* response_format json_object and json_schema go into the job; text is the default. */
Test(http, response_format)
{
	struct oai_req r;
	json_t *j = job_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], "
				     "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
				     "{\"name\": \"p\", \"strict\": true, \"schema\": {\"type\": "
				     "\"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, "
				     "\"required\": [\"a\"], \"additionalProperties\": false}}}}", &r);
	json_t *f = json_object_get(json_object_get(j, "input"), "response_format");
	cr_expect_str_eq(json_string_value(json_object_get(f, "type")), "json_schema");
	cr_expect(json_is_object(json_object_get(json_object_get(f, "json_schema"), "schema")));
	json_decref(j);
	oai_req_free(&r);
	j = job_of(OAI_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": "
				   "\"json_object\"}}", &r);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(
				 json_object_get(j, "input"), "response_format"), "type")),
			 "json_object");
	json_decref(j);
	oai_req_free(&r);
	struct oai_err e = err_of(OAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": "
					    "\"a\"}], \"response_format\": {\"type\": \"json_schema\", "
					    "\"json_schema\": {\"schema\": {\"type\": \"string\", "
					    "\"format\": \"uri\"}}}}");
	cr_expect(strstr(e.message, "\"uri\"") != NULL, "names the format: %s", e.message);
}

/* ---- several choices: n, and a list of prompts ---- */

/* One job a choice: n of each prompt in order, each with its own id, and with a seed, choice i
 * of a prompt draws from seed + i. */
Test(http, several_choices_make_one_job_each)
{
	struct oai_req r;
	struct oai_err e;
	const char *body = "{\"prompt\": [\"a b\", [1, 2, 3]], \"n\": 2, \"seed\": 7, "
			   "\"max_tokens\": 3}";
	cr_assert_eq(oai_to_job(OAI_COMPLETION, body, strlen(body), "m", "cmpl-x", "t", 100, &r,
				&e), 0, "%s", e.message);
	cr_assert_eq(r.n_choices, 4);
	cr_expect_eq(r.per_prompt, 2);
	for (int c = 0; c < 4; c++) {
		json_t *j = json_loadb(r.jobs[c], r.job_lens[c], 0, NULL);
		json_t *in = json_object_get(j, "input"), *p = json_object_get(in, "prompt");
		char id[32];
		snprintf(id, sizeof id, "cmpl-x-%d", c);
		cr_expect_str_eq(json_string_value(json_object_get(j, "id")), id);
		cr_expect_eq(json_integer_value(json_object_get(in, "seed")), 7 + c % 2, "%d", c);
		cr_expect_eq(json_integer_value(json_object_get(in, "max_tokens")), 3);
		if (c < 2)
			cr_expect_str_eq(json_string_value(p), "a b", "%d", c);
		else
			cr_expect(json_array_size(p) == 3 &&
				  json_integer_value(json_array_get(p, 2)) == 3, "%d", c);
		json_decref(j);
	}
	oai_req_free(&r);
	/* the largest seed wraps to 0; no seed stays none; one choice keeps the request's id */
	body = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"n\": 3, "
	       "\"seed\": 9223372036854775807}";
	cr_assert_eq(oai_to_job(OAI_CHAT, body, strlen(body), "m", "chatcmpl-y", "t", 100, &r, &e),
		     0, "%s", e.message);
	cr_assert_eq(r.n_choices, 3);
	cr_expect(strstr(r.jobs[1], "\"seed\":0") != NULL, "%s", r.jobs[1]);
	cr_expect(strstr(r.jobs[2], "\"id\":\"chatcmpl-y-2\"") != NULL, "%s", r.jobs[2]);
	cr_expect(strstr(r.jobs[2], "\"messages\":[{") != NULL, "%s", r.jobs[2]);
	oai_req_free(&r);
	body = "{\"prompt\": [\"a\", \"b\"]}";
	cr_assert_eq(oai_to_job(OAI_COMPLETION, body, strlen(body), "m", "cmpl-z", "t", 100, &r,
				&e), 0, "%s", e.message);
	cr_expect(r.n_choices == 2 && r.per_prompt == 1);
	cr_expect(strstr(r.jobs[0], "seed") == NULL, "%s", r.jobs[0]);
	oai_req_free(&r);
	body = "{\"prompt\": [\"a\"], \"n\": 1}";
	cr_assert_eq(oai_to_job(OAI_COMPLETION, body, strlen(body), "m", "cmpl-z", "t", 100, &r,
				&e), 0, "%s", e.message);
	cr_expect(r.n_choices == 1 && strstr(r.jobs[0], "\"id\":\"cmpl-z\"") != NULL);
	oai_req_free(&r);
	/* not streamed, a prompt's first choice alone scores it; streamed (echo), each does */
	body = "{\"prompt\": [\"a b\", \"c\"], \"n\": 3, \"prompt_logprobs\": 2, "
	       "\"max_tokens\": 1}";
	cr_assert_eq(oai_to_job(OAI_COMPLETION, body, strlen(body), "m", "cmpl-p", "t", 100, &r,
				&e), 0, "%s", e.message);
	cr_assert_eq(r.n_choices, 6);
	for (int c = 0; c < 6; c++)
		cr_expect_eq(strstr(r.jobs[c], "\"prompt_logprobs\":2") != NULL, c % 3 == 0, "%d: %s",
			     c, r.jobs[c]);
	oai_req_free(&r);
	static const char *const each[] = { /* streamed; max_tokens 0 (a job that only scores) */
		"{\"prompt\": \"a b\", \"n\": 2, \"echo\": true, \"logprobs\": 1, \"stream\": true}",
		"{\"prompt\": \"a b\", \"n\": 2, \"echo\": true, \"logprobs\": 1, \"max_tokens\": 0}"};
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(oai_to_job(OAI_COMPLETION, each[k], strlen(each[k]), "m", "cmpl-q",
					"t", 100, &r, &e), 0, "%s", e.message);
		for (int c = 0; c < 2; c++)
			cr_expect(strstr(r.jobs[c], "\"prompt_logprobs\":1") != NULL, "%s %d: %s",
				  each[k], c, r.jobs[c]);
		oai_req_free(&r);
	}
	/* a bad prompt is named by its place */
	e = err_of(OAI_COMPLETION, "{\"prompt\": [\"fine\", [1, -2]]}");
	cr_expect_str_eq(e.param, "prompt");
	cr_expect(strstr(e.message, "prompt[1]: ") == e.message, "%s", e.message);
	/* 128 choices at most, and 16 MiB of jobs */
	e = err_of(OAI_COMPLETION, "{\"prompt\": [\"a\", \"b\", \"c\"], \"n\": 43}");
	cr_expect_str_eq(e.param, "n");
	cr_expect(strstr(e.message, "129 choices") != NULL, "%s", e.message);
	size_t big = 600u << 10;
	char *b = malloc(big + 64);
	cr_assert_not_null(b);
	int o = snprintf(b, 64, "{\"n\": 30, \"prompt\": \"");
	memset(b + o, 'x', big);
	strcpy(b + o + big, "\"}");
	e = err_of(OAI_COMPLETION, b);
	free(b);
	cr_expect_str_eq(e.code, "request_too_large");
	cr_expect_str_eq(e.param, "n");
}

/* The choices of a response in order, and their usage summed: each prompt's tokens once, the
 * rest of every choice. */
Test(http, several_choices_join_into_one_response)
{
	struct oai_result rs[3];
	const char *docs[3] = {
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \"zero\", \"finish_reason\": "
		"\"stop\"}, \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1, "
		"\"cost_micro_usd\": 10, \"gpu_seconds\": 0.5, \"queue_seconds\": 0.1}}",
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \"one\", \"finish_reason\": "
		"\"length\"}, \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 2, "
		"\"cost_micro_usd\": 11, \"gpu_seconds\": 0.25, \"queue_seconds\": 0.3, "
		"\"completion_tokens_details\": {\"accepted_prediction_tokens\": 1, "
		"\"rejected_prediction_tokens\": 2}}}",
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \"two\"}, \"usage\": "
		"{\"prompt_tokens\": 4, \"completion_tokens\": 3, \"cost_micro_usd\": 12, "
		"\"gpu_seconds\": 0.25, \"queue_seconds\": 0.2}}"};
	for (int i = 0; i < 3; i++)
		cr_assert_eq(oai_result_parse(docs[i], strlen(docs[i]), &rs[i]), WK_OK);
	json_t *resp = oai_response_n(OAI_COMPLETION, "cmpl-j", 1, "m", rs, 3, 1);
	cr_assert_not_null(resp);
	json_t *ch = json_object_get(resp, "choices"), *u = json_object_get(resp, "usage");
	cr_assert_eq(json_array_size(ch), 3);
	static const char *const texts[] = {"zero", "one", "two"};
	for (int i = 0; i < 3; i++) {
		json_t *c = json_array_get(ch, (size_t)i);
		cr_expect_eq(json_integer_value(json_object_get(c, "index")), i);
		cr_expect_str_eq(json_string_value(json_object_get(c, "text")), texts[i]);
	}
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(ch, 1),
							   "finish_reason")), "length");
	cr_expect_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 14);
	cr_expect_eq(json_integer_value(json_object_get(u, "completion_tokens")), 6);
	cr_expect_eq(json_integer_value(json_object_get(u, "total_tokens")), 20);
	cr_expect_eq(json_integer_value(json_object_get(u, "cost_micro_usd")), 33);
	cr_expect_float_eq(json_real_value(json_object_get(u, "gpu_seconds")), 1.0, 1e-9);
	cr_expect_float_eq(json_real_value(json_object_get(u, "queue_seconds")), 0.3, 1e-9);
	json_t *d = json_object_get(u, "completion_tokens_details");
	cr_expect_eq(json_integer_value(json_object_get(d, "accepted_prediction_tokens")), 1);
	cr_expect_eq(json_integer_value(json_object_get(d, "rejected_prediction_tokens")), 2);
	json_decref(resp);
	/* n 3 of one prompt: its tokens once */
	resp = oai_response_n(OAI_CHAT, "c", 1, "m", rs, 3, 3);
	u = json_object_get(resp, "usage");
	cr_expect_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
	cr_expect_eq(json_integer_value(json_object_get(u, "total_tokens")), 11);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(
				 json_object_get(resp, "choices"), 2), "message"), "content")), "two");
	json_decref(resp);
	for (int i = 0; i < 3; i++)
		oai_result_free(&rs[i]);
	/* a prompt's first choice scored it (prompt_logprobs, echo) for the others, whose jobs
	 * did not: each choice shows its entries and echoes its text */
	const char *scored =
		"{\"status\": \"COMPLETED\", \"output\": {\"text\": \" d\", \"token_ids\": [9], "
		"\"prompt_logprobs\": [{\"token\": \"a\", \"logprob\": null, \"bytes\": [97], "
		"\"top_logprobs\": []}, {\"token\": \"b\", \"logprob\": -2, \"bytes\": [98], "
		"\"rank\": 2, \"top_logprobs\": [{\"token\": \"x\", \"logprob\": -1, \"bytes\": "
		"[120], \"id\": 120}]}], \"prompt_token_ids\": [1, 5]}, \"usage\": "
		"{\"prompt_tokens\": 2, \"completion_tokens\": 1}}",
	*plain = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \" e\", \"token_ids\": "
		"[3]}, \"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 1}}";
	cr_assert_eq(oai_result_parse(scored, strlen(scored), &rs[0]), WK_OK);
	cr_assert_eq(oai_result_parse(plain, strlen(plain), &rs[1]), WK_OK);
	for (int i = 0; i < 2; i++) {
		rs[i].plp = true;
		rs[i].plp_top = 1;
		rs[i].echo = true;
	}
	resp = oai_response_n(OAI_COMPLETION, "c", 1, "m", rs, 2, 2);
	ch = json_object_get(resp, "choices");
	char *c0 = json_dumps(json_object_get(json_array_get(ch, 0), "prompt_logprobs"),
			      JSON_SORT_KEYS);
	char *c1 = json_dumps(json_object_get(json_array_get(ch, 1), "prompt_logprobs"),
			      JSON_SORT_KEYS);
	cr_expect(c0 && c1 && !strcmp(c0, c1) && strstr(c0, "\"5\""), "%s\nagainst %s", c0, c1);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(ch, 1), "text")), "ab e");
	free(c0);
	free(c1);
	json_decref(resp);
	for (int i = 0; i < 2; i++)
		oai_result_free(&rs[i]);
}

/* Takes n flights in order, waiting up to 5 s. */
static void take_n(struct http_flight **f, struct queue_job *j, int n)
{
	int got = 0;
	for (int i = 0; i < 100 && got < n; i++)
		got += http_api_take(srv, f + got, n - got, 0.05);
	cr_assert_eq(got, n, "%d of %d choices reached the inbox", got, n);
	for (int i = 0; i < n; i++)
		http_flight_job(f[i], &j[i]);
}

static void finish_text(struct http_flight *f, const char *text, int prompt, int completion)
{
	char res[512];
	snprintf(res, sizeof res, "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"%s\", "
				  "\"finish_reason\": \"length\"}, \"usage\": {\"prompt_tokens\": %d, "
				  "\"completion_tokens\": %d}}", text, prompt, completion);
	http_api_finish(srv, f, res, strlen(res));
}

/* Two prompts, n 2: four jobs, finished out of order, answered as one response in order. */
Test(http_server, several_choices_are_joined)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123",
			 .body = "{\"prompt\": [\"a\", [5, 6, 7]], \"n\": 2, \"max_tokens\": 3}"};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct http_flight *f[4];
	struct queue_job j[4];
	take_n(f, j, 4);
	for (int i = 0; i < 4; i++) {
		char tail[16];
		snprintf(tail, sizeof tail, "-%d", i);
		cr_expect(strcmp(j[i].id + strlen(j[i].id) - 2, tail) == 0, "%s", j[i].id);
		cr_expect(strstr(j[i].body, i < 2 ? "\"prompt\":\"a\"" : "\"prompt\":[5,6,7]") != NULL,
			  "%s", j[i].body);
		free(j[i].body);
	}
	char out[8192];
	for (int i = 3; i >= 0; i--) {
		char text[16];
		snprintf(text, sizeof text, "t%d", i);
		finish_text(f[i], text, i < 2 ? 2 : 3, 1);
		if (i == 1) { /* three of four in: no answer yet */
			cr_expect_eq(c.status, 0);
			cr_expect_eq(get("/health", NULL, out, sizeof out), 200);
			cr_expect(strstr(out, "\"requests_in_flight\":1") != NULL, "%s", out);
		}
	}
	pthread_join(t, NULL);
	cr_assert_eq(c.status, 200, "%s", c.out);
	json_t *resp = json_loads(c.out, 0, NULL), *ch = json_object_get(resp, "choices");
	cr_assert_eq(json_array_size(ch), 4, "%s", c.out);
	for (int i = 0; i < 4; i++) {
		char text[16];
		snprintf(text, sizeof text, "t%d", i);
		json_t *x = json_array_get(ch, (size_t)i);
		cr_expect_eq(json_integer_value(json_object_get(x, "index")), i);
		cr_expect_str_eq(json_string_value(json_object_get(x, "text")), text);
	}
	cr_expect(strncmp(json_string_value(json_object_get(resp, "id")), j[0].id,
			  strlen(j[0].id) - 2) == 0, "the response's id is the jobs' stem");
	json_t *u = json_object_get(resp, "usage");
	cr_expect_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
	cr_expect_eq(json_integer_value(json_object_get(u, "completion_tokens")), 4);
	json_decref(resp);
}

/* A stream of n 2: each choice's chunks carry its index as they come; the usage comes once,
 * after both have finished, then [DONE]. */
Test(http_server, several_choices_stream_with_their_index)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123",
			 .body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 2, "
				 "\"stream\": true, \"stream_options\": {\"include_usage\": true}}"};
	snprintf(c.url, sizeof c.url, "%s/v1/chat/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct http_flight *f[2];
	struct queue_job j[2];
	take_n(f, j, 2);
	free(j[0].body);
	free(j[1].body);
	http_api_token(srv, f[1], 1, "B", 1);
	http_api_token(srv, f[0], 1, "A", 1);
	http_api_token(srv, f[1], 2, "b", 1);
	finish_text(f[1], "Bb", 2, 2);
	finish_text(f[0], "A", 2, 1);
	pthread_join(t, NULL);
	cr_assert_eq(c.status, 200, "%s", c.out);
	/* the events in order: index and content (or finish, or usage) of each */
	char seen[512] = "";
	size_t o = 0;
	for (char *p = strstr(c.out, "data: "); p; p = strstr(p + 6, "data: ")) {
		if (!strncmp(p + 6, "[DONE]", 6)) {
			o += (size_t)snprintf(seen + o, sizeof seen - o, "DONE ");
			continue;
		}
		json_t *ev = json_loadb(p + 6, strcspn(p + 6, "\n"), 0, NULL);
		json_t *x = json_array_get(json_object_get(ev, "choices"), 0);
		json_t *d = json_object_get(x, "delta");
		const char *fin = json_string_value(json_object_get(x, "finish_reason"));
		if (!x)
			o += (size_t)snprintf(seen + o, sizeof seen - o, "usage%lld ",
					      json_integer_value(json_object_get(json_object_get(
						      ev, "usage"), "completion_tokens")));
		else
			o += (size_t)snprintf(seen + o, sizeof seen - o, "%lld:%s%s ",
					      json_integer_value(json_object_get(x, "index")),
					      json_object_get(d, "role") ? "role" : fin ? fin
					      : json_string_value(json_object_get(d, "content")) ?: "?",
					      "");
		json_decref(ev);
	}
	cr_expect_str_eq(seen, "0:role 1:role 1:B 0:A 1:b 1:length 0:length usage3 DONE ",
			 "%s", c.out);
}

/* The first choice that fails is the request's answer; its other choices are cancelled: those
 * the worker holds are reported, those still queued never run. */
Test(http_server, a_failed_choice_fails_the_request)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123", .body = "{\"prompt\": \"a\", \"n\": 4}"};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct http_flight *f[2];
	struct queue_job j[2];
	take_n(f, j, 2); /* two run, two wait */
	free(j[0].body);
	free(j[1].body);
	cr_expect_eq(http_api_waiting(srv), 2);
	const char *bad = "{\"status\": \"FAILED\", \"error\": {\"code\": \"prompt_too_long\", "
			  "\"message\": \"the prompt is 9 tokens; the context is 8\"}}";
	http_api_finish(srv, f[1], bad, strlen(bad));
	pthread_join(t, NULL);
	cr_expect_eq(c.status, 400, "%s", c.out);
	cr_expect(strstr(c.out, "\"code\":\"prompt_too_long\"") != NULL, "%s", c.out);
	struct http_flight *gone = NULL;
	for (int i = 0; i < 100 && !http_api_cancelled(srv, &gone, 1); i++)
		usleep(10000);
	cr_expect_eq(gone, f[0], "the running choice was not cancelled");
	cr_expect_eq(http_api_waiting(srv), 0, "the queued choices were not taken back");
	usleep(600000); /* the answered client's connection is closed and swept meanwhile */
	const char *res = "{\"status\": \"CANCELLED\", \"error\": {\"code\": \"cancelled\", "
			  "\"message\": \"cancelled\"}}";
	http_api_finish(srv, f[0], res, strlen(res));
	char out[8192];
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_requests_in_flight 0") != NULL, "%s", out);
	cr_expect(strstr(out, "wick_http_requests_total{code=\"400\"} 1") != NULL, "%s", out);
}

/* A client that leaves cancels every choice, and counts once. */
Test(http_server, a_client_that_leaves_cancels_every_choice)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123", .timeout_ms = 300,
			 .body = "{\"prompt\": [\"a\", \"b\", \"c\"], \"max_tokens\": 50}"};
	snprintf(c.url, sizeof c.url, "%s/v1/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct http_flight *f[2];
	struct queue_job j[2];
	take_n(f, j, 2);
	free(j[0].body);
	free(j[1].body);
	pthread_join(t, NULL); /* the client gave up and closed */
	struct http_flight *gone[4] = {0};
	int n = 0;
	for (int i = 0; i < 100 && n < 2; i++) {
		n += http_api_cancelled(srv, gone + n, 4 - n);
		usleep(10000);
	}
	cr_expect_eq(n, 2, "%d of the 2 running choices were cancelled", n);
	cr_expect((gone[0] == f[0] && gone[1] == f[1]) || (gone[0] == f[1] && gone[1] == f[0]));
	cr_expect_eq(http_api_waiting(srv), 0);
	const char *res = "{\"status\": \"CANCELLED\", \"error\": {\"code\": \"cancelled\", "
			  "\"message\": \"cancelled\"}}";
	http_api_finish(srv, f[0], res, strlen(res));
	http_api_finish(srv, f[1], res, strlen(res));
	char out[8192];
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_requests_total{code=\"499\"} 1") != NULL, "%s", out);
	cr_expect(strstr(out, "wick_http_requests_in_flight 0") != NULL, "%s", out);
}

/* POST /v1/responses: the job is its chat's; streamed, its events go out as "event: TYPE" and
 * "data: JSON" (no [DONE]), ending response.completed with the usage; a failure after the
 * first event ends it response.failed; not streamed, the answer is the response object. */
Test(http_server, a_response_streams_its_events)
{
	http_api_set_state(srv, "READY");
	struct call c = {.key = "k-123",
			 .body = "{\"input\": \"hi\", \"instructions\": \"Be brief.\", "
				 "\"max_output_tokens\": 5, \"stream\": true}"};
	snprintf(c.url, sizeof c.url, "%s/v1/responses", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct queue_job j;
	struct http_flight *f = take_one(&j);
	cr_expect(strncmp(j.id, "resp_", 5) == 0, "%s", j.id);
	cr_expect(strstr(j.body, "\"max_tokens\":5") && strstr(j.body, "\"role\":\"system\"") &&
		  strstr(j.body, "\"content\":\"Be brief.\""), "%s", j.body);
	free(j.body);
	http_api_token(srv, f, 1, "Hel", 3);
	http_api_token(srv, f, 2, "lo", 2);
	const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Hello\", "
			  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 4, "
			  "\"completion_tokens\": 2}}";
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	cr_expect_eq(c.status, 200, "%s", c.out);
	cr_expect(strstr(c.out, "event: response.created\ndata: {") == c.out, "%s", c.out);
	cr_expect(strstr(c.out, "event: response.output_text.delta\ndata: {\"type\":"
			 "\"response.output_text.delta\",\"sequence_number\":") &&
		  strstr(c.out, "\"item_id\":\"msg_") &&
		  strstr(c.out, "\"delta\":\"Hel\"") && strstr(c.out, "\"delta\":\"lo\""), "%s", c.out);
	const char *end = strstr(c.out, "event: response.completed\ndata: {");
	cr_expect(end && strstr(end, "\"output_text\",\"text\":\"Hello\"") &&
		  strstr(end, "\"input_tokens\":4") && strstr(end, "\"output_tokens\":2") &&
		  strcmp(c.out + c.len - 3, "}\n\n") == 0, "%s", c.out);
	cr_expect_null(strstr(c.out, "[DONE]"), "%s", c.out);
	/* a failure mid-stream */
	struct call d = {.key = "k-123", .body = "{\"input\": \"hi\", \"stream\": true}"};
	snprintf(d.url, sizeof d.url, "%s/v1/responses", base);
	cr_assert_eq(pthread_create(&t, NULL, do_call, &d), 0);
	f = take_one(&j);
	free(j.body);
	http_api_token(srv, f, 1, "Hel", 3);
	const char *bad = "{\"status\": \"TIMED_OUT\", \"error\": {\"code\": \"timeout\", "
			  "\"message\": \"the job ran past its timeout_s\"}}";
	http_api_finish(srv, f, bad, strlen(bad));
	pthread_join(t, NULL);
	end = strstr(d.out, "event: response.failed\ndata: {");
	cr_expect(end && strstr(end, "\"status\":\"failed\"") &&
		  strstr(end, "\"error\":{\"code\":\"timeout\"") &&
		  strcmp(d.out + d.len - 3, "}\n\n") == 0, "%s", d.out);
	/* not streamed */
	struct call g = {.key = "k-123", .body = "{\"input\": [{\"role\": \"user\", \"content\": "
						 "[{\"type\": \"input_text\", \"text\": \"hi\"}]}]}"};
	snprintf(g.url, sizeof g.url, "%s/v1/responses", base);
	cr_assert_eq(pthread_create(&t, NULL, do_call, &g), 0);
	f = take_one(&j);
	free(j.body);
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	cr_expect_eq(g.status, 200, "%s", g.out);
	json_t *o = json_loads(g.out, 0, NULL);
	cr_expect_str_eq(json_string_value(json_object_get(o, "object")), "response", "%s", g.out);
	cr_expect_str_eq(json_string_value(json_object_get(o, "status")), "completed", "%s", g.out);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(
				 json_array_get(json_object_get(o, "output"), 0), "content"), 0),
							   "text")), "Hello", "%s", g.out);
	json_decref(o);
	/* refused before it runs, named as the Responses API names it */
	char out[8192];
	cr_expect_eq(post("/v1/responses", "{\"input\": \"hi\", \"max_output_tokens\": 0}", out,
			  sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "\"param\":\"max_output_tokens\""), "%s", out);
	cr_expect_eq(get("/v1/responses", "k-123", out, sizeof out), 405, "%s", out);
}

/* POST /v1/messages (Anthropic's): a key as x-api-key, errors in Anthropic's shape on its
 * route, max_tokens held to the server's limit, the stream's events and a mid-stream failure
 * as an error event. */
Test(http_server, a_message_streams_anthropics_events)
{
	http_api_set_state(srv, "READY");
	struct call c = {.body = "{\"max_tokens\": 5}"};
	snprintf(c.url, sizeof c.url, "%s/v1/messages", base);
	do_call(&c); /* no key */
	cr_expect_eq(c.status, 401, "%s", c.out);
	cr_expect(strstr(c.out, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\""),
		  "%s", c.out);
	char out[8192];
	cr_expect_eq(post("/v1/messages", "{\"messages\": [{\"role\": \"user\", \"content\": "
			  "\"hi\"}]}", out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "\"type\":\"invalid_request_error\",\"message\":\"max_tokens: field "
			 "required\""), "%s", out);
	cr_expect_eq(post("/v1/messages", "{\"model\": \"other\", \"max_tokens\": 5, \"messages\": "
			  "[{\"role\": \"user\", \"content\": \"hi\"}]}", out, sizeof out), 404, "%s",
		     out);
	cr_expect(strstr(out, "\"type\":\"not_found_error\""), "%s", out);
	cr_expect_eq(post("/v1/chat/completions", "{}", out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "{\"error\":{"), "other routes keep OpenAI's shape: %s", out);
	/* streamed, with the key as x-api-key */
	struct call d = {.x_api_key = "k-123",
			 .body = "{\"max_tokens\": 100000, \"stream\": true, \"system\": \"Be "
				 "brief.\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}"};
	snprintf(d.url, sizeof d.url, "%s/v1/messages", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &d), 0);
	struct queue_job j;
	struct http_flight *f = take_one(&j);
	cr_expect(strncmp(j.id, "msg_", 4) == 0, "%s", j.id);
	cr_expect(strstr(j.body, "\"max_tokens\":50") && strstr(j.body, "\"role\":\"system\""),
		  "held to the limit (50): %s", j.body);
	free(j.body);
	http_api_token(srv, f, 1, "Hel", 3);
	const char *bad = "{\"status\": \"FAILED\", \"error\": {\"code\": \"engine_error\", "
			  "\"message\": \"the engine failed\"}}";
	http_api_finish(srv, f, bad, strlen(bad));
	pthread_join(t, NULL);
	cr_expect_eq(d.status, 200, "%s", d.out);
	cr_expect(strstr(d.out, "event: message_start\ndata: {\"type\":\"message_start\"") == d.out,
		  "%s", d.out);
	cr_expect(strstr(d.out, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\""
			 ",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel\"}}"), "%s",
		  d.out);
	const char *end = strstr(d.out, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
				 "\"api_error\",\"message\":\"the engine failed\"}}\n\n");
	cr_expect(end && !end[strlen("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
				     "\"api_error\",\"message\":\"the engine failed\"}}\n\n")],
		  "%s", d.out);
	/* cut at the limit it was held to (50): max_tokens; cut before it, the context ended */
	static const char *const why[][2] = {{"50", "max_tokens"},
					     {"20", "model_context_window_exceeded"}};
	for (int i = 0; i < 2; i++) {
		struct call e = {.x_api_key = "k-123",
				 .body = "{\"max_tokens\": 100000, \"messages\": [{\"role\": "
					 "\"user\", \"content\": \"hi\"}]}"};
		snprintf(e.url, sizeof e.url, "%s/v1/messages", base);
		cr_assert_eq(pthread_create(&t, NULL, do_call, &e), 0);
		f = take_one(&j);
		free(j.body);
		char res[300], want[100];
		snprintf(res, sizeof res, "{\"status\": \"COMPLETED\", \"output\": {\"text\": "
			 "\"Hi\", \"finish_reason\": \"length\"}, \"usage\": {\"prompt_tokens\": "
			 "4, \"completion_tokens\": %s}}", why[i][0]);
		http_api_finish(srv, f, res, strlen(res));
		pthread_join(t, NULL);
		snprintf(want, sizeof want, "\"stop_reason\":\"%s\"", why[i][1]);
		cr_expect(e.status == 200 && strstr(e.out, want), "%s: %s", want, e.out);
	}
}

/* --model-alias: a request naming an alias runs on the served model, whose name the answer
 * shows; another name is still a 404 on every route. */
Test(http_server, a_model_alias_is_served)
{
	stop_server();
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .max_tokens_limit = 50, .model_aliases = {"claude-*", "gpt-4o"},
				  .n_model_aliases = 2};
	char bound[100], err[WK_ERRSZ], out[8192];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	snprintf(base, sizeof base, "http://%s", bound);
	http_api_set_state(srv, "READY");
	static const char *const paths[] = {"/v1/messages", "/v1/chat/completions"};
	static const char *const models[] = {"claude-sonnet-4-5-20250929", "gpt-4o"};
	for (int i = 0; i < 2; i++) {
		struct call c = {.key = "k-123"};
		char body[300];
		snprintf(body, sizeof body, "{\"model\": \"%s\", \"max_tokens\": 5, \"messages\": "
			 "[{\"role\": \"user\", \"content\": \"hi\"}]}", models[i]);
		c.body = body;
		snprintf(c.url, sizeof c.url, "%s%s", base, paths[i]);
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
		struct queue_job j;
		struct http_flight *f = take_one(&j);
		free(j.body);
		/* the job as the request's check decoded it: the worker need not decode it again */
		struct job *dj = http_flight_take_job(f);
		cr_expect(dj && dj->n_messages == 1 && !strcmp(dj->messages[0].content, "hi") &&
			  !strcmp(dj->id, j.id) && dj->max_tokens == 5, "%s", models[i]);
		cr_expect_null(http_flight_take_job(f));
		job_free(dj);
		free(dj);
		const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Hi\", "
				  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 4, "
				  "\"completion_tokens\": 1}}";
		http_api_finish(srv, f, res, strlen(res));
		pthread_join(t, NULL);
		cr_expect(c.status == 200 && strstr(c.out, "\"model\":\"tiny\""), "%s: %ld %s",
			  models[i], c.status, c.out);
		snprintf(body, sizeof body, "{\"model\": \"gpt-4o-mini\", \"max_tokens\": 5, "
			 "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}");
		cr_expect_eq(post(paths[i], body, out, sizeof out), 404, "%s", out);
	}
	cr_expect_eq(get("/v1/models/claude-opus-4-1", "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"id\":\"tiny\""), "%s", out);
	cr_expect_eq(get("/v1/models/llama", "k-123", out, sizeof out), 404, "%s", out);
	cr_expect_eq(get("/v1/models", "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"id\":\"tiny\"") && !strstr(out, "claude"), "%s", out);
}

/* Runs one response request (body) to its end with the answer text; its id into id. */
static void respond(const char *body, const char *text, char *id, size_t n, struct queue_job *job)
{
	struct call c = {.key = "k-123", .body = body};
	snprintf(c.url, sizeof c.url, "%s/v1/responses", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	struct http_flight *f = take_one(job);
	char res[512];
	snprintf(res, sizeof res, "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"%s\", "
				  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 4, "
				  "\"completion_tokens\": 2}}", text);
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	cr_assert_eq(c.status, 200, "%s", c.out);
	json_t *o = json_loads(c.out, 0, NULL);
	snprintf(id, n, "%s", json_string_value(json_object_get(o, "id")));
	json_decref(o);
}

/* DELETE path (key k-123): its status and body in out. */
static long delete(const char *path, char *out, size_t n)
{
	struct call d = {.key = "k-123"};
	snprintf(d.url, sizeof d.url, "%s%s", base, path);
	CURL *cu = curl_easy_init();
	curl_easy_setopt(cu, CURLOPT_URL, d.url);
	curl_easy_setopt(cu, CURLOPT_CUSTOMREQUEST, "DELETE");
	struct curl_slist *hd = curl_slist_append(NULL, "Authorization: Bearer k-123");
	curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(cu, CURLOPT_WRITEDATA, &d);
	curl_easy_perform(cu);
	curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &d.status);
	curl_slist_free_all(hd);
	curl_easy_cleanup(cu);
	snprintf(out, n, "%s", d.out);
	return d.status;
}

/* previous_response_id: the kept conversation (not its instructions) before the new input,
 * after the new instructions; GET and DELETE /v1/responses/ID; store false keeps none. */
Test(http_server, a_response_goes_on_from_a_kept_one)
{
	http_api_set_state(srv, "READY");
	char id1[64], id2[64], body[512], out[8192];
	struct queue_job j;
	respond("{\"input\": \"hi\", \"instructions\": \"Be brief.\"}", "Hello", id1, sizeof id1, &j);
	free(j.body);
	snprintf(body, sizeof body, "{\"input\": \"more\", \"instructions\": \"New.\", "
		 "\"previous_response_id\": \"%s\"}", id1);
	respond(body, "Done", id2, sizeof id2, &j);
	json_t *jb = json_loads(j.body, 0, NULL);
	free(j.body);
	json_t *msgs = json_object_get(json_object_get(jb, "input"), "messages");
	static const char *const want[][2] = {{"system", "New."}, {"user", "hi"},
					      {"assistant", "Hello"}, {"user", "more"}};
	cr_assert_eq(json_array_size(msgs), 4, "%s", json_dumps(msgs, JSON_COMPACT));
	for (size_t i = 0; i < 4; i++) {
		json_t *m = json_array_get(msgs, i);
		cr_expect_str_eq(json_string_value(json_object_get(m, "role")), want[i][0]);
		cr_expect_str_eq(json_string_value(json_object_get(m, "content")), want[i][1]);
	}
	json_decref(jb);
	/* the second's conversation holds the first's: a third goes on from it */
	snprintf(body, sizeof body, "{\"input\": \"end\", \"previous_response_id\": \"%s\"}", id2);
	char id3[64];
	respond(body, "Bye", id3, sizeof id3, &j);
	cr_expect(strstr(j.body, "\"content\":\"hi\"") && strstr(j.body, "\"content\":\"Done\"") &&
		  !strstr(j.body, "New."), "%s", j.body);
	free(j.body);
	/* read and dropped */
	char path[80];
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, id1) && strstr(out, "\"text\":\"Hello\""), "%s", out);
	cr_expect_eq(delete(path, out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"deleted\":true"), "%s", out);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 404, "%s", out);
	snprintf(body, sizeof body, "{\"input\": \"x\", \"previous_response_id\": \"%s\"}", id1);
	cr_expect_eq(post("/v1/responses", body, out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "\"code\":\"previous_response_not_found\""), "%s", out);
	/* store false: not kept */
	respond("{\"input\": \"hi\", \"store\": false}", "Hello", id1, sizeof id1, &j);
	free(j.body);
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 404, "%s", out);
}

/* GET path's list (200 wanted): its items' "role/type:text" joined by " | " into got, its
 * ids into ids (at most 8); has_more. */
static bool items_page(const char *path, char *got, size_t n, char ids[][40])
{
	char out[8192];
	cr_assert_eq(get(path, "k-123", out, sizeof out), 200, "%s: %s", path, out);
	json_t *o = json_loads(out, 0, NULL), *it;
	size_t i;
	got[0] = 0;
	cr_expect_str_eq(json_string_value(json_object_get(o, "object")), "list");
	json_array_foreach(json_object_get(o, "data"), i, it) {
		const json_t *c = json_array_get(json_object_get(it, "content"), 0);
		size_t l = strlen(got);
		snprintf(got + l, n - l, "%s%s/%s:%s", i ? " | " : "",
			 json_string_value(json_object_get(it, "role")),
			 json_string_value(json_object_get(c, "type")),
			 json_string_value(json_object_get(c, "text")));
		if (i < 8)
			snprintf(ids[i], 40, "%s", json_string_value(json_object_get(it, "id")));
	}
	size_t k = json_array_size(json_object_get(o, "data"));
	if (k)
		cr_expect(!strcmp(json_string_value(json_object_get(o, "first_id")), ids[0]) &&
			  !strcmp(json_string_value(json_object_get(o, "last_id")), ids[k - 1]),
			  "%s", out);
	bool more = json_is_true(json_object_get(o, "has_more"));
	json_decref(o);
	return more;
}

/* GET /v1/responses/ID/input_items: the conversation less the answer, newest first or in
 * order, paged by limit and after; an item's id the same in each response that holds it, an
 * answer's the one its response's output gave it. */
Test(http_server, a_kept_responses_input_items_are_listed)
{
	http_api_set_state(srv, "READY");
	char id1[64], id2[64], path[160], got[1024], out[8192], ids[8][40], ids2[8][40];
	struct queue_job j;
	respond("{\"input\": \"hi\", \"instructions\": \"Be brief.\"}", "Hello", id1, sizeof id1, &j);
	free(j.body);
	char body[256];
	snprintf(body, sizeof body, "{\"input\": [{\"role\": \"developer\", \"content\": "
		 "\"Rules\"}, {\"role\": \"user\", \"content\": [{\"type\": \"input_text\", "
		 "\"text\": \"more\"}]}], \"previous_response_id\": \"%s\"}", id1);
	respond(body, "Done", id2, sizeof id2, &j);
	free(j.body);
	snprintf(path, sizeof path, "/v1/responses/%s/input_items", id2);
	cr_expect(!items_page(path, got, sizeof got, ids), "%s", got);
	cr_expect_str_eq(got, "user/input_text:more | developer/input_text:Rules | "
			      "assistant/output_text:Hello | user/input_text:hi");
	/* in order, two at a time */
	snprintf(path, sizeof path, "/v1/responses/%s/input_items?order=asc&limit=2", id2);
	cr_expect(items_page(path, got, sizeof got, ids2), "%s", got);
	cr_expect_str_eq(got, "user/input_text:hi | assistant/output_text:Hello");
	cr_expect(!strcmp(ids2[0], ids[3]) && !strcmp(ids2[1], ids[2]), "%s %s", ids2[0], ids[3]);
	snprintf(path, sizeof path, "/v1/responses/%s/input_items?limit=2&order=asc&after=%s", id2,
		 ids2[1]);
	cr_expect(!items_page(path, got, sizeof got, ids2), "%s", got);
	cr_expect_str_eq(got, "developer/input_text:Rules | user/input_text:more");
	/* newest first after the newest: the rest */
	snprintf(path, sizeof path, "/v1/responses/%s/input_items?after=%s&limit=100", id2,
		 ids[0]);
	cr_expect(!items_page(path, got, sizeof got, ids2), "%s", got);
	cr_expect_str_eq(got, "developer/input_text:Rules | assistant/output_text:Hello | "
			      "user/input_text:hi");
	/* the first's items, their ids the second's */
	snprintf(path, sizeof path, "/v1/responses/%s/input_items", id1);
	cr_expect(!items_page(path, got, sizeof got, ids2), "%s", got);
	cr_expect_str_eq(got, "user/input_text:hi");
	cr_expect_str_eq(ids2[0], ids[3]);
	/* the first's answer has the id of the first's output message */
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 200, "%s", out);
	json_t *o1 = json_loads(out, 0, NULL);
	cr_expect_str_eq(ids[2], json_string_value(json_object_get(
					 json_array_get(json_object_get(o1, "output"), 0), "id")));
	json_decref(o1);
	snprintf(path, sizeof path, "/v1/responses/%s", id2); /* (what names them is not shown) */
	cr_expect_eq(get(path, "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, id1) && !strstr(out, "_wick"), "%s", out);
	/* refusals, each naming its parameter */
	static const char *const bad[][2] = {{"limit=0", "limit"}, {"limit=101", "limit"},
					     {"limit=2x", "limit"}, {"order=up", "order"},
					     {"after=msg_none", "after"}};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(path, sizeof path, "/v1/responses/%s/input_items?%s", id2, bad[i][0]);
		cr_expect_eq(get(path, "k-123", out, sizeof out), 400, "%s: %s", bad[i][0], out);
		char want[48];
		snprintf(want, sizeof want, "\"param\":\"%s\"", bad[i][1]);
		cr_expect(strstr(out, want), "%s: %s", bad[i][0], out);
	}
	cr_expect_eq(get("/v1/responses/resp_none/input_items", "k-123", out, sizeof out), 404,
		     "%s", out);
	snprintf(path, sizeof path, "/v1/responses/%s/other", id2);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 404, "%s", out);
	cr_expect(strstr(out, "no route"), "%s", out);
	snprintf(path, sizeof path, "/v1/responses/%s/input_items", id2);
	cr_expect_eq(delete(path, out, sizeof out), 405, "%s", out);
	cr_expect_eq(get(path, "other-key", out, sizeof out), 401, "%s", out);
	/* the first deleted: its answer in the second's items keeps its id */
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(delete(path, out, sizeof out), 200, "%s", out);
	snprintf(path, sizeof path, "/v1/responses/%s/input_items", id2);
	cr_expect(!items_page(path, got, sizeof got, ids2), "%s", got);
	cr_expect_str_eq(ids2[2], ids[2]);
	snprintf(path, sizeof path, "/v1/responses/%s", id2);
	cr_expect_eq(delete(path, out, sizeof out), 200, "%s", out);
	snprintf(path, sizeof path, "/v1/responses/%s/input_items", id2);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 404, "%s", out);
}

static char logged[4096]; /* the server's events (http_api_opts.log) */

static void on_log(void *ctx, const char *event, const char *msg)
{
	(void)ctx;
	size_t o = strlen(logged);
	snprintf(logged + o, sizeof logged - o, "%s: %s\n", event, msg);
}

/* A server on --responses-dir DIR. */
static void start_kept(const char *dir)
{
	stop_server();
	logged[0] = 0;
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .max_tokens_limit = 50, .responses_dir = dir, .log = on_log,
				  .parse_threads = 2, .parse_min = 1};
	char bound[100], err[WK_ERRSZ];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	snprintf(base, sizeof base, "http://%s", bound);
	http_api_set_state(srv, "READY");
}

/* --responses-dir: a kept response outlives the server (a worker scaled to zero, a dev
 * session ended): the next one goes on from it, reads it and deletes it; a file that is not
 * a kept response is logged and counted, not served. */
Test(http_server, a_kept_response_outlives_the_server)
{
	char tmp[] = "/tmp/wick-kept-XXXXXX", dir[64], body[512], out[8192], id1[64], id2[64];
	cr_assert_not_null(mkdtemp(tmp));
	snprintf(dir, sizeof dir, "%s/kept", tmp);
	start_kept(dir);
	cr_expect(strstr(logged, "responses_dir: ") && strstr(logged, ": 0 kept responses"), "%s",
		  logged);
	struct queue_job j;
	respond("{\"input\": \"hi\", \"instructions\": \"Be brief.\"}", "Hello", id1, sizeof id1, &j);
	free(j.body);
	respond("{\"input\": \"other\"}", "Other", id2, sizeof id2, &j);
	free(j.body);
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_responses_kept{where=\"disk\"} 2\n") &&
		  strstr(out, "wick_responses_kept{where=\"memory\"} 2\n"), "%s", out);

	start_kept(dir); /* a new process: memory empty */
	cr_expect(strstr(logged, ": 2 kept responses"), "%s", logged);
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_responses_kept{where=\"memory\"} 0\n"), "%s", out);
	char items[128]; /* the input items, read from the file */
	snprintf(items, sizeof items, "/v1/responses/%s/input_items", id2);
	cr_expect_eq(get(items, "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, "\"text\":\"other\"") && strstr(out, "\"has_more\":false"), "%s",
		  out);
	snprintf(body, sizeof body, "{\"input\": \"more\", \"previous_response_id\": \"%s\"}", id1);
	char id3[64];
	respond(body, "Done", id3, sizeof id3, &j);
	json_t *jb = json_loads(j.body, 0, NULL);
	free(j.body);
	json_t *msgs = json_object_get(json_object_get(jb, "input"), "messages");
	static const char *const want[][2] = {{"user", "hi"}, {"assistant", "Hello"},
					      {"user", "more"}};
	cr_assert_eq(json_array_size(msgs), 3, "%s", json_dumps(msgs, JSON_COMPACT));
	for (size_t i = 0; i < 3; i++) {
		json_t *m = json_array_get(msgs, i);
		cr_expect_str_eq(json_string_value(json_object_get(m, "role")), want[i][0]);
		cr_expect_str_eq(json_string_value(json_object_get(m, "content")), want[i][1]);
	}
	json_decref(jb);
	char path[80];
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 200, "%s", out);
	cr_expect(strstr(out, id1) && strstr(out, "\"text\":\"Hello\""), "%s", out);
	/* deleted in memory and on disk: the next server has it not */
	snprintf(path, sizeof path, "/v1/responses/%s", id2);
	cr_expect_eq(delete(path, out, sizeof out), 200, "%s", out);
	start_kept(dir);
	cr_expect(strstr(logged, ": 2 kept responses"), "%s", logged); /* the first and third */
	/* the third's input items, read from disk with the first's: the first's answer has the id
	 * the first's output gave it (asked before the first is read on its own) */
	snprintf(items, sizeof items, "/v1/responses/%s/input_items?order=asc", id3);
	cr_expect_eq(get(items, "k-123", out, sizeof out), 200, "%s", out);
	json_t *li = json_loads(out, 0, NULL);
	json_t *answer = json_array_get(json_object_get(li, "data"), 1);
	char answer_id[80];
	const char *aid = json_string_value(json_object_get(answer, "id"));
	snprintf(answer_id, sizeof answer_id, "%s", aid ? aid : "(none)");
	json_decref(li);
	snprintf(path, sizeof path, "/v1/responses/%s", id1);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 200, "%s", out);
	json_t *r1 = json_loads(out, 0, NULL);
	const char *oid = json_string_value(
		json_object_get(json_array_get(json_object_get(r1, "output"), 0), "id"));
	cr_expect_str_eq(answer_id, oid ? oid : "(no output id)");
	json_decref(r1);
	start_kept(dir); /* memory empty again */
	snprintf(path, sizeof path, "/v1/responses/%s", id2);
	cr_expect_eq(get(path, "k-123", out, sizeof out), 404, "%s", out);
	cr_expect(strstr(out, "--responses-dir"), "%s", out);
	cr_expect_eq(delete(path, out, sizeof out), 404, "%s", out);
	/* a file cut short: logged, counted, not found (and removed) */
	char cmd[300];
	snprintf(cmd, sizeof cmd, "truncate -s 10 %s/%s.*.json", dir, id3);
	cr_assert_eq(system(cmd), 0);
	snprintf(body, sizeof body, "{\"input\": \"x\", \"previous_response_id\": \"%s\"}", id3);
	cr_expect_eq(post("/v1/responses", body, out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "previous_response_not_found"), "%s", out);
	cr_expect(strstr(logged, "not a kept response"), "%s", logged);
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_responses_dir_errors_total 1\n") &&
		  strstr(out, "wick_responses_kept{where=\"disk\"} 1\n"), "%s", out);
	/* a directory that cannot be one: named at start */
	stop_server();
	struct http_api_opts o = {.listen = "127.0.0.1:0", .api_key = "k-123",
				  .responses_dir = "/dev/null/kept"};
	char bound[100], err[WK_ERRSZ];
	cr_expect_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_EINVAL);
	cr_expect(strstr(err, "--responses-dir") && strstr(err, "/dev/null/kept"), "%s", err);
	snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
	cr_assert_eq(system(cmd), 0);
}

/* --sse-keepalive: a stream that waits (queued, or a long prefill) starts, then says it is
 * alive (an SSE comment; Anthropic's ping event on its API), so that a proxy's idle timeout
 * keeps it; its tokens then come as ever. */
Test(http_server, a_waiting_stream_is_kept_alive)
{
	stop_server();
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .max_tokens_limit = 50, .keepalive_s = 0.3};
	char bound[100], err[WK_ERRSZ];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	snprintf(base, sizeof base, "http://%s", bound);
	http_api_set_state(srv, "READY");
	static const char *const paths[] = {"/v1/chat/completions", "/v1/messages"};
	static const char *const alive[] = {"\n\n: keepalive\n\n",
					    "event: ping\ndata: {\"type\":\"ping\"}\n\n"};
	for (int i = 0; i < 2; i++) {
		struct call c = {.key = "k-123", .body = "{\"max_tokens\": 5, \"stream\": true, "
							 "\"messages\": [{\"role\": \"user\", "
							 "\"content\": \"hi\"}]}"};
		snprintf(c.url, sizeof c.url, "%s%s", base, paths[i]);
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
		struct queue_job j;
		struct http_flight *f = take_one(&j);
		free(j.body);
		usleep(1600000); /* no token for 1.6 s: a keepalive each other sweep (0.25 s) */
		http_api_token(srv, f, 1, "Hi", 2);
		const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Hi\", "
				  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 4, "
				  "\"completion_tokens\": 1}}";
		http_api_finish(srv, f, res, strlen(res));
		pthread_join(t, NULL);
		cr_expect_eq(c.status, 200, "%s", c.out);
		int n = 0;
		for (const char *p = strstr(c.out, alive[i]); p; p = strstr(p + 1, alive[i]))
			n++;
		cr_expect(n >= 2 && n <= 7, "%s: %d keepalives in %s", paths[i], n, c.out);
		const char *first = strstr(c.out, alive[i]), *tok = strstr(c.out, "Hi\"");
		cr_expect(first && tok && first < tok, "%s", c.out);
		cr_expect(strstr(c.out, i ? "event: message_stop" : "data: [DONE]"), "%s", c.out);
	}
}

/* The parsers' hook: a request taken waits here while held. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int entered;
	bool held;
} ph = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void parse_hold(void *ctx)
{
	(void)ctx;
	pthread_mutex_lock(&ph.mu);
	ph.entered++;
	pthread_cond_broadcast(&ph.cv);
	while (ph.held)
		pthread_cond_wait(&ph.cv, &ph.mu);
	pthread_mutex_unlock(&ph.mu);
}

static int parse_entered(void)
{
	pthread_mutex_lock(&ph.mu);
	int n = ph.entered;
	pthread_mutex_unlock(&ph.mu);
	return n;
}

/* Waits up to 5 s for the parsers to have taken n requests in all. */
static void parse_wait(int n)
{
	pthread_mutex_lock(&ph.mu);
	for (int i = 0; i < 500 && ph.entered < n; i++) {
		pthread_mutex_unlock(&ph.mu);
		usleep(10000);
		pthread_mutex_lock(&ph.mu);
	}
	int got = ph.entered;
	pthread_mutex_unlock(&ph.mu);
	cr_assert_geq(got, n, "the parsers took %d requests, not %d", got, n);
}

/* From now on a request taken is held. */
static void parse_holding(void)
{
	pthread_mutex_lock(&ph.mu);
	ph.held = true;
	pthread_mutex_unlock(&ph.mu);
}

static void parse_release(void)
{
	pthread_mutex_lock(&ph.mu);
	ph.held = false;
	pthread_cond_broadcast(&ph.cv);
	pthread_mutex_unlock(&ph.mu);
}

/* The value of a /metrics line beginning name (and a space), or -1. */
static long metric(const char *name)
{
	char out[8192], key[128];
	cr_assert_eq(get("/metrics", "k-123", out, sizeof out), 200);
	snprintf(key, sizeof key, "\n%s ", name);
	const char *p = strstr(out, key);
	return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* A chat request with a user message of kb KB (a long conversation's size). */
static char *big_chat(int kb, int seed)
{
	size_t n = (size_t)kb << 10;
	char *body = malloc(n + 200);
	cr_assert_not_null(body);
	int o = snprintf(body, 200, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", "
			 "\"content\": \"%d ", seed);
	for (size_t i = 0; i < n; i++)
		body[o + i] = "abcdefgh ij"[(i * 7 + (size_t)seed) % 11];
	snprintf(body + o + n, 200, "\"}]}");
	return body;
}

static void *stop_later(void *arg)
{
	(void)arg;
	usleep(50000);
	parse_release();
	return NULL;
}

/* A request of 16 KB or more is made into its jobs on a parser thread, beside the server's:
 * the server answers others while a parser holds one (a client that leaves meanwhile is
 * answered by no one, and nothing of it runs), its jobs are what the server thread would
 * have made, a drain serves a request being parsed as one accepted (new ones get 503), the
 * server's end answers one being parsed or queued 503, and a small request is parsed on the
 * server thread. */
Test(http_server, a_big_request_is_parsed_beside_the_server)
{
	stop_server();
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .max_tokens_limit = 50, .parse_threads = 1,
				  .parse_hook = parse_hold};
	char bound[100], err[WK_ERRSZ];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	snprintf(base, sizeof base, "http://%s", bound);
	http_api_set_state(srv, "READY");
	parse_holding();

	/* 1: held by its parser; the client leaves; the server answers /metrics meanwhile */
	char *body = big_chat(64, 1);
	struct call c = {.key = "k-123", .body = body, .timeout_ms = 400};
	snprintf(c.url, sizeof c.url, "%s/v1/chat/completions", base);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c), 0);
	parse_wait(1);
	cr_expect_eq(metric("wick_http_requests_parsing"), 1);
	pthread_join(t, NULL);
	cr_expect_eq(c.status, 0, "the client timed out: %ld %s", c.status, c.out);
	usleep(100000); /* the server sees the close */
	parse_release();
	struct http_flight *f = NULL;
	cr_expect_eq(http_api_take(srv, &f, 1, 0.5), 0, "a request whose client left ran");
	cr_expect_eq(metric("wick_http_requests_parsed_beside_total"), 1);
	cr_expect_eq(metric("wick_http_requests_parsing"), 0);

	/* 2: its job is the one the server thread makes of it (oai_to_job), its id aside */
	struct call c2 = {.key = "k-123", .body = body};
	snprintf(c2.url, sizeof c2.url, "%s/v1/chat/completions", base);
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c2), 0);
	struct queue_job j;
	f = take_one(&j);
	struct oai_req r;
	struct oai_err e;
	cr_assert_eq(oai_to_job(OAI_CHAT, body, strlen(body), "tiny", j.id, "default", 50, &r, &e),
		     0, "%s", e.message);
	cr_expect(j.len == r.job_lens[0] && !memcmp(j.body, r.jobs[0], j.len),
		  "%.200s\nagainst\n%.200s", j.body, r.jobs[0]);
	struct job *dj = http_flight_take_job(f);
	cr_expect(dj && dj->n_messages == 1 && strlen(dj->messages[0].content) > 64 << 10);
	job_free(dj);
	free(dj);
	oai_req_free(&r);
	free(j.body);
	const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Hi\", "
			  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 4, "
			  "\"completion_tokens\": 1}}";
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	cr_expect_eq(c2.status, 200, "%s", c2.out);
	cr_expect(strstr(c2.out, "\"content\":\"Hi\""), "%s", c2.out);

	/* 3: a small one and a big bad one: the server's, and the parser's error */
	char out[8192];
	long before = metric("wick_http_requests_parsed_beside_total");
	cr_expect_eq(post("/v1/chat/completions", "{\"messages\": 1}", out, sizeof out), 400);
	cr_expect_eq(metric("wick_http_requests_parsed_beside_total"), before);
	memcpy(body + strlen(body) - 4, "\"}] ", 4); /* (not JSON: no closing brace) */
	cr_expect_eq(post("/v1/chat/completions", body, out, sizeof out), 400, "%s", out);
	cr_expect(strstr(out, "\"code\":\"invalid_json\""), "%s", out);
	cr_expect_eq(metric("wick_http_requests_parsed_beside_total"), before + 1);
	free(body);

	/* 4: a drain while it is held: it was accepted before, so it waits (counted), and runs */
	parse_holding();
	int n = parse_entered();
	body = big_chat(32, 2);
	struct call c3 = {.key = "k-123", .body = body};
	snprintf(c3.url, sizeof c3.url, "%s/v1/chat/completions", base);
	cr_assert_eq(pthread_create(&t, NULL, do_call, &c3), 0);
	parse_wait(n + 1);
	http_api_set_state(srv, "DRAINING");
	cr_expect_eq(http_api_waiting(srv), 1, "a drain would not wait for it");
	cr_expect_eq(post("/v1/chat/completions", "{\"messages\": 1}", out, sizeof out), 503);
	parse_release();
	f = take_one(&j);
	free(j.body);
	http_api_finish(srv, f, res, strlen(res));
	pthread_join(t, NULL);
	cr_expect_eq(c3.status, 200, "%s", c3.out);
	cr_expect_eq(http_api_waiting(srv), 0);

	/* 5: the server's end while one is held and another queued: both answered 503 */
	http_api_set_state(srv, "READY");
	parse_holding();
	n = parse_entered();
	struct call c4 = {.key = "k-123", .body = body}, c5 = c4;
	snprintf(c4.url, sizeof c4.url, "%s/v1/chat/completions", base);
	snprintf(c5.url, sizeof c5.url, "%s/v1/chat/completions", base);
	pthread_t t4, t5, rel;
	cr_assert_eq(pthread_create(&t4, NULL, do_call, &c4), 0);
	parse_wait(n + 1);
	cr_assert_eq(pthread_create(&t5, NULL, do_call, &c5), 0);
	for (int i = 0; i < 100 && metric("wick_http_requests_parsing") < 2; i++)
		usleep(10000);
	cr_expect_eq(metric("wick_http_requests_parsing"), 2);
	cr_assert_eq(pthread_create(&rel, NULL, stop_later, NULL), 0);
	stop_server();
	pthread_join(rel, NULL);
	pthread_join(t4, NULL);
	pthread_join(t5, NULL);
	free(body);
	cr_expect_eq(c4.status, 503, "%s", c4.out);
	cr_expect_eq(c5.status, 503, "%s", c5.out);
	start_server(); /* (for the suite's fini) */
}

/* Choices wait in the inbox for a batch slot; the worker takes first the first to come of the
 * tenant whose choices it holds fewest of (of those, the one served longest ago), so one
 * tenant's burst does not keep another's request waiting behind all of it; within a tenant,
 * first come, first served. */
Test(http_server, a_tenants_burst_does_not_starve_another)
{
	stop_server();
	char keys[300];
	snprintf(keys, sizeof keys, "/tmp/wick-keys-%d", (int)getpid());
	FILE *kf = fopen(keys, "w");
	cr_assert_not_null(kf);
	fputs("k-b team-b\n", kf);
	fclose(kf);
	struct http_api_opts o = {.listen = "127.0.0.1:0", .served_name = "tiny", .api_key = "k-123",
				  .api_keys_file = keys, .max_tokens_limit = 50};
	char bound[100], err[WK_ERRSZ];
	cr_assert_eq(http_api_start(&o, &srv, bound, sizeof bound, err, sizeof err), WK_OK, "%s", err);
	unlink(keys);
	snprintf(base, sizeof base, "http://%s", bound);
	http_api_set_state(srv, "READY");
	struct call c[5];
	pthread_t t[5];
	for (int i = 0; i < 5; i++) { /* four of the default tenant's, then team-b's */
		c[i] = (struct call){.key = i < 4 ? "k-123" : "k-b",
				     .body = "{\"prompt\": \"hi\", \"max_tokens\": 5}"};
		snprintf(c[i].url, sizeof c[i].url, "%s/v1/completions", base);
		cr_assert_eq(pthread_create(&t[i], NULL, do_call, &c[i]), 0);
		for (int k = 0; k < 500 && http_api_waiting(srv) < i + 1; k++)
			usleep(10000);
		cr_assert_eq(http_api_waiting(srv), i + 1);
	}
	char out[8192];
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_tenant_choices{tenant=\"default\",state=\"waiting\"} 4\n") &&
		  strstr(out, "wick_http_tenant_choices{tenant=\"team-b\",state=\"waiting\"} 1\n") &&
		  strstr(out, "wick_http_tenant_choices{tenant=\"team-b\",state=\"held\"} 0\n"), "%s",
		  out);
	static const char *const want[5] = {"default", "team-b", "default", "default", "default"};
	struct http_flight *f[5];
	for (int i = 0; i < 5; i++) {
		struct queue_job j;
		f[i] = take_one(&j);
		char ten[64];
		snprintf(ten, sizeof ten, "\"tenant\":\"%s\"", want[i]);
		cr_expect(strstr(j.body, ten), "take %d: %s, not %s", i, j.body, want[i]);
		free(j.body);
		if (i == 1) { /* team-b's ends: its tenant holds none again */
			const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"b\", "
					  "\"finish_reason\": \"stop\"}, \"usage\": "
					  "{\"prompt_tokens\": 2, \"completion_tokens\": 1}}";
			http_api_finish(srv, f[i], res, strlen(res));
		}
	}
	cr_expect_eq(get("/metrics", "k-123", out, sizeof out), 200);
	cr_expect(strstr(out, "wick_http_tenant_choices{tenant=\"default\",state=\"held\"} 4\n") &&
		  strstr(out, "wick_http_tenant_choices{tenant=\"team-b\",state=\"held\"} 0\n"), "%s",
		  out);
	const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"a\", "
			  "\"finish_reason\": \"stop\"}, \"usage\": {\"prompt_tokens\": 2, "
			  "\"completion_tokens\": 1}}";
	for (int i = 0; i < 5; i++)
		if (i != 1)
			http_api_finish(srv, f[i], res, strlen(res));
	for (int i = 0; i < 5; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(c[i].status, 200, "%d: %s", i, c[i].out);
	}
	/* none held now: of two default requests and then team-b's, team-b's goes first, its
	 * tenant served longer ago (one slot: tenants take turns) */
	for (int i = 0; i < 3; i++) {
		c[i] = (struct call){.key = i < 2 ? "k-123" : "k-b",
				     .body = "{\"prompt\": \"hi\", \"max_tokens\": 5}"};
		snprintf(c[i].url, sizeof c[i].url, "%s/v1/completions", base);
		cr_assert_eq(pthread_create(&t[i], NULL, do_call, &c[i]), 0);
		for (int k = 0; k < 500 && http_api_waiting(srv) < i + 1; k++)
			usleep(10000);
	}
	static const char *const turns[3] = {"team-b", "default", "default"};
	for (int i = 0; i < 3; i++) {
		struct queue_job j;
		struct http_flight *g = take_one(&j);
		char ten[64];
		snprintf(ten, sizeof ten, "\"tenant\":\"%s\"", turns[i]);
		cr_expect(strstr(j.body, ten), "turn %d: %s, not %s", i, j.body, turns[i]);
		free(j.body);
		http_api_finish(srv, g, res, strlen(res));
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(c[i].status, 200, "%d: %s", i, c[i].out);
	}
}
