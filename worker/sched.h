/*
 * sched.h - the continuous-batching scheduler: many requests, one engine.
 *
 * Each call to sched_step() runs one engine step. Before it, waiting requests are admitted
 * into free sequences (up to the engine's max_seqs); a newly admitted request prefills its
 * prompt in the same step in which the running ones decode a token, so a request that arrives
 * mid-flight never waits for the others to finish. After the step each running request samples
 * its next token and finishes on EOS, max_tokens, a stop string, its deadline or a cancel.
 *
 * Every step is recorded in the step log (a JSON line per step, when a FILE is given):
 *   {"step": N, "t": seconds, "items": [{"id": ID, "phase": "prefill"|"decode", "tokens": K}]}
 * which is how tests see that requests share steps; a speculative decode item also has
 * "draft": D, the draft tokens among its K.
 *
 * Not thread-safe: one thread drives a scheduler.
 */
#ifndef SCHED_H
#define SCHED_H

#include <stdbool.h>
#include <stdio.h>

#include "common/wk.h"
#include "engine/sampler.h"
#include "worker/grammar.h"

struct engine;
struct sched_ix; /* sched.c: a request's n-gram index, for speculation */

#define SCHED_MAX_STOP 16
#define SCHED_MAX_ID 128
#define SCHED_TOP_LOGPROBS_MAX 20 /* OpenAI's limit on top_logprobs */

/* A generated token's log probability, and the most likely tokens in its place, under the
 * model's own distribution: the raw logits' log-softmax, before temperature and the filters
 * (as vLLM's logprobs), so the same whatever the sampling settings. top: the n_top ids of
 * the highest logits, highest first (the lower id first among equals). */
struct sched_logprob {
	float lp;
	int rank;             /* 1 + the tokens whose logit is higher (vLLM's rank) */
	int n_top;
	int top_id[SCHED_TOP_LOGPROBS_MAX];
	float top_lp[SCHED_TOP_LOGPROBS_MAX];
};

enum sched_status { SCHED_RUNNING, SCHED_DONE, SCHED_FAILED, SCHED_TIMED_OUT, SCHED_CANCELLED };
enum sched_finish { SCHED_FIN_NONE, SCHED_FIN_STOP, SCHED_FIN_LENGTH };

struct sched_req {
	/* set by the caller before sched_submit */
	char id[SCHED_MAX_ID + 1];
	int *prompt;          /* token ids, malloc'd; owned by the scheduler after submit */
	int n_prompt;
	int max_tokens;
	struct samp_cfg samp;
	char *stop[SCHED_MAX_STOP]; /* malloc'd strings, owned after submit */
	int n_stop;
	int stop_hit;               /* 1 + the index of the stop string that ended it; 0: none */
	int *pred;            /* token ids of text the output is expected to repeat (malloc'd,
			       * owned after submit; NULL: none): the first place speculation
			       * looks for a draft */
	int n_pred;
	double deadline;      /* wk_now() seconds; 0 = none */
	/* Logit processing before each pick (the caller's settings; all off by default): a bias
	 * added to the logits of some ids (OpenAI's logit_bias: bias_id[n_bias] < vocab, bias
	 * [n_bias], malloc'd, owned after submit); the repetition penalty (vLLM's and Hugging
	 * Face's: each id of the prompt or the output so far has its logit divided by it where
	 * positive, else multiplied; 0 or 1: off); then OpenAI's penalties, each id's logit less
	 * frequency_penalty times its count in the output so far and presence_penalty once it is
	 * there. Such a request's logits come to the host and the scheduler picks there, with
	 * the same rule and draws as the engine (speculation still verifies its drafts; the MTP
	 * layer does not draft for it, as its drafts follow the engine's own pick). */
	float presence_penalty, frequency_penalty, repetition_penalty;
	int *bias_id;
	float *bias;
	int n_bias;
	/* Structured output (owned after submit; NULL: none): each pick is among the tokens whose
	 * bytes continue a document the grammar accepts (grammar.h), a stop id only once the
	 * document may end, and the request ends (SCHED_FIN_STOP) the moment it is whole. Its
	 * logits come to the host, as with the processing above. gram_after: the token id + 1
	 * after which the grammar applies (GLM's "</think>": the reasoning before it is free
	 * text, and the token itself is not fed to the grammar); 0: from the first token. */
	struct gram *gram;
	int gram_after;
	bool logprobs;        /* fill lp[n_out]: each generated token's log probability */
	int top_logprobs;     /* and its n_top alternatives, 0..SCHED_TOP_LOGPROBS_MAX */
	/* Prompt logprobs (vLLM's prompt_logprobs, and what OpenAI's legacy echo + logprobs
	 * returns): fill plp[1..n_prompt), each prompt token's log probability after the tokens
	 * before it, with prompt_top alternatives (the first token has none: nothing precedes
	 * it). Such a prompt is prefilled in chunks of at most sched_set_prompt_rows tokens, each
	 * chunk's logits coming to the host, and its first token is picked there from the last
	 * row (the same rule and draw as the engine's). With max_tokens 0 the request ends after
	 * its prompt (SCHED_FIN_LENGTH), nothing generated: a scoring request. */
	bool prompt_logprobs;
	int prompt_top;
	/* The prefix cache (sched_set_prefix_cache): only a request with the same key may reuse
	 * what this one leaves in the cache (the worker's: its tenant's hash), so that one tenant
	 * cannot time another's prompts. */
	uint64_t cache_key;
	void *user;           /* the caller's */
	/* Optional streaming hook, called during sched_step (ctx is the step's ctx) once after
	 * each token the request generates, with the text that became final since the last call
	 * (len may be 0). Text that could still change is held back: a trailing U+FFFD (an
	 * incomplete UTF-8 sequence) and a tail that could be the start of a stop string. What
	 * is left comes in one more call when the request finishes SCHED_DONE, so the pieces add
	 * up to r->text exactly. piece is valid only during the call. */
	void (*on_token)(void *ctx, struct sched_req *r, const char *piece, size_t len);

