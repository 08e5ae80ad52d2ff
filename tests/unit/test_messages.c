/*
 * Anthropic's Messages API (worker/http_anthropic.c): requests into the chat requests that run
 * them, the refusals, results into messages, and the stream's events.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/api_test.h"
#include "worker/http_int.h"

static json_t *chat_of(const char *body)
{
	return api_chat_of(&oai_messages_api, body, NULL);
}

static struct oai_err refusal_of(const char *body)
{
	return api_refusal_of(&oai_messages_api, body);
}

/* A tool-using conversation: system blocks, a user's text, an assistant's thinking, text and
 * tool_use, the user's tool_result blocks (tool messages, before the user's text), and the
 * members that keep their names or change them. */
Test(messages, a_request_becomes_a_chat_request)
{
	json_t *c = chat_of(
		"{\"model\": \"glm\", \"max_tokens\": 64, \"temperature\": 0.2, \"top_p\": 0.9, "
		"\"top_k\": 5, \"stream\": true, \"stop_sequences\": [\"END\"], "
		"\"metadata\": {\"user_id\": \"u\"}, "
		"\"system\": [{\"type\": \"text\", \"text\": \"Be \", \"cache_control\": "
		"{\"type\": \"ephemeral\"}}, {\"type\": \"text\", \"text\": \"brief.\"}], "
		"\"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 1024}, "
		"\"tools\": [{\"name\": \"get_weather\", \"description\": \"The weather\", "
		"\"input_schema\": {\"type\": \"object\"}}], "
		"\"tool_choice\": {\"type\": \"any\", \"disable_parallel_tool_use\": true}, "
		"\"messages\": ["
		"{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
		"{\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": "
		"\"Let me see\", \"signature\": \"x\"}, {\"type\": \"redacted_thinking\", \"data\": "
		"\"y\"}, {\"type\": \"text\", \"text\": \"Sure.\"}, {\"type\": \"tool_use\", \"id\": "
		"\"toolu_1\", \"name\": \"get_weather\", \"input\": {\"city\": \"Paris\"}}]},"
		"{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
		"\"toolu_1\", \"content\": [{\"type\": \"text\", \"text\": \"clear\"}]}, "
		"{\"type\": \"text\", \"text\": \"And Rome?\"}]}]}");
	expect_json(c, "{\"model\": \"glm\", \"max_tokens\": 64, \"temperature\": 0.2, "
		       "\"top_p\": 0.9, \"top_k\": 5, \"stream\": true, \"stop\": [\"END\"], "
		       "\"thinking\": {\"type\": \"enabled\"}, "
		       "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
		       "\"get_weather\", \"description\": \"The weather\", \"parameters\": "
		       "{\"type\": \"object\"}}}], "
		       "\"tool_choice\": \"required\", \"parallel_tool_calls\": false, "
		       "\"messages\": ["
		       "{\"role\": \"system\", \"content\": \"Be brief.\"},"
		       "{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
		       "{\"role\": \"assistant\", \"content\": \"Sure.\", \"reasoning_content\": "
		       "\"Let me see\", \"tool_calls\": [{\"id\": \"toolu_1\", \"type\": "
		       "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
		       "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
		       "{\"role\": \"tool\", \"tool_call_id\": \"toolu_1\", \"content\": \"clear\"},"
		       "{\"role\": \"user\", \"content\": \"And Rome?\"}]}");
	/* the function's members in chat's order: the prompt writes the tools' JSON as it is,
	 * so another order is another prompt (and another bill) */
	char *tools = json_dumps(json_object_get(c, "tools"), JSON_COMPACT);
	cr_expect_str_eq(tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
			 "\"description\":\"The weather\",\"parameters\":{\"type\":\"object\"}}}]");
	free(tools);
	json_decref(c);
	/* each tool_choice, and thinking off */
	static const char *const choices[][2] = {
		{"{\"type\": \"auto\"}", "\"auto\""},
		{"{\"type\": \"none\"}", "\"none\""},
		{"{\"type\": \"tool\", \"name\": \"f\"}",
		 "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"}};
	for (size_t i = 0; i < 3; i++) {
		char body[300];
		snprintf(body, sizeof body, "{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", "
			 "\"content\": \"x\"}], \"tool_choice\": %s, \"thinking\": {\"type\": "
			 "\"disabled\"}}", choices[i][0]);
		c = chat_of(body);
		expect_json(json_object_get(c, "tool_choice"), choices[i][1]);
		expect_json(json_object_get(c, "thinking"), "{\"type\": \"disabled\"}");
		json_decref(c);
	}
}

