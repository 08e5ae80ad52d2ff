/*
 * OpenAI's Responses API (worker/http_responses.c): requests into the chat requests that run
 * them, the refusals, results into response objects, and the stream's events.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/api_test.h"
#include "worker/http_int.h"

static json_t *chat_of(const char *body, json_t **skel)
{
	return api_chat_of(&oai_responses_api, body, skel);
}

static struct oai_err refusal_of(const char *body)
{
	return api_refusal_of(&oai_responses_api, body);
}

/* input as a string, instructions, and the members of chat's that keep their names or change
 * them */
Test(responses, a_request_becomes_a_chat_request)
{
	json_t *skel;
	json_t *c = chat_of("{\"model\": \"m\", \"input\": \"Hi\", \"instructions\": \"Be brief.\", "
			    "\"max_output_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, "
			    "\"seed\": 3, \"stream\": true, \"reasoning\": {\"effort\": \"high\"}, "
			    "\"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"x\", "
			    "\"schema\": {\"type\": \"object\"}, \"strict\": true}}, "
			    "\"metadata\": {\"k\": \"v\"}, \"store\": true, \"user\": \"u1\"}",
			    &skel);
	expect_json(c, "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": "
		       "\"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}], "
		       "\"max_completion_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, "
		       "\"seed\": 3, \"stream\": true, \"reasoning_effort\": \"high\", "
		       "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
		       "{\"name\": \"x\", \"schema\": {\"type\": \"object\"}, \"strict\": true}}}");
	/* what was asked, as the response says it */
	cr_expect_str_eq(json_string_value(json_object_get(skel, "instructions")), "Be brief.");
	cr_expect_eq(json_integer_value(json_object_get(skel, "max_output_tokens")), 7);
	cr_expect(json_is_true(json_object_get(skel, "store")));
	cr_expect_str_eq(json_string_value(json_object_get(skel, "user")), "u1");
	expect_json(json_object_get(skel, "metadata"), "{\"k\": \"v\"}");
	expect_json(json_object_get(skel, "text"), "{\"format\": {\"type\": \"json_schema\", "
		    "\"name\": \"x\", \"schema\": {\"type\": \"object\"}, \"strict\": true}}");
	json_decref(c);
	json_decref(skel);
	/* defaults */
	c = chat_of("{\"input\": \"Hi\", \"text\": {\"format\": {\"type\": \"json_object\"}}}",
		    &skel);
	expect_json(c, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
		       "\"response_format\": {\"type\": \"json_object\"}}");
	cr_expect_str_eq(json_string_value(json_object_get(skel, "tool_choice")), "auto");
	cr_expect(json_is_null(json_object_get(skel, "instructions")));
	cr_expect_eq(json_real_value(json_object_get(skel, "temperature")), 1.0);
	json_decref(c);
	json_decref(skel);
}

/* Items: messages with text parts (developer as it is: chat reads it as system), a
 * reasoning item joining the next assistant turn, function calls joining the assistant
 * message before them (or one of their own), and the calls' outputs as tool messages. */
