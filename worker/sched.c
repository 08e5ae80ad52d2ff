#include "worker/sched.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"

/* How many drafts pay (plan_drafts): */
#define SCHED_COST_PRIOR 0.2   /* a draft's cost against a step, before any is measured */
#define SCHED_COST_PRIOR_W 2.0 /* ... its weight, in steps with drafts */
#define SCHED_COST_DECAY 0.98  /* a measured step's weight, one of its kind later */
#define SCHED_COST_CLIP 4.0    /* a step counts as at most this times its kind's mean */
#define SCHED_ACC_PRIOR 0.6    /* a draft kept, before any has been verified */
#define SCHED_ACC_WEIGHT 2.0   /* the prior's weight, in verifications */
#define SCHED_ACC_DECAY 0.8    /* a verification's weight in its request's, one later */
#define SCHED_ACC_GLOBAL_DECAY 0.99 /* ... in every request's */
#define SCHED_PROBE_MIN 4      /* steps between probes where no draft pays */
#define SCHED_PROBE_MAX 32

struct sched {
	struct engine *e;
	const struct tok *tok;
	FILE *log;
	int vocab, max_seq, slots;
	int prompt_rows;         /* sched_set_prompt_rows */
	struct eng_info stops;   /* n_stop and stop: the ids that end a generation */
	struct sched_req *wait_head, *wait_tail;
	struct sched_req **run;  /* [slots]: running requests, NULL when free */
	int *next_tok;           /* [slots]: each request's next token, from the engine */
	struct eng_item *items;  /* [slots] */
	int *item_slot;          /* [slots] */
	struct sched_req **item_req; /* [slots]: the request of each item of the current step */
	int spec;                /* speculative decoding's max_draft (0: off) */
	int *spec_in, *spec_out; /* [slots][SCHED_DRAFT_MAX + 1]: a step's tokens and argmaxes */
	int *spec_k;             /* [slots]: the draft tokens of this step (0: none) */
	double *spec_u;          /* [slots][2 * (SCHED_DRAFT_MAX + 1)]: a sampled one's draws */
	float *pick_row;         /* [vocab]: a row processed for a host pick (sched_req.proc) */
	struct samp_cand *pick_cand; /* [vocab]: the pick's scratch */
	struct gram_vocab *gvocab; /* structured output: the tokens' bytes as a trie */
	char **gpiece;           /* [vocab]: each token's bytes (NULL: a special token) */
	size_t *glen;
	unsigned char *gallowed; /* [vocab]: a row's allowed tokens */
	bool mtp;                /* the engine's MTP layer drafts (sched.h) */
	int spec_max_batch;      /* sched_set_speculate_max_batch (0: no limit) */
	bool spec_now;           /* this step drafts */
	int *spec_d;             /* [slots][SCHED_DRAFT_MAX]: the MTP drafts a step returns */
	double draft_cost;       /* sched_set_draft_cost (SCHED_COST_AUTO: cost measured) */
	struct sched_cost cost;  /* decode steps' seconds against their drafts */
	double acc_s, acc_f;     /* every request's drafts kept and failed, decayed (a prior) */
	struct sched_req *fin_head, *fin_tail; /* finished in this call; done() after accounting */
	long steps;
	int engine_rc;           /* WK_OK until a step fails in the engine */
	char engine_err[WK_ERRSZ];
	double t0;
	double t_mark;           /* end of the last accounted slice (see sched.h) */
	/* the prefix cache (sched_set_prefix_cache): finished requests' sequences, kept */
	bool pc_on;
	int pc_wait;             /* sched_set_prefix_wait */
	struct pcache {
		int seq;             /* the engine's, still allocated */
		int *tok;            /* [n]: the tokens its cache holds, in order */
		int n;
		uint64_t key;        /* its request's cache_key */
		long used;           /* s->steps when it was cached */
	} *pc;                   /* [n_pc], at most slots */
	int n_pc;
	struct sched_cache_stats pc_stats;
};

struct sched *sched_create(struct engine *e, FILE *log)
{
	struct sched *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	const struct eng_info *in = eng_info(e);
	s->e = e;
	s->tok = eng_tokenizer(e);
	s->log = log;
	s->vocab = in->vocab;
	s->stops.n_stop = in->n_stop;
	memcpy(s->stops.stop, in->stop, sizeof s->stops.stop);
	s->max_seq = in->max_seq;
	s->slots = in->max_seqs;
	size_t rows = SCHED_PROMPT_ROWS_BYTES / ((size_t)s->vocab * sizeof(float));
	s->prompt_rows = rows < 1 ? 1 : rows > 256 ? 256 : (int)rows;
	s->pc_wait = strcmp(in->backend, "cpu") ? SCHED_WAIT_DEVICE : SCHED_CACHE_MIN;
	s->run = calloc((size_t)s->slots, sizeof *s->run);
	s->items = calloc((size_t)s->slots, sizeof *s->items);
	s->next_tok = calloc((size_t)s->slots, sizeof *s->next_tok);
	s->item_slot = calloc((size_t)s->slots, sizeof *s->item_slot);
	s->item_req = calloc((size_t)s->slots, sizeof *s->item_req);
	s->spec_k = calloc((size_t)s->slots, sizeof *s->spec_k);
	if (!s->run || !s->items || !s->next_tok || !s->item_slot || !s->item_req || !s->spec_k) {
		sched_free(s);
		return NULL;
	}
	s->t0 = wk_now();
	s->draft_cost = SCHED_COST_AUTO;
	s->acc_s = SCHED_ACC_PRIOR * SCHED_ACC_WEIGHT;
	s->acc_f = (1 - SCHED_ACC_PRIOR) * SCHED_ACC_WEIGHT;
	return s;
}

/* ---- speculation's n-gram indexes ----
 * For each n up to SCHED_NGRAM_MAX, an open-addressing table from an n-gram to a position it
 * begins at, among those with a token after them. Two per request: its prompt + output's,
 * which keeps the last start (the most recent place) and leaves out the current last n
 * tokens themselves, filled as tokens come; and its prediction's, which keeps the first.
 * A step's lookup costs O(1) however long the text: a scan of a 100K-token prompt each step
 * would cost about what a GPU's decode step of 64 sequences does. */
typedef int (*ix_tok_fn)(const struct sched_req *r, int i);
struct sched_ix {
	int *tab[SCHED_NGRAM_MAX + 1]; /* [cap[n]] start positions, -1 empty */
	int cap[SCHED_NGRAM_MAX + 1], used[SCHED_NGRAM_MAX + 1];
	int upto[SCHED_NGRAM_MAX + 1]; /* starts 0 .. upto-1 are in */
	ix_tok_fn tok;                 /* the text's token i */
	bool first;                    /* keep the first start of each n-gram, not the last */
};

static int ctx_tok(const struct sched_req *r, int i);

static void ix_free(struct sched_ix *x)
{
	if (!x)
		return;
	for (int n = 0; n <= SCHED_NGRAM_MAX; n++)
		free(x->tab[n]);
	free(x);
}

/* The slot of the n tokens key: where they are, or the empty one they would go in. */
static int ix_slot(const struct sched_ix *x, const struct sched_req *r, const int *key, int n)
{
	uint32_t h = 2166136261u;
	for (int i = 0; i < n; i++)
		h = (h ^ (uint32_t)key[i]) * 16777619u;
	int mask = x->cap[n] - 1;
	for (int k = (int)((h ^ (h >> 15)) & (uint32_t)mask);; k = (k + 1) & mask) {
		int p = x->tab[n][k], i = 0;
		while (p >= 0 && i < n && x->tok(r, p + i) == key[i])
			i++;
		if (p < 0 || i == n)
			return k;
	}
}

/* Puts start p of the n-gram in. */
static void ix_put(struct sched_ix *x, const struct sched_req *r, int p, int n)
{
	int key[SCHED_NGRAM_MAX];
	for (int i = 0; i < n; i++)
		key[i] = x->tok(r, p + i);
	int k = ix_slot(x, r, key, n);
	if (x->tab[n][k] < 0)
		x->used[n]++;
	else if (x->first)
		return;
	x->tab[n][k] = p;
}

/* Adds the starts up to last. false when out of memory. */
static bool ix_fill(struct sched_ix *x, const struct sched_req *r, int last, int n)
{
	for (; x->upto[n] <= last; x->upto[n]++) {
		if (2 * (x->used[n] + 1) > x->cap[n]) { /* grow: reinsert every start so far */
			int cap = x->cap[n] ? 2 * x->cap[n] : 64;
			int *t = malloc((size_t)cap * sizeof *t);
			if (!t)
				return false;
			free(x->tab[n]);
			x->tab[n] = t;
			x->cap[n] = cap;
			x->used[n] = 0;
			memset(t, 0xff, (size_t)cap * sizeof *t);
			for (int p = 0; p < x->upto[n]; p++)
				ix_put(x, r, p, n);
		}
		ix_put(x, r, x->upto[n], n);
	}
	return true;
}

