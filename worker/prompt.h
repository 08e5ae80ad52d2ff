/*
 * prompt.h - a job's prompt as the model reads it: its token ids as they are, its prompt
 * encoded (with what the tokenizer's post-processor adds, a BOS for Llama), or its messages
 * rendered in the model's chat format (tools and thinking as the job asks) and encoded. The
 * worker admits a job with it, and the HTTP server's /tokenize counts the same tokens.
 */
#ifndef WICK_PROMPT_H
#define WICK_PROMPT_H

#include <stdbool.h>

#include "engine/chat.h"
#include "engine/tokenizer.h"
#include "worker/job.h"

struct job_model {
	const struct tok *tok;  /* NULL: the model has no tokenizer */
	enum chat_format chat;
	int vocab;              /* the model's: token ids past it are refused */
};

/* j's prompt token ids (*ids malloc'd, *n of them); add_generation_prompt false leaves a
 * chat's last turn open (no assistant header after it). WK_OK, or WK_EINVAL naming the input
 * at fault (an id outside the vocabulary, tools or thinking in a plain chat format),
 * WK_EUNSUPPORTED (no tokenizer), WK_ELIMIT (a prompt past the tokenizer's limit), WK_ENOMEM,
 * with a message. */
int job_prompt(const struct job_model *m, const struct job *j, bool add_generation_prompt,
	       int **ids, int *n, char *err, size_t errsz);

#endif