Test(responses, input_items_become_messages)
{
	json_t *c = chat_of(
		"{\"input\": ["
		"{\"role\": \"developer\", \"content\": \"Rules.\"},"
		"{\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": "
		"\"input_text\", \"text\": \"Weather \"}, {\"type\": \"input_text\", \"text\": "
		"\"in Paris?\"}]},"
		"{\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": [], \"content\": "
		"[{\"type\": \"reasoning_text\", \"text\": \"Let me see\"}]},"
		"{\"type\": \"message\", \"id\": \"msg_1\", \"role\": \"assistant\", \"status\": "
		"\"completed\", \"content\": [{\"type\": \"output_text\", \"text\": \"Sure.\", "
		"\"annotations\": []}]},"
		"{\"type\": \"function_call\", \"id\": \"fc_1\", \"call_id\": \"call_a\", "
		"\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\", "
		"\"status\": \"completed\"},"
		"{\"type\": \"function_call\", \"call_id\": \"call_b\", \"name\": \"get_time\", "
		"\"arguments\": \"{}\"},"
		"{\"type\": \"function_call_output\", \"call_id\": \"call_a\", \"output\": "
		"\"clear\"},"
		"{\"type\": \"function_call_output\", \"call_id\": \"call_b\", \"output\": "
		"[{\"type\": \"input_text\", \"text\": \"noon\"}]},"
		"{\"type\": \"function_call\", \"call_id\": \"call_c\", \"name\": \"get_weather\", "
		"\"arguments\": \"{}\"}]}", NULL);
	expect_json(json_object_get(c, "messages"), "["
		    "{\"role\": \"developer\", \"content\": \"Rules.\"},"
		    "{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
		    "{\"role\": \"assistant\", \"content\": \"Sure.\", \"reasoning_content\": "
		    "\"Let me see\", \"tool_calls\": ["
		    "{\"id\": \"call_a\", \"type\": \"function\", \"function\": {\"name\": "
		    "\"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}},"
		    "{\"id\": \"call_b\", \"type\": \"function\", \"function\": {\"name\": "
		    "\"get_time\", \"arguments\": \"{}\"}}]},"
		    "{\"role\": \"tool\", \"tool_call_id\": \"call_a\", \"content\": \"clear\"},"
		    "{\"role\": \"tool\", \"tool_call_id\": \"call_b\", \"content\": \"noon\"},"
		    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": "
		    "\"call_c\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
		    "\"arguments\": \"{}\"}}]}]");
	json_decref(c);
}

/* A conversation's messages as items (what input_items lists) read back as the same messages
 * (an assistant's calls after another assistant message open their turn with an empty
 * message); each item's id is its own, and the same for the same messages before it. */
Test(responses, messages_become_items_and_back)
{
	json_t *msgs = json_loads(
		"[{\"role\": \"developer\", \"content\": \"Rules.\"},"
		"{\"role\": \"user\", \"content\": \"Weather?\"},"
		"{\"role\": \"assistant\", \"content\": \"Sure.\", \"reasoning_content\": \"Hm\","
		"\"tool_calls\": [{\"id\": \"call_a\", \"type\": \"function\", \"function\": "
		"{\"name\": \"get\", \"arguments\": \"{}\"}}, {\"id\": \"call_b\", \"type\": "
		"\"function\", \"function\": {\"name\": \"get\", \"arguments\": \"{}\"}}]},"
		"{\"role\": \"tool\", \"tool_call_id\": \"call_a\", \"content\": \"clear\"},"
		"{\"role\": \"tool\", \"tool_call_id\": \"call_b\", \"content\": \"clear\"},"
		"{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"So\"},"
		"{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"d\", "
		"\"type\": \"function\", \"function\": {\"name\": \"get\", \"arguments\": "
		"\"{}\"}}]},"
		"{\"role\": \"user\", \"content\": \"And?\"},"
		"{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c\", "
		"\"type\": \"function\", \"function\": {\"name\": \"get\", \"arguments\": "
		"\"{}\"}}]}, {\"role\": \"user\", \"content\": \"And?\"}]", 0, NULL);
	cr_assert(msgs);
	json_t *items = oai_messages_items(msgs, json_array_size(msgs), NULL);
	static const char *const want[] = {"message", "message", "reasoning", "message",
					   "function_call", "function_call", "function_call_output",
					   "function_call_output", "reasoning", "message", "message",
					   "function_call", "message", "function_call", "message"};
	size_t n = sizeof want / sizeof *want;
	cr_assert_eq(json_array_size(items), n, "%s", json_dumps(items, JSON_COMPACT));
	for (size_t i = 0; i < n; i++) {
		const json_t *it = json_array_get(items, i);
		const char *id = json_string_value(json_object_get(it, "id"));
		cr_expect_str_eq(json_string_value(json_object_get(it, "type")), want[i], "%zu", i);
		cr_expect(id && strlen(id) > 4, "%zu", i);
		for (size_t k = 0; id && k < i; k++)
			cr_expect_str_neq(json_string_value(json_object_get(json_array_get(items, k),
									     "id")), id);
	}
	json_t *body = json_pack("{s:O}", "input", items);
	char *text = json_dumps(body, 0);
	json_t *c = chat_of(text, NULL);
	cr_assert(c, "%s", text);
	cr_expect(json_equal(json_object_get(c, "messages"), msgs), "%s",
		  json_dumps(json_object_get(c, "messages"), JSON_COMPACT));
	/* the first three messages' items, ids and all, are the whole's first six */
	json_t *head = oai_messages_items(msgs, 3, NULL);
	cr_assert_eq(json_array_size(head), 6);
	for (size_t i = 0; i < 6; i++)
		cr_expect(json_equal(json_array_get(head, i), json_array_get(items, i)), "%zu", i);
	json_decref(head);
	json_decref(c);
	free(text);
	json_decref(body);
	json_decref(items);
	json_decref(msgs);
}