/* Where the n tokens key begin in x's text (filled up to last), or -1; NULL x: -1. */
static int ix_find(struct sched_ix *x, const struct sched_req *r, const int *key, int n,
		   int last)
{
	if (!x || !ix_fill(x, r, last, n) || !x->cap[n])
		return -1;
	return x->tab[n][ix_slot(x, r, key, n)];
}

_Static_assert(SCHED_DRAFT_MAX == ENG_DRAFT_MAX && SCHED_DRAFT_MAX <= 16,
	       "sched_req.mtp_d holds an engine step's drafts");

int sched_set_speculate(struct sched *s, int max_draft)
{
	if (max_draft < 0 || max_draft > SCHED_DRAFT_MAX)
		return WK_EINVAL;
	size_t w = SCHED_DRAFT_MAX + 1;
	if (max_draft > 0 && !s->spec_in) {
		s->spec_in = calloc((size_t)s->slots * w, sizeof *s->spec_in);
		s->spec_out = calloc((size_t)s->slots * w, sizeof *s->spec_out);
		s->spec_u = calloc((size_t)s->slots * 2 * w, sizeof *s->spec_u);
		s->spec_d = calloc((size_t)s->slots * SCHED_DRAFT_MAX, sizeof *s->spec_d);
		if (!s->spec_in || !s->spec_out || !s->spec_u || !s->spec_d) {
			free(s->spec_in);
			free(s->spec_out);
			free(s->spec_u);
			free(s->spec_d);
			s->spec_in = s->spec_out = s->spec_d = NULL;
			s->spec_u = NULL;
			return WK_ENOMEM;
		}
	}
	s->spec = max_draft;
	s->mtp = max_draft > 0 && eng_info(s->e)->mtp;
	return WK_OK;
}

int sched_set_prompt_rows(struct sched *s, int rows)
{
	if (rows < 1 || rows > SCHED_PROMPT_ROWS_MAX)
		return WK_EINVAL;
	s->prompt_rows = rows;
	return WK_OK;
}

int sched_set_speculate_max_batch(struct sched *s, int max_batch)
{
	if (max_batch < 0)
		return WK_EINVAL;
	s->spec_max_batch = max_batch;
	return WK_OK;
}

int sched_set_draft_cost(struct sched *s, double cost)
{
	if (cost != SCHED_COST_AUTO && !(cost >= 0 && cost <= SCHED_COST_MAX))
		return WK_EINVAL;
	s->draft_cost = cost;
	return WK_OK;
}

/* ---- how many drafts pay ----
 * A request's next step verifies K drafts, K chosen to give the most tokens for the time:
 * each draft is expected kept with probability alpha once the one before it was (so a step
 * gives 1 + alpha + ... + alpha^K tokens), and costs `cost` of a step without drafts (its
 * row in the verification, and with the MTP layer its pass of that layer). alpha is the
 * request's own kept and failed drafts, decayed, after a prior of every request's; the cost
 * is measured from the decode steps (sched_cost), or fixed (sched_set_draft_cost). */

int sched_draft_len(double alpha, double cost, int max)
{
	int best = 0;
	double gain = 1, tokens = 1, a = 1;
	for (int k = 1; k <= max; k++) {
		a *= alpha;
		tokens += a;
		double g = tokens / (1 + cost * k);
		if (g > gain * (1 + 1e-9)) {
			gain = g;
			best = k;
		}
	}
	return best;
}

void sched_cost_add(struct sched_cost *c, double z, double y)
{
	const double l = SCHED_COST_DECAY;
	if (!(z >= 0 && y >= 0))
		return;
	/* a step far slower than the others of its kind (a page fault, the machine's other
	 * work) counts as SCHED_COST_CLIP times their mean */
	double w = z == 0 ? c->w0 : c->w1, sum = z == 0 ? c->y0 : c->y1;
	if (w >= SCHED_COST_CLIP && y > SCHED_COST_CLIP * sum / w)
		y = SCHED_COST_CLIP * sum / w;
	if (z == 0) {
		c->w0 = l * c->w0 + 1;
		c->y0 = l * c->y0 + y;
	} else {
		c->w1 = l * c->w1 + 1;
		c->y1 = l * c->y1 + y;
		c->z1 = l * c->z1 + z;
	}
}

double sched_cost_ratio(const struct sched_cost *c)
{
	if (c->w0 <= 0 || c->w1 <= 0)
		return SCHED_COST_PRIOR;
	double base = c->y0 / c->w0, unit = (c->y1 - c->w1 * base) / c->z1;
	double r = !(unit > 0) ? 0 : unit >= SCHED_COST_MAX * base ? SCHED_COST_MAX : unit / base;
	/* pulled toward the prior by the weight of SCHED_COST_PRIOR_W steps */
	return (r * c->w1 + SCHED_COST_PRIOR * SCHED_COST_PRIOR_W) / (c->w1 + SCHED_COST_PRIOR_W);
}

double sched_draft_cost(const struct sched *s)
{
	return s->draft_cost != SCHED_COST_AUTO ? s->draft_cost
						: sched_cost_ratio(&s->cost) * (s->mtp ? 2 : 1);
}

/* The most draft tokens request r's next verification may have (and with the MTP layer, how
 * many drafts it asks the layer for now). 0 where drafts do not pay; then a probe of one
 * draft every probe_gap steps keeps its alpha current (the gap doubles while probes fail). */
static int plan_drafts(struct sched *s, struct sched_req *r)
{
	double alpha = (r->acc_s + SCHED_ACC_WEIGHT * s->acc_s / (s->acc_s + s->acc_f)) /
		       (r->acc_s + r->acc_f + SCHED_ACC_WEIGHT);
	int k = sched_draft_len(alpha, sched_draft_cost(s), s->spec);
	if (k == 0 && r->pred && r->pred_at < r->n_pred)
		k = 1; /* the caller expects the output to repeat its prediction: always look */
	if (k > 0) {
		r->probe_in = 0;
		return k;
	}
	if (!r->probe_gap)
		r->probe_gap = SCHED_PROBE_MIN;
	if (r->probe_in <= 0)
		r->probe_in = r->probe_gap;
	if (--r->probe_in > 0)
		return 0;
	r->probe = true;
	return 1;
}

/* After a verification of d drafts that kept a: the request's and every request's counts. */
static void drafts_kept(struct sched *s, struct sched_req *r, int d, int a)
{
	const double l = SCHED_ACC_DECAY, g = SCHED_ACC_GLOBAL_DECAY;
	bool failed = a < d;
	r->acc_s = l * r->acc_s + a;
	r->acc_f = l * r->acc_f + failed;
	s->acc_s = g * s->acc_s + a;
	s->acc_f = g * s->acc_f + failed;
	if (r->probe) /* a probe's outcome sets the next gap */
		r->probe_gap = failed ? (r->probe_gap * 2 < SCHED_PROBE_MAX ? r->probe_gap * 2
									 : SCHED_PROBE_MAX)
				      : SCHED_PROBE_MIN;
	r->probe = false;
}

void sched_req_free(struct sched_req *r)
{
	if (!r)
		return;
	free(r->prompt);
	for (int i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->out);
	free(r->pred);
	ix_free(r->ix);
	ix_free(r->pix);
	free(r->text);
	free(r->lp);
	free(r->lp_rows);
	free(r->plp);
	free(r->plp_rows);
	free(r->bias_id);
	free(r->bias);
	free(r->counts);
	free(r->in_prompt);
	gram_free(r->gram);
	samp_free(r->sampler);
	free(r);
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	for (struct sched_req *r = s->wait_head, *n; r; r = n) {
		n = r->next;
		sched_req_free(r);
	}
	if (s->run)
		for (int i = 0; i < s->slots; i++)
			if (s->run[i]) {
				eng_seq_free(s->e, s->run[i]->seq);
				sched_req_free(s->run[i]);
			}
	for (int i = 0; i < s->n_pc; i++) {
		eng_seq_free(s->e, s->pc[i].seq);
		free(s->pc[i].tok);
	}
	free(s->pc);
	free(s->run);
	free(s->next_tok);
	free(s->items);
	free(s->item_slot);
	free(s->spec_in);
	free(s->spec_out);
	free(s->spec_u);
	free(s->spec_d);
	free(s->spec_k);
	free(s->item_req);
	free(s->pick_row);
	free(s->pick_cand);
	gram_vocab_free(s->gvocab);
	for (int v = 0; s->gpiece && v < s->vocab; v++)
		free(s->gpiece[v]);
	free(s->gpiece);
	free(s->glen);
	free(s->gallowed);
	free(s);
}

int sched_submit(struct sched *s, struct sched_req *r, char *err, size_t errsz)
{
	if (r->n_prompt <= 0)
		return wk_errf(err, errsz, WK_EINVAL, "the prompt is empty");
	if (r->n_prompt >= s->max_seq)
		return wk_errf(err, errsz, WK_EINVAL,
			       "the prompt is %d tokens; the context holds %d, so a prompt may "
			       "have at most %d (one position for a generated token)", r->n_prompt,
			       s->max_seq, s->max_seq - 1);
	if (sched_pending(s) == 0)
		s->t_mark = wk_now(); /* busy from here: the first slice starts now */
	r->status = SCHED_RUNNING;
	r->seq = -1;
	r->next = NULL;
	if (s->wait_tail)
		s->wait_tail->next = r;
	else
		s->wait_head = r;
	s->wait_tail = r;
	return WK_OK;
}