	/* filled by the scheduler */
	enum sched_status status;
	enum sched_finish finish;
	int *out;             /* generated ids [n_out] */
	int n_out, cap_out;
	struct sched_logprob *lp; /* with logprobs: [n_out] (the engine copies each row's logits
				   * to the host for them: a row of vocab floats a token) */
	struct sched_logprob *plp; /* with prompt_logprobs: [n_prompt] (plp[0] unfilled) */
	char *text;           /* decoded output (after the stop string is cut), on finish */
	size_t text_len;
	char error[WK_ERRSZ];  /* for SCHED_FAILED */
	double t_admit, t_first, t_done; /* wk_now() */
	int steps;            /* engine steps this request took part in */
	int cached;           /* prompt tokens whose cache came from the prefix cache (not run) */
	int drafted, accepted; /* speculative decoding: draft tokens proposed, and kept */
	double gpu_seconds;   /* its share of the busy time: see sched_mark() */

	/* private */
	int seq;
	int pre;              /* prompt tokens in the cache (the prefill is done at n_prompt) */
	float *plp_rows;      /* prompt_logprobs, during the prefill: a chunk's logits */
	size_t sent;          /* bytes of text handed to on_token */
	int win;              /* on_token, no stop strings: first token of the decode window */
	int draft_len;        /* speculation: the most draft tokens of this step's plan */
	double acc_s, acc_f;  /* speculation: its drafts kept, and its verifications that failed
			       * one, decayed (sched_set_draft_cost) */
	int probe_gap, probe_in; /* speculation: steps between drafts where none pay, and left */
	bool probe;           /* speculation: this plan's draft is a probe */
	int pred_at;          /* speculation: where in pred the last draft came from */
	struct sched_ix *ix, *pix; /* speculation: the n-grams of prompt + output, of pred */
	int mtp_d[16], mtp_n;  /* speculation: the MTP layer's drafts after its last token */
	size_t win_sent;      /* bytes of decode(out[win..n_out)) handed to on_token */
	struct sampler *sampler;
	float *lp_rows;        /* with logprobs or processing: the step's logits [lp_cap][vocab] */
	int lp_cap;
	bool proc;             /* its logits are processed and picked on the host */
	int *counts;           /* processing with penalties: each id's count in out [vocab] */
	unsigned char *in_prompt; /* the repetition penalty: the ids of the prompt [vocab] */
	struct gram_state gst;  /* structured output: where the output stands */
	bool gram_on;           /* ... the grammar applies (past gram_after) */
	bool gram_dead;         /* ... no token could continue it (the request fails: its
				 * schema's doing, not the engine's) */
	bool cancel;
	struct sched_req *next;
};

struct sched;