Test(responses, tools_and_their_choice_take_chats_shape)
{
	json_t *skel;
	json_t *c = chat_of("{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": "
			    "\"f\", \"description\": \"d\", \"parameters\": {\"type\": "
			    "\"object\"}, \"strict\": true}], \"tool_choice\": {\"type\": "
			    "\"function\", \"name\": \"f\"}, \"parallel_tool_calls\": false}", &skel);
	expect_json(json_object_get(c, "tools"), "[{\"type\": \"function\", \"function\": "
		    "{\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": "
		    "\"object\"}, \"strict\": true}}]");
	expect_json(json_object_get(c, "tool_choice"), "{\"type\": \"function\", \"function\": "
		    "{\"name\": \"f\"}}");
	cr_expect(json_is_false(json_object_get(c, "parallel_tool_calls")));
	/* the response says the tools as they were given */
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(
				 json_object_get(skel, "tools"), 0), "name")), "f");
	json_decref(c);
	json_decref(skel);
	c = chat_of("{\"input\": \"x\", \"tools\": [], \"tool_choice\": \"none\"}", NULL);
	cr_expect_str_eq(json_string_value(json_object_get(c, "tool_choice")), "none");
	json_decref(c);
}

/* include's message.output_text.logprobs, or top_logprobs above 0, ask for logprobs. */
Test(responses, logprobs_are_asked_by_include_or_top_logprobs)
{
	json_t *c = chat_of("{\"input\": \"x\", \"include\": [\"message.output_text.logprobs\", "
			    "\"reasoning.encrypted_content\"]}", NULL);
	cr_expect(json_is_true(json_object_get(c, "logprobs")));
	cr_expect_null(json_object_get(c, "top_logprobs"));
	json_decref(c);
	c = chat_of("{\"input\": \"x\", \"top_logprobs\": 3}", NULL);
	cr_expect(json_is_true(json_object_get(c, "logprobs")));
	cr_expect_eq(json_integer_value(json_object_get(c, "top_logprobs")), 3);
	json_decref(c);
	c = chat_of("{\"input\": \"x\", \"include\": [\"reasoning.encrypted_content\"]}", NULL);
	cr_expect_null(json_object_get(c, "logprobs"));
	json_decref(c);
}

