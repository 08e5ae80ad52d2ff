/* The job decoder and result encoder: every error code and limit. */
#include <criterion/criterion.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/job.h"

static char msg[512];

static enum job_err dec(const char *s, struct job *j) { return job_decode(s, strlen(s), NULL, j, msg, sizeof msg); }

/* Decodes s, expects code e, frees. */
static void expect(const char *s, enum job_err e)
{
	struct job j;
	enum job_err got = dec(s, &j);
	cr_expect_eq(got, e, "%s -> %s (%s), want %s", s, job_err_code(got), msg, job_err_code(e));
	if (e != JOB_OK)
		cr_expect_neq(msg[0], 0, "no message for %s", s);
	job_free(&j);
}

Test(job, minimal_prompt_and_defaults)
{
	struct job j;
	cr_assert_eq(dec("{\"id\": \"a-1.b_c\", \"input\": {\"prompt\": \"Once\"}}", &j), JOB_OK, "%s", msg);
	cr_expect_str_eq(j.id, "a-1.b_c");
	cr_expect_str_eq(j.prompt, "Once");
	cr_expect_str_eq(j.tenant, "");
	cr_expect_eq(j.max_tokens, JOB_MAX_TOKENS_DEFAULT);
	cr_expect_float_eq(j.temperature, 1.0f, 1e-9);
	cr_expect_float_eq(j.top_p, 1.0f, 1e-9);
	cr_expect_eq(j.top_k, 0);
	cr_expect(!j.has_seed);
	cr_expect_eq(j.n_stop, 0);
	cr_expect_float_eq(j.timeout_s, JOB_TIMEOUT_DEFAULT, 1e-9);
	cr_expect(!j.stream);
	job_free(&j);
	job_free(&j); /* twice is fine */
}

Test(job, all_fields)
{
	struct job j;
	const char *s = "{\"id\": \"x\", \"tenant\": \"acme\", \"timeout_s\": 2.5, \"extra\": [1],"
			"\"input\": {\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
			"{\"role\": \"user\", \"content\": \"Hi \\u00e9\"}],"
			"\"max_tokens\": 16, \"temperature\": 0, \"top_p\": 0.9, \"top_k\": 40,"
			"\"seed\": 9007199254740993, \"stop\": [\"\\n\", \"END\"], \"stream\": true,"
			"\"prediction\": \"Hello \\u00e9\"}}";
	cr_assert_eq(dec(s, &j), JOB_OK, "%s", msg);
	cr_expect_str_eq(j.tenant, "acme");
	cr_expect_float_eq(j.timeout_s, 2.5, 1e-9);
	cr_expect_null(j.prompt);
	cr_assert_eq(j.n_messages, 2);
	cr_expect_str_eq(j.messages[0].role, "system");
	cr_expect_str_eq(j.messages[1].content, "Hi \xc3\xa9");
	cr_expect_eq(j.max_tokens, 16);
	cr_expect_float_eq(j.temperature, 0.0f, 1e-9);
	cr_expect_float_eq(j.top_p, 0.9f, 1e-6);
	cr_expect_eq(j.top_k, 40);
	cr_expect(j.has_seed);
	cr_expect_eq(j.seed, 9007199254740993ull);
	cr_assert_eq(j.n_stop, 2);
	cr_expect_str_eq(j.stop[0], "\n");
	cr_expect_str_eq(j.stop[1], "END");
	cr_expect(j.stream);
	cr_expect_str_eq(j.prediction, "Hello \xc3\xa9");
	job_free(&j);
	/* a single stop string, nulls as absent, max_tokens 16.0 */
	cr_assert_eq(dec("{\"id\": \"x\", \"tenant\": null, \"input\": {\"prompt\": \"p\", \"stop\": \"s\","
			 " \"seed\": null, \"max_tokens\": 16.0}}", &j), JOB_OK, "%s", msg);
	cr_expect_eq(j.n_stop, 1);
	cr_expect_eq(j.max_tokens, 16);
	job_free(&j);
}

Test(job, invalid_json)
{
	expect("", JOB_EINVALID_JSON);
	expect("{", JOB_EINVALID_JSON);
	expect("not json", JOB_EINVALID_JSON);
	expect("[1, 2]", JOB_EINVALID_JSON);
	expect("\"a string\"", JOB_EINVALID_JSON);
	expect("{\"id\": \"a\", \"id\": \"b\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_JSON); /* duplicate key */
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"a\\u0000b\"}}", JOB_EINVALID_JSON);     /* NUL */
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"\xff\"}}", JOB_EINVALID_JSON);          /* bad UTF-8 */
	struct job j;
	cr_expect_eq(job_decode(NULL, 0, "q", &j, msg, sizeof msg), JOB_EINVALID_JSON);
	cr_expect_str_eq(j.id, "q"); /* the queue's id survives, for the FAILED result */
	job_free(&j);
}

Test(job, invalid_input)
{
	expect("{\"id\": \"a\"}", JOB_EINVALID_INPUT);                                       /* no input */
	expect("{\"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);                      /* no id */
	expect("{\"id\": \"a\", \"input\": \"x\"}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": 5}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"messages\": []}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": []}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": {}}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": [\"hi\"]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\"}]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": [{\"content\": \"x\"}]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"\", \"content\": \"x\"}]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": [1]}]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": 5, \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a b\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"..\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a/b\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"tenant\": \"t t\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"tenant\": 3, \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"timeout_s\": 0, \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"timeout_s\": 86401, \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"timeout_s\": \"5\", \"input\": {\"prompt\": \"x\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": \"5\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 1.5}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"temperature\": -0.1}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"temperature\": 2.01}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"temperature\": \"hot\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_p\": 0}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_p\": 1.01}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_k\": -1}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_k\": 2.5}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_k\": 1000001}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"seed\": -1}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"seed\": 1.5}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": 5}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": [\"\"]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": [1]}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": \"\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stream\": 1}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stream\": \"yes\"}}", JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"prediction\": [\"a\"]}}",
	       JOB_EINVALID_INPUT);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"prediction\": 3}}", JOB_EINVALID_INPUT);
}