/* Returns NULL when out of memory. log may be NULL. */
struct sched *sched_create(struct engine *e, FILE *log);
void sched_free(struct sched *s); /* frees requests still held */

/* Speculative decoding by prompt lookup (n-gram drafts). Before a decode step, the last
 * tokens of the request's prompt and output are looked up in its prediction (sched_req.pred:
 * text the caller expects the output to repeat, read in order), then earlier in the prompt and
 * output themselves, most recent first (SCHED_NGRAM_MAX tokens down to SCHED_NGRAM_MIN); the
 * tokens that followed there are the draft. The step runs the last token and the draft
 * together and returns the token after each (eng_item.rows): the draft tokens that equal the
 * token before them are kept, and the token after the last kept one is one more, so a step
 * gives 1 to max_draft + 1 tokens. Greedy, the token after each is the argmax; sampled, a
 * draft is kept with its probability and else replaced by a pick from the rest
 * (samp_pick_draft), which leaves the distribution exactly as it was, but draws other
 * numbers: a seeded sampled request gives another text with speculation than without. The
 * rest of the draft is truncated from the cache. A request drafts as many tokens (up to
 * max_draft) as are expected to pay (sched_set_draft_cost), so one whose drafts fail drafts
 * none but a probe now and then. A greedy request's output
 * is the same as without (each kept token is the argmax the model gives after the tokens
 * before it), up to the rounding of a step of several tokens against a step of one. It pays where the output
 * repeats its prompt, its prediction or itself (edits of code or text, extraction, quoting)
 * and costs the compute of the rejected drafts where not: a GPU step of a few tokens costs
 * about what one does (it is bound by reading the weights), a CPU step more (wick bench
 * speculate measures both). max_draft 0 (the default): off; at most SCHED_DRAFT_MAX
 * (WK_EINVAL past it).
 *
 * Where the engine has the model's MTP layer loaded (eng_info.mtp, eng_opts.mtp), it is the
 * drafter instead of the lookup in the prompt and output (a prediction still comes first):
 * each step's items ask the engine for the MTP layer's drafts after the token the step gives
 * them (eng_item.drafts, as many as the request's next draft may have), and the next step
 * verifies them. The drafts are the MTP layer's argmaxes: a sampled request keeps one with
 * its probability, as any draft, and its distribution stays exact. */
#define SCHED_DRAFT_MAX 16
#define SCHED_NGRAM_MAX 3
#define SCHED_NGRAM_MIN 2
int sched_set_speculate(struct sched *s, int max_draft);
/* No drafts in a step that runs more than max_batch requests (0, the default: no limit), as
 * vLLM's speculative_disable_by_batch_size: a big batch is bound by compute rather than by
 * reading the weights, and every rejected draft costs it. With the MTP layer the items still
 * run it over their rows (eng_item.mtp_cache), so that its caches keep up (a pass of one
 * layer). WK_EINVAL when negative. */
int sched_set_speculate_max_batch(struct sched *s, int max_batch);

/* How many drafts a request's step verifies: as many as pay. Each draft is expected kept with
 * probability alpha once the one before it was, alpha from the request's own drafts (the
 * recent ones weigh most) after a prior of every request's; a step with K drafts is expected
 * to give 1 + alpha + ... + alpha^K tokens for 1 + K * cost the time of a step without, and
 * K (up to max_draft) is the one that gives the most tokens a second. cost is a draft's:
 * measured from the scheduler's own decode steps (SCHED_COST_AUTO, the default: a least-
 * squares line of a step's seconds against its drafts, an item each, the recent steps
 * weighing most; with the MTP layer a draft is counted twice, its row in the verification and
 * its pass of the layer), or fixed here (0 to SCHED_COST_MAX; WK_EINVAL else). On a GPU a
 * step of a few tokens costs about what one does and drafts pay from a low alpha; on a CPU
 * a row costs more and they pay only where most are kept. Where none pays, the request
 * drafts one token every few steps (a probe: 4 steps, doubling up to 32 while probes fail)
 * to see whether that has changed, and with the MTP layer its items still run the layer over
 * their rows (eng_item.mtp_cache) so that its drafts, when they come, attend to every
 * position. A request with a prediction drafts at least one token while the prediction lasts.
 * The outputs do not depend on any of this: only how many steps they take. */
#define SCHED_COST_AUTO (-1.0)
#define SCHED_COST_MAX 16.0
int sched_set_draft_cost(struct sched *s, double cost);
/* The cost a draft has now: the fixed one, or the measured one (a draft's, with the MTP
 * layer two units). */
