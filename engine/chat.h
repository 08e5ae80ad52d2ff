/*
 * chat.h - renders chat messages (OpenAI style: a role and a content string) into a model's
 * prompt text, which the tokenizer then encodes with its added tokens split out, so the role
 * markers become their special ids.
 *
 * Formats, each written out from the model family's own Jinja chat template as transformers
 * renders it (trim_blocks, lstrip_blocks); tools and tool calls at the end of this comment:
 *
 *   CHAT_GLM   GLM-4.7 and GLM-5 (GlmMoeDsaForCausalLM; Glm4MoeForCausalLM by default):
 *                "[gMASK]<sop>"
 *                system     "<|system|>" TEXT
 *                user       "<|user|>" TEXT
 *                assistant  "<|assistant|>" "</think>" strip(TEXT)  (history: reasoning dropped)
 *                           "<|assistant|>" "<think>" strip(R) "</think>" strip(TEXT) when the
 *                           message comes after the last user message and carries reasoning R
 *                           ("<think>R</think>TEXT" in its content)
 *                tool       "<|observation|>" (once per run of tool messages)
 *                           "<tool_response>" TEXT "</tool_response>"
 *                generation prompt "<|assistant|><think>" (thinking on, the default) or
 *                "<|assistant|></think>" (thinking off)
 *              Source: llama.cpp models/templates/GLM-4.7-Flash.jinja (GLM-4.7-Flash shares
 *              GLM-5's tokenizer), which agrees with ../shared/reference/glm.md section 4.
 *   CHAT_GLM45 GLM-4.5 and GLM-4.6: a newline after each role marker, "<|user|>\n" TEXT (plus
 *              "/nothink" when thinking is off), "<|assistant|>\n<think></think>\n" TEXT,
 *              generation prompt "<|assistant|>" (thinking on) or
 *              "<|assistant|>\n<think></think>" (off). Source: llama.cpp
 *              models/templates/GLM-4.6.jinja; glm.md section 4, last item.
 *   CHAT_PLAIN the contents concatenated, nothing added: models with no chat template
 *              (stories260K).
 *
 * Tools (chat_render_tools), both GLM formats: when the list is not empty, the prompt starts
 * (after "[gMASK]<sop>") with a system block: "<|system|>\n# Tools\n\n" ... "<tools>\n", each
 * tool as Python's json.dumps(tool, ensure_ascii=False) and "\n", "</tools>\n\n" and the call
 * format's description. An assistant message's tool calls follow its text, each
 *   CHAT_GLM    "<tool_call>" NAME ("<arg_key>" K "</arg_key><arg_value>" V "</arg_value>")*
 *               "</tool_call>"
 *   CHAT_GLM45  "\n<tool_call>" NAME ("\n<arg_key>" K "</arg_key>\n<arg_value>" V
 *               "</arg_value>")* "\n</tool_call>"
 * with the arguments' keys in their order, V a string's own text or else the value's
 * json.dumps. chat_tool_calls reads calls in that form back out of generated text.
 *
 * strip() is Python's str.strip(), which the templates call. Thread-safe; no global state.
 */
#ifndef CHAT_H
#define CHAT_H

#include <stdbool.h>
#include <stddef.h>

#define CHAT_MAX_MESSAGES 65536    /* messages in one conversation */
#define CHAT_MAX_TEXT (64u << 20)  /* bytes of rendered prompt (the tokenizer's TOK_MAX_TEXT) */
#define CHAT_MAX_FILE (16u << 20)  /* bytes of a config.json, tokenizer_config.json, template */

enum chat_format { CHAT_PLAIN, CHAT_GLM, CHAT_GLM45 };
enum chat_role { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_TOOL };

/* An assistant message's tool call: the function's name, and its arguments as a JSON
 * object's text (OpenAI's "arguments" string; args_len 0 or "null": none). */
struct chat_call {
	const char *name, *args;
	size_t name_len, args_len;
};

struct chat_msg {
	enum chat_role role;
	const char *content; /* len bytes, any bytes (not NUL-terminated) */
	size_t len;
	const struct chat_call *calls; /* an assistant message's tool calls [n_calls], or NULL */
	size_t n_calls;
};

/* Renders n messages into *out (malloc'd, NUL-terminated, *len bytes; caller frees). With
 * add_generation_prompt, ends with the format's assistant prompt; thinking chooses GLM's
 * thinking on/off markers (ignored by CHAT_PLAIN). Returns WK_OK, WK_EINVAL (a bad role or
 * format), WK_ELIMIT (more than CHAT_MAX_MESSAGES, or a prompt past CHAT_MAX_TEXT) or
 * WK_ENOMEM. */
