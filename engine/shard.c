/*
 * shard.c - the sharded engine: a model split over `world` ranks (tensor and expert
 * parallelism), each rank an engine of its own run by one thread, joined by the collectives
 * of comm.h. The snapshot decides what each rank holds (layout.c); the families (llama.c,
 * glm*.c) compute their shard and call the collectives below where the split needs them.
 *
 * Shape of a run. eng_open restores the snapshot once (every rank file streams in parallel,
 * snapshot_read.c), then makes one rank engine per rank: its own backend (CPU: threads / world
 * pool threads each; CUDA: GPU r), its own shard of the model bound from rank file r only, its
 * own KV caches. eng_forward / eng_step hand the same tokens to every rank thread at once (the
 * caller's thread is rank 0); the scheduler and the sampler run once, outside, on the logits
 * that rank 0 returns. On the CPU the collectives are comm_cpu (deterministic), on GPUs
 * comm_nccl.
 *
 * What every rank computes (activations are replicated: every rank sees every token):
 *   embedding    vocab-parallel: rows of its vocabulary range, zeros elsewhere; all_reduce
 *   attention    its heads; the o_proj shard's partial sums are all_reduce'd (row-parallel)
 *   dense MLP    its slice of intermediate_size (gate/up rows, down columns); all_reduce
 *   MoE          the router on every rank (replicated, identical choices); each rank runs
 *                only its own experts on the tokens routed to them, adds the shared
 *                expert's TP partial, and one all_reduce combines everything
 *   lm_head      vocab-parallel rows; all_gather; rank 0 lays the slices out as [n][vocab]
 *
 * Why all_reduce for expert combine, and no all-to-all dispatch: with TP attention every rank
 * already holds every token's hidden state after the o_proj all_reduce, so dispatch needs no
 * communication at all (each rank picks its experts' tokens out of the replicated router
 * output), and the combine rides on the all_reduce the TP shared expert needs anyway: one
 * collective per MoE layer, exact, deterministic. All-to-all dispatch (all_to_allv in comm.h)
 * pays when tokens are partitioned over the ranks (data-parallel attention), where it sends
 * each token only to the ranks of its top-k experts instead of replicating it; that is the
 * GPU path's next step, not needed for correctness here.
 *
 * When tp (or ep) is less than world, several ranks hold the same TP shard (or experts): they
 * compute it too, but only the first copy (the lead, rank < tp) adds it into the reductions.
 *
 * Failures: a rank that fails on its own (out of memory growing scratch) would leave the
 * others waiting in the next collective, so the families call eng_agree after those steps;
 * then every rank stops and the top reports the rank that failed first-hand.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/engine_int.h"

/* ---- layout arithmetic (also used by the families' plan()) -------------------------------- */

int shard_heads(int heads, int kv, int tp, int k, struct shard_heads *out, char *err,
		size_t errsz)
{
	if (heads % tp != 0)
		return wk_errf(err, errsz, WK_EINVAL,
			       "num_attention_heads %d does not split over tp %d", heads, tp);
	out->nq = heads / tp;
	out->q0 = k * out->nq;
	if (kv % tp == 0) {
		out->nkv = kv / tp;
		out->kv0 = k * out->nkv;
	} else if (tp % kv == 0) {
		out->nkv = 1;
		out->kv0 = k * kv / tp;
	} else {
		return wk_errf(err, errsz, WK_EINVAL,
			       "num_key_value_heads %d and tp %d: one must divide the other", kv, tp);
	}
	return WK_OK;
}

int shard_even(long long n, int parts, int k, const char *what, const char *over, int *lo,
	       int *hi, char *err, size_t errsz)
{
	if (n % parts != 0)
		return wk_errf(err, errsz, WK_EINVAL, "%s %lld does not split evenly over %s %d",
			       what, n, over, parts);
	*lo = (int)(n / parts * k);
	*hi = (int)(n / parts * (k + 1));
	return WK_OK;
}

/* ---- collectives for the families ----------------------------------------------------------- */

static void keep(struct engine *e, int rc)
{
	if (rc != WK_OK && e->comm_rc == WK_OK)
		e->comm_rc = rc; /* the message is in e->comm_err already */
}

