/*
 * engine_open.c - eng_open and eng_close: reads a model directory or restores a snapshot
 * (into the backend's memory where it streams), with the tokenizer loaded on a thread beside
 * the weights; checks that the snapshot and its KV caches fit before a restore into a device;
 * picks the family and the backend, and counts the model's parameters.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/wk.h"
#include "engine/comm.h"
#include "engine/engine_int.h"
#include "engine/tokenizer.h"

static int token_id(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	if (json_is_array(v))
		v = json_array_get(v, 0);
	return json_is_integer(v) ? (int)json_integer_value(v) : -1;
}

/* in->stop: the integers of eos (an id or a list of ids), then bos, each once, at most 8 */
static void stop_ids(struct eng_info *in, json_t *eos)
{
	int ids[9], n = 0;
	if (json_is_integer(eos))
		ids[n++] = (int)json_integer_value(eos);
	for (size_t i = 0; json_is_array(eos) && i < json_array_size(eos) && n < 8; i++)
		if (json_is_integer(json_array_get(eos, i)))
			ids[n++] = (int)json_integer_value(json_array_get(eos, i));
	ids[n++] = in->bos;
	in->n_stop = 0;
	for (int i = 0; i < n && in->n_stop < 8; i++)
		if (ids[i] >= 0 && !eng_is_stop(in, ids[i]))
			in->stop[in->n_stop++] = ids[i];
}

int eng_open_backend(struct engine *e, const struct eng_opts *o, int threads, int device,
		     char *err, size_t errsz)
{
	const char *name = o && o->backend ? o->backend : "auto";
	struct be_config bc = {.threads = threads, .device = device, .fp8_act = o && o->fp8_act};
	e->be = o && o->backend_ops ? o->backend_ops : be_find(name);
	if (!e->be)
		return wk_errf(err, errsz, WK_EINVAL, "unknown backend '%s' (cpu, cuda, null or auto)", name);
	int rc = e->be->init(&e->bctx, &bc, err, errsz);
	if (rc != WK_OK && !strcmp(name, "auto") && e->be != &be_cpu) {
		fprintf(stderr, "wick: %s; using the cpu backend\n", err);
		e->be = &be_cpu;
		rc = e->be->init(&e->bctx, &bc, err, errsz);
	}
	if (rc == WK_OK && o && o->fp8_act && !e->be->act_quant) {
		rc = wk_errf(err, errsz, WK_EUNSUPPORTED, "the %s backend cannot quantize "
			     "activations to FP8", e->be->name);
		e->be->shutdown(e->bctx);
	}
	if (rc != WK_OK)
		e->be = NULL;
	else if (o && o->count_launches &&
		 (rc = eng_count_wrap(e, o->op_times, err, errsz)) != WK_OK) {
		e->be->shutdown(e->bctx);
		e->be = NULL;
	}
	return rc;
}

int eng_adopt_backend(struct engine *e, const struct backend *be, void *ctx, bool counted,
		      const struct eng_opts *o, char *err, size_t errsz)
{
	e->be = be;
	e->bctx = ctx;
	e->counting = counted;
	int rc = WK_OK;
	if (!counted && o && o->count_launches &&
		 (rc = eng_count_wrap(e, o->op_times, err, errsz)) != WK_OK) {
		be->shutdown(ctx);
		e->be = NULL;
	}
	return rc;
}

/* Whether tensor i of rank r is the copy of its data that counts towards the model's size:
 * replicated tensors on rank 0, TP shards on their lead rank (r < tp; a range that an earlier
 * rank holds too, as GQA kv heads shared over shards, counts there), experts on r < ep. The
 * layout tags say which is which (layout.c); untagged (version 1) tensors are rank 0's. */
static bool counts_once(struct engine *e, int r, size_t i)
{
	const char *tag = snap_tensor_layout(e->snap, r, i);
	if (tag && !strncmp(tag, "expert", 6))
		return r < e->ep;
	if (!tag || strncmp(tag, "tp ", 3))
		return r == 0;
	if (r >= e->tp)
		return false;
	const char *name = snap_tensor_at(e->snap, r, i)->name;
	for (int q = 0; q < r; q++) {
		const struct st_tensor *t = snap_tensor(e->snap, q, name);
		size_t j = t ? (size_t)(t - snap_tensor_at(e->snap, q, 0)) : 0;
		const char *qt = t ? snap_tensor_layout(e->snap, q, j) : NULL;
		if (qt && !strcmp(qt, tag))
			return false;
	}
	return true;
}