void sched_cancel(struct sched *s, struct sched_req *r)
{
	(void)s;
	r->cancel = true;
}

int sched_running(const struct sched *s)
{
	int n = 0;
	for (int i = 0; i < s->slots; i++)
		n += s->run[i] != NULL;
	return n;
}

int sched_pending(const struct sched *s)
{
	int n = sched_running(s);
	for (struct sched_req *r = s->wait_head; r; r = r->next)
		n++;
	return n;
}

long sched_steps(const struct sched *s)
{
	return s->steps;
}

int sched_engine_failed(const struct sched *s, const char **why)
{
	if (why)
		*why = s->engine_err;
	return s->engine_rc;
}

double sched_mark(const struct sched *s)
{
	return s->t_mark;
}

/* A finished request waits on the fin list until its slice is accounted (end of the step). */
static void fin_push(struct sched *s, struct sched_req *r)
{
	r->next = NULL;
	if (s->fin_tail)
		s->fin_tail->next = r;
	else
		s->fin_head = r;
	s->fin_tail = r;
}

/* Decodes the output; a stop string cuts the text (and ends the request). */
/* Decodes the n tokens ids (that follow prev[0..n_prev), and before them prompt[0..n_prompt))
 * as they read after what precedes them: up to SCHED_CTX tokens before them are decoded with
 * them and their own text is cut off again. A SentencePiece decoder strips the first piece's
 * leading space, which inside the text is real: after the prompt "Once upon a time" the
 * output is ", there was", and after "there was" it is " a little girl". Falls back to the
 * tokens alone when the context's text is not a prefix (a byte split across the boundary).
 * raw: tok_decode's exact bytes, else tok_decode_utf8's text. */
#define SCHED_CTX 4
/* The context of tokens that follow prev[0..n_prev) (and before them prompt[0..n_prompt)):
 * up to SCHED_CTX tokens before them, into ctx[SCHED_CTX - k..SCHED_CTX); returns k. Tokens
 * the decoder drops are no context: after four <unk> it would strip the leading space of
 * what follows. */
static int context_of(const struct tok *tk, const int *prompt, int n_prompt, const int *prev,
		      int n_prev, int ctx[SCHED_CTX])
{
	int k = 0, i = n_prev - 1;
	for (; i >= 0 && k < SCHED_CTX; i--)
		if (!tok_is_skipped(tk, prev[i]))
			ctx[SCHED_CTX - 1 - k++] = prev[i];
	for (int j = n_prompt - 1; i < 0 && j >= 0 && k < SCHED_CTX; j--)
		if (!tok_is_skipped(tk, prompt[j]))
			ctx[SCHED_CTX - 1 - k++] = prompt[j];
	return k;
}

static int decode_after(const struct tok *tk, const int *prompt, int n_prompt, const int *prev,
			int n_prev, const int *tokens, int n, bool raw, char **t, size_t *len)
{
	int ctx[SCHED_CTX];
	if (n <= 0) { /* no tokens (an EOS first): out may be NULL, and no decoder is needed */
		*t = calloc(1, 1);
		*len = 0;
		return *t ? WK_OK : WK_ENOMEM;
	}
	int (*dec)(const struct tok *, const int *, int, bool, char **, size_t *, char *,
		   size_t) = raw ? tok_decode : tok_decode_utf8;
	int k = context_of(tk, prompt, n_prompt, prev, n_prev, ctx);
	int *ids = malloc((size_t)(k + n + 1) * sizeof *ids);
	char *pre = NULL, *full = NULL;
	size_t plen = 0, flen = 0;
	if (ids && k > 0) {
		memcpy(ids, ctx + SCHED_CTX - k, (size_t)k * sizeof *ids);
		memcpy(ids + k, tokens, (size_t)n * sizeof *ids);
		if (dec(tk, ids, k, true, &pre, &plen, NULL, 0) == WK_OK &&
		    dec(tk, ids, k + n, true, &full, &flen, NULL, 0) == WK_OK && flen >= plen &&
		    !memcmp(full, pre, plen)) {
			memmove(full, full + plen, flen - plen + 1);
			*t = full;
			*len = flen - plen;
			free(pre);
			free(ids);
			return WK_OK;
		}
	}
	free(pre);
	free(full);
	free(ids);
	return dec(tk, tokens, n, true, t, len, NULL, 0);
}

/* out[from..to). */
static int decode_range(struct sched *s, const struct sched_req *r, int from, int to, char **t,
			size_t *len)
{
	return decode_after(s->tok, r->prompt, r->n_prompt, r->out, from,
			    r->out ? r->out + from : NULL, to - from, false, t, len);
}

int sched_token_bytes(const struct sched *s, const struct sched_req *r, int k, int id,
		      char **bytes, size_t *len)
{
	if (!s->tok)
		return WK_EINVAL;
	return decode_after(s->tok, r->prompt, r->n_prompt, r->out, k < r->n_out ? k : r->n_out,
			    &id, 1, true, bytes, len);
}

int sched_prompt_bytes(const struct sched *s, const struct sched_req *r, int k, int id,
		       char **bytes, size_t *len)
{
	if (!s->tok)
		return WK_EINVAL;
	return decode_after(s->tok, r->prompt, k < r->n_prompt ? k : r->n_prompt, NULL, 0, &id,
			    1, true, bytes, len);
}

void sched_logprob_of(struct sched_logprob *o, const float *l, int vocab, int tok, int top)
{
	top = top < 0 ? 0 : top > SCHED_TOP_LOGPROBS_MAX ? SCHED_TOP_LOGPROBS_MAX : top;
	float m = -INFINITY;
	for (int i = 0; i < vocab; i++)
		m = l[i] > m ? l[i] : m;
	double sum = 0;
	int above = 0;
	for (int i = 0; i < vocab; i++) {
		sum += expf(l[i] - m);
		above += l[i] > l[tok];
	}
	double lse = m + log(sum);
	o->lp = (float)(l[tok] - lse);
	o->rank = 1 + above;
	o->n_top = 0;
	for (int i = 0; i < vocab && top; i++) { /* an insertion into the few highest so far */
		if (o->n_top == top && !(l[i] > o->top_lp[top - 1]))
			continue;
		int j = o->n_top < top ? o->n_top++ : top - 1;
		for (; j > 0 && l[i] > o->top_lp[j - 1]; j--) {
			o->top_lp[j] = o->top_lp[j - 1];
			o->top_id[j] = o->top_id[j - 1];
		}
		o->top_lp[j] = l[i];
		o->top_id[j] = i;
	}
	for (int j = 0; j < o->n_top; j++)
		o->top_lp[j] = (float)(o->top_lp[j] - lse);
}

/* out[from..n_out). */
static int decode_from(struct sched *s, const struct sched_req *r, int from, char **t,
		       size_t *len)
{
	return decode_range(s, r, from, r->n_out, t, len);
}

static bool decode_and_stop(struct sched *s, struct sched_req *r)
{
	free(r->text);
	r->text = NULL;
	r->text_len = 0;
	if (!s->tok) {
		r->text = strdup("");
		return false;
	}
	if (decode_from(s, r, 0, &r->text, &r->text_len) != WK_OK) {
		r->text = strdup("");
		r->text_len = 0;
		return false;
	}
	for (int i = 0; i < r->n_stop; i++) {
		/* memmem: the text may hold a NUL byte before the stop string */
		char *hit = memmem(r->text, r->text_len, r->stop[i], strlen(r->stop[i]));
		if (hit) {
			*hit = 0;
			r->text_len = (size_t)(hit - r->text);
			r->stop_hit = i + 1;
			return true;
		}
	}
	return false;
}

/* The start of the run of <0xXX> byte tokens (with the tokens the decoder drops among them:
 * they do not end a run) that ends at out[to), not before out[floor]; *bytes (may be NULL):
 * whether it holds a byte token. */
static int byte_run_start(const struct sched *s, const struct sched_req *r, int to, int floor,
			  bool *bytes)
{
	bool b = false;
	for (; to > floor; to--) {
		int id = r->out[to - 1];
		if (tok_is_byte_fallback(s->tok, id))
			b = true;
		else if (!tok_is_skipped(s->tok, id))
			break;
	}
	if (bytes)
		*bytes = b;
	return to;
}

/* Whether the text before out[from] can no longer change, so that a window may start there:
 * its context does not end in a run of byte tokens (a later byte may turn it into U+FFFD)
 * nor in a UTF-8 sequence cut short (a byte-level token may finish it; the context then
 * decodes apart from the tokens after it). */
static bool settled_at(const struct sched *s, const struct sched_req *r, int from)
{
	int ctx[SCHED_CTX];
	int k = context_of(s->tok, r->prompt, r->n_prompt, r->out, from, ctx);
	if (k == 0)
		return true;
	if (tok_is_byte_fallback(s->tok, ctx[SCHED_CTX - 1]))
		return false;
	char *t = NULL;
	size_t len = 0;
	if (tok_decode_utf8(s->tok, ctx + SCHED_CTX - k, k, true, &t, &len, NULL, 0) != WK_OK)
		return false;
	bool ok = len < 3 || memcmp(t + len - 3, "\xEF\xBF\xBD", 3);
	free(t);
	return ok;
}