void eng_all_reduce(struct engine *e, float *buf, size_t n)
{
	char err[WK_ERRSZ];
	if (e->world == 1)
		return;
	eng_chain_flush(e);
	e->n_collectives++;
	int rc = e->comm->all_reduce(e->comm_ctx, e->rank, buf, n, err, sizeof err);
	if (rc != WK_OK && e->comm_rc == WK_OK)
		snprintf(e->comm_err, sizeof e->comm_err, "%s", err);
	keep(e, rc);
}

int eng_agree(struct engine *e, int rc, char *err, size_t errsz)
{
	if (e->world == 1)
		return rc;
	int all = 0;
	char cerr[WK_ERRSZ];
	e->n_collectives++;
	int vrc = e->comm->vote(e->comm_ctx, e->rank, rc == WK_OK, &all, cerr, sizeof cerr);
	if (vrc != WK_OK) {
		if (e->comm_rc == WK_OK)
			snprintf(e->comm_err, sizeof e->comm_err, "%s", cerr);
		keep(e, vrc);
		return rc != WK_OK ? rc : wk_errf(err, errsz, vrc, "%s", cerr);
	}
	if (all)
		return WK_OK;
	if (rc != WK_OK)
		return rc;
	e->failed_elsewhere = true;
	return wk_errf(err, errsz, WK_EINVAL, "rank %d stopped because another rank failed",
		       e->rank);
}

void eng_embed(struct engine *e, float *x, float *xh, const int *tokens, int n,
	       const struct st_tensor *embed, int vocab0, int dim)
{
	eng_chain_flush(e);
	size_t esz = dt_size(embed->dtype);
	int lv = (int)embed->shape[0];
	bool lead = eng_tp_lead(e);
	float *h = xh ? xh : x;
	for (int i = 0; i < n; i++) {
		int t = tokens[i] - vocab0;
		float *row = h + (size_t)i * dim;
		if (lead && t >= 0 && t < lv)
			dt_to_f32(row, (const char *)embed->data + (size_t)t * dim * esz,
				  embed->dtype, (size_t)dim);
		else
			memset(row, 0, (size_t)dim * sizeof *row);
	}
	eng_to_dev(e, x, h, (size_t)n * dim * sizeof *x);
	eng_all_reduce(e, x, (size_t)n * dim);
}

void eng_gather_vocab(struct engine *e, float *out, bool out_host, const float *local,
		      int rows, int lv, float *gbuf)
{
	eng_chain_flush(e);
	size_t blk = (size_t)rows * lv;
	bool host = eng_host_mem(e);
	if (e->world == 1) {
		if (out && out != local) {
			if (out_host)
				eng_to_host(e, out, local, blk * sizeof *out);
			else
				eng_dcopy(e, out, local, blk * sizeof *out);
		}
		return;
	}
	char err[WK_ERRSZ];
	e->n_collectives++;
	int rc = e->comm->all_gather(e->comm_ctx, e->rank, local, gbuf, blk * sizeof *local, err,
				     sizeof err);
	if (rc != WK_OK && e->comm_rc == WK_OK)
		snprintf(e->comm_err, sizeof e->comm_err, "%s", err);
	keep(e, rc);
	if (!out || rc != WK_OK)
		return;
	/* ranks 0..tp-1 hold the vocabulary slices in order; later ranks repeat them */
	size_t V = (size_t)lv * e->tp;
	const float *g = gbuf;
	float *stage = NULL;
	if (!host && out_host) { /* one copy of the slices to the host, laid out there */
		stage = malloc(blk * e->tp * sizeof *stage);
		if (!stage) {
			if (e->comm_rc == WK_OK) {
				e->comm_rc = WK_ENOMEM;
				snprintf(e->comm_err, sizeof e->comm_err,
					 "out of memory for %zu gathered logits", blk * e->tp);
			}
			return;
		}
		eng_to_host(e, stage, gbuf, blk * e->tp * sizeof *stage);
		g = stage;
	}
	if (host || out_host) {
		for (int i = 0; i < rows; i++)
			for (int k = 0; k < e->tp; k++)
				memcpy(out + (size_t)i * V + (size_t)k * lv,
				       g + (size_t)k * blk + (size_t)i * lv, (size_t)lv * sizeof *out);
		free(stage);
		return;
	}
	/* in device memory: one row's slices are already in order, [tp][1][lv] = [1][V]; else
	 * rank k's rows go to column block k of out, one 2-D copy each */
	if (rows == 1) {
		eng_dcopy(e, out, gbuf, V * sizeof *out);
		return;
	}
	for (int k = 0; k < e->tp; k++)
		eng_dcopy_2d(e, out + (size_t)k * lv, V * sizeof *out, gbuf + (size_t)k * blk,
			     (size_t)lv * sizeof *out, (size_t)lv * sizeof *out, (size_t)rows);
}

