/*
 * Chat template tests: golden renderings of the GLM-4.7/GLM-5 and GLM-4.5/4.6 formats (each
 * checked against the model family's Jinja template rendered by jinja2 as transformers does;
 * tests/e2e/tokenizer_bytelevel.sh repeats that check when jinja2 is installed), the plain
 * fallback, format choice from a model directory, and messages from JSON.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/chat.h"

#define MSG(r, s) {.role = (r), .content = (s), .len = sizeof(s) - 1}

static void render_is(enum chat_format f, const struct chat_msg *m, size_t n, bool gen,
		      bool think, const char *want)
{
	char *out, err[WK_ERRSZ];
	size_t len;
	int rc = chat_render(f, m, n, gen, think, &out, &len, err, sizeof err);
	cr_assert_eq(rc, WK_OK, "%s", err);
	cr_assert_eq(len, strlen(want), "got '%s', want '%s'", out, want);
	cr_assert_str_eq(out, want);
	free(out);
}

TestSuite(chat);

static const struct chat_msg conv1[] = {
	MSG(CHAT_SYSTEM, "You are helpful."),
	MSG(CHAT_USER, "Hi"),
	MSG(CHAT_ASSISTANT, "<think>hmm</think>\nHello!"),
	MSG(CHAT_USER, "Who are you?"),
};

Test(chat, glm_thinking_on_and_off)
{
	render_is(CHAT_GLM, conv1, 4, true, true,
		  "[gMASK]<sop><|system|>You are helpful.<|user|>Hi<|assistant|></think>Hello!"
		  "<|user|>Who are you?<|assistant|><think>");
	render_is(CHAT_GLM, conv1, 4, true, false,
		  "[gMASK]<sop><|system|>You are helpful.<|user|>Hi<|assistant|></think>Hello!"
		  "<|user|>Who are you?<|assistant|></think>");
	render_is(CHAT_GLM, conv1 + 1, 1, true, false, "[gMASK]<sop><|user|>Hi<|assistant|></think>");
	render_is(CHAT_GLM, conv1 + 1, 1, false, true, "[gMASK]<sop><|user|>Hi");
	render_is(CHAT_GLM, NULL, 0, false, true, "[gMASK]<sop>");
}

/* Reasoning is kept only after the last user message; both parts are stripped. */
Test(chat, glm_reasoning)
{
	const struct chat_msg m[] = {
		MSG(CHAT_USER, "Hi"),
		MSG(CHAT_ASSISTANT, "\n<think>\n plan \n</think>\n\n answer \n"),
	};
	render_is(CHAT_GLM, m, 2, false, true,
		  "[gMASK]<sop><|user|>Hi<|assistant|><think>plan</think>answer");
	render_is(CHAT_GLM45, m, 2, false, true,
		  "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think>plan</think>\nanswer");
	/* the split takes the text before the first </think> and after the last */
	const struct chat_msg m2[] = {
		MSG(CHAT_ASSISTANT, "a<think>b<think>c</think>d</think>e"),
	};
	render_is(CHAT_GLM, m2, 1, false, true, "[gMASK]<sop><|assistant|><think>c</think>e");
	/* Python's strip: Unicode whitespace (U+3000, U+00A0, \x1c) goes, U+200B stays */
	const struct chat_msg m3[] = {
		MSG(CHAT_USER, "q"),
		MSG(CHAT_ASSISTANT, "\xe3\x80\x80\x1c \xc2\xa0x\xe2\x80\x8b \t"),
		MSG(CHAT_ASSISTANT, " \n "),
	};
	render_is(CHAT_GLM, m3, 3, false, true,
		  "[gMASK]<sop><|user|>q<|assistant|></think>x\xe2\x80\x8b<|assistant|></think>");
}

Test(chat, glm_tools)
{
	const struct chat_msg m[] = {
		MSG(CHAT_USER, "q"),       MSG(CHAT_ASSISTANT, "a"), MSG(CHAT_TOOL, "r1"),
		MSG(CHAT_TOOL, "r2"),      MSG(CHAT_USER, "x/nothink"),
	};
	render_is(CHAT_GLM, m, 5, true, false,
		  "[gMASK]<sop><|user|>q<|assistant|></think>a<|observation|><tool_response>r1"
		  "</tool_response><tool_response>r2</tool_response><|user|>x/nothink<|assistant|>"
		  "</think>");
	render_is(CHAT_GLM45, m, 5, true, false,
		  "[gMASK]<sop><|user|>\nq/nothink<|assistant|>\n<think></think>\na<|observation|>\n"
		  "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
		  "<|user|>\nx/nothink<|assistant|>\n<think></think>");
}