Test(responses, what_cannot_be_honoured_is_refused_by_name)
{
	static const char *const bad[][2] = {
		{"{\"input\": \"x\", \"previous_response_id\": 5}", "previous_response_id"},
		{"{\"input\": \"x\", \"conversation\": \"conv_1\"}", "conversation"},
		{"{\"input\": \"x\", \"background\": true}", "background"},
		{"{\"input\": \"x\", \"prompt\": {\"id\": \"p\"}}", "prompt"},
		{"{\"input\": \"x\", \"truncation\": \"auto\"}", "truncation"},
		{"{\"input\": \"x\", \"store\": 1}", "store"},
		{"{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "tools"},
		{"{\"input\": \"x\", \"tools\": [{\"type\": \"function\"}]}", "tools"},
		{"{\"input\": \"x\", \"tool_choice\": {\"type\": \"file_search\"}, \"tools\": []}",
		 "tool_choice"},
		{"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\"}}}",
		 "text.format"},
		{"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"yaml\"}}}", "text.format"},
		{"{\"input\": \"x\", \"include\": [\"everything\"]}", "include"},
		{"{\"input\": \"x\", \"instructions\": 5}", "instructions"},
		{"{\"input\": \"x\", \"reasoning\": \"high\"}", "reasoning"},
		{"{\"input\": []}", "input"},
		{"{}", "input"},
		{"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", "
		 "\"image_url\": \"http://x\"}]}]}", "input"},
		{"{\"input\": [{\"type\": \"input_image\"}]}", "input"},
		{"{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "input"},
		{"{\"input\": [{\"type\": \"function_call\", \"call_id\": \"a\", \"name\": \"f\"}]}",
		 "input"},
		{"{\"input\": [{\"type\": \"function_call_output\", \"output\": \"x\"}]}", "input"},
		{"{\"input\": [5]}", "input"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct oai_err e = refusal_of(bad[i][0]);
		cr_expect_eq(e.status, 400, "%s", bad[i][0]);
		cr_expect(e.param && !strcmp(e.param, bad[i][1]), "%s: param %s (%s)", bad[i][0],
			  e.param ? e.param : "null", e.message);
	}
	struct oai_err e = refusal_of("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": "
				      "\"input_image\"}]}]}");
	cr_expect(strstr(e.message, "input[0].content[0]: input_image parts are not supported"),
		  "%s", e.message);
	e = refusal_of("not json");
	cr_expect_str_eq(e.code, "invalid_json");
}

/* chat's errors, named as the Responses API names its members */
Test(responses, chats_errors_take_the_responses_names)
{
	struct oai_err e;
	oai_errf(&e, 400, "invalid_request_error", "max_tokens_range", "max_completion_tokens",
		 "max_completion_tokens is 0; this server allows 1 to 50 (0 with echo)");
	oai_responses_err(&e);
	cr_expect_str_eq(e.param, "max_output_tokens");
	cr_expect_str_eq(e.message, "max_output_tokens is 0; this server allows 1 to 50");
	oai_errf(&e, 400, "invalid_request_error", "invalid_input", "reasoning_effort",
		 "reasoning_effort is none, minimal, low, medium or high");
	oai_responses_err(&e);
	cr_expect_str_eq(e.param, "reasoning.effort");
	cr_expect_str_eq(e.message, "reasoning.effort is none, minimal, low, medium or high");
}

static const char *const RESULT_CALL =
	"{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Sure.\", \"reasoning_content\": "
	"\"Let me see\", \"finish_reason\": \"tool_calls\", \"tool_calls\": [{\"id\": "
	"\"call_j_0\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}], \"logprobs\": {\"content\": "
	"[{\"token\": \"Sure\", \"logprob\": -0.5, \"bytes\": [83,117,114,101], "
	"\"top_logprobs\": []}]}}, \"usage\": {\"prompt_tokens\": 9, \"completion_tokens\": 6, "
	"\"prompt_tokens_details\": {\"cached_tokens\": 4}, \"completion_tokens_details\": "
	"{\"reasoning_tokens\": 3}, \"cost_micro_usd\": 12}}";

Test(responses, a_result_becomes_a_response)
{
	json_t *skel;
	json_t *c = chat_of("{\"input\": \"x\", \"max_output_tokens\": 20}", &skel);
	json_decref(c);
	struct oai_result r = result_of(RESULT_CALL);
	json_t *o = oai_responses_object(skel, "resp_abc", 1700000000, "glm", &r);
	cr_assert_not_null(o);
	cr_expect_str_eq(json_string_value(json_object_get(o, "id")), "resp_abc");
	cr_expect_str_eq(json_string_value(json_object_get(o, "object")), "response");
	cr_expect_str_eq(json_string_value(json_object_get(o, "status")), "completed");
	cr_expect_str_eq(json_string_value(json_object_get(o, "model")), "glm");
	cr_expect_eq(json_integer_value(json_object_get(o, "created_at")), 1700000000);
	cr_expect(json_is_null(json_object_get(o, "incomplete_details")));
	expect_json(json_object_get(o, "output"), "["
		    "{\"id\": \"rs_abc\", \"type\": \"reasoning\", \"summary\": [], \"content\": "
		    "[{\"type\": \"reasoning_text\", \"text\": \"Let me see\"}]},"
		    "{\"id\": \"msg_abc\", \"type\": \"message\", \"status\": \"completed\", "
		    "\"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": "
		    "\"Sure.\", \"annotations\": [], \"logprobs\": [{\"token\": \"Sure\", "
		    "\"logprob\": -0.5, \"bytes\": [83,117,114,101], \"top_logprobs\": []}]}]},"
		    "{\"id\": \"fc_abc_0\", \"type\": \"function_call\", \"status\": \"completed\", "
		    "\"call_id\": \"call_j_0\", \"name\": \"get_weather\", \"arguments\": "
		    "\"{\\\"city\\\":\\\"Paris\\\"}\"}]");
	json_t *u = json_object_get(o, "usage");
	cr_expect_eq(json_integer_value(json_object_get(u, "input_tokens")), 9);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(u, "input_tokens_details"),
							"cached_tokens")), 4);
	cr_expect_eq(json_integer_value(json_object_get(u, "output_tokens")), 6);
	cr_expect_eq(json_integer_value(json_object_get(json_object_get(u, "output_tokens_details"),
							"reasoning_tokens")), 3);
	cr_expect_eq(json_integer_value(json_object_get(u, "total_tokens")), 15);
	cr_expect_eq(json_integer_value(json_object_get(u, "cost_micro_usd")), 12);
	/* the answer in a later response's input items: the same items, the same ids */
	json_t *conv = json_pack("[{s:s, s:s}, o]", "role", "user", "content", "x",
				 oai_result_message(&r));
	const char *answer_of[] = {NULL, "resp_abc"};
	json_t *items = oai_messages_items(conv, 2, answer_of);
	json_t *output = json_object_get(o, "output");
	cr_assert_eq(json_array_size(items), 1 + json_array_size(output), "%s",
		     json_dumps(items, JSON_COMPACT));
	for (size_t i = 0; i < json_array_size(output); i++)
		cr_expect_str_eq(json_string_value(json_object_get(json_array_get(items, i + 1), "id")),
				 json_string_value(json_object_get(json_array_get(output, i), "id")));
	json_decref(items);
	json_decref(conv);
	json_decref(o);
	oai_result_free(&r);
	/* cut at max_output_tokens: incomplete; calls alone: no message */
	r = result_of("{\"status\": \"COMPLETED\", \"output\": {\"text\": \"abc\", "
		      "\"finish_reason\": \"length\"}, \"usage\": {}}");
	o = oai_responses_object(skel, "resp_abc", 1, "glm", &r);
	cr_expect_str_eq(json_string_value(json_object_get(o, "status")), "incomplete");
	expect_json(json_object_get(o, "incomplete_details"), "{\"reason\": \"max_output_tokens\"}");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(
				 json_object_get(o, "output"), 0), "status")), "incomplete");
	json_decref(o);
	oai_result_free(&r);
	r = result_of("{\"status\": \"COMPLETED\", \"output\": {\"text\": \"\", \"finish_reason\": "
		      "\"tool_calls\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
		      "\"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}}");
	o = oai_responses_object(skel, "resp_abc", 1, "glm", &r);
	json_t *out = json_object_get(o, "output");
	cr_expect_eq(json_array_size(out), 1);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "type")),
			 "function_call");
	json_decref(o);
	oai_result_free(&r);
	json_decref(skel);
}