/* ---- rank engines and their threads ---------------------------------------------------------- */

struct shard {
	int world;
	struct engine *r[COMM_MAX_WORLD];
	const struct comm_ops *comm;
	void *comm_ctx;
	pthread_t th[COMM_MAX_WORLD];
	int started; /* threads running: ranks 1..started */
	bool sync_ok;
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	unsigned gen;
	int pending;
	bool quit;
	/* the job: one call of the family on every rank */
	int (*job)(struct shard *sh, int rank, char *err, size_t errsz);
	const int *tokens;
	int n, pos0;
	float *logits;
	bool all;
	const struct eng_item *items;
	int dst, src; /* job_copy: n positions */
	char *host;   /* job_io: the bytes (eng_caches_io); save or load */
	bool save;
	struct eng_item *ritems[COMM_MAX_WORLD]; /* per rank: items with its own logits */
	int rc[COMM_MAX_WORLD];
	char err[COMM_MAX_WORLD][WK_ERRSZ];
};

static int job_step(struct shard *sh, int r, char *err, size_t errsz);

struct engine *shard_rank(struct engine *e, int rank)
{
	return e->shard && rank >= 0 && rank < e->shard->world ? e->shard->r[rank] : NULL;
}

const struct eng_item *shard_items(const struct engine *e)
{
	return e->top && e->top->shard && e->top->shard->job == job_step ? e->top->shard->items
									 : NULL;
}

/* Runs the job on rank r and folds in a collective that failed during it. */
static void run_rank(struct shard *sh, int r)
{
	struct engine *re = sh->r[r];
	re->failed_elsewhere = false;
	if (re->be->attach)
		re->be->attach(re->bctx);
	int rc = sh->job(sh, r, sh->err[r], sizeof sh->err[r]);
	if (rc == WK_OK && re->comm_rc != WK_OK) {
		rc = re->comm_rc;
		snprintf(sh->err[r], sizeof sh->err[r], "%s", re->comm_err);
	}
	sh->rc[r] = rc;
}

struct worker_arg {
	struct shard *sh;
	int rank;
};

static void *worker_main(void *arg)
{
	struct worker_arg wa = *(struct worker_arg *)arg;
	free(arg);
	struct shard *sh = wa.sh;
	unsigned seen = 0;
	for (;;) {
		pthread_mutex_lock(&sh->mu);
		while (sh->gen == seen && !sh->quit)
			pthread_cond_wait(&sh->go, &sh->mu);
		if (sh->quit) {
			pthread_mutex_unlock(&sh->mu);
			return NULL;
		}
		seen = sh->gen;
		pthread_mutex_unlock(&sh->mu);
		run_rank(sh, wa.rank);
		pthread_mutex_lock(&sh->mu);
		if (--sh->pending == 0)
			pthread_cond_signal(&sh->done);
		pthread_mutex_unlock(&sh->mu);
	}
}

/* Runs sh->job on every rank at once (rank 0 on this thread) and returns the error of the
 * rank that failed first-hand, if any. */
static int dispatch(struct shard *sh, char *err, size_t errsz)
{
	pthread_mutex_lock(&sh->mu);
	sh->pending = sh->world - 1;
	sh->gen++;
	pthread_cond_broadcast(&sh->go);
	pthread_mutex_unlock(&sh->mu);
	run_rank(sh, 0);
	pthread_mutex_lock(&sh->mu);
	while (sh->pending > 0)
		pthread_cond_wait(&sh->done, &sh->mu);
	pthread_mutex_unlock(&sh->mu);
	int pick = -1;
	for (int r = 0; r < sh->world; r++)
		if (sh->rc[r] != WK_OK && (pick < 0 || (sh->r[pick]->failed_elsewhere &&
							!sh->r[r]->failed_elsewhere)))
			pick = r;
	if (pick < 0)
		return WK_OK;
	return wk_errf(err, errsz, sh->rc[pick], "rank %d of %d: %s", pick, sh->world,
		       sh->err[pick]);
}