Test(chat, glm45)
{
	render_is(CHAT_GLM45, conv1, 4, true, true,
		  "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nHi<|assistant|>\n<think></think>"
		  "\nHello!<|user|>\nWho are you?<|assistant|>");
	render_is(CHAT_GLM45, conv1 + 1, 1, true, false,
		  "[gMASK]<sop><|user|>\nHi/nothink<|assistant|>\n<think></think>");
}

Test(chat, plain)
{
	render_is(CHAT_PLAIN, conv1, 4, true, true,
		  "You are helpful.Hi<think>hmm</think>\nHello!Who are you?");
	render_is(CHAT_PLAIN, NULL, 0, true, false, "");
	/* contents are bytes: a NUL goes through */
	const struct chat_msg m[] = {{.role = CHAT_USER, .content = "a\0b", .len = 3}};
	char *out;
	size_t len;
	cr_assert_eq(chat_render(CHAT_PLAIN, m, 1, true, true, &out, &len, NULL, 0), WK_OK);
	cr_assert_eq(len, 3);
	cr_assert_eq(memcmp(out, "a\0b", 3), 0);
	free(out);
}

Test(chat, errors)
{
	char *out, err[WK_ERRSZ];
	size_t len;
	struct chat_msg bad = {.role = (enum chat_role)9, .content = "x", .len = 1};
	cr_assert_eq(chat_render(CHAT_GLM, &bad, 1, true, true, &out, &len, err, sizeof err),
		     WK_EINVAL);
	cr_assert_null(out);
	cr_assert_eq(chat_render((enum chat_format)7, NULL, 0, true, true, &out, &len, err,
				 sizeof err), WK_EINVAL);
	struct chat_msg *many = calloc(CHAT_MAX_MESSAGES + 1, sizeof *many);
	cr_assert_eq(chat_render(CHAT_GLM, many, CHAT_MAX_MESSAGES + 1, true, true, &out, &len,
				 err, sizeof err), WK_ELIMIT);
	/* a prompt past CHAT_MAX_TEXT */
	size_t big = CHAT_MAX_TEXT / 2 + 1;
	char *text = malloc(big);
	memset(text, 'a', big);
	for (int i = 0; i < 2; i++)
		many[i] = (struct chat_msg){.role = CHAT_USER, .content = text, .len = big};
	cr_assert_eq(chat_render(CHAT_PLAIN, many, 2, true, true, &out, &len, err, sizeof err),
		     WK_ELIMIT, "%s", err);
	cr_assert(strstr(err, "longer than"), "%s", err);
	free(text);
	free(many);
	enum chat_format f;
	cr_assert_eq(chat_format_parse("glm45", &f, err, sizeof err), WK_OK);
	cr_assert_eq(f, CHAT_GLM45);
	cr_assert_eq(chat_format_parse("chatml", &f, err, sizeof err), WK_EINVAL);
	cr_assert(strstr(err, "chatml"));
}

Test(chat, format_for_arch)
{
	cr_assert_eq(chat_format_for("GlmMoeDsaForCausalLM"), CHAT_GLM);
	cr_assert_eq(chat_format_for("Glm4MoeForCausalLM"), CHAT_GLM);
	cr_assert_eq(chat_format_for("LlamaForCausalLM"), CHAT_PLAIN);
	cr_assert_eq(chat_format_for(NULL), CHAT_PLAIN);
	cr_assert_str_eq(chat_format_name(CHAT_GLM), "glm");
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	fclose(f);
}