/* Parameters and bytes of the whole model in a snapshot, each tensor once. */
static void count_params(struct engine *e)
{
	for (int r = 0; r < snap_world(e->snap); r++)
		for (size_t i = 0; i < snap_tensor_count(e->snap, r); i++) {
			if (!counts_once(e, r, i))
				continue;
			const struct st_tensor *t = snap_tensor_at(e->snap, r, i);
			e->info.params += t->numel;
			e->info.weight_bytes += t->nbytes;
		}
}

/* "1.50 GiB", "12.0 MiB", "640 KiB": bytes for a message. */
static const char *bytes_str(uint64_t v, char b[32])
{
	if (v >= (1ull << 30))
		snprintf(b, 32, "%.2f GiB", (double)v / (1ull << 30));
	else if (v >= (1ull << 20))
		snprintf(b, 32, "%.1f MiB", (double)v / (1ull << 20));
	else
		snprintf(b, 32, "%.0f KiB", (double)v / 1024);
	return b;
}

/* Before a restore into device memory (snap_open's check, on the manifest it has read and
 * validated): whether this snapshot's weights and the KV caches of o->max_seqs sequences can
 * fit in the free memory of rank 0's device at all (a necessary condition: activations and
 * scratch come on top). A restore takes minutes at GLM-5 size, and the caches are allocated
 * after it; refused here, a misconfigured worker says so in milliseconds, with what does fit.
 * Nothing is checked where the backend cannot tell its memory (mem_info). */
struct fit {
	struct engine *e;
	const struct eng_opts *o;
	const char *dir;
};

static int fit_check(void *ctx, json_t *m, char *err, size_t errsz)
{
	const struct fit *f = ctx;
	struct engine *e = f->e;
	const struct eng_opts *o = f->o;
	const char *dir = f->dir;
	json_t *cfg = json_object_get(m, "config");
	json_t *archs = json_object_get(cfg, "architectures");
	const char *arch = json_string_value(json_array_get(archs, 0));
	enum dt_type kvt;
	int rc = eng_kv_type(o ? o->kv_dtype : NULL, cfg, &kvt, err, errsz);
	bool mla = arch && !strcmp(arch, "GlmMoeDsaForCausalLM");
	if (rc == WK_OK && arch) /* a KV type the backend cannot attend over, before the restore */
		rc = eng_kv_check_arch(e, arch, mla ? BE_OP_MLA_ATTENTION : BE_OP_ATTENTION, kvt,
				       err, errsz);
	if (rc != WK_OK || !e->be->mem_info)
		return rc;
	json_t *ranks = json_object_get(m, "ranks");
	long long tp = json_integer_value(json_object_get(m, "tp"));
	uint64_t image = 0, per_seq;
	for (size_t i = 0; i < json_array_size(ranks); i++) {
		json_int_t v = json_integer_value(json_object_get(json_array_get(ranks, i),
								  "image_size"));
		if (v > 0 && (uint64_t)v > image)
			image = (uint64_t)v;
	}
	int max_seq;
	char e2[WK_ERRSZ];
	size_t free_b = 0, total_b = 0;
	bool mtp = o && o->mtp != ENG_MTP_OFF;
	if (!arch || tp < 1 || tp > 4096 || !image ||
	    eng_seq_cache_bytes(arch, cfg, o ? o->max_seq : 0, (int)tp, kvt, mtp, &max_seq,
				&per_seq, e2, sizeof e2) != WK_OK ||
	    e->be->mem_info(e->bctx, &free_b, &total_b, e2, sizeof e2) != WK_OK)
		return WK_OK; /* the load will name what is wrong */
	int seqs = o && o->max_seqs > 0 ? o->max_seqs : 1;
	uint64_t kv = per_seq * (uint64_t)seqs;
	if (image + kv > free_b) {
		uint64_t left = free_b > image ? free_b - image : 0;
		uint64_t per_pos = per_seq / (uint64_t)max_seq; /* every position the same */
		uint64_t fit = per_seq ? left / per_seq : 0;
		uint64_t len = per_pos ? left / ((uint64_t)seqs * per_pos) : 0;
		/* a smaller cache type, and what it would hold */
		char alt[96] = "";
		uint64_t ps8;
		int ms8;
		if (kvt == DT_F32)
			snprintf(alt, sizeof alt, ", or --kv-dtype bf16 for half the cache");
		else if (kvt == DT_BF16 && /* only where this backend takes fp8 */
			 eng_kv_check_arch(e, arch, mla ? BE_OP_MLA_ATTENTION : BE_OP_ATTENTION,
					   DT_F8_E4M3, e2, sizeof e2) == WK_OK &&
			 (!mla || eng_kv_check_arch(e, arch, BE_OP_DSA_TOPK, DT_F8_E4M3, e2,
						    sizeof e2) == WK_OK) &&
			 eng_seq_cache_bytes(arch, cfg, max_seq, (int)tp, DT_F8_E4M3, mtp, &ms8,
					     &ps8, e2, sizeof e2) == WK_OK && ps8 && left / ps8)
			snprintf(alt, sizeof alt, ", or --kv-dtype fp8: room for %llu sequence%s of "
				 "%d positions", (unsigned long long)(left / ps8),
				 left / ps8 == 1 ? "" : "s", max_seq);
		char b[5][32];
		rc = wk_errf(err, errsz, WK_ELIMIT,
			     "%s: %s does not fit the GPU: its weights take %s of each GPU and the "
			     "%s KV caches of %d sequence%s of %d positions %s more (%s a "
			     "sequence), but GPU 0 has %s free of %s. Room beside the weights: %llu "
			     "sequence%s of %d positions, or %d of %llu positions (lower the "
			     "concurrency or --max-seq%s; `wick plan` sizes a node)", dir, arch,
			     bytes_str(image, b[0]), eng_kv_name(kvt), seqs, seqs == 1 ? "" : "s",
			     max_seq,
			     bytes_str(kv, b[1]), bytes_str(per_seq, b[2]),
			     bytes_str(free_b, b[3]), bytes_str(total_b, b[4]),
			     (unsigned long long)fit, fit == 1 ? "" : "s", max_seq, seqs,
			     (unsigned long long)len, alt);
	}
	return rc;
}

