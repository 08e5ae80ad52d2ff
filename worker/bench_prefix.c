/*
 * bench_prefix.c - `wick bench prefix MODEL`: what the prefix cache (sched_set_prefix_cache)
 * saves a conversation. A chat of T turns grows by a user message and the model's reply each
 * turn, and each turn is a request whose prompt is the whole conversation so far, as a client
 * sends it. The same conversation runs through a scheduler with the cache and one without, in
 * the same run and on the same engine, and each turn's time to its first token and the prompt
 * tokens it ran are printed side by side, with their ratios. Greedy, so the two give the same
 * replies up to the rounding of a prompt run in two parts against one (the count of replies
 * that differ is printed).
 *
 * Then N choices of one prompt (an OpenAI request's n), submitted at once and sampled with
 * seeds of their own: with the cache, the first prefills the prompt and the others copy it
 * from its sequence (eng_seq_copy); without, each prefills it. The prompt tokens run, the time
 * until every choice has its first token, and the time until all are done are printed beside
 * each other, with the choices whose tokens differ.
 *
 * Last, a restart (--prefix-cache-dir): a worker runs that prompt and writes its cache at its
 * exit (prefix_store_save); the engine is opened again, as by the next worker, and the prompt
 * sent again runs once with nothing kept (a whole prefill) and once with the file read at the
 * start (its last token only; the file's pages dropped from the page cache before each read,
 * so that it comes from the disk). Printed: the file's size, the time to write it and to read it,
 * and the time to the first token each way, with the ratio counting the read.
 */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/engine.h"
#include "worker/cmd.h"
#include "worker/prefix_store.h"
#include "worker/sched.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench prefix MODEL [--turns T] [--system S] [--user U] [--reply R]\n"
		   "                         [--choices C] [--prompt P] [--prefix-wait W] [--runs N]\n"
		   "                         [--backend B] [--kv-dtype D]\n\n"
		   "A conversation of T turns (default 8): a system prompt of S tokens (default 64),\n"
		   "then each turn a user message of U tokens (default 32) and a greedy reply of R\n"
		   "(default 16; a stop token ends it sooner), each turn a request with the whole\n"
		   "conversation as its prompt.\n"
		   "It runs with the prefix cache and without, best of N runs (default 3), and\n"
		   "prints each turn's time to first token and prompt tokens run, the totals and\n"
		   "their ratios.\n"
		   "Then C choices (default 8) of one prompt of P tokens (default 256, or what\n"
		   "the model's context leaves), submitted\n"
		   "at once and sampled (temperature 0.8, a seed each), R tokens each, with the\n"
		   "cache (one prefill, copied) and without (C prefills): the prompt tokens run,\n"
		   "the time until every choice has its first token and until all are done. The\n"
		   "choices wait for the first's prefill where they share W tokens or more\n"
		   "(default: the scheduler's, 2 on the CPU backend, 1024 on a GPU).\n"
		   "Then a restart: that prompt's cache written at a worker's exit and read by\n"
		   "the next one's start (--prefix-cache-dir), against the next one without it:\n"
		   "the file's size, the write, the read and the time to the first token.\n"
		   "Last, one JSON line. The token ids are a fixed sequence (no tokenizer needed).\n");
}

static void done(void *ctx, struct sched_req *r)
{
	*(struct sched_req **)ctx = r;
}

struct conv {
	double ttft[64];   /* each turn's, best over the runs */
	int ran[64];       /* prompt tokens it ran */
	int prompt[64];
	int *replies;      /* [turns][reply] the last run's (a stop token may end one early) */
	int n_reply[64];
};

/* One conversation through a scheduler with the cache on or off; its turns' times into c
 * (the best so far kept). WK_OK, or an error printed. */