Test(chat, format_for_model)
{
	const char *b = getenv("WICK_BUILD");
	char dir[512], err[WK_ERRSZ], cmd[600];
	snprintf(dir, sizeof dir, "%s/tmp", b ? b : "build");
	mkdir(dir, 0755);
	snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/chat-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	enum chat_format f = CHAT_GLM;
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(f, CHAT_PLAIN); /* nothing there */
	write_file(dir, "config.json", "{\"architectures\": [\"GlmMoeDsaForCausalLM\"]}");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(f, CHAT_GLM);
	/* the template wins over the architecture */
	write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"[gMASK]<sop>{% for m in "
		   "messages %}<|user|>\\n{{ m.content }}/nothink{% endfor %}\"}");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(f, CHAT_GLM45);
	write_file(dir, "chat_template.jinja", "{{ bos_token }}[INST] {{ m.content }} [/INST]");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_EUNSUPPORTED);
	cr_assert(strstr(err, "chat template"), "%s", err);
	write_file(dir, "chat_template.jinja", "[gMASK]<sop>{% for m in messages %}...");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(f, CHAT_GLM);
	snprintf(cmd, sizeof cmd, "rm '%s/chat_template.jinja'", dir);
	cr_assert_eq(system(cmd), 0);
	write_file(dir, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", "
		   "\"template\": \"x\"}, {\"name\": \"default\", \"template\": \"[gMASK]<sop>\"}]}");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(f, CHAT_GLM);
	write_file(dir, "tokenizer_config.json", "{\"chat_template\": ");
	cr_assert_eq(chat_format_for_model(dir, &f, err, sizeof err), WK_EFORMAT);
	cr_assert(strstr(err, "tokenizer_config.json"), "%s", err);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