/* A stream of reasoning, text with logprobs, and a call: the events in the order OpenAI's
 * clients accumulate them, numbered from 0, and response.completed holding what the
 * response object not streamed holds. */
Test(responses, a_stream_has_its_events_in_order)
{
	json_t *skel;
	json_decref(chat_of("{\"input\": \"x\", \"stream\": true}", &skel));
	struct oai_rstream s;
	cr_assert_eq(oai_rstream_init(&s, skel, "resp_abc", 5, "glm", true), WK_OK);
	json_t *all = json_array();
	json_t *lp = json_loads("[{\"token\": \"Sure\", \"logprob\": -0.5, \"bytes\": "
				"[83,117,114,101], \"top_logprobs\": []}]", 0, NULL);
	take(all, oai_rstream_start(&s));
	take(all, oai_rstream_text(&s, true, "Let me", 6, NULL));
	take(all, oai_rstream_text(&s, true, " see", 4, NULL));
	take(all, oai_rstream_text(&s, false, "Sure", 4, lp));
	take(all, oai_rstream_text(&s, false, ".", 1, NULL));
	take(all, oai_rstream_text(&s, false, "", 0, NULL)); /* nothing */
	struct oai_result r = result_of(RESULT_CALL);
	take(all, oai_rstream_end(&s, &r));
	static const char *const types[] = {
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added",
		"response.reasoning_text.delta", "response.reasoning_text.delta",
		"response.reasoning_text.done", "response.content_part.done",
		"response.output_item.done",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done",
		"response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed"};
	size_t n = sizeof types / sizeof types[0];
	cr_assert_eq(json_array_size(all), n, "%zu events: %s", json_array_size(all),
		     json_dumps(all, JSON_COMPACT));
	for (size_t i = 0; i < n; i++) {
		json_t *ev = json_array_get(all, i);
		cr_expect_str_eq(json_string_value(json_object_get(ev, "type")), types[i], "event %zu",
				 i);
		cr_expect_eq(json_integer_value(json_object_get(ev, "sequence_number")), (int)i);
	}
	/* each item at its index, with its id */
	json_t *ev = json_array_get(all, 4);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "item_id")), "rs_abc");
	cr_expect_str_eq(json_string_value(json_object_get(ev, "delta")), "Let me");
	ev = json_array_get(all, 6);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "text")), "Let me see");
	ev = json_array_get(all, 11);
	cr_expect_eq(json_integer_value(json_object_get(ev, "output_index")), 1);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "item_id")), "msg_abc");
	expect_json(json_object_get(ev, "logprobs"), "[{\"token\": \"Sure\", \"logprob\": -0.5, "
		    "\"bytes\": [83,117,114,101], \"top_logprobs\": []}]");
	ev = json_array_get(all, 13);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "text")), "Sure.");
	cr_expect_eq(json_array_size(json_object_get(ev, "logprobs")), 1);
	ev = json_array_get(all, 16);
	cr_expect_eq(json_integer_value(json_object_get(ev, "output_index")), 2);
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(ev, "item"),
							   "arguments")), "");
	ev = json_array_get(all, 17);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "delta")), "{\"city\":\"Paris\"}");
	/* the streamed response is the one not streamed */
	json_t *done = json_object_get(json_array_get(all, n - 1), "response");
	json_t *whole = oai_responses_object(skel, "resp_abc", 5, "glm", &r);
	cr_expect(json_equal(done, whole), "%s\nagainst %s", json_dumps(done, JSON_COMPACT),
		  json_dumps(whole, JSON_COMPACT));
	json_decref(whole);
	/* a failure after this: response.failed with the error and the items done */
	struct oai_err e;
	oai_errf(&e, 504, "server_error", "timeout", NULL, "the job ran past its timeout");
	json_t *f = oai_rstream_fail(&s, &e);
	ev = json_array_get(f, 0);
	cr_expect_str_eq(json_string_value(json_object_get(ev, "type")), "response.failed");
	cr_expect_eq(json_integer_value(json_object_get(ev, "sequence_number")), (int)n);
	json_t *resp = json_object_get(ev, "response");
	cr_expect_str_eq(json_string_value(json_object_get(resp, "status")), "failed");
	expect_json(json_object_get(resp, "error"), "{\"code\": \"timeout\", \"message\": "
		    "\"the job ran past its timeout\"}");
	cr_expect_eq(json_array_size(json_object_get(resp, "output")), 3);
	json_decref(f);
	oai_result_free(&r);
	json_decref(lp);
	json_decref(all);
	oai_rstream_free(&s);
	json_decref(skel);
}