Test(job, ranges_at_their_edges)
{
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"\", \"max_tokens\": 1}}", JOB_OK);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 131072}}", JOB_OK);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 0}}", JOB_EMAX_TOKENS);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": -5}}", JOB_EMAX_TOKENS);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 131073}}", JOB_EMAX_TOKENS);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 1e12}}", JOB_EMAX_TOKENS);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"temperature\": 2, \"top_p\": 1, \"top_k\": 1000000}}", JOB_OK);
	expect("{\"id\": \"a\", \"timeout_s\": 86400, \"input\": {\"prompt\": \"x\"}}", JOB_OK);
	expect("{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"seed\": 0}}", JOB_OK);
}

static char *repeat(char c, size_t n)
{
	char *s = malloc(n + 1);
	memset(s, c, n);
	s[n] = 0;
	return s;
}

Test(job, limits)
{
	char *id = repeat('i', JOB_ID_MAX), *big = repeat('p', JOB_PROMPT_MAX + 1);
	size_t cap = JOB_PROMPT_MAX + 4096;
	char *s = malloc(cap);
	snprintf(s, cap, "{\"id\": \"%s\", \"input\": {\"prompt\": \"x\"}}", id);
	expect(s, JOB_OK);
	snprintf(s, cap, "{\"id\": \"%sj\", \"input\": {\"prompt\": \"x\"}}", id);
	expect(s, JOB_EINVALID_INPUT);
	snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"prompt\": \"%s\"}}", big);
	expect(s, JOB_EPROMPT_TOO_LONG);
	big[JOB_PROMPT_MAX] = 0;
	snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"prompt\": \"%s\"}}", big);
	expect(s, JOB_OK);
	/* messages: their total counts */
	big[JOB_PROMPT_MAX / 2 + 1] = 0;
	snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"%s\"},"
		 "{\"role\": \"user\", \"content\": \"%s\"}]}}", big, big);
	expect(s, JOB_EPROMPT_TOO_LONG);
	free(big);
	/* message count: an agent's session of thousands of turns is one chat */
	size_t off = (size_t)snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"messages\": [");
	for (int i = 0; i < JOB_MESSAGES_MAX; i++)
		off += (size_t)snprintf(s + off, cap - off, "%s{\"role\": \"user\", \"content\": \"m\"}", i ? "," : "");
	snprintf(s + off, cap - off, "]}}");
	cr_expect_geq(JOB_MESSAGES_MAX, 4096);
	expect(s, JOB_OK);
	off = (size_t)snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"messages\": [");
	for (int i = 0; i <= JOB_MESSAGES_MAX; i++)
		off += (size_t)snprintf(s + off, cap - off, "%s{\"role\": \"user\", \"content\": \"m\"}", i ? "," : "");
	snprintf(s + off, cap - off, "]}}");
	expect(s, JOB_EINVALID_INPUT);
	/* stop strings: count and length */
	off = (size_t)snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": [");
	for (int i = 0; i <= JOB_STOP_MAX; i++)
		off += (size_t)snprintf(s + off, cap - off, "%s\"s\"", i ? "," : "");
	snprintf(s + off, cap - off, "]}}");
	expect(s, JOB_EINVALID_INPUT);
	char *stop = repeat('s', JOB_STOP_LEN_MAX + 1);
	snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": \"%s\"}}", stop);
	expect(s, JOB_EINVALID_INPUT);
	stop[JOB_STOP_LEN_MAX] = 0;
	snprintf(s, cap, "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"stop\": \"%s\"}}", stop);
	expect(s, JOB_OK);
	free(stop);
	/* the whole document */
	struct job j;
	cr_expect_eq(job_decode("{}", JOB_BODY_MAX + 1, NULL, &j, msg, sizeof msg), JOB_EINVALID_INPUT);
	job_free(&j);
	free(s);
	free(id);
}

Test(job, queue_id)
{
	struct job j;
	const char *s = "{\"input\": {\"prompt\": \"x\"}}";
	cr_assert_eq(job_decode(s, strlen(s), "from-queue", &j, msg, sizeof msg), JOB_OK, "%s", msg);
	cr_expect_str_eq(j.id, "from-queue");
	job_free(&j);
	s = "{\"id\": \"other\", \"input\": {\"prompt\": \"x\"}}";
	cr_expect_eq(job_decode(s, strlen(s), "from-queue", &j, msg, sizeof msg), JOB_EINVALID_INPUT);
	cr_expect_str_eq(j.id, "from-queue");
	job_free(&j);
	/* an id known from the body is kept when a later member fails */
	s = "{\"id\": \"mine\", \"input\": {\"prompt\": \"x\", \"max_tokens\": 0}}";
	cr_expect_eq(job_decode(s, strlen(s), NULL, &j, msg, sizeof msg), JOB_EMAX_TOKENS);
	cr_expect_str_eq(j.id, "mine");
	job_free(&j);
}