static int run_conv(struct engine *e, bool cache, int turns, int sys, int user, int reply,
		    struct conv *c, bool first)
{
	int vocab = eng_info(e)->vocab, n = 0, rc = WK_OK;
	int *ctx = malloc((size_t)(sys + turns * (user + reply)) * sizeof *ctx);
	struct sched *s = sched_create(e, NULL);
	char err[WK_ERRSZ];
	if (!ctx || !s || sched_set_prefix_cache(s, cache) != WK_OK) {
		fprintf(stderr, "wick bench prefix: out of memory\n");
		free(ctx);
		sched_free(s);
		return WK_ENOMEM;
	}
	unsigned x = 12345; /* a fixed sequence of ids, away from the special ones */
	for (int t = 0; t < turns && rc == WK_OK; t++) {
		for (int i = 0; i < (t ? user : sys + user); i++) {
			x = x * 1103515245u + 12345u;
			ctx[n++] = 3 + (int)((x >> 8) % (unsigned)(vocab - 3));
		}
		struct sched_req *r = calloc(1, sizeof *r), *fin = NULL;
		if (!r || !(r->prompt = malloc((size_t)n * sizeof *r->prompt))) {
			free(r);
			rc = WK_ENOMEM;
			break;
		}
		snprintf(r->id, sizeof r->id, "turn-%d", t);
		memcpy(r->prompt, ctx, (size_t)n * sizeof *ctx);
		r->n_prompt = n;
		r->max_tokens = reply;
		r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
		if ((rc = sched_submit(s, r, err, sizeof err)) != WK_OK) {
			fprintf(stderr, "wick bench prefix: turn %d: %s\n", t, err);
			sched_req_free(r);
			break;
		}
		while (sched_pending(s) > 0)
			if (sched_step(s, done, &fin) < 0)
				break;
		if (!fin || fin->status != SCHED_DONE) {
			fprintf(stderr, "wick bench prefix: turn %d failed: %s\n", t,
				fin ? fin->error : "no result");
			sched_req_free(fin);
			rc = WK_EIO;
			break;
		}
		double ttft = fin->t_first - fin->t_admit;
		if (first || ttft < c->ttft[t])
			c->ttft[t] = ttft;
		c->ran[t] = fin->n_prompt - fin->cached;
		c->prompt[t] = fin->n_prompt;
		c->n_reply[t] = fin->n_out;
		if (fin->n_out > 0) { /* (a reply may be empty: a stop token first; out NULL) */
			memcpy(c->replies + (size_t)t * reply, fin->out,
			       (size_t)fin->n_out * sizeof *ctx);
			memcpy(ctx + n, fin->out, (size_t)fin->n_out * sizeof *ctx);
		}
		n += fin->n_out;
		sched_req_free(fin);
	}
	sched_free(s);
	free(ctx);
	return rc;
}

struct choices {
	double first_s, all_s; /* until every choice's first token, until all are done (best) */
	int ran;               /* prompt tokens run */
	int *out;              /* [n][reply] the last run's tokens */
	int *n_out;            /* [n] */
};

static void done_n(void *ctx, struct sched_req *r)
{
	struct sched_req **fin = ctx;
	int i = atoi(r->id + 7); /* "choice-i" */
	fin[i] = r;
}

/* n choices of one prompt of np tokens at once, through a scheduler with the cache on or off;
 * the times into c (the best so far kept). WK_OK, or an error printed. */
static int run_choices(struct engine *e, bool cache, int n, int np, int reply, int wait,
		       struct choices *c, bool first)
{
	int vocab = eng_info(e)->vocab, rc = WK_OK;
	struct sched *s = sched_create(e, NULL);
	struct sched_req **fin = calloc((size_t)n, sizeof *fin);
	char err[WK_ERRSZ];
	if (!s || !fin || sched_set_prefix_cache(s, cache) != WK_OK ||
	    (wait >= 0 && sched_set_prefix_wait(s, wait) != WK_OK)) {
		fprintf(stderr, "wick bench prefix: out of memory\n");
		sched_free(s);
		free(fin);
		return WK_ENOMEM;
	}
	double t0 = wk_now();
	for (int i = 0; i < n && rc == WK_OK; i++) {
		struct sched_req *r = calloc(1, sizeof *r);
		if (!r || !(r->prompt = malloc((size_t)np * sizeof *r->prompt))) {
			free(r);
			rc = WK_ENOMEM;
			break;
		}
		unsigned x = 777; /* the same fixed ids for every choice */
		for (int k = 0; k < np; k++) {
			x = x * 1103515245u + 12345u;
			r->prompt[k] = 3 + (int)((x >> 8) % (unsigned)(vocab - 3));
		}
		snprintf(r->id, sizeof r->id, "choice-%d", i);
		r->n_prompt = np;
		r->max_tokens = reply;
		r->samp = (struct samp_cfg){.temperature = 0.8f, .top_p = 1, .seed = 1000 + i};
		if ((rc = sched_submit(s, r, err, sizeof err)) != WK_OK) {
			fprintf(stderr, "wick bench prefix: choice %d: %s\n", i, err);
			sched_req_free(r);
		}
	}
	while (rc == WK_OK && sched_pending(s) > 0)
		if (sched_step(s, done_n, fin) < 0)
			break;
	double t1 = wk_now(), last = 0;
	int ran = 0;
	for (int i = 0; i < n && rc == WK_OK; i++) {
		struct sched_req *r = fin[i];
		if (!r || r->status != SCHED_DONE) {
			fprintf(stderr, "wick bench prefix: choice %d failed: %s\n", i,
				r ? r->error : "no result");
			rc = WK_EIO;
			break;
		}
		last = r->t_first > last ? r->t_first : last;
		ran += r->n_prompt - r->cached;
		c->n_out[i] = r->n_out;
		if (r->n_out > 0)
			memcpy(c->out + (size_t)i * reply, r->out, (size_t)r->n_out * sizeof *r->out);
	}
	if (rc == WK_OK) {
		if (first || last - t0 < c->first_s)
			c->first_s = last - t0;
		if (first || t1 - t0 < c->all_s)
			c->all_s = t1 - t0;
		c->ran = ran;
	}
	for (int i = 0; i < n; i++)
		sched_req_free(fin[i]);
	free(fin);
	sched_free(s);
	return rc;
}