/* An empty answer is still a message; an answer cut short is incomplete. */
Test(responses, an_empty_or_cut_stream_still_ends_whole)
{
	json_t *skel;
	json_decref(chat_of("{\"input\": \"x\"}", &skel));
	struct oai_rstream s;
	cr_assert_eq(oai_rstream_init(&s, skel, "resp_e", 5, "m", false), WK_OK);
	json_t *all = json_array();
	take(all, oai_rstream_start(&s));
	struct oai_result r = result_of("{\"status\": \"COMPLETED\", \"output\": {\"text\": \"\", "
					"\"finish_reason\": \"length\"}}");
	take(all, oai_rstream_end(&s, &r));
	static const char *const types[] = {
		"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.incomplete"};
	cr_assert_eq(json_array_size(all), sizeof types / sizeof types[0]);
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		cr_expect_str_eq(json_string_value(json_object_get(json_array_get(all, i), "type")),
				 types[i]);
	json_t *resp = json_object_get(json_array_get(all, 7), "response");
	cr_expect_str_eq(json_string_value(json_object_get(resp, "status")), "incomplete");
	json_t *whole = oai_responses_object(skel, "resp_e", 5, "m", &r);
	cr_expect(json_equal(resp, whole), "%s\nagainst %s", json_dumps(resp, JSON_COMPACT),
		  json_dumps(whole, JSON_COMPACT));
	json_decref(whole);
	oai_result_free(&r);
	json_decref(all);
	oai_rstream_free(&s);
	json_decref(skel);
}