Test(job, error_codes_and_status_names)
{
	const char *want[] = {"ok", "invalid_json", "invalid_input", "prompt_too_long", "max_tokens_range",
			      "timeout", "cancelled", "engine_error", "internal"};
	for (int e = JOB_OK; e <= JOB_EINTERNAL; e++)
		cr_expect_str_eq(job_err_code((enum job_err)e), want[e]);
	cr_expect_str_eq(job_err_code((enum job_err)99), "internal");
	cr_expect_str_eq(job_status_name(JOB_COMPLETED), "COMPLETED");
	cr_expect_str_eq(job_status_name(JOB_FAILED), "FAILED");
	cr_expect_str_eq(job_status_name(JOB_TIMED_OUT), "TIMED_OUT");
	cr_expect_str_eq(job_status_name(JOB_CANCELLED), "CANCELLED");
}

Test(job, id_validity)
{
	cr_expect(job_id_valid("A-z_0.9"));
	cr_expect(!job_id_valid(""));
	cr_expect(!job_id_valid(NULL));
	cr_expect(!job_id_valid("."));
	cr_expect(!job_id_valid(".."));
	cr_expect(job_id_valid("..."));
	cr_expect(!job_id_valid("a~1"));
	cr_expect(!job_id_valid("é"));
}

/* Parses an encoded result with jansson, so the tests check real JSON. */
static json_t *parse(const char *s)
{
	json_error_t e;
	json_t *v = json_loads(s, 0, &e);
	cr_assert_not_null(v, "not JSON (%s): %s", e.text, s);
	return v;
}

Test(job, encode_completed)
{
	int toks[] = {1, 2, 3};
	struct job_result r = {.id = "j1", .status = JOB_COMPLETED, .text = "Once upon\n\"a\"", .token_ids = toks,
			       .n_tokens = 3, .finish_reason = "length", .prompt_tokens = 4,
			       .completion_tokens = 3, .queue_seconds = 0.25, .gpu_seconds = 1.5,
			       .cost_micro_usd = 12345678, .worker = "w1", .attempt = 2};
	size_t len;
	char *s = job_encode_result(&r, &len);
	cr_assert_not_null(s);
	cr_expect_eq(strlen(s), len);
	cr_expect_not_null(strstr(s, "\"cost_usd\": 12.345678,"), "%s", s);
	json_t *v = parse(s);
	cr_expect_str_eq(json_string_value(json_object_get(v, "id")), "j1");
	cr_expect_str_eq(json_string_value(json_object_get(v, "status")), "COMPLETED");
	cr_expect_null(json_object_get(v, "error"));
	json_t *out = json_object_get(v, "output");
	cr_expect_str_eq(json_string_value(json_object_get(out, "text")), "Once upon\n\"a\"");
	cr_expect_eq(json_array_size(json_object_get(out, "token_ids")), 3);
	cr_expect_eq(json_integer_value(json_array_get(json_object_get(out, "token_ids"), 2)), 3);
	cr_expect_str_eq(json_string_value(json_object_get(out, "finish_reason")), "length");
	json_t *u = json_object_get(v, "usage");
	cr_expect_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 4);
	cr_expect_eq(json_integer_value(json_object_get(u, "completion_tokens")), 3);
	cr_expect_float_eq(json_real_value(json_object_get(u, "queue_seconds")), 0.25, 1e-9);
	cr_expect_float_eq(json_real_value(json_object_get(u, "gpu_seconds")), 1.5, 1e-9);
	cr_expect_eq(json_integer_value(json_object_get(u, "cost_micro_usd")), 12345678);
	cr_expect_str_eq(json_string_value(json_object_get(v, "worker")), "w1");
	cr_expect_eq(json_integer_value(json_object_get(v, "attempt")), 2);
	json_decref(v);
	free(s);
}

Test(job, encode_cost_digits)
{
	struct { int64_t micro; const char *want; } c[] = {
		{0, "\"cost_usd\": 0.000000,"}, {1, "\"cost_usd\": 0.000001,"}, {999999, "\"cost_usd\": 0.999999,"},
		{1000000, "\"cost_usd\": 1.000000,"}, {-5, "\"cost_usd\": -0.000005,"},
		{INT64_MAX, "\"cost_usd\": 9223372036854.775807,"}, {INT64_MIN, "\"cost_usd\": -9223372036854.775808,"}};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		struct job_result r = {.id = "x", .cost_micro_usd = c[i].micro};
		char *s = job_encode_result(&r, NULL);
		cr_expect_not_null(strstr(s, c[i].want), "%s", s);
		json_decref(parse(s));
		free(s);
	}
}

Test(job, encode_errors)
{
	size_t len;
	char *s = job_encode_error("bad", JOB_FAILED, JOB_EINVALID_JSON, "not JSON: \x01", "w", 1, &len);
	json_t *v = parse(s);
	cr_expect_str_eq(json_string_value(json_object_get(v, "status")), "FAILED");
	json_t *e = json_object_get(v, "error");
	cr_expect_str_eq(json_string_value(json_object_get(e, "code")), "invalid_json");
	cr_expect_str_eq(json_string_value(json_object_get(e, "message")), "not JSON: \x01");
	cr_expect(json_is_null(json_object_get(json_object_get(v, "output"), "finish_reason")));
	json_decref(v);
	free(s);
	/* every non-COMPLETED status has an error; JOB_OK there means internal */
	enum job_status sts[] = {JOB_TIMED_OUT, JOB_CANCELLED};
	enum job_err errs[] = {JOB_ETIMEOUT, JOB_OK};
	const char *codes[] = {"timeout", "internal"};
	for (int i = 0; i < 2; i++) {
		struct job_result r = {.id = "x", .status = sts[i], .err = errs[i], .text = "partial"};
		s = job_encode_result(&r, NULL);
		v = parse(s);
		cr_expect_str_eq(json_string_value(json_object_get(json_object_get(v, "error"), "code")), codes[i]);
		cr_expect_str_eq(json_string_value(json_object_get(json_object_get(v, "output"), "text")), "partial");
		json_decref(v);
		free(s);
	}
}