double sched_draft_cost(const struct sched *s);
/* The K in 0..max that gives the most tokens a second for alpha and cost (the smallest of
 * equals). */
int sched_draft_len(double alpha, double cost, int max);
/* The measured cost: sched_cost_add(c, z, y) adds a step of y seconds an item with z units
 * of draft work an item; sched_cost_ratio is what a unit adds to a step without drafts, as a
 * part of one: (the mean y of the steps with drafts - the mean y of those without) / their
 * mean z / the mean y of those without, within 0..SCHED_COST_MAX, pulled toward a prior of
 * 0.2 by the weight of two steps (the prior alone until both kinds have been seen). Each
 * kind's means weigh its recent steps most (x 0.98 a step of that kind), and a step slower
 * than 4 times its kind's mean so far counts as 4 times it. */
struct sched_cost {
	double w0, y0;     /* steps without drafts: decayed count, and sum of y */
	double w1, y1, z1; /* with: decayed count, sum of y, sum of z */
};
void sched_cost_add(struct sched_cost *c, double z, double y);
double sched_cost_ratio(const struct sched_cost *c);

/* The most prompt tokens a request with prompt_logprobs prefills in one step: a row of
 * logits (vocab floats) each comes to the host. Default: as many as 64 MiB holds, 1 to 256.
 * WK_EINVAL outside 1..4096. */
#define SCHED_PROMPT_ROWS_BYTES (64u << 20)
#define SCHED_PROMPT_ROWS_MAX 4096
int sched_set_prompt_rows(struct sched *s, int rows);

/* The prefix cache (off by default). A finished request's sequence is kept, with the tokens
 * in its cache (its prompt and output), instead of being freed; a request admitted later whose
 * prompt begins with some of those tokens (SCHED_CACHE_MIN at least, and the same cache_key)
 * begins with that prefix and prefills only the rest of its prompt: a conversation's next
 * turn runs only the new messages, a prompt sent again only its last token. It takes the
 * entry's sequence where the entry holds nothing more, and else copies the prefix into a
 * free sequence (eng_seq_copy), leaving the entry for others. A running request's cache is
 * a prefix too, copied: the choices of one prompt (n) and requests with one system prompt
 * run it once. A request whose prompt shares at least half its tokens, and at least
 * sched_set_prefix_wait's, with a running request's that is still being prefilled waits for
 * that prefill (keeping its place and a slot), then copies. An entry is evicted, least
 * recently cached first, when a request needs its sequence and none is free, so it never
 * holds a request back. A request with
 * prompt_logprobs reuses nothing (every row of its prompt must run). With the MTP layer
 * drafting, a prefix is reused one position short: the layer's row at its last position was
 * made from the token after it, which the new prompt need not share. The reused positions'
 * cache is what the earlier request computed: the same numbers a fresh prefill gives, up to
 * the rounding of a prompt run in two parts against one (as prompt chunks). WK_ENOMEM. */
#define SCHED_CACHE_MIN 2
int sched_set_prefix_cache(struct sched *s, bool on);
/* The fewest shared prompt tokens a request waits a step for (a running request's prefill, to
 * copy it) rather than prefilling them beside it (0: never wait). A step costs a fixed time
 * and a prefill row a little more. On a GPU the rows of a prefill beside others are nearly
 * free until compute binds, around a thousand rows of a GLM-5 step, while a step of eager
 * GLM-5 costs tens of milliseconds: the default on a device backend (SCHED_WAIT_DEVICE)
 * waits only for long prefixes (a RAG context, a long system prompt) and lets short
 * prompts' choices prefill together. On the CPU backend a row costs more than a step's fixed
 * part, and the default waits from SCHED_CACHE_MIN tokens. WK_EINVAL when negative. */
#define SCHED_WAIT_DEVICE 1024
int sched_set_prefix_wait(struct sched *s, int min_tokens);
struct sched_cache_stats {
	long hits, misses;      /* admissions that began with a cached prefix, and those that
				 * found none worth it (with the cache on, no prompt logprobs) */
	long copies;            /* of the hits, those copied (eng_seq_copy) from an entry or a
				 * running request rather than taking an entry */
	long waits;             /* steps a request waited for a running one's prefill */
	long hit_tokens;        /* prompt tokens not run, summed over the hits */
	long evicted;           /* entries freed for a request that needed a sequence */
	int entries;            /* entries now, and the tokens they hold */
	long tokens;
};
void sched_cache_stats(const struct sched *s, struct sched_cache_stats *out);
/* The prefix cache's entries, for keeping them past the process (prefix_store.c), in order
 * of use, the most recent first: each one's sequence (the engine's), its tokens (borrowed
 * until the next step) and its cache_key. *out is a new array of sched_cache_stats' entries
 * (NULL with none); WK_ENOMEM. */