/* Whether a stop string has appeared, looking only at the decode of the last tokens (the
 * longest stop string's bytes in tokens, plus slack, each at least one byte; where their text
 * is shorter than that, the whole output), so that a long generation with stop strings costs
 * O(1) a token, not O(output) (each token decoded the whole output again). A hit there is
 * confirmed on the whole output by decode_and_stop, which cuts the text at the first stop. */
static bool stop_seen(struct sched *s, struct sched_req *r)
{
	if (!s->tok)
		return false;
	size_t longest = 0;
	for (int i = 0; i < r->n_stop; i++)
		if (strlen(r->stop[i]) > longest)
			longest = strlen(r->stop[i]);
	int from = r->n_out - (int)longest - 8;
	char *t = NULL;
	size_t len = 0;
	/* (from where the text before them is settled: inside a run of byte tokens their text
	 * depends on the run's first bytes, so from its start) */
	if (from > 0)
		from = byte_run_start(s, r, from, 0, NULL);
	while (from > 0 && !settled_at(s, r, from))
		from--;
	bool hit = false, whole = from <= 0;
	if (!whole && decode_from(s, r, from, &t, &len) == WK_OK && len >= longest + 8) {
		for (int i = 0; i < r->n_stop && !hit; i++)
			hit = memmem(t, len, r->stop[i], strlen(r->stop[i])) != NULL;
	} else {
		whole = true;
	}
	free(t);
	if (!whole && !hit)
		return false;
	if (decode_and_stop(s, r))
		return true;
	free(r->text); /* no stop after all: the text is decoded again at the end */
	r->text = NULL;
	r->text_len = 0;
	return false;
}

/* ---- streaming (on_token) ---- */

/* Bytes at the end of t[0..len) that a stream holds back: trailing U+FFFDs (an incomplete
 * UTF-8 sequence decodes to one until its last byte arrives: they may still become any
 * text), and before them the longest tail that is the start of a stop string. */
static size_t held_back(const struct sched_req *r, const char *t, size_t len)
{
	size_t open = 0;
	while (len - open >= 3 && !memcmp(t + len - open - 3, "\xEF\xBF\xBD", 3))
		open += 3;
	size_t base = len - open, k = open;
	for (int i = 0; i < r->n_stop; i++)
		for (size_t m = strlen(r->stop[i]); m-- > 1;)
			if (m <= base && m + open > k && !memcmp(t + base - m, r->stop[i], m)) {
				k = m + open;
				break;
			}
	return k;
}

/* After a token (with no stop string in the output so far): hands on_token the text that
 * became final. Only a window of the last tokens is decoded, so a long stream costs O(1) per
 * token. The window keeps a few tokens before the new ones so that the decoder treats the
 * new ones as it does in the whole text (a SentencePiece decoder strips the first piece's
 * leading space); its tail that could still become a stop string is held back. The window
 * moves on only to where it decodes as the tail of the text before, so the pieces add up to
 * the whole text exactly. */
static void stream_token(struct sched *s, struct sched_req *r, void *ctx)
{
	char *t = NULL;
	size_t len = 0;
	if (!s->tok || decode_from(s, r, r->win, &t, &len) != WK_OK) {
		r->on_token(ctx, r, "", 0);
		return;
	}
	size_t safe = len - held_back(r, t, len);
	/* A run of <0xXX> tokens at the end decodes as one group (HF's ByteFallback: a group
	 * that is not valid UTF-8 becomes one U+FFFD a byte, so a later byte can turn an earlier
	 * one into U+FFFD): its text waits for the run to end, and so does the text before it
	 * that could begin a stop string. A token the decoder drops (a special one, such as
	 * <unk>) does not end the run. */
	bool bytes;
	int run = byte_run_start(s, r, r->n_out, r->win, &bytes);
	if (bytes) {
		char *t3 = NULL;
		size_t len3 = 0;
		if (decode_range(s, r, r->win, run, &t3, &len3) != WK_OK)
			len3 = 0;
		else /* the run's text may still change: a stop may begin before it */
			len3 -= held_back(r, t3, len3);
		if (len3 < safe)
			safe = len3;
		free(t3);
	}
	size_t n = safe > r->win_sent ? safe - r->win_sent : 0;
	r->on_token(ctx, r, t + r->win_sent, n);
	r->sent += n;
	r->win_sent += n;
	if (r->n_out - r->win >= 16 && r->win_sent == len) {
		char *t2 = NULL;
		size_t len2 = 0;
		int from = r->n_out - 4;
		/* only where the new window's text is the old one's tail, and the text before it
		 * is settled: a window that starts inside a run of byte tokens decodes its first
		 * bytes otherwise, and the stream would part from the whole text */
		if (settled_at(s, r, from) && decode_from(s, r, from, &t2, &len2) == WK_OK &&
		    len2 <= len && !memcmp(t + len - len2, t2, len2)) {
			r->win = from;
			r->win_sent = len2;
		}
		free(t2);
	}
	free(t);
}

/* ---- the prefix cache ---- */

/* Forgets entry i (its sequence stays allocated: the caller's now). */
static void cache_remove(struct sched *s, int i)
{
	free(s->pc[i].tok);
	s->pc[i] = s->pc[--s->n_pc];
}

/* Frees the sequences of the n least recently used entries but the one in sequence keep (-1:
 * none kept); false when none is left to free. */
static bool cache_drop_but(struct sched *s, int n, int keep)
{
	while (n-- > 0) {
		int lru = -1;
		for (int i = 0; i < s->n_pc; i++)
			if (s->pc[i].seq != keep && (lru < 0 || s->pc[i].used < s->pc[lru].used))
				lru = i;
		if (lru < 0)
			return false;
		eng_seq_free(s->e, s->pc[lru].seq);
		cache_remove(s, lru);
		s->pc_stats.evicted++;
	}
	return true;
}

static void cache_drop(struct sched *s, int n)
{
	cache_drop_but(s, n, -1);
}

int sched_set_prefix_wait(struct sched *s, int min_tokens)
{
	if (min_tokens < 0)
		return WK_EINVAL;
	s->pc_wait = min_tokens;
	return WK_OK;
}

int sched_set_prefix_cache(struct sched *s, bool on)
{
	if (on && !s->pc && !(s->pc = calloc((size_t)s->slots, sizeof *s->pc)))
		return WK_ENOMEM;
	s->pc_on = on;
	if (!on)
		cache_drop(s, s->n_pc);
	return WK_OK;
}

void sched_cache_stats(const struct sched *s, struct sched_cache_stats *out)
{
	*out = s->pc_stats;
	out->entries = s->n_pc;
	out->tokens = 0;
	for (int i = 0; i < s->n_pc; i++)
		out->tokens += s->pc[i].n;
}

static int by_use(const void *a, const void *b)
{
	const struct sched_cache_entry *x = a, *y = b;
	return (x->used < y->used) - (x->used > y->used); /* the most recent first */
}

int sched_cache_entries(const struct sched *s, struct sched_cache_entry **out)
{
	*out = NULL;
	if (!s->n_pc)
		return WK_OK;
	if (!(*out = malloc((size_t)s->n_pc * sizeof **out)))
		return WK_ENOMEM;
	for (int i = 0; i < s->n_pc; i++) {
		const struct pcache *c = &s->pc[i];
		(*out)[i] = (struct sched_cache_entry){c->seq, c->n, c->tok, c->key, c->used};
	}
	qsort(*out, (size_t)s->n_pc, sizeof **out, by_use);
	return WK_OK;
}

int sched_cache_add(struct sched *s, int seq, const int *tok, int n, uint64_t key)
{
	if (!s->pc_on || n < 1 || eng_seq_len(s->e, seq) != n)
		return WK_EINVAL;
	if (s->n_pc >= s->slots)
		return WK_ELIMIT;
	int *t = malloc((size_t)n * sizeof *t);
	if (!t)
		return WK_ENOMEM;
	memcpy(t, tok, (size_t)n * sizeof *t);
	long used = s->steps;
	for (int i = 0; i < s->n_pc; i++)
		used = s->pc[i].used <= used ? s->pc[i].used - 1 : used;
	s->pc[s->n_pc++] = (struct pcache){.seq = seq, .tok = t, .n = n, .key = key, .used = used};
	return WK_OK;
}

/* A free sequence, freeing the least recently used entry's where none is left (never the
 * entry in sequence keep, -1 for none). */
static int seq_alloc_but(struct sched *s, int *seq, int keep)
{
	while (eng_seq_alloc(s->e, seq) != WK_OK)
		if (!cache_drop_but(s, 1, keep))
			return WK_ELIMIT;
	return WK_OK;
}

static int seq_alloc(struct sched *s, int *seq)
{
	return seq_alloc_but(s, seq, -1);
}