static int job_forward(struct shard *sh, int r, char *err, size_t errsz)
{
	struct engine *re = sh->r[r];
	return re->fam->forward(re, sh->tokens, sh->n, sh->pos0, r == 0 ? sh->logits : NULL,
				sh->all, err, errsz);
}

static int job_step(struct shard *sh, int r, char *err, size_t errsz)
{
	struct engine *re = sh->r[r];
	struct eng_item *it = sh->ritems[r];
	for (int i = 0; i < sh->n; i++) {
		it[i] = sh->items[i];
		if (r != 0) {
			it[i].logits = NULL;
			it[i].token = NULL;
		}
	}
	if (re->fam->step)
		return re->fam->step(re, it, sh->n, err, errsz);
	return re->fam->forward(re, it[0].tokens, it[0].n, re->seq_len[it[0].seq], it[0].logits,
				false, err, errsz);
}

int shard_forward(struct engine *e, const int *tokens, int n, int pos0, float *logits,
		  bool all, char *err, size_t errsz)
{
	struct shard *sh = e->shard;
	sh->job = job_forward;
	sh->tokens = tokens;
	sh->n = n;
	sh->pos0 = pos0;
	sh->logits = logits;
	sh->all = all;
	return dispatch(sh, err, errsz);
}

int shard_step(struct engine *e, const struct eng_item *items, int n, char *err,
	       size_t errsz)
{
	struct shard *sh = e->shard;
	sh->job = job_step;
	sh->items = items;
	sh->n = n;
	return dispatch(sh, err, errsz);
}

static int job_copy(struct shard *sh, int r, char *err, size_t errsz)
{
	(void)err;
	(void)errsz;
	struct engine *re = sh->r[r];
	eng_caches_copy(re, sh->dst, sh->src, sh->n);
	return WK_OK;
}

static int job_io(struct shard *sh, int r, char *err, size_t errsz)
{
	struct engine *re = sh->r[r];
	eng_caches_io(re, sh->dst, sh->n, sh->host, sh->save);
	return eng_sync(re, err, errsz);
}

size_t shard_seq_bytes(struct engine *e, int len)
{
	return eng_caches_bytes(e->shard->r[0], len);
}

int shard_seq_io(struct engine *e, int seq, int len, void *host, bool save, char *err,
		 size_t errsz)
{
	struct shard *sh = e->shard;
	sh->job = job_io;
	sh->dst = seq;
	sh->n = len;
	sh->host = host;
	sh->save = save;
	return dispatch(sh, err, errsz);
}

int shard_seq_copy(struct engine *e, int dst, int src, int len, char *err, size_t errsz)
{
	struct shard *sh = e->shard;
	sh->job = job_copy;
	sh->dst = dst;
	sh->src = src;
	sh->n = len;
	return dispatch(sh, err, errsz);
}

/* A rank's model and scratch; its backend stays (rank_close), since a snapshot restored
 * into the devices' memory is released through the ranks' contexts after this. */
static void rank_free(struct engine *re)
{
	if (!re)
		return;
	if (re->be && re->be->attach)
		re->be->attach(re->bctx);
	if (re->fam && re->model)
		re->fam->free(re);
	if (re->be) {
		eng_release(re, re->aq);
		eng_release(re, re->tok_d);
		eng_release(re, re->samp_d);
		eng_release(re, re->cand_d);
	}
	eng_free_host_copies(re);
}

static void rank_close(struct engine *re)
{
	if (!re)
		return;
	if (re->be) {
		if (re->be->attach)
			re->be->attach(re->bctx);
		re->be->shutdown(re->bctx);
	}
	free(re->tok_h);
	free(re->samp_h);
	free(re->cand_h);
	free(re->pick);
	free(re->pick_row);
	free(re->used);
	free(re);
}