struct sched_cache_entry {
	int seq, n;
	const int *tok;
	uint64_t key;
	long used;
};
int sched_cache_entries(const struct sched *s, struct sched_cache_entry **out);
/* Makes sequence seq (allocated; its caches hold tok[0..n)) an entry, used less recently than
 * those there: the cache's from now on (tok is copied). WK_EINVAL (the cache off, n < 1, or
 * seq not holding n positions), WK_ELIMIT (as many entries as slots) or WK_ENOMEM; the
 * sequence stays the caller's then. */
int sched_cache_add(struct sched *s, int seq, const int *tok, int n, uint64_t key);

/* Queues r (admitted at the next step when a sequence is free). The prompt must be
 * non-empty; max_tokens 0 prefills it and ends. Returns WK_OK, or WK_EINVAL (prompt + max_tokens past the context: the caller
 * reports prompt_too_long) with a message. */
int sched_submit(struct sched *s, struct sched_req *r, char *err, size_t errsz);

/* Marks r to be cancelled at the next step. */
void sched_cancel(struct sched *s, struct sched_req *r);

/* Runs one step. Finished requests are handed to done(user_ctx, r) after it, and are the
 * caller's to free with sched_req_free. Returns the number of requests still held (waiting
 * or running), or a WK_E* code when the engine failed: then every held request has been
 * finished as SCHED_FAILED through done(). */
int sched_step(struct sched *s, void (*done)(void *ctx, struct sched_req *r), void *ctx);

int sched_pending(const struct sched *s); /* waiting + running */
int sched_running(const struct sched *s);
long sched_steps(const struct sched *s);
/* WK_OK, or the code of the first step the engine failed (its message in *why, when not
 * NULL): after that the engine is not to be trusted (a sticky device error). */
int sched_engine_failed(const struct sched *s, const char **why);

/* Busy-time accounting. The scheduler is busy from the submit that finds it empty until the
 * end of the sched_step() call after which nothing is pending. That time is cut into slices,
 * one per sched_step() call: from the end of the previous call (or the first submit) to the
 * end of this one, so the gaps between steps (admission, sampling, storing results) belong
 * to the step after them. A slice is split over the step's items in proportion to the
 * tokens each ran (prompt tokens for a prefill, 1 for a decode, 1 + its drafts for a
 * speculative decode: the drafts thrown away cost the request that made them); a call that
 * ran no item
 * splits it equally over the requests it finished. Each request's gpu_seconds is the sum of
 * its shares, final when done() is called, and the shares sum to the busy time.
 * sched_mark() is the end of the last slice (or the first submit): the worker takes its
 * BUSY -> IDLE and IDLE -> BUSY transition times from it. */
double sched_mark(const struct sched *s);

void sched_req_free(struct sched_req *r);

/* The log probability of token tok in a logits row of vocab, and the top most likely
 * (struct sched_logprob's rule; top is clamped to 0..SCHED_TOP_LOGPROBS_MAX). */
void sched_logprob_of(struct sched_logprob *o, const float *logits, int vocab, int tok, int top);

/* The bytes token id adds to r's text in place of its output token k (after out[0..k) and
 * the prompt; as the output's text is decoded, special tokens left out), malloc'd and
 * NUL-terminated (length *len). A byte-level piece may end inside a UTF-8 sequence: these
 * are its raw bytes, so the pieces of an output concatenate to its text. Decoded with the
 * few tokens before it, so the cost is the same at any length. WK_OK, or WK_ENOMEM, or
 * WK_EINVAL (no tokenizer, or id outside it). */
int sched_token_bytes(const struct sched *s, const struct sched_req *r, int k, int id,
		      char **bytes, size_t *len);
/* The same for token id in place of prompt token k (after prompt[0..k)). */
int sched_prompt_bytes(const struct sched *s, const struct sched_req *r, int k, int id,
		       char **bytes, size_t *len);

#endif