/* The tokenizer is read on a thread of its own while the weights are opened or restored, the
 * longest part of a cold start: parsing a 150k-token tokenizer.json takes most of a second,
 * which a start would otherwise spend after the last weight byte arrived. A snapshot also
 * holds the tokenizer prepared (tokenizer.prepared, made by `wick snapshot`), which loads
 * without JSON; tok_load_dir takes it where it is fresh, else tokenizer.json. */
struct tok_loader {
	char dir[4096], path[4096]; /* path: its tokenizer.json */
	pthread_t th;
	bool started, prepared;
	struct tok *tok;
	int rc;
	double s; /* its load's seconds */
	char err[WK_ERRSZ];
};

static void *tok_loader_main(void *arg)
{
	struct tok_loader *l = arg;
	double t0 = wk_now();
	l->rc = tok_load_dir(l->dir, &l->tok, &l->prepared, l->err, sizeof l->err);
	l->s = wk_now() - t0;
	return NULL;
}

/* Starts loading dir's tokenizer; where no thread can be had, tok_loader_end loads it. */
static void tok_loader_start(struct tok_loader *l, const char *dir)
{
	snprintf(l->dir, sizeof l->dir, "%s", dir);
	snprintf(l->path, sizeof l->path, "%s/tokenizer.json", dir);
	l->started = pthread_create(&l->th, NULL, tok_loader_main, l) == 0;
}

/* Its result: WK_OK with *out, or its status with its message in err. */
static int tok_loader_end(struct tok_loader *l, struct tok **out, double *secs, bool *prepared,
			  char *err, size_t errsz)
{
	if (l->started)
		pthread_join(l->th, NULL);
	else
		tok_loader_main(l);
	l->started = false;
	*out = l->tok;
	*secs = l->s;
	*prepared = l->prepared;
	l->tok = NULL;
	if (l->rc != WK_OK)
		snprintf(err, errsz, "%s", l->err);
	return l->rc;
}