void shard_close(struct engine *e)
{
	struct shard *sh = e->shard;
	if (!sh)
		return;
	if (sh->sync_ok) {
		pthread_mutex_lock(&sh->mu);
		sh->quit = true;
		pthread_cond_broadcast(&sh->go);
		pthread_mutex_unlock(&sh->mu);
		for (int r = 1; r <= sh->started; r++)
			pthread_join(sh->th[r], NULL);
		pthread_mutex_destroy(&sh->mu);
		pthread_cond_destroy(&sh->go);
		pthread_cond_destroy(&sh->done);
	}
	for (int r = 0; r < sh->world; r++)
		rank_free(sh->r[r]);
	if (e->snap && snap_on_sink(e->snap)) { /* its images are the ranks' device memory */
		snap_close(e->snap);
		e->snap = NULL;
	}
	for (int r = 0; r < sh->world; r++) {
		rank_close(sh->r[r]);
		free(sh->ritems[r]);
	}
	if (sh->comm && sh->comm_ctx)
		sh->comm->destroy(sh->comm_ctx);
	free(sh);
	e->shard = NULL;
}

/* Makes rank engine r: borrows the top's snapshot, config and sequence table; opens its own
 * backend and loads its shard. */
static int rank_open(struct engine *e, const struct eng_opts *o, int r, int threads, char *err,
		     size_t errsz)
{
	struct shard *sh = e->shard;
	struct engine *re = calloc(1, sizeof *re);
	if (!re)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	sh->r[r] = re;
	snprintf(re->dir, sizeof re->dir, "%s", e->dir);
	snprintf(re->arch, sizeof re->arch, "%s", e->arch);
	re->snap = e->snap;
	re->config = e->config;
	re->fam = e->fam;
	re->max_seq_opt = e->max_seq_opt;
	re->experts_one_by_one = e->experts_one_by_one;
	re->unfused = e->unfused;
	re->no_chain = e->no_chain;
	re->fp8_act = e->fp8_act;
	re->kv = e->kv;
	re->max_seqs = e->max_seqs;
	re->seq_len = e->seq_len;
	re->seq_used = e->seq_used;
	re->mtp_len = e->mtp_len;
	re->mtp_opt = e->mtp_opt;
	re->rank = r;
	re->world = e->world;
	re->tp = e->tp;
	re->ep = e->ep;
	re->comm = sh->comm;
	re->comm_ctx = sh->comm_ctx;
	re->top = e;
	re->used = calloc(snap_tensor_count(e->snap, r) + 1, sizeof *re->used);
	sh->ritems[r] = malloc((size_t)e->max_seqs * sizeof *sh->ritems[r]);
	if (!re->used || !sh->ritems[r])
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	/* restored into the devices' memory: the sink's contexts, rank 0's from the top */
	void *ctx = e->snap && snap_on_sink(e->snap) ? be_sink_take(&e->sink, r) : NULL;
	int rc;
	if (ctx && r == 0) {
		rc = eng_adopt_backend(re, e->be, ctx, e->counting, o, err, errsz);
		e->be = NULL;
		e->bctx = NULL;
		e->counting = false;
	} else if (ctx) {
		rc = eng_adopt_backend(re, e->sink.raw, ctx, false, o, err, errsz);
	} else {
		rc = eng_open_backend(re, o, threads, r, err, errsz);
	}
	if (rc != WK_OK)
		return rc;
	/* the load runs on this thread: its device is the rank's (a context the restore started
	 * was made current on this thread only while it was created) */
	if (re->be->attach)
		re->be->attach(re->bctx);
	if ((rc = re->fam->load(re, err, errsz)) != WK_OK) {
		char why[WK_ERRSZ];
		snprintf(why, sizeof why, "%s", err ? err : "");
		return wk_errf(err, errsz, rc, "rank %d of %d: %s", r, e->world, why);
	}
	return WK_OK;
}