/* Keeps r's sequence as an entry, with the tokens its cache holds (the prompt, then the
 * output but its last token, which was never run); false when it is not to be kept: the
 * cache is off, the engine failed, nothing is in it, or with the MTP layer a request picked
 * on the host (its items skip the layer, whose cache would then miss those positions). */
static bool cache_keep(struct sched *s, struct sched_req *r)
{
	int len = r->seq >= 0 ? eng_seq_len(s->e, r->seq) : 0;
	if (!s->pc_on || s->engine_rc != WK_OK || len < 1 || len > r->n_prompt + r->n_out ||
	    (s->mtp && r->proc) || s->n_pc >= s->slots)
		return false;
	int *tok = malloc((size_t)len * sizeof *tok);
	if (!tok)
		return false;
	int np = len < r->n_prompt ? len : r->n_prompt;
	memcpy(tok, r->prompt, (size_t)np * sizeof *tok);
	if (len > np) /* (r->out is NULL where nothing was generated: max_tokens 0) */
		memcpy(tok + np, r->out, (size_t)(len - np) * sizeof *tok);
	s->pc[s->n_pc++] = (struct pcache){.seq = r->seq, .tok = tok, .n = len,
					   .key = r->cache_key, .used = s->steps};
	return true;
}

/* Where r's prompt may begin (the prefix cache): the entry, or the running request, of r's
 * cache_key whose cache holds the longest run of tokens that begins r's prompt, at most its
 * n_prompt - 1 (the last token runs: its logits make the first pick). */
struct prefix {
	int len;   /* those tokens */
	int entry; /* the entry that holds them, or -1 */
	int from;  /* else the slot of the running request that does, or -1 */
	int wait;  /* the most a running request still in its prefill will hold once it is in */
};

static void prefix_find(const struct sched *s, const struct sched_req *r, struct prefix *p)
{
	*p = (struct prefix){.entry = -1, .from = -1};
	int most = r->n_prompt - 1;
	for (int i = 0; i < s->n_pc; i++) {
		const struct pcache *c = &s->pc[i];
		if (c->key != r->cache_key)
			continue;
		int l = 0, m = c->n < most ? c->n : most;
		while (l < m && c->tok[l] == r->prompt[l])
			l++;
		if (l > p->len || (l == p->len && p->entry >= 0 && c->used > s->pc[p->entry].used)) {
			p->len = l;
			p->entry = i;
		}
	}
	for (int i = 0; i < s->slots; i++) {
		const struct sched_req *q = s->run[i];
		/* (with the MTP layer, one the host picks for lacks the layer's rows, as in
		 * cache_keep) */
		if (!q || q->cache_key != r->cache_key || q->seq < 0 || (s->mtp && q->proc))
			continue;
		int held = eng_seq_len(s->e, q->seq), l = 0, m = held < most ? held : most;
		while (l < m && ctx_tok(q, l) == r->prompt[l])
			l++;
		if (l > p->len) { /* (an entry of the same length is taken, not copied) */
			p->len = l;
			p->entry = -1;
			p->from = i;
		}
		if (q->pre < q->n_prompt) {
			int w = 0, mw = q->n_prompt < most ? q->n_prompt : most;
			while (w < mw && q->prompt[w] == r->prompt[w])
				w++;
			p->wait = w > p->wait ? w : p->wait;
		}
	}
}

enum { PREFIX_ADMIT, PREFIX_WAIT, PREFIX_FULL };

/* A sequence for r (*seq) and the positions of its prompt already in it (*reused), with the
 * prefix cache on and no prompt logprobs (every prompt row of those must run) from the
 * longest prefix prefix_find sees, SCHED_CACHE_MIN tokens at least:
 *   - an entry that holds nothing past the prefix is taken (no copy: while r runs, others
 *     may copy from it);
 *   - an entry that holds more is copied into a free sequence (eng_seq_copy), so it stays
 *     for others (another entry is evicted for it where none is free; with no other entry,
 *     it is taken and truncated);
 *   - a running request's cache is copied (several choices of one prompt, and requests that
 *     share a system prompt, run it once).
 * PREFIX_WAIT, with no sequence, when a running request still in its prefill will hold a
 * longer prefix, at least half r's prompt and sched_set_prefix_wait's tokens: r waits for it
 * and copies then (its prefill would cost more than the wait). PREFIX_FULL when no sequence
 * is free, none held by an entry either. */
static int prefix_seq(struct sched *s, struct sched_req *r, int *seq, int *reused)
{
	*seq = -1;
	*reused = 0;
	struct prefix p = {.entry = -1, .from = -1};
	bool on = s->pc_on && !r->prompt_logprobs;
	if (on)
		prefix_find(s, r, &p);
	if (p.wait > p.len && p.wait >= SCHED_CACHE_MIN && 2 * p.wait >= r->n_prompt &&
	    s->pc_wait > 0 && p.wait >= s->pc_wait) {
		s->pc_stats.waits++;
		return PREFIX_WAIT;
	}
	if (p.len < SCHED_CACHE_MIN) {
		s->pc_stats.misses += on;
		return seq_alloc(s, seq) == WK_OK ? PREFIX_ADMIT : PREFIX_FULL;
	}
	/* With the MTP layer, one position fewer: its row at the prefix's last position was made
	 * from the token after it, which r's prompt need not share; r makes that row again */
	int use = p.len - s->mtp, from;
	if (p.entry >= 0) {
		from = s->pc[p.entry].seq;
		if (p.len == s->pc[p.entry].n || seq_alloc_but(s, seq, from) != WK_OK) {
			*seq = from;
			cache_remove(s, p.entry);
			if (eng_seq_truncate(s->e, *seq, use) != WK_OK) {
				eng_seq_free(s->e, *seq);
				return seq_alloc(s, seq) == WK_OK ? PREFIX_ADMIT : PREFIX_FULL;
			}
			s->pc_stats.hits++;
			s->pc_stats.hit_tokens += use;
			*reused = use;
			return PREFIX_ADMIT;
		}
		for (int i = 0; i < s->n_pc; i++) /* (evictions moved the entries) */
			if (s->pc[i].seq == from)
				s->pc[i].used = s->steps;
	} else {
		from = s->run[p.from]->seq;
		if (seq_alloc(s, seq) != WK_OK) /* (evicts only entries, never a running one) */
			return PREFIX_FULL;
	}
	char err[WK_ERRSZ];
	if (eng_seq_copy(s->e, *seq, from, use, err, sizeof err) != WK_OK) {
		s->pc_stats.misses++; /* (a fresh sequence: its length is still 0) */
		return PREFIX_ADMIT;
	}
	s->pc_stats.hits++;
	s->pc_stats.copies++;
	s->pc_stats.hit_tokens += use;
	*reused = use;
	return PREFIX_ADMIT;
}

static void finish(struct sched *s, int slot, enum sched_status st, enum sched_finish fin,
		   void (*done)(void *, struct sched_req *), void *ctx)
{
	struct sched_req *r = s->run[slot];
	s->run[slot] = NULL;
	if (!cache_keep(s, r))
		eng_seq_free(s->e, r->seq);
	r->seq = -1;
	r->status = st;
	r->finish = fin;
	r->t_done = wk_now();
	if (!r->text)
		decode_and_stop(s, r);
	if (r->on_token && st == SCHED_DONE && r->text_len > r->sent) {
		r->on_token(ctx, r, r->text + r->sent, r->text_len - r->sent);
		r->sent = r->text_len;
	}
	(void)done;
	fin_push(s, r);
}

static void finish_waiting(struct sched *s, enum sched_status st, bool only_flagged,
			   void (*done)(void *, struct sched_req *), void *ctx, double now)
{
	struct sched_req **pp = &s->wait_head, *prev = NULL;
	while (*pp) {
		struct sched_req *r = *pp;
		bool expired = r->deadline > 0 && now > r->deadline;
		if (!only_flagged || r->cancel || expired) {
			*pp = r->next;
			if (s->wait_tail == r)
				s->wait_tail = prev;
			r->status = only_flagged ? (r->cancel ? SCHED_CANCELLED : SCHED_TIMED_OUT) : st;
			r->t_done = now;
			r->text = strdup("");
			(void)done;
			(void)ctx;
			fin_push(s, r);
		} else {
			prev = r;
			pp = &r->next;
		}
	}
}

static void log_step(struct sched *s, int n, double t)
{
	if (!s->log)
		return;
	fprintf(s->log, "{\"step\": %ld, \"t\": %.6f, \"items\": [", s->steps, t - s->t0);
	for (int i = 0; i < n; i++) {
		struct sched_req *r = s->run[s->item_slot[i]];
		fprintf(s->log, "%s{\"id\": \"%s\", \"phase\": \"%s\", \"tokens\": %d", i ? ", " : "",
			r->id, r->pre < r->n_prompt ? "prefill" : "decode", s->items[i].n);
		if (s->spec_k[s->item_slot[i]])
			fprintf(s->log, ", \"draft\": %d", s->spec_k[s->item_slot[i]]);
		fprintf(s->log, "}");
	}
	fprintf(s->log, "]}\n");
	fflush(s->log);
}