static int open_weights(struct engine *e, const char *dir, const struct eng_opts *o, char *err,
			size_t errsz)
{
	if (!snap_is_snapshot(dir)) {
		if (o && (o->tp > 1 || o->ep > 1))
			return wk_errf(err, errsz, WK_EUNSUPPORTED,
				       "%s: tp %d, ep %d run from a snapshot cut for them (wick "
				       "snapshot %s -o SNAP --tp %d --ep %d)", dir, o->tp > 0 ? o->tp : 1,
				       o->ep > 0 ? o->ep : 1, dir, o->tp > 0 ? o->tp : 1,
				       o->ep > 0 ? o->ep : 1);
		int rc = hf_open(dir, &e->hf, err, errsz);
		if (rc == WK_OK)
			e->config = hf_config(e->hf);
		return rc;
	}
	struct snap_open_opts so = {.verify = !(o && o->no_verify), .progress = true};
	/* A backend that can take the snapshot straight into its memory starts before the
	 * restore (rank 0's; a sharded snapshot's sink starts the other ranks' as it accepts,
	 * and the rank engines take them over in shard.c). */
	struct snap_sink sink;
	const struct backend *b = o && o->backend_ops ? o->backend_ops
						      : be_find(o && o->backend ? o->backend : "auto");
	int rc;
	struct fit fit = {.e = e, .o = o, .dir = dir};
	if (be_streams(b)) {
		if ((rc = eng_open_backend(e, o, o ? o->threads : 0, 0, err, errsz)) != WK_OK)
			return rc;
		so.check = fit_check;
		so.check_ctx = &fit;
		/* a sharded restore into GPUs makes its communicator while the snapshot streams:
		 * the collectives shard_open will pick (NCCL between GPUs, or the caller's) */
		e->sink = (struct be_sink){.be = e->be, .ctx = e->bctx, .raw = b,
					   .threads = o ? o->threads : 0,
					   .fp8_act = o && o->fp8_act,
					   .comm = o && o->comm_ops ? o->comm_ops
						   : b == &be_cuda ? &comm_nccl : NULL};
		if (be_streams(e->be)) {
			sink = be_snap_sink(&e->sink);
			so.sink = &sink;
		}
	}
	rc = snap_open(dir, &so, &e->snap, err, errsz);
	if (rc == WK_OK && e->be && !snap_on_sink(e->snap)) {
		e->be->shutdown(e->bctx); /* restored into host memory: each rank starts its own */
		e->be = NULL;
		e->bctx = NULL;
		e->counting = false;
	}
	if (rc != WK_OK)
		return rc;
	json_t *m = snap_manifest(e->snap);
	long long mtp = json_integer_value(json_object_get(m, "tp"));
	long long mep = json_integer_value(json_object_get(m, "ep"));
	e->world = snap_world(e->snap);
	e->tp = mtp >= 1 && mtp <= e->world ? (int)mtp : 0;
	e->ep = mep >= 1 && mep <= e->world ? (int)mep : 0;
	if (!e->tp || !e->ep || e->world != (e->tp > e->ep ? e->tp : e->ep) || e->world % e->tp ||
	    e->world % e->ep)
		return wk_errf(err, errsz, WK_EFORMAT, "%s/manifest.json: tp %lld, ep %lld do not "
			       "make a world of %d ranks (it must be max(tp, ep))", dir, mtp, mep,
			       e->world);
	long long lv = json_integer_value(json_object_get(json_object_get(m, "layout"), "version"));
	if (e->world > 1 && lv != 2)
		return wk_errf(err, errsz, WK_EUNSUPPORTED, "%s: a snapshot of %d ranks with layout "
			       "version %lld; this wick runs sharded layout version 2 (make the "
			       "snapshot again)", dir, e->world, lv);
	if (o && ((o->tp > 0 && o->tp != mtp) || (o->ep > 0 && o->ep != mep)))
		return wk_errf(err, errsz, WK_EINVAL,
			       "%s: the snapshot was made for tp %lld, ep %lld; it cannot run with "
			       "tp %d, ep %d (make a snapshot for that layout)", dir, mtp, mep,
			       o->tp > 0 ? o->tp : (int)mtp, o->ep > 0 ? o->ep : (int)mep);
	if (o && o->source && (rc = snap_source_check(e->snap, o->source, err, errsz)) != WK_OK)
		return rc;
	const struct snap_timings *tm = snap_timings(e->snap);
	e->info.startup.snapshot = true;
	e->info.startup.read_s = tm->read_s;
	e->info.startup.verify_s = tm->verify_s;
	e->info.startup.bytes = tm->bytes_restored;
	e->info.startup.to_device = snap_on_sink(e->snap);
	e->config = snap_config(e->snap);
	if (!json_is_object(e->config))
		return wk_errf(err, errsz, WK_EFORMAT, "%s/manifest.json: 'config' is missing", dir);
	return WK_OK;
}