int chat_render(enum chat_format f, const struct chat_msg *m, size_t n,
		bool add_generation_prompt, bool thinking, char **out, size_t *len, char *err,
		size_t errsz);

/* As chat_render, with tools: tools_json (tools_len bytes; NULL: none) the text of a JSON
 * array of OpenAI tools ({"type": "function", "function": {"name": ..., ...}}), which the GLM
 * formats render as their templates do (above; CHAT_PLAIN leaves them out). WK_EFORMAT when
 * tools_json is not an array, or a tool call's arguments are not a JSON object. */
int chat_render_tools(enum chat_format f, const struct chat_msg *m, size_t n,
		      const char *tools_json, size_t tools_len, bool add_generation_prompt,
		      bool thinking, char **out, size_t *len, char *err, size_t errsz);

/* The tool calls in generated text (text[0..len)), in the format's form (above). Each call
 * "<tool_call>" NAME ... "</tool_call>" becomes {"name": NAME, "arguments": ARGS} with ARGS a
 * JSON object's text of its keys and values in order: a value is a string, unless the tool's
 * parameters schema (tools_json, as for chat_render_tools; NULL: none) gives the key a type
 * other than "string" and the value is JSON, which it then is. *calls: a malloc'd JSON array's
 * text of the calls, or NULL when the text has none or an unfinished one (a call cut short
 * by max_tokens: then the text is all content); *content_len: the length of the text before
 * the first call, with trailing whitespace left out (len when there are no calls). With
 * max_calls (0: all), only the first max_calls of the calls (OpenAI's parallel_tool_calls
 * false: one). WK_OK or WK_ENOMEM. */
int chat_tool_calls(enum chat_format f, const char *text, size_t len, const char *tools_json,
		    size_t tools_len, size_t max_calls, size_t *content_len, char **calls,
		    char *err, size_t errsz);

/* The length of s[0..n) without its trailing whitespace, as Python's str.rstrip() (Unicode's
 * spaces too; bytes that are not valid UTF-8 are never whitespace). */
size_t chat_rstrip_len(const char *s, size_t n);

/* Python's json.dumps(value, ensure_ascii=False) of the JSON text json[0..len), into *out
 * (malloc'd, NUL-terminated, *out_len bytes): ", " and ": " between items, keys in their order,
 * floats as Python's repr. WK_EFORMAT when json is not JSON. */
int chat_py_json(const char *json, size_t len, char **out, size_t *out_len, char *err,
		 size_t errsz);

/* The format for config.json's architectures[0]: CHAT_GLM for GlmMoeDsaForCausalLM and
 * Glm4MoeForCausalLM, else CHAT_PLAIN (also for NULL). Never fails. */
enum chat_format chat_format_for(const char *arch);

/* The format for the model directory dir: from its chat template (chat_template.jinja, else
 * tokenizer_config.json's chat_template) when it has one, else from config.json's
 * architectures (chat_format_for; no config.json means CHAT_PLAIN). A GLM template is told
 * apart as GLM-4.5/4.6 by its "/nothink" switch. A template of another family is
 * WK_EUNSUPPORTED; a malformed file WK_EFORMAT; else WK_OK. */
int chat_format_for_model(const char *dir, enum chat_format *f, char *err, size_t errsz);

const char *chat_format_name(enum chat_format f); /* "plain", "glm", "glm45" */
/* Parses a format name; WK_OK or WK_EINVAL. */
int chat_format_parse(const char *name, enum chat_format *f, char *err, size_t errsz);
/* Parses "system", "user", "assistant" or "tool"; WK_OK or WK_EINVAL. */
int chat_role_parse(const char *name, enum chat_role *r, char *err, size_t errsz);

/* Parses messages from JSON text: an array of {"role": ROLE, "content": C}, or an object
 * with such an array under "messages"; C is a string, null (empty), or a list of parts whose
 * {"type": "text", "text": S} parts are concatenated (the templates' visible_text). *msgs is
 * one malloc'd block holding the messages and their contents (caller frees it with free()),
 * *n their count. WK_OK, WK_EFORMAT, WK_EINVAL (a bad role), WK_ELIMIT or WK_ENOMEM. */
int chat_parse_json(const char *json, size_t len, struct chat_msg **msgs, size_t *n,
		    char *err, size_t errsz);
/* As chat_parse_json, also reading each assistant message's "tool_calls" (OpenAI's: [{"type":
 * "function", "function": {"name": S, "arguments": S or an object}}]) into its calls, and an
 * object's "tools" (an array) into *tools (malloc'd JSON text, *tools_len bytes; NULL when
 * absent). */
int chat_parse_json_tools(const char *json, size_t len, struct chat_msg **msgs, size_t *n,
			  char **tools, size_t *tools_len, char *err, size_t errsz);

#endif