int shard_open(struct engine *e, const struct eng_opts *o, char *err, size_t errsz)
{
	int W = e->world;
	struct shard *sh = calloc(1, sizeof *sh);
	if (!sh)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	e->shard = sh;
	sh->world = W;
	if (pthread_mutex_init(&sh->mu, NULL) || pthread_cond_init(&sh->go, NULL) ||
	    pthread_cond_init(&sh->done, NULL))
		return wk_errf(err, errsz, WK_ENOMEM, "cannot create the rank threads' locks");
	sh->sync_ok = true;

	/* One backend for every rank, decided here: "auto" means cuda only when it starts. */
	const char *bname = o && o->backend ? o->backend : "auto";
	const struct backend *be = be_find(bname);
	if (!be)
		return wk_errf(err, errsz, WK_EINVAL, "unknown backend '%s' (cpu, cuda, null or auto)",
			       bname);
	if (be == &be_cuda && !strcmp(bname, "auto")) {
		void *ctx;
		struct be_config bc = {.threads = 1, .device = 0};
		if (be_cuda.init(&ctx, &bc, err, errsz) == WK_OK) {
			if (be_cuda.shutdown)
				be_cuda.shutdown(ctx);
		} else {
			fprintf(stderr, "wick: %s; using the cpu backend\n", err);
			be = &be_cpu;
		}
	}
	struct eng_opts ro = {0};
	if (o)
		ro = *o;
	ro.backend = be->name;
	/* The collectives follow the backend: NCCL between GPUs, in-process between CPU ranks
	 * (and for the null backend, which computes nothing). */
	sh->comm = o && o->comm_ops ? o->comm_ops : be == &be_cuda ? &comm_nccl : &comm_cpu;
	/* made beside the restore where it streamed into the devices (be_sink_comm), else now */
	struct eng_startup *su = &e->info.startup;
	int rc = be_sink_comm(&e->sink, sh->comm, W, &sh->comm_ctx, &su->comm_s, &su->comm_wait_s,
			      err, errsz);
	if (rc == WK_ENOTFOUND) {
		double t = wk_now();
		rc = sh->comm->init(&sh->comm_ctx, W, err, errsz);
		su->comm_s = su->comm_wait_s = wk_now() - t;
	}
	if (rc != WK_OK) {
		sh->comm_ctx = NULL;
		return rc;
	}
	su->ranks_s = e->sink.ranks_s;
	/* CPU ranks share the cores: each gets threads / world of them (at least one). */
	int threads = be_rank_threads(o ? o->threads : 0, W);
	for (int r = 0; r < W; r++)
		if ((rc = rank_open(e, &ro, r, threads, err, errsz)) != WK_OK)
			return rc;
	struct engine *r0 = sh->r[0];
	e->info.backend = r0->be->name;
	e->info.vocab = r0->info.vocab;
	e->info.max_seq = r0->info.max_seq;
	e->info.bytes_per_token = r0->info.bytes_per_token;
	e->info.mtp_layers_skipped = r0->info.mtp_layers_skipped;
	e->info.mtp = r0->info.mtp;
	int layers = (int)json_integer_value(json_object_get(e->config, "num_hidden_layers"));
	/* a name no rank read, once however many ranks hold a piece of it: skipped when another
	 * rank read its piece, or when an earlier rank holds it too (counted there) */
	for (int r = 0; r < W; r++)
		for (size_t i = 0; i < snap_tensor_count(e->snap, r); i++) {
			const char *name = eng_unused_at(sh->r[r], i, layers);
			bool skip = false;
			for (int q = 0; name && q < W && !skip; q++) {
				const struct st_tensor *t = q == r ? NULL : snap_tensor(e->snap, q, name);
				skip = t && (q < r || !eng_unused_at(sh->r[q], (size_t)(t - snap_tensor_at(
									  e->snap, q, 0)), layers));
			}
			if (name && !skip && !e->info.unused_tensors++)
				e->info.unused_example = name;
		}
	for (int r = 1; r < W; r++) {
		struct worker_arg *wa = malloc(sizeof *wa);
		if (!wa)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		*wa = (struct worker_arg){.sh = sh, .rank = r};
		if (pthread_create(&sh->th[r], NULL, worker_main, wa) != 0) {
			free(wa);
			return wk_errf(err, errsz, WK_ENOMEM, "cannot start the thread of rank %d", r);
		}
		sh->started = r;
	}
	return WK_OK;
}