Test(job, encode_invalid_utf8_and_nulls)
{
	/* a token that ends mid-character, a lone continuation byte, an overlong form, a surrogate */
	const char text[] = "ok \xe2\x82 x \x80 \xc0\xaf \xed\xa0\x80 \xf0\x9f\x98\x80 end";
	struct job_result r = {.id = NULL, .status = JOB_COMPLETED, .text = text, .worker = NULL};
	char *s = job_encode_result(&r, NULL);
	json_t *v = parse(s);
	const char *t = json_string_value(json_object_get(json_object_get(v, "output"), "text"));
	cr_expect_not_null(strstr(t, "ok \xef\xbf\xbd"), "%s", t);
	cr_expect_not_null(strstr(t, "\xf0\x9f\x98\x80 end"), "%s", t);
	cr_expect_str_eq(json_string_value(json_object_get(v, "id")), "");
	json_decref(v);
	free(s);
	/* text_len: bytes with a NUL inside */
	struct job_result r2 = {.id = "n", .text = "a\0b", .text_len = 3};
	s = job_encode_result(&r2, NULL);
	cr_expect_not_null(strstr(s, "\"a\\u0000b\""), "%s", s);
	free(s);
	/* a stream's piece: the same repair, as {"output": {"text": ...}} */
	size_t n = 0;
	s = job_stream_chunk(text, sizeof text - 1, 0, &n);
	cr_assert_not_null(s);
	cr_expect_eq(n, strlen(s));
	v = parse(s);
	const char *pt = json_string_value(json_object_get(json_object_get(v, "output"), "text"));
	cr_expect_not_null(pt && strstr(pt, "ok \xef\xbf\xbd"), "%s", s);
	cr_expect_not_null(pt && strstr(pt, "\xf0\x9f\x98\x80 end"), "%s", s);
	cr_expect_null(json_object_get(v, "attempt"));
	json_decref(v);
	free(s);
	s = job_stream_chunk("a\"b", 3, 2, NULL);
	cr_expect_str_eq(s, "{\"output\": {\"text\": \"a\\\"b\"}, \"attempt\": 2}");
	free(s);
	/* NaN and infinite seconds still make JSON */
	struct job_result r3 = {.id = "n", .queue_seconds = 0.0 / 0.0, .gpu_seconds = 1e300};
	s = job_encode_result(&r3, NULL);
	json_decref(parse(s));
	free(s);
}

/* OpenAI's tools in a chat job: input.tools kept as JSON text, an assistant's tool_calls with
 * arguments as a JSON object's text or an object (content null beside them), and what is
 * refused, by the field. */
Test(job, tools_and_tool_calls)
{
	const char *body =
		"{\"id\": \"t\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
		"{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c\", \"type\": "
		"\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"b\\\": 1, \\\"a\\\": "
		"[2]}\"}}, {\"function\": {\"name\": \"g\", \"arguments\": {\"x\": \"y\"}}}]}, {\"role\": "
		"\"tool\", \"content\": \"r\"}], \"tools\": [{\"type\": \"function\", \"function\": "
		"{\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}]}}";
	struct job j;
	char err[WK_ERRSZ];
	cr_assert_eq(job_decode(body, strlen(body), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect_str_eq(j.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"f\","
				  "\"parameters\":{\"type\":\"object\"}}}]");
	cr_assert_eq(j.n_messages, 3);
	cr_expect_str_eq(j.messages[1].content, "");
	cr_assert_eq(j.messages[1].n_calls, 2);
	cr_expect_str_eq(j.messages[1].calls[0].name, "f");
	cr_expect_str_eq(j.messages[1].calls[0].arguments, "{\"b\":1,\"a\":[2]}");
	cr_expect_str_eq(j.messages[1].calls[1].arguments, "{\"x\":\"y\"}");
	cr_expect_eq(j.messages[0].n_calls, 0);
	job_free(&j);
	static const char *const bad[] = {
		/* tools with a prompt; not an array; not a function; no name */
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"tools\": []}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
		"\"tools\": {}}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
		"\"tools\": [{\"type\": \"retrieval\"}]}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
		"\"tools\": [{\"type\": \"function\", \"function\": {}}]}}",
		/* calls on a user message; arguments not an object; no name; content null alone */
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\", "
		"\"tool_calls\": []}]}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"\", "
		"\"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"\", "
		"\"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": null}]}}",
	};
	static const char *const named[] = {"input.tools", "input.tools", "input.tools[0]",
					    "input.tools[0]", "tool_calls", "arguments",
					    "tool_calls[0]", "content"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		cr_expect_eq(job_decode(bad[i], strlen(bad[i]), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT, "case %zu", i);
		cr_expect(strstr(err, named[i]), "case %zu: %s", i, err);
		job_free(&j);
	}
}

