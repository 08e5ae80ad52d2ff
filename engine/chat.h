/*
 * chat.h - renders chat messages (OpenAI style: a role and a content string) into a model's
 * prompt text, which the tokenizer then encodes with its added tokens split out, so the role
 * markers become their special ids.
 *
 * Formats, each written out from the model family's own Jinja chat template as transformers
 * renders it (trim_blocks, lstrip_blocks), with no tools:
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

struct chat_msg {
	enum chat_role role;
	const char *content; /* len bytes, any bytes (not NUL-terminated) */
	size_t len;
};

/* Renders n messages into *out (malloc'd, NUL-terminated, *len bytes; caller frees). With
 * add_generation_prompt, ends with the format's assistant prompt; thinking chooses GLM's
 * thinking on/off markers (ignored by CHAT_PLAIN). Returns WK_OK, WK_EINVAL (a bad role or
 * format), WK_ELIMIT (more than CHAT_MAX_MESSAGES, or a prompt past CHAT_MAX_TEXT) or
 * WK_ENOMEM. */
int chat_render(enum chat_format f, const struct chat_msg *m, size_t n,
		bool add_generation_prompt, bool thinking, char **out, size_t *len, char *err,
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

#endif