Test(chat, parse_json)
{
	const char *j = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, "
			"{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
			"{\"type\": \"image_url\", \"image_url\": {}}, \"b\", {\"type\": \"text\", "
			"\"text\": \"c\\u0000d\"}]}, {\"role\": \"assistant\", \"content\": null}, "
			"{\"role\": \"tool\", \"content\": \"r\"}]}";
	struct chat_msg *m;
	size_t n;
	char err[WK_ERRSZ];
	cr_assert_eq(chat_parse_json(j, strlen(j), &m, &n, err, sizeof err), WK_OK, "%s", err);
	cr_assert_eq(n, 4);
	cr_assert_eq(m[0].role, CHAT_SYSTEM);
	cr_assert_eq(m[1].role, CHAT_USER);
	cr_assert_eq(m[1].len, 5);
	cr_assert_eq(memcmp(m[1].content, "abc\0d", 5), 0);
	cr_assert_eq(m[2].role, CHAT_ASSISTANT);
	cr_assert_eq(m[2].len, 0);
	cr_assert_eq(m[3].role, CHAT_TOOL);
	cr_assert_eq(m[3].len, 1);
	free(m);
	const char *list = "[{\"role\": \"user\", \"content\": \"hi\"}]";
	cr_assert_eq(chat_parse_json(list, strlen(list), &m, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 1);
	free(m);
	cr_assert_eq(chat_parse_json("[]", 2, &m, &n, err, sizeof err), WK_OK);
	cr_assert_eq(n, 0);
	free(m);
	static const struct {
		const char *json;
		int rc;
		const char *msg;
	} bad[] = {
		{"[{\"role\": \"bot\", \"content\": \"x\"}]", WK_EINVAL, "bot"},
		{"[{\"content\": \"x\"}]", WK_EFORMAT, "messages[0]"},
		{"[{\"role\": \"user\", \"content\": 5}]", WK_EFORMAT, "content"},
		{"{\"msgs\": []}", WK_EFORMAT, "list"},
		{"[1,", WK_EFORMAT, "messages"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		m = (struct chat_msg *)1;
		cr_assert_eq(chat_parse_json(bad[i].json, strlen(bad[i].json), &m, &n, err,
					     sizeof err), bad[i].rc, "case %zu: %s", i, err);
		cr_assert_null(m);
		cr_assert(strstr(err, bad[i].msg), "case %zu: '%s' lacks '%s'", i, err, bad[i].msg);
	}
}

/* Tools and an assistant's tool calls, golden (each text the GLM-4.7-Flash and GLM-4.6
 * templates' own, rendered by jinja2 as transformers does; tokenizer_bytelevel.sh checks more
 * against the templates themselves). */
Test(chat, tools_and_tool_calls)
{
	const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
			    "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": "
			    "{\"type\": \"number\", \"minimum\": 0.1}}}}}]";
#define ARGS "{\"a\": 1.50, \"s\": \"x y\", \"o\": [true]}"
	const struct chat_call calls[] = {
		{.name = "f", .name_len = 1, .args = ARGS, .args_len = sizeof ARGS - 1},
		{.name = "g", .name_len = 1}};
	const struct chat_msg m[] = {MSG(CHAT_USER, "q"),
				     {.role = CHAT_ASSISTANT, .content = "ok", .len = 2,
				      .calls = calls, .n_calls = 2},
				     MSG(CHAT_TOOL, "r")};
	const char *head = "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions "
			   "to assist with the user query.\n\nYou are provided with function "
			   "signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": "
			   "\"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
			   "\"object\", \"properties\": {\"a\": {\"type\": \"number\", \"minimum\": "
			   "0.1}}}}}\n</tools>\n\nFor each function call, output the function name "
			   "and arguments within the following XML format:\n";
	char want[2048], *out, err[WK_ERRSZ];
	size_t len;
	snprintf(want, sizeof want, "%s<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
		 "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>"
		 "{arg-value-2}</arg_value>...</tool_call><|user|>q<|assistant|></think>ok"
		 "<tool_call>f<arg_key>a</arg_key><arg_value>1.5</arg_value><arg_key>s</arg_key>"
		 "<arg_value>x y</arg_value><arg_key>o</arg_key><arg_value>[true]</arg_value>"
		 "</tool_call><tool_call>g</tool_call><|observation|><tool_response>r"
		 "</tool_response><|assistant|></think>", head);
	cr_assert_eq(chat_render_tools(CHAT_GLM, m, 3, tools, strlen(tools), true, false, &out,
				       &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(out, want);
	free(out);
	snprintf(want, sizeof want, "%s<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>"
		 "\n<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
		 "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call><|user|>\nq/nothink"
		 "<|assistant|>\n<think></think>\nok\n<tool_call>f\n<arg_key>a</arg_key>\n"
		 "<arg_value>1.5</arg_value>\n<arg_key>s</arg_key>\n<arg_value>x y</arg_value>\n"
		 "<arg_key>o</arg_key>\n<arg_value>[true]</arg_value>\n</tool_call>\n"
		 "<tool_call>g\n</tool_call><|observation|>\n<tool_response>\nr\n"
		 "</tool_response><|assistant|>\n<think></think>", head);
	cr_assert_eq(chat_render_tools(CHAT_GLM45, m, 3, tools, strlen(tools), true, false, &out,
				       &len, err, sizeof err), WK_OK, "%s", err);
	cr_expect_str_eq(out, want);
	free(out);
	/* no tools, or an empty list: no block */
	cr_assert_eq(chat_render_tools(CHAT_GLM, m, 1, "[]", 2, true, false, &out, &len, err,
				       sizeof err), WK_OK);
	cr_expect_str_eq(out, "[gMASK]<sop><|user|>q<|assistant|></think>");
	free(out);
	/* bad: tools not a list, arguments not an object */
	cr_expect_eq(chat_render_tools(CHAT_GLM, m, 1, "{}", 2, true, false, &out, &len, err,
				       sizeof err), WK_EFORMAT);
	const struct chat_call badc = {.name = "f", .name_len = 1, .args = "[1]", .args_len = 3};
	const struct chat_msg bm[] = {{.role = CHAT_ASSISTANT, .calls = &badc, .n_calls = 1}};
	cr_expect_eq(chat_render_tools(CHAT_GLM, bm, 1, NULL, 0, true, false, &out, &len, err,
				       sizeof err), WK_EFORMAT);
	cr_expect(strstr(err, "arguments are not a JSON object"), "%s", err);
}

/* Python's json.dumps: floats as repr, escapes as Python writes them, keys in order. */
Test(chat, py_json)
{
	static const struct {
		const char *in, *want;
	} cases[] = {
		{"[1.0, 0.1, 1e-5, 0.0001, 1e16, 1e15, 123.456, -0.0, 2.5e-300, 1e22]",
		 "[1.0, 0.1, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 123.456, -0.0, 2.5e-300, "
		 "1e+22]"},
		{"{\"b\": 1, \"a\": [], \"c\": {}}", "{\"b\": 1, \"a\": [], \"c\": {}}"},
		{"\"a\\\"\\\\\\n\\t\\u0001\\u007f\\u00e9/\"", "\"a\\\"\\\\\\n\\t\\u0001\x7f\xc3\xa9/\""},
		{"[true, false, null, -12]", "[true, false, null, -12]"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *out, err[WK_ERRSZ];
		size_t len;
		cr_assert_eq(chat_py_json(cases[i].in, strlen(cases[i].in), &out, &len, err,
					  sizeof err), WK_OK, "%s", err);
		cr_expect_str_eq(out, cases[i].want);
		free(out);
	}
	char *out, err[WK_ERRSZ];
	size_t len;
	cr_expect_eq(chat_py_json("{", 1, &out, &len, err, sizeof err), WK_EFORMAT);
}

/* Tool calls read back out of generated text: both forms, values typed by the tool's schema,
 * content before the calls, and text that is not a whole call left as content. */
Test(chat, tool_calls_from_text)
{
	const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
			    "\"parameters\": {\"properties\": {\"n\": {\"type\": \"integer\"}, "
			    "\"s\": {\"type\": \"string\"}, \"o\": {\"type\": \"object\"}}}}}]";
	static const struct {
		enum chat_format f;
		const char *text, *calls;
		size_t content;
	} cases[] = {
		{CHAT_GLM, "Sure. <tool_call>f<arg_key>n</arg_key><arg_value>42</arg_value>"
			   "<arg_key>s</arg_key><arg_value>42</arg_value><arg_key>o</arg_key>"
			   "<arg_value>{\"k\": [1]}</arg_value></tool_call>",
		 "[{\"name\":\"f\",\"arguments\":\"{\\\"n\\\":42,\\\"s\\\":\\\"42\\\",\\\"o\\\":"
		 "{\\\"k\\\":[1]}}\"}]", 5},
		{CHAT_GLM45, "\n<tool_call>f\n<arg_key>n</arg_key>\n<arg_value>7</arg_value>\n"
			     "</tool_call>\n<tool_call>g\n</tool_call>",
		 "[{\"name\":\"f\",\"arguments\":\"{\\\"n\\\":7}\"},{\"name\":\"g\",\"arguments\":"
		 "\"{}\"}]", 0},
		/* an unknown tool's values: JSON where they are JSON, else strings */
		{CHAT_GLM, "<tool_call>h<arg_key>x</arg_key><arg_value>[1, 2]</arg_value><arg_key>"
			   "y</arg_key><arg_value>not json</arg_value></tool_call>",
		 "[{\"name\":\"h\",\"arguments\":\"{\\\"x\\\":[1,2],\\\"y\\\":\\\"not json\\\"}\"}]",
		 0},
		/* not whole: cut short, text after, a malformed body, no name */
		{CHAT_GLM, "a <tool_call>f<arg_key>n</arg_key><arg_value>4", NULL, 0},
		{CHAT_GLM, "<tool_call>g</tool_call> and more", NULL, 0},
		{CHAT_GLM, "<tool_call>f<arg_key>n</arg_key>4</tool_call>", NULL, 0},
		{CHAT_GLM, "<tool_call> </tool_call>", NULL, 0},
		{CHAT_GLM, "no calls", NULL, 0},
		{CHAT_PLAIN, "<tool_call>g</tool_call>", NULL, 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *calls, err[WK_ERRSZ];
		size_t content, len = strlen(cases[i].text);
		cr_assert_eq(chat_tool_calls(cases[i].f, cases[i].text, len, tools, strlen(tools), 0,
					     &content, &calls, err, sizeof err), WK_OK);
		if (cases[i].calls) {
			cr_expect_str_eq(calls ? calls : "(none)", cases[i].calls, "case %zu", i);
			cr_expect_eq(content, cases[i].content, "case %zu", i);
		} else {
			cr_expect_null(calls, "case %zu: %s", i, calls);
			cr_expect_eq(content, len, "case %zu", i);
		}
		free(calls);
	}
	/* parallel_tool_calls false: the first call only */
	const char *two = "<tool_call>f</tool_call><tool_call>g</tool_call>";
	char *calls, err[WK_ERRSZ];
	size_t content;
	cr_assert_eq(chat_tool_calls(CHAT_GLM, two, strlen(two), NULL, 0, 1, &content, &calls, err,
				     sizeof err), WK_OK);
	cr_expect_str_eq(calls, "[{\"name\":\"f\",\"arguments\":\"{}\"}]");
	free(calls);
}