/* A result with tool calls: output.tool_calls in OpenAI's shape, an id each. */
Test(job, encode_tool_calls)
{
	struct job_result r = {.id = "j9", .status = JOB_COMPLETED, .text = "Sure.",
			       .finish_reason = "tool_calls",
			       .tool_calls = "[{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
					     "{\"name\":\"g\",\"arguments\":\"{}\"}]"};
	char *s = job_encode_result(&r, NULL);
	json_t *v = parse(s), *calls = json_object_get(json_object_get(v, "output"), "tool_calls");
	cr_assert_eq(json_array_size(calls), 2, "%s", s);
	json_t *c = json_array_get(calls, 1);
	cr_expect_str_eq(json_string_value(json_object_get(c, "id")), "call_j9_1");
	cr_expect_str_eq(json_string_value(json_object_get(c, "type")), "function");
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c, "function"), "name")),
			 "g");
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(calls,
		0), "function"), "arguments")), "{\"a\":1}");
	json_decref(v);
	free(s);
	r.tool_calls = NULL; /* none: no member */
	s = job_encode_result(&r, NULL);
	cr_expect_null(strstr(s, "tool_calls\":"), "%s", s);
	free(s);
}

/* input.thinking: a chat's, a boolean; a result's reasoning as output.reasoning_content and
 * usage.completion_tokens_details.reasoning_tokens (beside speculation's counts). */
Test(job, thinking)
{
	const char *on = "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", "
			 "\"content\": \"q\"}], \"thinking\": true}}";
	struct job j;
	char err[WK_ERRSZ];
	cr_assert_eq(job_decode(on, strlen(on), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.thinking);
	job_free(&j);
	static const char *const bad[] = {
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"thinking\": true}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
		"\"thinking\": \"yes\"}}"};
	for (size_t i = 0; i < 2; i++) {
		cr_expect_eq(job_decode(bad[i], strlen(bad[i]), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT);
		cr_expect(strstr(err, "input.thinking"), "%s", err);
		job_free(&j);
	}
	struct job_result r = {.id = "r", .status = JOB_COMPLETED, .text = "Sure.",
			       .has_reasoning = true, .reasoning = "Let me see", .reasoning_len = 10,
			       .reasoning_tokens = 3, .accepted_prediction_tokens = 2,
			       .rejected_prediction_tokens = 1};
	char *s = job_encode_result(&r, NULL);
	json_t *v = parse(s);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(v, "output"),
							   "reasoning_content")), "Let me see");
	json_t *d = json_object_get(json_object_get(v, "usage"), "completion_tokens_details");
	cr_expect_eq(json_integer_value(json_object_get(d, "reasoning_tokens")), 3, "%s", s);
	cr_expect_eq(json_integer_value(json_object_get(d, "accepted_prediction_tokens")), 2);
	json_decref(v);
	free(s);
}

/* input.tool_choice: a call the answer must open with ("required": "", a name: that name),
 * "none" (the tools left out), "auto"; a name not among the tools, or no tools, refused. */