/* A last message of the assistant's is a prefill: chat's continue_final_message; not with
 * thinking, a forced tool, or its own tool_use. */
Test(messages, a_final_assistant_message_is_continued)
{
	json_t *c = chat_of("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
			    "\"Name a pet.\"}, {\"role\": \"assistant\", \"content\": \"A\"}]}");
	cr_expect(json_is_true(json_object_get(c, "continue_final_message")));
	json_decref(c);
	c = chat_of("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
	cr_expect_null(json_object_get(c, "continue_final_message"));
	json_decref(c);
	static const char *const bad[][2] = {
		{"{\"max_tokens\": 5, \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 9}, "
		 "\"messages\": [{\"role\": \"assistant\", \"content\": \"A\"}]}", "thinking"},
		{"{\"max_tokens\": 5, \"tools\": [{\"name\": \"f\", \"input_schema\": {}}], "
		 "\"tool_choice\": {\"type\": \"any\"}, \"messages\": [{\"role\": \"assistant\", "
		 "\"content\": \"A\"}]}", "tool_choice"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"assistant\", \"content\": "
		 "[{\"type\": \"tool_use\", \"id\": \"t\", \"name\": \"f\", \"input\": {}}]}]}",
		 "messages"}};
	for (size_t i = 0; i < 3; i++) {
		struct oai_err e = refusal_of(bad[i][0]);
		cr_expect(e.param && !strcmp(e.param, bad[i][1]), "%s: %s", bad[i][0], e.message);
	}
}

Test(messages, what_cannot_be_honoured_is_refused_by_name)
{
	static const char *const bad[][2] = {
		{"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "max_tokens"},
		{"{\"max_tokens\": 5, \"messages\": []}", "messages"},
		{"{\"max_tokens\": 5}", "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}",
		 "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": 5}]}",
		 "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
		 "\"image\", \"source\": {}}]}]}", "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
		 "\"document\"}]}]}", "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
		 "\"tool_result\", \"content\": \"x\"}]}]}", "messages"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"assistant\", \"content\": "
		 "[{\"type\": \"tool_use\", \"id\": \"a\", \"name\": \"f\", \"input\": \"x\"}]}]}",
		 "messages"},
		{"{\"max_tokens\": 5, \"system\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
		 "\"x\"}]}", "system"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
		 "\"tools\": [{\"type\": \"web_search_20250305\", \"name\": \"web_search\"}]}",
		 "tools"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
		 "\"tools\": [{\"name\": \"f\"}]}", "tools"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
		 "\"tool_choice\": {\"type\": \"tool\"}}", "tool_choice"},
		{"{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
		 "\"thinking\": {\"type\": \"on\"}}", "thinking"},
		{"[1]", NULL}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct oai_err e = refusal_of(bad[i][0]);
		cr_expect_eq(e.status, 400, "%s", bad[i][0]);
		if (bad[i][1])
			cr_expect(e.param && !strcmp(e.param, bad[i][1]), "%s: param %s (%s)",
				  bad[i][0], e.param ? e.param : "null", e.message);
	}
	/* an image a tool returned is a note, not a refusal: the agent's loop goes on */
	json_t *c = chat_of("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
			    "[{\"type\": \"tool_result\", \"tool_use_id\": \"a\", \"content\": "
			    "[{\"type\": \"text\", \"text\": \"shot: \"}, {\"type\": \"image\", "
			    "\"source\": {}}]}]}]}");
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(
				 c, "messages"), 0), "content")),
			 "shot: [an image the tool returned, left out: this model reads text]");
	json_decref(c);
	struct oai_err e = refusal_of("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", "
				      "\"content\": [{\"type\": \"image\"}]}]}");
	cr_expect(strstr(e.message, "messages[0].content[0]: image blocks are not supported"),
		  "%s", e.message);
	/* errors in Anthropic's shape, typed by status */
	static const struct {
		int status;
		const char *type;
	} types[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
		     {404, "not_found_error"}, {413, "request_too_large"},
		     {500, "api_error"}, {503, "overloaded_error"}, {504, "timeout_error"}};
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
		oai_errf(&e, types[i].status, "x", NULL, NULL, "m%zu", i);
		json_t *j = oai_messages_error(&e);
		char want[200];
		snprintf(want, sizeof want, "{\"type\": \"error\", \"error\": {\"type\": \"%s\", "
			 "\"message\": \"m%zu\"}}", types[i].type, i);
		expect_json(j, want);
		json_decref(j);
	}
	oai_errf(&e, 400, "x", NULL, "stop", "stop must be a string or a list of strings");
	oai_messages_err(&e);
	cr_expect_str_eq(e.param, "stop_sequences");
	cr_expect_str_eq(e.message, "stop_sequences must be a string or a list of strings");
}