struct restart {
	double save_s, load_s, ttft[2]; /* best; [0] nothing kept, [1] the file read */
	uint64_t bytes;
	int ran[2], *out[2], n_out[2];
	char file[4200]; /* written */
};

/* The prompt of run_choices (ids x) through a scheduler with the cache: WK_OK and *fin, or
 * an error printed. */
static int run_one(struct sched *s, const int *p, int np, int reply, struct sched_req **fin)
{
	char err[WK_ERRSZ];
	struct sched_req *r = calloc(1, sizeof *r);
	*fin = NULL;
	if (!r || !(r->prompt = malloc((size_t)np * sizeof *p))) {
		free(r);
		return WK_ENOMEM;
	}
	snprintf(r->id, sizeof r->id, "restart");
	memcpy(r->prompt, p, (size_t)np * sizeof *p);
	r->n_prompt = np;
	r->max_tokens = reply;
	r->samp = (struct samp_cfg){.temperature = 0, .top_p = 1};
	int rc = sched_submit(s, r, err, sizeof err);
	if (rc != WK_OK) {
		fprintf(stderr, "wick bench prefix: %s\n", err);
		sched_req_free(r);
		return rc;
	}
	while (sched_pending(s) > 0)
		if (sched_step(s, done, fin) < 0)
			break;
	if (!*fin || (*fin)->status != SCHED_DONE) {
		fprintf(stderr, "wick bench prefix: the restart's request failed: %s\n",
			*fin ? (*fin)->error : "no result");
		sched_req_free(*fin);
		return WK_EIO;
	}
	return WK_OK;
}

/* The file's pages out of the page cache (written and fsync'd, so clean: the kernel drops
 * them), so that its read comes from the disk. */