/* Kept responses: the most recently used kept within the bounds (entries and bytes), a
 * tenant's own only, a get making one the most recent, a delete; and a result as the
 * assistant's message a conversation goes on from. */
Test(responses, kept_responses_are_bounded_and_a_tenants_own)
{
	struct oai_kept *k = oai_kept_new(3, 1 << 20);
	cr_assert_not_null(k);
	char id[32];
	for (int i = 0; i < 4; i++) {
		json_t *conv = json_pack("[{s:s, s:i}]", "role", "user", "content", i);
		json_t *obj = json_pack("{s:i}", "n", i);
		snprintf(id, sizeof id, "resp_%d", i);
		if (i == 3) /* resp_0 used last: resp_1 goes */
			cr_expect(oai_kept_get(k, "resp_0", "a", NULL, NULL));
		cr_assert_eq(oai_kept_put(k, id, "a", conv, obj), WK_OK);
		json_decref(conv);
		json_decref(obj);
	}
	cr_expect_eq(oai_kept_count(k), 3);
	const json_t *conv, *obj;
	cr_expect(!oai_kept_get(k, "resp_1", "a", &conv, &obj), "the least recently used went");
	cr_expect(oai_kept_get(k, "resp_0", "a", &conv, &obj));
	cr_expect_eq(json_integer_value(json_object_get(obj, "n")), 0);
	cr_expect_eq(json_integer_value(json_object_get(json_array_get(conv, 0), "content")), 0);
	cr_expect(!oai_kept_get(k, "resp_0", "b", &conv, &obj), "another tenant's");
	cr_expect(!oai_kept_delete(k, "resp_0", "b"));
	cr_expect(oai_kept_delete(k, "resp_0", "a"));
	cr_expect(!oai_kept_get(k, "resp_0", "a", NULL, NULL));
	cr_expect_eq(oai_kept_count(k), 2);
	oai_kept_free(k);
	/* bytes: one entry of ~600 bytes fits 1000, two do not; the one just kept always stays */
	k = oai_kept_new(100, 1000);
	char big[520];
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = 0;
	for (int i = 0; i < 2; i++) {
		json_t *c = json_pack("[{s:s}]", "content", big), *o = json_object();
		snprintf(id, sizeof id, "resp_%d", i);
		cr_assert_eq(oai_kept_put(k, id, "a", c, o), WK_OK);
		json_decref(c);
		json_decref(o);
	}
	cr_expect_eq(oai_kept_count(k), 1);
	cr_expect(oai_kept_get(k, "resp_1", "a", NULL, NULL));
	json_t *c = json_pack("[{s:s}, {s:s}]", "content", big, "content", big), *o = json_object();
	cr_assert_eq(oai_kept_put(k, "resp_2", "a", c, o), WK_OK);
	cr_expect_eq(oai_kept_count(k), 1, "over the bound alone, and kept");
	json_decref(c);
	json_decref(o);
	oai_kept_free(k);
	/* the answer as a message */
	struct oai_result r;
	const char *res = "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Sure.\", "
			  "\"reasoning_content\": \"Hm\", \"tool_calls\": [{\"id\": \"call_1\", "
			  "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
			  "\"{}\"}}]}}";
	cr_assert_eq(oai_result_parse(res, strlen(res), &r), WK_OK);
	json_t *m = oai_result_message(&r);
	expect_json(m, "{\"role\": \"assistant\", \"content\": \"Sure.\", \"reasoning_content\": "
		       "\"Hm\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", "
		       "\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}");
	json_decref(m);
	oai_result_free(&r);
}