int eng_open(const char *model_dir, const struct eng_opts *opts, struct engine **out,
	     char *err, size_t errsz)
{
	struct engine *e = calloc(1, sizeof *e);
	if (!e)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	e->world = e->tp = e->ep = 1;
	double t0 = wk_now();
	snprintf(e->dir, sizeof e->dir, "%s", model_dir);
	int rc;
	const char *nc = getenv("WICK_NO_CHAIN"); /* an operator's escape hatch */
	if (nc && *nc && strcmp(nc, "0") != 0 && strcmp(nc, "1") != 0) {
		rc = wk_errf(err, errsz, WK_EINVAL, "WICK_NO_CHAIN is '%s'; it takes 0 or 1", nc);
		goto fail;
	}
	bool want_tok = !(opts && opts->no_tokenizer);
	struct tok_loader tl = {0};
	if (want_tok)
		tok_loader_start(&tl, model_dir);
	rc = open_weights(e, model_dir, opts, err, errsz);
	double t1 = wk_now();
	char tok_err[WK_ERRSZ] = "";
	int tok_rc = want_tok ? tok_loader_end(&tl, &e->tok, &e->info.startup.tokenizer_s,
					       &e->info.startup.tokenizer_prepared, tok_err,
					       sizeof tok_err)
			      : WK_ENOTFOUND;
	if (rc != WK_OK) /* the weights' error is the one to report */
		goto fail;
	e->info.startup.weights_s = t1 - t0;
	json_t *cfg = e->config;
	json_t *archs = json_object_get(cfg, "architectures");
	const char *arch = json_string_value(json_array_get(archs, 0));
	if (!arch) {
		rc = wk_errf(err, errsz, WK_EFORMAT,
			     "%s/config.json: 'architectures' must be a list naming the model class",
			     model_dir);
		goto fail;
	}
	snprintf(e->arch, sizeof e->arch, "%s", arch);
	e->fam = eng_family(arch);
	if (!e->fam) {
		rc = wk_errf(err, errsz, WK_EUNSUPPORTED,
			     "%s/config.json: architecture '%s' is not supported (supported: "
			     "LlamaForCausalLM, Glm4MoeForCausalLM, GlmMoeDsaForCausalLM)", model_dir, arch);
		goto fail;
	}

	rc = tok_rc;
	if (rc != WK_OK && rc != WK_ENOTFOUND)
		snprintf(err, errsz, "%s", tok_err);
	if (want_tok && rc == WK_ENOTFOUND && e->snap && snap_lists_file(e->snap, "tokenizer.json")) {
		/* the snapshot was made with one: it is damaged, not a model without one (which
		 * would start and fail every prompt job) */
		rc = wk_errf(err, errsz, WK_EFORMAT, "%s: missing, though the snapshot's manifest "
						     "lists it", tl.path);
		goto fail;
	}
	if (rc == WK_ENOTFOUND)
		e->tok = NULL; /* token ids still work */
	else if (rc != WK_OK)
		goto fail;
	if (e->tok && opts && opts->tok_memo &&
	    (rc = tok_memo_set(e->tok, opts->tok_memo)) != WK_OK) {
		rc = wk_errf(err, errsz, rc, "out of memory");
		goto fail;
	}

	if ((rc = eng_kv_type(opts ? opts->kv_dtype : NULL, cfg, &e->kv, err, errsz)) != WK_OK)
		goto fail;
	e->info.kv_dtype = eng_kv_name(e->kv);
	e->max_seq_opt = opts ? opts->max_seq : 0;
	e->experts_one_by_one = opts && opts->experts_one_by_one;
	e->unfused = opts && opts->unfused;
	e->fp8_act = opts && opts->fp8_act;
	e->no_chain = opts && opts->no_chain;
	e->no_chain |= nc && !strcmp(nc, "1");
	e->max_seqs = opts && opts->max_seqs > 0 ? opts->max_seqs : 1;
	if (!e->fam->step)
		e->max_seqs = 1;
	if (e->max_seqs > 4096) {
		rc = wk_errf(err, errsz, WK_EINVAL, "max_seqs %d is more than 4096", e->max_seqs);
		goto fail;
	}
	e->info.max_seqs = e->max_seqs;
	e->seq_len = calloc((size_t)e->max_seqs, sizeof *e->seq_len);
	e->seq_used = calloc((size_t)e->max_seqs, sizeof *e->seq_used);
	e->mtp_len = calloc((size_t)e->max_seqs, sizeof *e->mtp_len);
	e->mtp_opt = opts ? opts->mtp : ENG_MTP_OFF;
	if (!e->seq_len || !e->seq_used || !e->mtp_len) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto fail;
	}
	e->info.arch = e->arch;
	e->info.bos = token_id(cfg, "bos_token_id");
	e->info.eos = token_id(cfg, "eos_token_id");
	stop_ids(&e->info, json_object_get(cfg, "eos_token_id"));
	if (e->snap) {
		count_params(e);
	} else {
		for (size_t i = 0; i < hf_tensor_count(e->hf); i++) {
			e->info.params += hf_tensor_at(e->hf, i)->numel;
			e->info.weight_bytes += hf_tensor_at(e->hf, i)->nbytes;
		}
	}
	if (e->world > 1) {
		rc = shard_open(e, opts, err, errsz); /* the rank engines load the model */
	} else {
		size_t nt = e->snap ? snap_tensor_count(e->snap, 0) : hf_tensor_count(e->hf);
		if (!(e->used = calloc(nt + 1, sizeof *e->used)))
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		else if (e->be || (rc = eng_open_backend(e, opts, opts ? opts->threads : 0, 0, err,
							 errsz)) == WK_OK)
			rc = e->fam->load(e, err, errsz);
		if (rc == WK_OK) {
			e->info.backend = e->be->name;
			eng_count_unused(e, (int)json_integer_value(json_object_get(cfg,
										    "num_hidden_layers")));
		}
	}
	if (rc == WK_OK && e->mtp_opt == ENG_MTP_ON && !e->info.mtp)
		rc = wk_errf(err, errsz, WK_EUNSUPPORTED,
			     "%s: %s has no MTP layer to draft with (num_nextn_predict_layers is "
			     "%d)", e->dir, e->arch, e->info.mtp_layers_skipped);
	if (rc != WK_OK)
		goto fail;
	e->info.startup.ready_mono = wk_now();
	e->info.startup.init_s = e->info.startup.ready_mono - t1;
	e->info.startup.total_s = e->info.startup.ready_mono - t0;
	*out = e;
	return WK_OK;