static void drop_cached(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

/* The restart: run 0 writes the file (on *e, then opened again as o says); each run then
 * sends the prompt to a scheduler with nothing kept and to one that read the file. */
static int run_restart(struct engine **e, const char *model, const struct eng_opts *o,
		       const char *dir, int np, int reply, struct restart *rs, bool first)
{
	char err[WK_ERRSZ];
	int vocab = eng_info(*e)->vocab, rc = WK_OK;
	int *p = malloc((size_t)np * sizeof *p);
	uint64_t id;
	if (!p)
		return WK_ENOMEM;
	unsigned x = 777; /* a fixed sequence of ids, away from the special ones */
	for (int i = 0; i < np; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = 3 + (int)((x >> 8) % (unsigned)(vocab - 3));
	}
	struct sched_req *fin = NULL;
	struct prefix_store_stats st;
	struct sched *s = NULL;
	if (first) {
		s = sched_create(*e, NULL);
		if (!s || sched_set_prefix_cache(s, true) != WK_OK ||
		    (rc = run_one(s, p, np, reply, &fin)) != WK_OK)
			goto out;
		sched_req_free(fin);
		if ((rc = eng_cache_id(*e, &id, err, sizeof err)) != WK_OK ||
		    (rc = prefix_store_save(s, *e, dir, id, NULL, &st, err, sizeof err)) !=
			    WK_OK)
			goto out;
		rs->save_s = st.seconds;
		rs->bytes = st.bytes;
		snprintf(rs->file, sizeof rs->file, "%s", st.path);
		sched_free(s);
		s = NULL;
		eng_close(*e);
		if ((rc = eng_open(model, o, e, err, sizeof err)) != WK_OK)
			goto out;
	}
	if ((rc = eng_cache_id(*e, &id, err, sizeof err)) != WK_OK)
		goto out;
	for (int k = 0; k < 2 && rc == WK_OK; k++) {
		s = sched_create(*e, NULL);
		if (!s || sched_set_prefix_cache(s, true) != WK_OK) {
			rc = WK_ENOMEM;
			break;
		}
		if (k) {
			drop_cached(rs->file); /* read from the disk, as after a reboot */
			if ((rc = prefix_store_load(s, *e, dir, id, &st, err, sizeof err)) != WK_OK)
				break;
			if (st.entries != 1) {
				rc = wk_errf(err, sizeof err, WK_EIO, "%s: %d entries read, not 1",
					     st.path, st.entries);
				break;
			}
			if (first || st.seconds < rs->load_s)
				rs->load_s = st.seconds;
		}
		if ((rc = run_one(s, p, np, reply, &fin)) != WK_OK)
			break;
		double ttft = fin->t_first - fin->t_admit;
		if (first || ttft < rs->ttft[k])
			rs->ttft[k] = ttft;
		rs->ran[k] = fin->n_prompt - fin->cached;
		rs->n_out[k] = fin->n_out;
		if (fin->n_out)
			memcpy(rs->out[k], fin->out, (size_t)fin->n_out * sizeof *p);
		sched_req_free(fin);
		sched_free(s);
		s = NULL;
	}
out:
	if (rc != WK_OK && rc != WK_EIO)
		fprintf(stderr, "wick bench prefix: the restart: %s\n", err);
	sched_free(s);
	free(p);
	return rc;
}

int bench_prefix(int argc, char **argv)
{
	int turns = 8, sys = 64, user = 32, reply = 16, runs = 3, nch = 8, np = 0, wait = -1;
	const char *backend = "cpu", *kv = NULL;
	static const struct option opts[] = {
		{"kv-dtype", required_argument, 0, 'k'},
		{"turns", required_argument, 0, 't'}, {"system", required_argument, 0, 's'},
		{"user", required_argument, 0, 'u'},  {"reply", required_argument, 0, 'r'},
		{"runs", required_argument, 0, 'n'},  {"backend", required_argument, 0, 'b'},
		{"choices", required_argument, 0, 'c'}, {"prompt", required_argument, 0, 'p'},
		{"prefix-wait", required_argument, 0, 'w'},
		{"help", no_argument, 0, 'h'},	      {0, 0, 0, 0}};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 't': turns = atoi(optarg); break;
		case 's': sys = atoi(optarg); break;
		case 'u': user = atoi(optarg); break;
		case 'r': reply = atoi(optarg); break;
		case 'n': runs = atoi(optarg); break;
		case 'b': backend = optarg; break;
		case 'k': kv = optarg; break;
		case 'c': nch = atoi(optarg); break;
		case 'w': wait = atoi(optarg) >= 0 ? atoi(optarg) : -2; break;
		case 'p': np = atoi(optarg) >= 2 ? atoi(optarg) : -1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || turns < 1 || turns > 64 || sys < 0 || sys > 100000 || user < 1 ||
	    user > 100000 || reply < 1 || reply > 100000 || runs < 1 || runs > 100 || nch < 2 ||
	    nch > 64 || np < 0 || np > 100000 || wait < -1) {
		usage(stderr);
		return 2;
	}
	int total = sys + turns * (user + reply);
	total = total > (np ? np : 256) + reply ? total : (np ? np : 256) + reply;
	char err[WK_ERRSZ];
	struct eng_opts o = {.backend = backend, .max_seq = total + 1, .max_seqs = nch,
			     .kv_dtype = kv};
	struct engine *e;
	if (eng_open(argv[optind], &o, &e, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench prefix: %s\n", err);
		return 1;
	}
	int ctx = eng_info(e)->max_seq;
	if (!np) /* the default: 256, or what the model's context leaves */
		np = 256 < ctx - reply ? 256 : ctx - reply;
	if (np < 2 || np + reply > ctx) {
		fprintf(stderr, "wick bench prefix: a prompt of %d tokens and %d more do not fit the "
			"model's context of %d\n", np, reply, ctx);
		eng_close(e);
		return 1;
	}
	struct conv cv[2]; /* [0]: without the cache, [1]: with */
	memset(cv, 0, sizeof cv);
	for (int k = 0; k < 2; k++)
		cv[k].replies = calloc((size_t)turns * reply, sizeof *cv[k].replies);
	struct choices ch[2] = {0}; /* the same */
	int rc = cv[0].replies && cv[1].replies ? WK_OK : WK_ENOMEM;
	for (int k = 0; k < 2 && rc == WK_OK; k++)
		if (!(ch[k].out = calloc((size_t)nch * reply, sizeof *ch[k].out)) ||
		    !(ch[k].n_out = calloc((size_t)nch, sizeof *ch[k].n_out)))
			rc = WK_ENOMEM;
	for (int i = 0; i < runs && rc == WK_OK; i++) /* alternated, so drift hits both alike */
		for (int k = 0; k < 2 && rc == WK_OK; k++)
			rc = run_conv(e, k, turns, sys, user, reply, &cv[k], i == 0);
	for (int i = 0; i < runs && rc == WK_OK; i++)
		for (int k = 0; k < 2 && rc == WK_OK; k++)
			rc = run_choices(e, k, nch, np, reply, wait, &ch[k], i == 0);
	struct restart rs = {0};
	char pdir[] = "/tmp/wick-bench-prefix-XXXXXX";
	if (rc == WK_OK && !mkdtemp(pdir)) {
		fprintf(stderr, "wick bench prefix: %s: cannot make a directory\n", pdir);
		rc = WK_EIO;
	}
	for (int k = 0; k < 2 && rc == WK_OK; k++)
		if (!(rs.out[k] = calloc((size_t)reply, sizeof *rs.out[k])))
			rc = WK_ENOMEM;
	for (int i = 0; i < runs && rc == WK_OK; i++)
		rc = run_restart(&e, argv[optind], &o, pdir, np, reply, &rs, i == 0);
	if (rs.file[0])
		unlink(rs.file);
	rmdir(pdir);
	char kvname[16];
	snprintf(kvname, sizeof kvname, "%s", e ? eng_info(e)->kv_dtype : "");
	eng_close(e);
	if (rc != WK_OK) {
		for (int k = 0; k < 2; k++) {
			free(cv[k].replies);
			free(ch[k].out);
			free(ch[k].n_out);
			free(rs.out[k]);
		}
		return 1;
	}
	int differ = 0;
	for (int t = 0; t < turns; t++)
		differ += cv[0].n_reply[t] != cv[1].n_reply[t] ||
			  memcmp(cv[0].replies + (size_t)t * reply, cv[1].replies + (size_t)t * reply,
				 (size_t)cv[0].n_reply[t] * sizeof *cv[0].replies) != 0;
	printf("a conversation of %d turns, backend %s, KV cache %s (best of %d runs; system %d, "
	       "user %d, reply %d tokens):\n", turns, backend, kvname, runs, sys, user, reply);
	printf("  %4s %7s %12s %12s %12s %12s %8s\n", "turn", "prompt", "ran (off)", "ran (on)",
	       "ttft ms off", "ttft ms on", "x faster");
	double t0 = 0, t1 = 0;
	long r0 = 0, r1 = 0;
	for (int t = 0; t < turns; t++) {
		printf("  %4d %7d %12d %12d %12.3f %12.3f %8.2f\n", t + 1, cv[1].prompt[t],
		       cv[0].ran[t], cv[1].ran[t], cv[0].ttft[t] * 1e3, cv[1].ttft[t] * 1e3,
		       cv[0].ttft[t] / cv[1].ttft[t]);
		t0 += cv[0].ttft[t];
		t1 += cv[1].ttft[t];
		r0 += cv[0].ran[t];
		r1 += cv[1].ran[t];
	}
	printf("  all: prompt tokens run %ld without the cache, %ld with (%.2fx fewer); time to "
	       "first token summed %.3f ms against %.3f ms (%.2fx faster); replies that differ: "
	       "%d of %d\n", r0, r1, (double)r0 / (double)r1, t0 * 1e3, t1 * 1e3, t0 / t1, differ,
	       turns);
	int cdiff = 0;
	for (int i = 0; i < nch; i++)
		cdiff += ch[0].n_out[i] != ch[1].n_out[i] ||
			 memcmp(ch[0].out + (size_t)i * reply, ch[1].out + (size_t)i * reply,
				(size_t)ch[0].n_out[i] * sizeof *ch[0].out) != 0;
	printf("%d choices of one prompt of %d tokens, %d tokens each, sampled (best of %d runs):\n",
	       nch, np, reply, runs);
	printf("  %-14s %12s %18s %14s\n", "", "prompt ran", "all first tokens", "all done");
	printf("  %-14s %12d %15.3f ms %11.3f ms\n", "without cache", ch[0].ran,
	       ch[0].first_s * 1e3, ch[0].all_s * 1e3);
	printf("  %-14s %12d %15.3f ms %11.3f ms\n", "with cache", ch[1].ran, ch[1].first_s * 1e3,
	       ch[1].all_s * 1e3);
	printf("  choices: %.2fx fewer prompt tokens run; every first token %.2fx sooner, all done "
	       "%.2fx sooner; choices that differ: %d of %d\n", (double)ch[0].ran / ch[1].ran,
	       ch[0].first_s / ch[1].first_s, ch[0].all_s / ch[1].all_s, cdiff, nch);
	int rdiff = rs.n_out[0] != rs.n_out[1] ||
		    memcmp(rs.out[0], rs.out[1], (size_t)rs.n_out[0] * sizeof *rs.out[0]) != 0;
	printf("a restart: the prompt of %d tokens again, at the next worker's start (best of %d "
	       "runs):\n", np, runs);
	printf("  the file: %.3f MB, written at the exit in %.3f ms, read at the start in %.3f "
	       "ms (from the disk: its pages dropped from the page cache first)\n",
	       rs.bytes / 1e6, rs.save_s * 1e3, rs.load_s * 1e3);
	printf("  %-14s %12s %18s\n", "", "prompt ran", "first token");
	printf("  %-14s %12d %15.3f ms\n", "nothing kept", rs.ran[0], rs.ttft[0] * 1e3);
	printf("  %-14s %12d %15.3f ms (+ %.3f ms read)\n", "file read", rs.ran[1],
	       rs.ttft[1] * 1e3, rs.load_s * 1e3);
	printf("  restart: first token %.2fx sooner, the read counted; replies that differ: %d "
	       "of 1\n", rs.ttft[0] / (rs.ttft[1] + rs.load_s), rdiff);
	json_t *j = json_pack("{s:s, s:i, s:I, s:I, s:f, s:f, s:i, s:i, s:i, s:i, s:f, s:f, s:f, "
			      "s:f, s:i}", "backend", backend, "turns",
			      turns, "ran_off", (json_int_t)r0, "ran_on", (json_int_t)r1,
			      "ttft_ms_off", t0 * 1e3, "ttft_ms_on", t1 * 1e3, "replies_differ",
			      differ, "choices", nch, "choices_ran_off", ch[0].ran,
			      "choices_ran_on", ch[1].ran, "choices_first_ms_off",
			      ch[0].first_s * 1e3, "choices_first_ms_on", ch[1].first_s * 1e3,
			      "choices_all_ms_off", ch[0].all_s * 1e3, "choices_all_ms_on",
			      ch[1].all_s * 1e3, "choices_differ", cdiff);
	json_t *rj = json_pack("{s:I, s:f, s:f, s:i, s:i, s:f, s:f, s:i}", "bytes",
			       (json_int_t)rs.bytes, "save_ms", rs.save_s * 1e3, "load_ms",
			       rs.load_s * 1e3, "ran_off", rs.ran[0], "ran_on", rs.ran[1],
			       "first_ms_off", rs.ttft[0] * 1e3, "first_ms_on", rs.ttft[1] * 1e3,
			       "differ", rdiff);
	if (j && rj)
		json_object_set_new(j, "restart", rj);
	else
		json_decref(rj);
	char *line = j ? json_dumps(j, JSON_COMPACT) : NULL;
	printf("%s\n", line ? line : "{}");
	free(line);
	json_decref(j);
	for (int k = 0; k < 2; k++) {
		free(cv[k].replies);
		free(ch[k].out);
		free(ch[k].n_out);
		free(rs.out[k]);
	}
	return 0;
}