Test(job, tool_choice)
{
	static const struct {
		const char *choice, *forced;
		bool tools;
	} ok[] = {{"\"required\"", "", true}, {"{\"type\": \"function\", \"function\": {\"name\": "
					      "\"f\"}}", "f", true},
		  {"\"none\"", NULL, false}, {"\"auto\"", NULL, true}};
	char body[512], err[WK_ERRSZ];
	struct job j;
	const char *head = "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", "
			   "\"content\": \"q\"}], \"tools\": [{\"type\": \"function\", \"function\": "
			   "{\"name\": \"f\"}}], \"tool_choice\": ";
	for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
		snprintf(body, sizeof body, "%s%s}}", head, ok[i].choice);
		cr_assert_eq(job_decode(body, strlen(body), NULL, &j, err, sizeof err), JOB_OK,
			     "%s", err);
		cr_expect_str_eq(j.forced ? j.forced : "(null)", ok[i].forced ? ok[i].forced
								     : "(null)");
		cr_expect_eq(j.tools != NULL, ok[i].tools, "%s", ok[i].choice);
		job_free(&j);
	}
	static const char *const bad[] = {
		"{\"type\": \"function\", \"function\": {\"name\": \"g\"}}", "\"always\"", "3",
		"{\"type\": \"function\"}"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		snprintf(body, sizeof body, "%s%s}}", head, bad[i]);
		cr_expect_eq(job_decode(body, strlen(body), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT, "%s", bad[i]);
		cr_expect(strstr(err, "input.tool_choice"), "%s", err);
		job_free(&j);
	}
	snprintf(body, sizeof body, "%s\"auto\", \"parallel_tool_calls\": false}}", head);
	cr_assert_eq(job_decode(body, strlen(body), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.one_call);
	job_free(&j);
	snprintf(body, sizeof body, "%s\"auto\", \"parallel_tool_calls\": 0}}", head);
	cr_expect_eq(job_decode(body, strlen(body), NULL, &j, err, sizeof err), JOB_EINVALID_INPUT);
	cr_expect(strstr(err, "input.parallel_tool_calls"), "%s", err);
	job_free(&j);
	const char *none = "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", "
			   "\"content\": \"q\"}], \"tool_choice\": \"required\"}}";
	cr_expect_eq(job_decode(none, strlen(none), NULL, &j, err, sizeof err), JOB_EINVALID_INPUT);
	cr_expect(strstr(err, "not among input.tools"), "%s", err);
	job_free(&j);
}

/* input.logprobs and input.top_logprobs; output.logprobs in OpenAI's chat shape. */
/* A prompt of token ids, prompt_logprobs, and max_tokens 0 with them (a prompt scored). */
Test(job, prompt_ids_and_prompt_logprobs)
{
	const char *on = "{\"id\": \"a\", \"input\": {\"prompt\": [1, 0, 2147483647], "
			 "\"prompt_logprobs\": 20, \"max_tokens\": 0}}";
	struct job j;
	char err[WK_ERRSZ];
	cr_assert_eq(job_decode(on, strlen(on), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect_null(j.prompt);
	cr_assert_eq(j.n_prompt_ids, 3);
	cr_expect(j.prompt_ids[0] == 1 && j.prompt_ids[1] == 0 && j.prompt_ids[2] == 2147483647);
	cr_expect(j.prompt_logprobs);
	cr_expect_eq(j.prompt_top, 20);
	cr_expect_eq(j.max_tokens, 0);
	job_free(&j);
	const char *text = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", "
			   "\"prompt_logprobs\": 0}}";
	cr_assert_eq(job_decode(text, strlen(text), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.prompt_logprobs && j.prompt_top == 0 && j.max_tokens == JOB_MAX_TOKENS_DEFAULT);
	job_free(&j);
	static const struct {
		const char *body, *named;
		enum job_err e;
	} bad[] = {
		{"{\"input\": {\"prompt\": []}}", "input.prompt has no", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": [1, -2]}}", "input.prompt[1]", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": [1, 2.5]}}", "input.prompt[1]", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": [\"a\"]}}", "input.prompt[0]", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": [2147483648]}}", "input.prompt[0]", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": 7}}", "input.prompt must", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": \"x\", \"max_tokens\": 0}}", "input.max_tokens is 0",
		 JOB_EMAX_TOKENS},
		{"{\"input\": {\"prompt\": \"x\", \"prompt_logprobs\": 21}}",
		 "input.prompt_logprobs", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": \"x\", \"prompt_logprobs\": true}}",
		 "input.prompt_logprobs", JOB_EINVALID_INPUT},
		{"{\"input\": {\"prompt\": \"x\", \"prompt_logprobs\": -1, \"max_tokens\": 0}}",
		 "input.prompt_logprobs", JOB_EINVALID_INPUT},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_expect_eq(job_decode(bad[i].body, strlen(bad[i].body), "q", &j, err, sizeof err),
			     bad[i].e, "%s", bad[i].body);
		cr_expect(strstr(err, bad[i].named) == err, "%s: %s", bad[i].body, err);
		job_free(&j);
	}
	/* too many ids: prompt_too_long */
	size_t n = JOB_PROMPT_IDS_MAX + 1, at = 0;
	char *big = malloc(n * 2 + 64);
	at += (size_t)sprintf(big, "{\"input\": {\"prompt\": [");
	for (size_t i = 0; i < n; i++)
		at += (size_t)sprintf(big + at, i ? ",1" : "1");
	strcpy(big + at, "]}}");
	cr_expect_eq(job_decode(big, strlen(big), "q", &j, err, sizeof err), JOB_EPROMPT_TOO_LONG);
	cr_expect(strstr(err, "token ids; the limit is") != NULL, "%s", err);
	job_free(&j);
	free(big);
	/* the result: entries for the prompt, the first one's logprob null, and its ids; an
	 * entry with a rank has it, and its alternatives their ids */
	struct job_top top[1] = {{" b", 2, -0.5f, 42}};
	struct job_logprob lp[2] = {{"", 0, NAN, 0, NULL, 0}, {" a", 2, -0.25f, 1, top, 2}};
	int ids[2] = {1, 7};
	struct job_result r = {.id = "r", .status = JOB_COMPLETED, .text = "",
			       .has_prompt_logprobs = true, .prompt_logprobs = lp,
			       .prompt_ids = ids, .n_prompt_logprobs = 2};
	char *s = job_encode_result(&r, NULL);
	json_t *v = parse(s), *o = json_object_get(v, "output");
	json_t *c = json_object_get(o, "prompt_logprobs");
	cr_assert_eq(json_array_size(c), 2, "%s", s);
	cr_expect(json_is_null(json_object_get(json_array_get(c, 0), "logprob")), "%s", s);
	cr_expect_float_eq(json_real_value(json_object_get(json_array_get(c, 1), "logprob")), -0.25,
			   1e-9);
	json_t *t0 = json_array_get(json_object_get(json_array_get(c, 1), "top_logprobs"), 0);
	cr_expect_str_eq(json_string_value(json_object_get(t0, "token")), " b");
	cr_expect_eq(json_integer_value(json_object_get(t0, "id")), 42, "%s", s);
	cr_expect_eq(json_integer_value(json_object_get(json_array_get(c, 1), "rank")), 2, "%s", s);
	cr_expect_null(json_object_get(json_array_get(c, 0), "rank"), "%s", s);
	json_t *pi = json_object_get(o, "prompt_token_ids");
	cr_expect(json_array_size(pi) == 2 && json_integer_value(json_array_get(pi, 1)) == 7, "%s",
		  s);
	cr_expect_null(json_object_get(o, "logprobs"));
	json_decref(v);
	free(s);
}

Test(job, logprobs)
{
	const char *on = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"logprobs\": true, "
			 "\"top_logprobs\": 20}}";
	struct job j;
	char err[WK_ERRSZ];
	cr_assert_eq(job_decode(on, strlen(on), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.logprobs);
	cr_expect_eq(j.top_logprobs, 20);
	job_free(&j);
	static const char *const bad[] = {
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"logprobs\": 1}}",
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"logprobs\": true, "
		"\"top_logprobs\": 21}}",
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"logprobs\": true, "
		"\"top_logprobs\": -1}}",
		"{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"top_logprobs\": 2}}"};
	static const char *const named[] = {"input.logprobs", "input.top_logprobs",
					    "input.top_logprobs", "input.top_logprobs"};
	for (size_t i = 0; i < 4; i++) {
		cr_expect_eq(job_decode(bad[i], strlen(bad[i]), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT, "%s", bad[i]);
		cr_expect(strstr(err, named[i]) == err, "%s", err);
		job_free(&j);
	}
	/* a piece that ends inside a UTF-8 sequence: "token" has U+FFFD, "bytes" the byte */
	struct job_top top[2] = {{" a", 2, -0.25f, 9}, {"\xe2\x82", 2, -1.5f, 10}};
	struct job_logprob lp[2] = {{" a", 2, -0.25f, 2, top, 0},
				    {"\xe2", 1, -INFINITY, 0, NULL, 0}};
	struct job_result r = {.id = "r", .status = JOB_COMPLETED, .text = " a\xe2",
			       .has_logprobs = true, .logprobs = lp, .n_logprobs = 2};
	char *s = job_encode_result(&r, NULL);
	json_t *v = parse(s);
	json_t *c = json_object_get(json_object_get(json_object_get(v, "output"), "logprobs"),
				    "content");
	cr_assert_eq(json_array_size(c), 2, "%s", s);
	json_t *e0 = json_array_get(c, 0), *e1 = json_array_get(c, 1);
	cr_expect_str_eq(json_string_value(json_object_get(e0, "token")), " a");
	cr_expect_float_eq(json_real_value(json_object_get(e0, "logprob")), -0.25, 1e-9);
	cr_expect_eq(json_integer_value(json_array_get(json_object_get(e0, "bytes"), 1)), 'a');
	json_t *t1 = json_array_get(json_object_get(e0, "top_logprobs"), 1);
	cr_expect_str_eq(json_string_value(json_object_get(t1, "token")), "\xef\xbf\xbd\xef\xbf\xbd");
	cr_expect_eq(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 0)), 0xe2);
	cr_expect_eq(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 1)), 0x82);
	cr_expect_null(json_object_get(t1, "id"), "no rank: no ids (OpenAI's entries)");
	cr_expect_null(json_object_get(e0, "rank"));
	cr_expect_float_eq(json_number_value(json_object_get(e1, "logprob")), -9999, 1e-9,
			   "-inf is -9999 (JSON has no -Infinity)");
	cr_expect_eq(json_array_size(json_object_get(e1, "top_logprobs")), 0);
	json_decref(v);
	free(s);
	r.has_logprobs = false; /* not asked for: no member */
	s = job_encode_result(&r, NULL);
	v = parse(s);
	cr_expect_null(json_object_get(json_object_get(v, "output"), "logprobs"));
	json_decref(v);
	free(s);
	size_t n;
	s = job_logprobs_json(lp, 2, &n); /* a stream's entries: the same array */
	cr_expect_eq(strlen(s), n);
	v = parse(s);
	cr_expect_eq(json_array_size(v), 2);
	json_decref(v);
	free(s);
}

/* input.presence_penalty, frequency_penalty, repetition_penalty and logit_bias. */
Test(job, penalties_and_bias)
{
	const char *on = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"presence_penalty\": -2, "
			 "\"frequency_penalty\": 2, \"repetition_penalty\": 1.3, \"logit_bias\": "
			 "{\"0\": 100, \"2147483647\": -100, \"7\": 0.5}}}";
	struct job j;
	char err[WK_ERRSZ];
	cr_assert_eq(job_decode(on, strlen(on), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect_float_eq(j.presence_penalty, -2, 1e-6);
	cr_expect_float_eq(j.frequency_penalty, 2, 1e-6);
	cr_expect_float_eq(j.repetition_penalty, 1.3, 1e-6);
	cr_assert_eq(j.n_bias, 3);
	int found = 0;
	for (int k = 0; k < 3; k++)
		found += (j.bias_id[k] == 0 && j.bias[k] == 100) +
			 (j.bias_id[k] == 2147483647 && j.bias[k] == -100) +
			 (j.bias_id[k] == 7 && j.bias[k] == 0.5f);
	cr_expect_eq(found, 3);
	job_free(&j);
	const char *plain = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\"}}";
	cr_assert_eq(job_decode(plain, strlen(plain), NULL, &j, err, sizeof err), JOB_OK);
	cr_expect(j.presence_penalty == 0 && j.frequency_penalty == 0 &&
		  j.repetition_penalty == 1 && j.n_bias == 0, "the defaults are off");
	job_free(&j);
	static const char *const bad[][2] = {
		{"\"presence_penalty\": 2.01", "input.presence_penalty"},
		{"\"frequency_penalty\": \"1\"", "input.frequency_penalty"},
		{"\"repetition_penalty\": 0", "input.repetition_penalty"},
		{"\"repetition_penalty\": 11", "input.repetition_penalty"},
		{"\"logit_bias\": [1]", "input.logit_bias"},
		{"\"logit_bias\": {\"-1\": 1}", "input.logit_bias"},
		{"\"logit_bias\": {\"1x\": 1}", "input.logit_bias"},
		{"\"logit_bias\": {\"\": 1}", "input.logit_bias"},
		{"\"logit_bias\": {\"2147483648\": 1}", "input.logit_bias"},
		{"\"logit_bias\": {\"5\": 100.5}", "input.logit_bias"},
		{"\"logit_bias\": {\"5\": null}", "input.logit_bias"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char doc[256];
		snprintf(doc, sizeof doc, "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", %s}}",
			 bad[i][0]);
		cr_expect_eq(job_decode(doc, strlen(doc), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT, "%s", doc);
		cr_expect(strstr(err, bad[i][1]) == err, "%s: %s", doc, err);
		job_free(&j);
	}
	char *big = malloc(20 * (JOB_BIAS_IDS_MAX + 2) + 64), *q = big;
	q += sprintf(q, "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"logit_bias\": {");
	for (int k = 0; k <= JOB_BIAS_IDS_MAX; k++)
		q += sprintf(q, "%s\"%d\": 1", k ? ", " : "", k);
	sprintf(q, "}}}");
	cr_expect_eq(job_decode(big, strlen(big), NULL, &j, err, sizeof err), JOB_EINVALID_INPUT);
	cr_expect(strstr(err, "limit"), "%s", err);
	job_free(&j);
	free(big);
}

/* input.response_format: json_object, json_schema (compiled with the job), text. */
Test(job, response_format)
{
	struct job j;
	char err[WK_ERRSZ];
	const char *obj = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"response_format\": "
			  "{\"type\": \"json_object\"}}}";
	cr_assert_eq(job_decode(obj, strlen(obj), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.json);
	cr_expect_null(j.schema);
	job_free(&j);
	const char *sch = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"response_format\": "
			  "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": "
			  "{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}}}}}";
	cr_assert_eq(job_decode(sch, strlen(sch), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.json);
	cr_expect(j.schema && strstr(j.schema, "\"items\""), "%s", j.schema);
	job_free(&j);
	const char *think = "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", "
			    "\"content\": \"q\"}], \"thinking\": true, \"response_format\": "
			    "{\"type\": \"json_object\"}}}"; /* the reasoning free, then the JSON */
	cr_assert_eq(job_decode(think, strlen(think), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(j.json && j.thinking);
	job_free(&j);
	const char *txt = "{\"id\": \"a\", \"input\": {\"prompt\": \"x\", \"response_format\": "
			  "{\"type\": \"text\"}}}";
	cr_assert_eq(job_decode(txt, strlen(txt), NULL, &j, err, sizeof err), JOB_OK, "%s", err);
	cr_expect(!j.json);
	job_free(&j);
	static const char *const bad[][2] = {
		{"\"response_format\": {\"type\": \"yaml\"}", "input.response_format must"},
		{"\"response_format\": {\"type\": \"json_schema\"}", "input.response_format.json_schema"},
		{"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
		 "{\"type\": \"string\", \"format\": \"uri\"}}}", "\"uri\""},
		{"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": "
		 "{\"$ref\": \"#/$defs/x\"}}}", "$ref"},
		{"\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": [{\"type\": "
		 "\"function\", \"function\": {\"name\": \"f\"}}], \"response_format\": {\"type\": "
		 "\"json_object\"}", "input.tools"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char doc[512];
		snprintf(doc, sizeof doc, "{\"id\": \"a\", \"input\": {%s%s}}",
			 strstr(bad[i][0], "messages") ? "" : "\"prompt\": \"x\", ", bad[i][0]);
		cr_expect_eq(job_decode(doc, strlen(doc), NULL, &j, err, sizeof err),
			     JOB_EINVALID_INPUT, "%s", doc);
		cr_expect(strstr(err, bad[i][1]), "%s: %s", doc, err);
		job_free(&j);
	}
}

/* vLLM's continue_final_message (Anthropic's prefill): the last message, the assistant's
 * without calls, is the answer's start; thinking off and no forced call; a stop string that
 * ends a result is named in it (output.stop_sequence) */
Test(job, continue_final_message)
{
	struct job j;
	const char *ok = "{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", "
			 "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"Sure, \"}], "
			 "\"continue_final_message\": true}}";
	cr_assert_eq(dec(ok, &j), JOB_OK, "%s", msg);
	cr_expect(j.continue_final);
	job_free(&j);
	static const char *const bad[] = {
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
		"\"continue_final_message\": true}}",
		"{\"id\": \"a\", \"input\": {\"prompt\": \"hi\", \"continue_final_message\": true}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
		"\"continue_final_message\": 1}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
		"\"continue_final_message\": true, \"thinking\": true}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"\", "
		"\"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": "
		"\"f\", \"arguments\": \"{}\"}}]}], \"continue_final_message\": true}}",
		"{\"id\": \"a\", \"input\": {\"messages\": [{\"role\": \"assistant\", \"content\": \"a\"}], "
		"\"continue_final_message\": true, \"tools\": [{\"type\": \"function\", \"function\": "
		"{\"name\": \"f\"}}], \"tool_choice\": \"required\"}}"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		expect(bad[i], JOB_EINVALID_INPUT);
		cr_expect(strstr(msg, "continue_final_message"), "%s: %s", bad[i], msg);
	}
	struct job_result r = {.id = "a", .status = JOB_COMPLETED, .text = "x", .finish_reason = "stop",
			       .stop_sequence = "END"};
	size_t len;
	char *s = job_encode_result(&r, &len);
	cr_expect(strstr(s, "\"finish_reason\": \"stop\", \"stop_sequence\": \"END\""), "%s", s);
	free(s);
	r.stop_sequence = NULL;
	s = job_encode_result(&r, &len);
	cr_expect_null(strstr(s, "stop_sequence"), "%s", s);
	free(s);
}