/* ---- speculative decoding (sched_set_speculate) ---- */

/* Token i of the request's prompt followed by its output. */
static int ctx_tok(const struct sched_req *r, int i)
{
	return i < r->n_prompt ? r->prompt[i] : r->out[i - r->n_prompt];
}

static int pred_tok(const struct sched_req *r, int i)
{
	return r->pred[i];
}

static struct sched_ix *ix_new(ix_tok_fn tok, bool first)
{
	struct sched_ix *x = calloc(1, sizeof *x);
	if (x) {
		x->tok = tok;
		x->first = first;
	}
	return x;
}

/* How far past where its last draft came from a prediction is scanned before its index is
 * asked (which knows only each n-gram's first place). */
#define SCHED_PRED_NEAR 256

/* Where the n tokens key begin in the prediction: near where the last draft came from (a
 * prediction is read in order), else their first place; -1 when nowhere (with a token after
 * them). */
static int pred_find(struct sched_req *r, const int *key, int n)
{
	int end = r->pred_at + SCHED_PRED_NEAR;
	for (int p = r->pred_at; p < end && p + n < r->n_pred; p++)
		if (!memcmp(r->pred + p, key, (size_t)n * sizeof *key))
			return p;
	if (!r->pix && !(r->pix = ix_new(pred_tok, true)))
		return -1;
	return ix_find(r->pix, r, key, n, r->n_pred - n - 1);
}

/* The draft, up to max tokens to d; returns how many (0: none). The last n tokens of the
 * prompt and output are looked up first in the request's prediction (n from SCHED_NGRAM_MAX
 * down to 1), then in the prompt and output themselves (n down to SCHED_NGRAM_MIN), the most
 * recent place first; the tokens that followed there are the draft. With mtp, the MTP
 * layer's drafts instead of the prompt and output's. */
static int draft(struct sched_req *r, int *d, int max, bool mtp)
{
	int len = r->n_prompt + r->n_out, key[SCHED_NGRAM_MAX];
	for (int n = SCHED_NGRAM_MAX; r->pred && n >= 1; n--) {
		if (n > len)
			continue;
		for (int m = 0; m < n; m++)
			key[m] = ctx_tok(r, len - n + m);
		int p = pred_find(r, key, n);
		if (p < 0)
			continue;
		int k = 0;
		for (; k < max && p + n + k < r->n_pred; k++)
			d[k] = r->pred[p + n + k];
		r->pred_at = p + n;
		if (k > 0 || !mtp) /* (the MTP layer drafts past the prediction's end) */
			return k;
		break;
	}
	if (mtp) { /* the MTP layer's, from the last step */
		int k = r->mtp_n < max ? r->mtp_n : max;
		memcpy(d, r->mtp_d, (size_t)k * sizeof *d);
		return k;
	}
	if (!r->ix && !(r->ix = ix_new(ctx_tok, false)))
		return 0;
	for (int n = SCHED_NGRAM_MAX; n >= SCHED_NGRAM_MIN; n--) {
		if (n > len)
			continue;
		for (int m = 0; m < n; m++)
			key[m] = ctx_tok(r, len - n + m);
		int p = ix_find(r->ix, r, key, n, len - n - 1);
		if (p < 0)
			continue;
		int k = 0;
		for (; k < max && p + n + k < len; k++)
			d[k] = ctx_tok(r, p + n + k);
		return k;
	}
	return 0;
}

/* A decode item for the request in slot i: its last token, and where it speculates a draft
 * after it (its tokens at spec_in, the argmax of each row to spec_out). */
static void decode_item(struct sched *s, int i, struct eng_item *it)
{
	struct sched_req *r = s->run[i];
	int last = r->out[r->n_out - 1], len = eng_seq_len(s->e, r->seq);
	int max = r->draft_len;
	if (s->mtp && r->mtp_n > max) /* (the MTP layer's drafts were asked for last step) */
		max = r->mtp_n;
	if (max > r->max_tokens - r->n_out - 1)
		max = r->max_tokens - r->n_out - 1;
	if (max > s->max_seq - len - 2)
		max = s->max_seq - len - 2;
	if ((r->logprobs || r->proc) && max > r->lp_cap - 1) /* (its rows' logits buffer) */
		max = r->lp_cap - 1;
	int *in = s->spec_in ? s->spec_in + (size_t)i * (SCHED_DRAFT_MAX + 1) : NULL;
	int k = s->spec && s->spec_now && max > 0 ? draft(r, in + 1, max, s->mtp) : 0;
	s->spec_k[i] = k;
	if (!k) {
		it->tokens = &r->out[r->n_out - 1];
		it->n = 1;
		return;
	}
	in[0] = last;
	it->tokens = in;
	it->n = it->rows = 1 + k;
	it->token = s->spec_out + (size_t)i * (SCHED_DRAFT_MAX + 1);
	if (r->samp.temperature > 0) { /* two draws a row: keep the draft or not, and a pick */
		double *u = s->spec_u + (size_t)i * 2 * (SCHED_DRAFT_MAX + 1);
		for (int j = 0; j < 2 * (1 + k); j++)
			u[j] = samp_draw(r->sampler);
		it->sample.u_rows = u;
	}
}

/* A request's host buffers, at admission: the logits rows of its steps (logprobs or
 * processing), its counts (penalties), its prompt's ids (the repetition penalty). */
/* Structured output's vocabulary, at its first request: each token's bytes as they read after
 * a plain token (so a SentencePiece piece keeps its leading space), as a trie. */
static int gram_vocab_init(struct sched *s)
{
	if (s->gvocab)
		return WK_OK;
	if (!s->tok)
		return WK_EINVAL;
	int *ctx = NULL, n_ctx = 0;
	char *pre = NULL;
	size_t plen = 0;
	s->gpiece = calloc((size_t)s->vocab, sizeof *s->gpiece);
	s->glen = calloc((size_t)s->vocab, sizeof *s->glen);
	s->gallowed = malloc((size_t)s->vocab);
	if (!s->gpiece || !s->glen || !s->gallowed ||
	    tok_encode(s->tok, "a", 1, false, &ctx, &n_ctx, NULL, 0) != WK_OK || n_ctx < 1 ||
	    tok_decode(s->tok, ctx, 1, false, &pre, &plen, NULL, 0) != WK_OK) {
		free(ctx);
		free(pre);
		return WK_ENOMEM;
	}
	for (int v = 0; v < s->vocab; v++) {
		if (tok_is_special(s->tok, v))
			continue;
		int two[2] = {ctx[0], v};
		char *t = NULL;
		size_t n = 0;
		if (tok_decode(s->tok, two, 2, false, &t, &n, NULL, 0) == WK_OK && n >= plen &&
		    !memcmp(t, pre, plen)) {
			memmove(t, t + plen, n - plen + 1);
			n -= plen;
		} else {
			free(t);
			t = NULL;
			if (tok_decode(s->tok, &v, 1, false, &t, &n, NULL, 0) != WK_OK)
				continue;
		}
		s->gpiece[v] = t;
		s->glen[v] = n;
	}
	free(ctx);
	free(pre);
	return gram_vocab_new((const char *const *)s->gpiece, s->glen, s->vocab, &s->gvocab);
}

static int admit_rows(struct sched *s, struct sched_req *r)
{
	bool rep = r->repetition_penalty > 0 && r->repetition_penalty != 1;
	r->proc = r->n_bias > 0 || rep || r->presence_penalty != 0 || r->frequency_penalty != 0 ||
		  r->gram;
	if (r->gram) {
		if (gram_vocab_init(s) != WK_OK) {
			snprintf(r->error, sizeof r->error, "structured output: the tokenizer's "
				 "pieces could not be read");
			return WK_EINVAL;
		}
		gram_start(r->gram, &r->gst);
		r->gram_on = r->gram_after <= 0;
	}
	int rows = 1 + (s->spec > 0 ? s->spec : 0);
	int prows = r->n_prompt < s->prompt_rows ? r->n_prompt : s->prompt_rows;
	r->lp_cap = rows;
	if (r->prompt_logprobs &&
	    (!(r->plp = calloc((size_t)r->n_prompt, sizeof *r->plp)) ||
	     !(r->plp_rows = malloc((size_t)prows * s->vocab * sizeof(float))))) {
		snprintf(r->error, sizeof r->error, "out of memory for the logits of %d prompt "
			 "rows", prows);
		return WK_ENOMEM;
	}
	if ((r->proc || r->prompt_logprobs) && !s->pick_row) {
		s->pick_row = malloc((size_t)s->vocab * sizeof *s->pick_row);
		s->pick_cand = malloc((size_t)s->vocab * sizeof *s->pick_cand);
	}
	if (((r->logprobs || r->proc) &&
	     !(r->lp_rows = malloc((size_t)rows * s->vocab * sizeof(float)))) ||
	    ((r->proc || r->prompt_logprobs) && (!s->pick_row || !s->pick_cand)) ||
	    ((rep || r->presence_penalty != 0 || r->frequency_penalty != 0) &&
	     !(r->counts = calloc((size_t)s->vocab, sizeof *r->counts))) ||
	    (rep && !(r->in_prompt = calloc((size_t)s->vocab, 1)))) {
		snprintf(r->error, sizeof r->error, "out of memory for the logits of %d rows", rows);
		return WK_ENOMEM;
	}
	for (int k = 0; r->in_prompt && k < r->n_prompt; k++)
		if (r->prompt[k] >= 0 && r->prompt[k] < s->vocab)
			r->in_prompt[r->prompt[k]] = 1;
	return WK_OK;
}