static const char *const RESULT_CALL =
	"{\"status\": \"COMPLETED\", \"output\": {\"text\": \"Sure.\", \"reasoning_content\": "
	"\"Let me see\", \"finish_reason\": \"tool_calls\", \"tool_calls\": [{\"id\": "
	"\"call_j_0\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
	"\"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]}, \"usage\": {\"prompt_tokens\": 9, "
	"\"completion_tokens\": 6, \"prompt_tokens_details\": {\"cached_tokens\": 4}}}";

/* stop_reason from how it ended; usage's input_tokens those not read from the cache */
Test(messages, a_result_becomes_a_message)
{
	json_t *skel = json_object();
	struct oai_result r = result_of(RESULT_CALL);
	json_t *m = oai_messages_object(skel, "msg_abc", 1, "glm", &r);
	expect_json(m, "{\"id\": \"msg_abc\", \"type\": \"message\", \"role\": \"assistant\", "
		       "\"model\": \"glm\", \"content\": ["
		       "{\"type\": \"thinking\", \"thinking\": \"Let me see\", \"signature\": \"\"},"
		       "{\"type\": \"text\", \"text\": \"Sure.\"},"
		       "{\"type\": \"tool_use\", \"id\": \"call_j_0\", \"name\": \"get_weather\", "
		       "\"input\": {\"city\": \"Paris\"}}], "
		       "\"stop_reason\": \"tool_use\", \"stop_sequence\": null, \"usage\": "
		       "{\"input_tokens\": 5, \"cache_creation_input_tokens\": 0, "
		       "\"cache_read_input_tokens\": 4, \"output_tokens\": 6}}");
	json_decref(m);
	oai_result_free(&r);
	/* (the skeleton holds the max_tokens it ran with: 8; cut before them, the context ended) */
	json_object_set_new(skel, "max_tokens", json_integer(8));
	static const char *const ends[][4] = {
		{"\"finish_reason\": \"length\"", "max_tokens", "null", "8"},
		{"\"finish_reason\": \"length\"", "model_context_window_exceeded", "null", "5"},
		{"\"finish_reason\": \"stop\"", "end_turn", "null", "5"},
		{"\"finish_reason\": \"stop\", \"stop_sequence\": \"END\"", "stop_sequence",
		 "\"END\"", "2"}};
	for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
		char res[300], want[100];
		snprintf(res, sizeof res, "{\"status\": \"COMPLETED\", \"output\": {\"text\": \"a\", "
			 "%s}, \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": %s}}",
			 ends[i][0], ends[i][3]);
		r = result_of(res);
		m = oai_messages_object(skel, "msg_abc", 1, "glm", &r);
		cr_expect_str_eq(json_string_value(json_object_get(m, "stop_reason")), ends[i][1]);
		snprintf(want, sizeof want, "%s", ends[i][2]);
		json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
		cr_expect(json_equal(json_object_get(m, "stop_sequence"), w), "%s", res);
		json_decref(w);
		json_decref(m);
		oai_result_free(&r);
	}
	json_decref(skel);
}