fail:
	eng_close(e);
	return rc;
}

void eng_close(struct engine *e)
{
	if (!e)
		return;
	shard_close(e);
	if (e->fam && e->model)
		e->fam->free(e);
	if (e->be) {
		eng_release(e, e->aq);
		eng_release(e, e->tok_d);
		eng_release(e, e->samp_d);
		eng_release(e, e->cand_d);
	}
	free(e->tok_h);
	free(e->samp_h);
	free(e->cand_h);
	free(e->pick);
	free(e->pick_row);
	if (e->snap && snap_on_sink(e->snap)) {
		snap_close(e->snap); /* its images are the backend's memory */
		e->snap = NULL;
	}
	if (e->be)
		e->be->shutdown(e->bctx);
	be_sink_close(&e->sink); /* the ranks' contexts no rank engine took */
	eng_free_host_copies(e);
	free(e->used);
	tok_free(e->tok);
	free(e->seq_len);
	free(e->seq_used);
	free(e->mtp_len);
	hf_close(e->hf);
	snap_close(e->snap);
	free(e);
}


int eng_cache_id(struct engine *e, uint64_t *id, char *err, size_t errsz)
{
	uint64_t w = 0;
	char hex[17];
	if (e->snap) {
		char *m = json_dumps(snap_manifest(e->snap), JSON_SORT_KEYS | JSON_COMPACT);
		if (!m)
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		w = XXH3_64bits(m, strlen(m));
		free(m);
	} else {
		int rc = snap_source_hash(e->dir, &w, err, errsz);
		if (rc != WK_OK)
			return rc;
	}
	snprintf(hex, sizeof hex, "%016llx", (unsigned long long)w);
	/* (format: what eng_seq_save writes; 1 for this layout) */
	json_t *o = json_pack("{si ss sO ss ss sb si si si si}", "format", 1, "weights", hex,
			      "config", e->config, "kv", e->info.kv_dtype ? e->info.kv_dtype : "",
			      "backend", e->info.backend ? e->info.backend : "", "fp8_act",
			      e->fp8_act, "mtp", e->info.mtp, "world", e->world, "tp", e->tp, "ep",
			      e->ep);
	char *s = o ? json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
	json_decref(o);
	if (!s)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	*id = XXH3_64bits(s, strlen(s));
	free(s);
	return WK_OK;
}