/* A logits row x [vocab] processed for request r: its bias, its repetition penalty, its
 * frequency and presence penalties (sched_req's rule), with r->counts as they stand; with a
 * grammar, -inf for each token that cannot continue gst (a stop id where it may end).
 * Returns false when no token can. */
static bool process_row(struct sched *s, const struct sched_req *r, float *x,
			const struct gram_state *gst, bool gram_on)
{
	for (int b = 0; b < r->n_bias; b++)
		x[r->bias_id[b]] += r->bias[b];
	float p = r->repetition_penalty;
	if (r->in_prompt)
		for (int v = 0; v < s->vocab; v++)
			if (r->in_prompt[v] || r->counts[v])
				x[v] = x[v] > 0 ? x[v] / p : x[v] * p;
	if (r->counts && (r->frequency_penalty != 0 || r->presence_penalty != 0))
		for (int v = 0; v < s->vocab; v++)
			if (r->counts[v])
				x[v] -= r->counts[v] * r->frequency_penalty + r->presence_penalty;
	if (!r->gram || !gram_on)
		return true;
	int n = gram_allowed(r->gram, s->gvocab, gst, s->gallowed);
	if (gram_complete(r->gram, gst))
		for (int k = 0; k < s->stops.n_stop; k++)
			if (s->stops.stop[k] >= 0 && s->stops.stop[k] < s->vocab)
				n += !s->gallowed[s->stops.stop[k]]++;
	for (int v = 0; v < s->vocab; v++)
		if (!s->gallowed[v])
			x[v] = -INFINITY;
	return n > 0;
}

/* The token after each of the item's rows, picked on the host from its processed logits
 * with the draws the engine would have used (eng_item.sample): into next_tok, or with
 * drafts into spec_out as far as the drafts are kept (the row after a draft sees it in the
 * counts). */
static void host_pick(struct sched *s, int i, const struct eng_item *it)
{
	struct sched_req *r = s->run[i];
	int d = s->spec_k[i], w = SCHED_DRAFT_MAX + 1;
	const int *in = d ? s->spec_in + (size_t)i * w + 1 : NULL;
	int *g = d ? s->spec_out + (size_t)i * w : &s->next_tok[i], j = 0;
	struct gram_state gst = r->gst; /* (advanced through the drafts kept in this step) */
	bool on = r->gram_on;
	for (; j <= d; j++) {
		memcpy(s->pick_row, r->lp_rows + (size_t)j * s->vocab, s->vocab * sizeof(float));
		if (!process_row(s, r, s->pick_row, &gst, on))
			r->gram_dead = true;
		if (r->samp.temperature <= 0)
			g[j] = samp_argmax(s->pick_row, s->vocab);
		else if (j < d) /* a draft follows: kept or not, samp_pick_draft's rule */
			g[j] = samp_pick_draft(s->pick_row, s->vocab, &r->samp, in[j],
					       it->sample.u_rows[2 * j], it->sample.u_rows[2 * j + 1],
					       s->pick_cand);
		else
			g[j] = samp_pick(s->pick_row, s->vocab, &r->samp,
					 d ? it->sample.u_rows[2 * j + 1] : it->sample.u,
					 s->pick_cand);
		if (j == d || g[j] != in[j])
			break;
		if (r->counts)
			r->counts[in[j]]++; /* (the rows after it see it; undone below) */
		if (r->gram && on && s->gpiece[in[j]])
			gram_feed(r->gram, &gst, s->gpiece[in[j]], s->glen[in[j]]);
		else if (r->gram && in[j] == r->gram_after - 1)
			on = true;
	}
	for (int k = 0; k < j && k < d && r->counts; k++)
		r->counts[in[k]]--;
}

/* Appends token next to the request in slot i, as after a decode step that left len tokens
 * in its cache; finishes it on a stop id, a stop string, max_tokens or the context's end.
 * Returns whether it finished. */
static bool take(struct sched *s, int i, int next, int len, const float *row,
		 void (*done)(void *ctx, struct sched_req *r), void *ctx)
{
	struct sched_req *r = s->run[i];
	if (eng_is_stop(&s->stops, next)) { /* as wick generate stops */
		finish(s, i, SCHED_DONE, SCHED_FIN_STOP, done, ctx);
		return true;
	}
	if (r->n_out == r->cap_out) {
		int cap = r->cap_out ? 2 * r->cap_out : 64;
		int *o = realloc(r->out, (size_t)cap * sizeof *o);
		if (o)
			r->out = o;
		struct sched_logprob *lp = o && r->logprobs
						   ? realloc(r->lp, (size_t)cap * sizeof *lp) : NULL;
		if (lp)
			r->lp = lp;
		if (!o || (r->logprobs && !lp)) {
			snprintf(r->error, sizeof r->error, "out of memory");
			finish(s, i, SCHED_FAILED, SCHED_FIN_NONE, done, ctx);
			return true;
		}
		r->cap_out = cap;
	}
	if (r->logprobs && row)
		sched_logprob_of(&r->lp[r->n_out], row, s->vocab, next, r->top_logprobs);
	if (r->counts)
		r->counts[next]++;
	r->out[r->n_out++] = next;
	if (r->n_stop && stop_seen(s, r)) {
		finish(s, i, SCHED_DONE, SCHED_FIN_STOP, done, ctx);
		return true;
	}
	if (r->gram && !r->gram_on) {
		r->gram_on = next == r->gram_after - 1; /* (the reasoning's end: free text before) */
	} else if (r->gram && (r->gram_dead || !s->gpiece[next] ||
			       !gram_feed(r->gram, &r->gst, s->gpiece[next], s->glen[next]))) {
		r->gram_dead = true; /* (the request's schema, not the engine: invalid_input) */
		snprintf(r->error, sizeof r->error, "structured output: no token could continue "
			 "the document (at %d tokens)", r->n_out);
		finish(s, i, SCHED_FAILED, SCHED_FIN_NONE, done, ctx);
		return true;
	}
	if (r->gram && r->gst.done) { /* the document is whole: nothing may follow */
		if (r->on_token)
			stream_token(s, r, ctx);
		finish(s, i, SCHED_DONE, SCHED_FIN_STOP, done, ctx);
		return true;
	}
	if (r->on_token)
		stream_token(s, r, ctx);
	if (r->n_out >= r->max_tokens || len + 1 >= s->max_seq) {
		finish(s, i, SCHED_DONE, SCHED_FIN_LENGTH, done, ctx);
		return true;
	}
	return false;
}

/* After a step that ran the item it of the prompt of the request in slot i: its prompt
 * logprobs, and where its prompt is all in, its first token picked from the last row when
 * the host picks (into next_tok, or lp_rows' first row for host_pick). Returns whether a
 * token is to be taken now (false: more of the prompt to come, or max_tokens 0 and the
 * request finished). */
static bool prompt_done(struct sched *s, int i, const struct eng_item *it,
			void (*done)(void *ctx, struct sched_req *r), void *ctx)
{
	struct sched_req *r = s->run[i];
	size_t V = (size_t)s->vocab;
	for (int j = 0; r->plp_rows && j < it->n && r->pre + j + 1 < r->n_prompt; j++)
		sched_logprob_of(&r->plp[r->pre + j + 1], r->plp_rows + j * V, s->vocab,
				 r->prompt[r->pre + j + 1], r->prompt_top);
	r->pre += it->n;
	if (r->pre < r->n_prompt)
		return false;
	if (r->max_tokens <= 0) {
		finish(s, i, SCHED_DONE, SCHED_FIN_LENGTH, done, ctx);
		return false;
	}
	if (!r->plp_rows)
		return true;
	const float *last = r->plp_rows + (size_t)(it->n - 1) * V;
	if (r->lp_rows) /* (its logprob, or host_pick's row) */
		memcpy(r->lp_rows, last, V * sizeof *last);
	if (!r->proc)
		s->next_tok[i] = r->samp.temperature <= 0
					 ? samp_argmax(last, s->vocab)
					 : samp_pick(last, s->vocab, &r->samp, it->sample.u, s->pick_cand);
	free(r->plp_rows);
	r->plp_rows = NULL;
	return true;
}