/* Thinking, text and a call: message_start, a block each (the call's input whole as one
 * input_json_delta), message_delta with the stop_reason and usage, message_stop. */
Test(messages, a_stream_has_its_events_in_order)
{
	json_t *skel = json_object();
	struct oai_rstream s;
	cr_assert_eq(oai_rstream_init(&s, skel, "msg_abc", 5, "glm", false), WK_OK);
	json_t *all = json_array();
	take(all, oai_messages_api.start(&s));
	take(all, oai_messages_api.text(&s, true, "Let me", 6, NULL));
	take(all, oai_messages_api.text(&s, true, " see", 4, NULL));
	take(all, oai_messages_api.text(&s, false, "Sure", 4, NULL));
	take(all, oai_messages_api.text(&s, false, "", 0, NULL));
	take(all, oai_messages_api.text(&s, false, ".", 1, NULL));
	struct oai_result r = result_of(RESULT_CALL);
	take(all, oai_messages_api.end(&s, &r));
	static const char *const want =
		"[{\"type\": \"message_start\", \"message\": {\"id\": \"msg_abc\", \"type\": "
		"\"message\", \"role\": \"assistant\", \"model\": \"glm\", \"content\": [], "
		"\"stop_reason\": null, \"stop_sequence\": null, \"usage\": {\"input_tokens\": 0, "
		"\"output_tokens\": 0}}},"
		"{\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": "
		"\"thinking\", \"thinking\": \"\", \"signature\": \"\"}},"
		"{\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": "
		"\"thinking_delta\", \"thinking\": \"Let me\"}},"
		"{\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": "
		"\"thinking_delta\", \"thinking\": \" see\"}},"
		"{\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": "
		"\"signature_delta\", \"signature\": \"\"}},"
		"{\"type\": \"content_block_stop\", \"index\": 0},"
		"{\"type\": \"content_block_start\", \"index\": 1, \"content_block\": {\"type\": "
		"\"text\", \"text\": \"\"}},"
		"{\"type\": \"content_block_delta\", \"index\": 1, \"delta\": {\"type\": "
		"\"text_delta\", \"text\": \"Sure\"}},"
		"{\"type\": \"content_block_delta\", \"index\": 1, \"delta\": {\"type\": "
		"\"text_delta\", \"text\": \".\"}},"
		"{\"type\": \"content_block_stop\", \"index\": 1},"
		"{\"type\": \"content_block_start\", \"index\": 2, \"content_block\": {\"type\": "
		"\"tool_use\", \"id\": \"call_j_0\", \"name\": \"get_weather\", \"input\": {}}},"
		"{\"type\": \"content_block_delta\", \"index\": 2, \"delta\": {\"type\": "
		"\"input_json_delta\", \"partial_json\": \"{\\\"city\\\":\\\"Paris\\\"}\"}},"
		"{\"type\": \"content_block_stop\", \"index\": 2},"
		"{\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"tool_use\", "
		"\"stop_sequence\": null}, \"usage\": {\"input_tokens\": 5, "
		"\"cache_creation_input_tokens\": 0, \"cache_read_input_tokens\": 4, "
		"\"output_tokens\": 6}},"
		"{\"type\": \"message_stop\"}]";
	expect_json(all, want);
	/* each event's "type" comes first, as Anthropic's own */
	char *first = json_dumps(json_array_get(all, 1), JSON_COMPACT);
	cr_expect(strncmp(first, "{\"type\":\"content_block_start\"", 29) == 0, "%s", first);
	free(first);
	struct oai_err e;
	oai_errf(&e, 503, "server_error", NULL, NULL, "the server is shutting down");
	json_t *f = oai_messages_api.fail(&s, &e);
	expect_json(f, "[{\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", "
		       "\"message\": \"the server is shutting down\"}}]");
	json_decref(f);
	oai_result_free(&r);
	json_decref(all);
	oai_rstream_free(&s);
	json_decref(skel);
}