/* One step without the accounting: finished requests go to the fin list. */
static int step_run(struct sched *s, void (*done)(void *ctx, struct sched_req *r), void *ctx,
		    int *n_items)
{
	double now = wk_now();
	*n_items = 0;
	/* Cancels and deadlines first: they free their slots for this very step. */
	finish_waiting(s, SCHED_CANCELLED, true, done, ctx, now);
	for (int i = 0; i < s->slots; i++) {
		struct sched_req *r = s->run[i];
		if (r && r->cancel)
			finish(s, i, SCHED_CANCELLED, SCHED_FIN_NONE, done, ctx);
		else if (r && r->deadline > 0 && now > r->deadline)
			finish(s, i, SCHED_TIMED_OUT, SCHED_FIN_NONE, done, ctx);
	}
	/* Admit waiting requests into free slots, in order. One that waits for a running
	 * request's prefill (prefix_seq) keeps its place and holds a slot for when it is in. */
	int free_slots = 0, held = 0, slot = 0;
	for (int i = 0; i < s->slots; i++)
		free_slots += !s->run[i];
	struct sched_req **link = &s->wait_head, *prev = NULL;
	while (*link && free_slots > held) {
		struct sched_req *r = *link;
		int seq, reused, how = prefix_seq(s, r, &seq, &reused);
		if (how == PREFIX_FULL)
			break;
		if (how == PREFIX_WAIT) {
			held++;
			prev = r;
			link = &r->next;
			continue;
		}
		r->sampler = samp_create(s->vocab, &r->samp);
		if (!r->sampler) {
			eng_seq_free(s->e, seq);
			break;
		}
		*link = r->next;
		if (s->wait_tail == r)
			s->wait_tail = prev;
		r->next = NULL;
		r->seq = seq;
		r->pre = r->cached = reused; /* (those positions are in its cache already) */
		r->t_admit = now;
		while (s->run[slot])
			slot++;
		s->run[slot] = r;
		free_slots--;
		if (admit_rows(s, r) != WK_OK) {
			finish(s, slot, SCHED_FAILED, SCHED_FIN_NONE, done, ctx);
			free_slots++;
		}
	}
	int n = 0, running = 0;
	for (int i = 0; i < s->slots; i++)
		running += s->run[i] != NULL;
	s->spec_now = !s->spec_max_batch || running <= s->spec_max_batch;
	bool decoding = true; /* every item a decode: a step the cost is measured from */
	for (int i = 0; i < s->slots; i++) {
		struct sched_req *r = s->run[i];
		if (!r)
			continue;
		struct eng_item *it = &s->items[n];
		it->seq = r->seq;
		/* the engine picks the token where the logits are (a GPU returns the argmax, or
		 * the few candidates a sampled pick needs), with the request's own draw:
		 * samp_next's token, and its RNG advanced as samp_next advances it */
		bool greedy = r->samp.temperature <= 0;
		it->logits = NULL;
		it->token = &s->next_tok[i];
		it->rows = 0;
		it->drafts = 0;
		s->spec_k[i] = 0;
		it->sample = (struct eng_sample){r->samp.temperature, r->samp.top_p, r->samp.top_k,
						 0, NULL};
		it->mtp_cache = false;
		r->draft_len = s->spec && s->spec_now ? plan_drafts(s, r) : 0;
		bool pre = r->pre < r->n_prompt, first = true; /* the step gives it a token */
		if (pre) { /* its prompt (a chunk of it, with prompt logprobs) */
			it->tokens = r->prompt + r->pre;
			it->n = r->n_prompt - r->pre;
			if (r->plp_rows && it->n > s->prompt_rows)
				it->n = s->prompt_rows;
			first = r->pre + it->n == r->n_prompt;
			decoding = false;
		} else {
			decode_item(s, i, it);
		}
		/* (a speculating one has its draws in u_rows; a chunk before the prompt's last
		 * makes no pick) */
		if (!greedy && !it->sample.u_rows && first)
			it->sample.u = samp_draw(r->sampler);
		if (r->logprobs || r->proc) /* each row's logits come to the host (<= lp_cap) */
			it->logits = r->lp_rows;
		if (s->mtp) { /* the drafts for its next step, after this step's token */
			it->drafts = r->draft_len;
			it->mtp_cache = true; /* (none: its caches keep up all the same) */
			it->draft = s->spec_d + (size_t)i * SCHED_DRAFT_MAX;
			r->mtp_n = 0;
		}
		if (r->proc) { /* the host picks: no token from the engine, so no MTP drafts */
			it->token = NULL;
			it->drafts = 0;
			it->mtp_cache = false;
		}
		if (pre && r->plp_rows) { /* every row's logits, and the host picks */
			it->logits = r->plp_rows;
			it->rows = it->n;
			it->token = NULL;
			it->drafts = 0;
		}
		s->item_req[n] = r;
		s->item_slot[n++] = i;
	}
	*n_items = n;
	if (n == 0)
		return WK_OK;

	char err[WK_ERRSZ];
	log_step(s, n, now);
	int rc = eng_step(s->e, s->items, n, err, sizeof err);
	s->steps++;
	if (rc != WK_OK) {
		s->engine_rc = rc;
		snprintf(s->engine_err, sizeof s->engine_err, "%s", err);
		for (int i = 0; i < s->slots; i++)
			if (s->run[i]) {
				snprintf(s->run[i]->error, sizeof s->run[i]->error, "%s", err);
				finish(s, i, SCHED_FAILED, SCHED_FIN_NONE, done, ctx);
			}
		finish_waiting(s, SCHED_FAILED, false, done, ctx, wk_now());
		cache_drop(s, s->n_pc); /* what the engine holds is not to be trusted */
		return rc;
	}
	double t = wk_now();
	int work = 0, most = 0; /* the step's draft work: its drafts, and the MTP layer's passes */
	for (int k = 0; k < n; k++) {
		work += s->spec_k[s->item_slot[k]];
		most = s->items[k].drafts > most ? s->items[k].drafts : most;
	}
	for (int k = 0; k < n; k++) {
		int i = s->item_slot[k];
		struct sched_req *r = s->run[i];
		r->steps++;
		if (r->n_out == 0)
			r->t_first = t;
		if (r->pre < r->n_prompt && !prompt_done(s, i, &s->items[k], done, ctx))
			continue;
		if (r->proc)
			host_pick(s, i, &s->items[k]);
		for (int j = 0; j < s->items[k].drafts && s->items[k].draft[j] >= 0; j++)
			r->mtp_d[r->mtp_n++] = s->items[k].draft[j];
		int d = s->spec_k[i], len = eng_seq_len(s->e, r->seq);
		if (!d) {
			take(s, i, s->next_tok[i], len, r->lp_rows, done, ctx);
			continue;
		}
		/* the drafts that equal the argmax before them are kept, and the argmax after the
		 * last kept one; the cache forgets the rest */
		const int *in = s->spec_in + (size_t)i * (SCHED_DRAFT_MAX + 1) + 1;
		const int *g = s->spec_out + (size_t)i * (SCHED_DRAFT_MAX + 1);
		int a = 0;
		while (a < d && in[a] == g[a])
			a++;
		r->drafted += d;
		r->accepted += a;
		drafts_kept(s, r, d, a);
		len -= d - a;
		eng_seq_truncate(s->e, r->seq, len);
		for (int j = 0; j <= a; j++)
			if (take(s, i, g[j], len - a + j,
				 r->lp_rows ? r->lp_rows + (size_t)j * s->vocab : NULL, done, ctx))
				break;
	}
	/* the step's seconds an item, from admission to its tokens taken (what a step costs the
	 * caller, more than the engine's part where the model is small), against its draft work
	 * an item */
	if (decoding && s->spec)
		sched_cost_add(&s->cost, (double)(work + most) / n, (wk_now() - now) / n);
	return WK_OK;
}

/* Accounting: the busy time since the last slice ended (s->t_mark: the first submit when
 * the scheduler was empty, else the end of the previous call) up to now is this call's
 * slice. It is split over the step's items in proportion to the tokens each ran (a prefill
 * counts its prompt tokens, a decode 1); a call that ran no item splits it equally over the
 * requests it finished (cancels, deadlines); a call that did neither leaves the slice open
 * for the next one. So the slices tile the busy time and the requests' gpu_seconds sum to it:
 * the gaps between steps (admission, sampling, storing results) are charged to the step
 * that follows them. */
static void account(struct sched *s, int n_items, double t)
{
	double slice = t - s->t_mark;
	if (slice < 0)
		slice = 0;
	if (n_items > 0) {
		long total = 0;
		for (int k = 0; k < n_items; k++)
			total += s->items[k].n;
		for (int k = 0; k < n_items; k++)
			s->item_req[k]->gpu_seconds += slice * s->items[k].n / (double)total;
		s->t_mark = t;
	} else if (s->fin_head) {
		int m = 0;
		for (struct sched_req *r = s->fin_head; r; r = r->next)
			m++;
		for (struct sched_req *r = s->fin_head; r; r = r->next)
			r->gpu_seconds += slice / m;
		s->t_mark = t;
	}
}

int sched_step(struct sched *s, void (*done)(void *ctx, struct sched_req *r), void *ctx)
{
	int n_items = 0;
	int rc = step_run(s, done, ctx, &n_items);
	account(s, n_items, wk_now());
	while (s->fin_head) {
		struct sched_req *r = s->fin_head;
		s->fin_head = r->next;
		if (!s->fin_head)
			s->fin_tail = NULL;
		r->next = NULL;
		done(ctx, r);
	}
	return rc == WK_OK ? sched_pending(s) : rc;
}
