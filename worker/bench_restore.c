/*
 * bench_restore.c - `wick bench restore SNAP`: how fast a snapshot comes back into memory,
 * against two baselines measured in the same run, with a warm page cache and a cold one:
 *
 *   plain    a sequential read of the snapshot's rank files with 1 MiB buffered reads, as
 *            `cat` does: what the storage gives a simple reader;
 *   naive    what wick would do with no snapshot (eng_naive_load): mmap the Hugging Face
 *            safetensors with MADV_SEQUENTIAL and, tensor by tensor in file order, apply the
 *            snapshot's transform and copy into the engine's memory;
 *   restore  snap_open with checksums verified: the prefetch pipeline.
 *
 * Restore and naive must end with identical bytes; the run checks that before timing.
 * "Cold" drops the files from the page cache with posix_fadvise(DONTNEED) before each run.
 * It also measures the fixed cost of a cold start: a child `wick generate SNAP --tokens 0 -n 0`
 * (which reads the tokenizer, where the snapshot has one, as a worker does: beside the
 * weights) from spawn to ready, minus the time it spent moving bytes.
 *
 * With --backend B on a backend with device memory (cuda), it also restores the snapshot
 * straight into the devices through pinned staging buffers (a sharded snapshot's rank r into
 * device r, as a worker starts), checks every device's bytes against a host restore, and sets
 * it beside the links' own speed in the same run: the same bytes copied to each device from a
 * pinned buffer of its own, every device at once, nothing read from disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coldstart/hfmodel.h"
#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "worker/cmd.h"

#define MAX_FILES 4096

extern char **environ;

struct files {
	char *path[MAX_FILES];
	int n;
	uint64_t bytes;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick bench restore SNAP [--source HF_DIR] [--runs N] [--no-cold]\n"
		"                          [--threads T] [--startup-runs N]\n\n"
		"Times restoring SNAP against a plain sequential read of its files and against the\n"
		"naive load of its source checkpoint, warm and cold, checking that restore and naive\n"
		"end with identical bytes; then the fixed cost of a cold start. Prints a table, then\n"
		"one JSON line.\n"
		"  --source HF_DIR    the checkpoint the snapshot was made from (default: the\n"
		"                     manifest's source.dir)\n"
		"  --runs N           runs per measurement; the median is reported (default 3)\n"
		"  --no-cold          skip the cold-cache runs\n"
		"  --threads T        restore reader threads (default: the pipeline's choice)\n"
		"  --startup-runs N   child processes for the fixed start-up cost (default 5)\n"
		"  --map M            restore into a mapping of the file: auto (default), always,\n"
		"                     never\n"
		"  --backend B        also restore into B's device memory (cuda; a sharded\n"
		"                     snapshot's rank r into device r) against pinned copies of the\n"
		"                     same bytes to the same devices at once (default cpu: nothing\n"
		"                     to add)\n");
}

static int add_file(struct files *f, const char *path)
{
	if (f->n == MAX_FILES)
		return -1;
	f->path[f->n] = strdup(path);
	if (!f->path[f->n])
		return -1;
	int fd = open(path, O_RDONLY);
	if (fd >= 0) {
		off_t sz = lseek(fd, 0, SEEK_END);
		f->bytes += sz > 0 ? (uint64_t)sz : 0;
		close(fd);
	}
	f->n++;
	return 0;
}

static void free_files(struct files *f)
{
	for (int i = 0; i < f->n; i++)
		free(f->path[i]);
	f->n = 0;
}

static void drop_cache(const struct files *f)
{
	for (int i = 0; i < f->n; i++) {
		int fd = open(f->path[i], O_RDONLY);
		if (fd < 0)
			continue;
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
}

/* Seconds to read every file front to back with 1 MiB read()s, or < 0 on an error. */
static double plain_read(const struct files *f)
{
	enum { BUF = 1 << 20 };
	char *buf = malloc(BUF);
	if (!buf)
		return -1;
	double t0 = wk_now();
	for (int i = 0; i < f->n; i++) {
		int fd = open(f->path[i], O_RDONLY);
		if (fd < 0) {
			free(buf);
			return -1;
		}
		ssize_t r;
		while ((r = read(fd, buf, BUF)) > 0)
			;
		close(fd);
		if (r < 0) {
			free(buf);
			return -1;
		}
	}
	double dt = wk_now() - t0;
	free(buf);
	return dt;
}

static int map_mode; /* --map: 0 auto, 1 always, -1 never */

static double do_restore(const char *dir, int threads, char *err, size_t errsz)
{
	struct snap *s;
	struct snap_open_opts o = {.verify = true, .threads = threads, .map = map_mode};
	double t0 = wk_now();
	if (snap_open(dir, &o, &s, err, errsz) != WK_OK)
		return -1;
	double dt = wk_now() - t0;
	snap_close(s);
	return dt;
}

static double do_naive(const char *src, const struct eng_snap_opts *so, char *err, size_t errsz)
{
	struct eng_naive *nv;
	double t0 = wk_now();
	if (eng_naive_load(src, so, &nv, err, errsz) != WK_OK)
		return -1;
	double dt = wk_now() - t0;
	eng_naive_free(nv);
	return dt;
}

/* Both paths must leave the same bytes in memory. Returns 0, or 1 with a message. */
static int check_identical(const char *dir, const char *src, const struct eng_snap_opts *so,
			   uint64_t *bytes)
{
	char err[WK_ERRSZ];
	struct snap *s;
	struct eng_naive *nv;
	struct snap_open_opts o = {.verify = true};
	if (snap_open(dir, &o, &s, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench restore: %s\n", err);
		return 1;
	}
	if (eng_naive_load(src, so, &nv, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench restore: naive load: %s\n", err);
		snap_close(s);
		return 1;
	}
	int bad = 0;
	size_t total = 0;
	for (int r = 0; r < snap_world(s); r++)
		total += snap_tensor_count(s, r);
	if (total != eng_naive_count(nv)) {
		fprintf(stderr, "wick bench restore: the snapshot holds %zu tensors, the naive load "
				"%zu\n", total, eng_naive_count(nv));
		bad = 1;
	}
	*bytes = 0;
	for (size_t i = 0; !bad && i < eng_naive_count(nv); i++) {
		const void *d;
		uint64_t nb;
		const char *name = eng_naive_tensor(nv, i, &d, &nb);
		/* sharded snapshots hold a name once per rank: compare the naive load's rank */
		const struct st_tensor *t = snap_tensor(s, eng_naive_rank(nv, i), name);
		if (!t || t->nbytes != nb || memcmp(t->data, d, nb) != 0) {
			fprintf(stderr, "wick bench restore: tensor '%s' differs between the snapshot "
					"and the naive load\n", name);
			bad = 1;
		}
		*bytes += nb;
	}
	eng_naive_free(nv);
	snap_close(s);
	return bad;
}

/* ---- into device memory ---- */


/* Each rank's device image (rank r of dev, in k's context r) against a host restore of the
 * same snapshot. */
static int device_identical(const struct be_sink *k, const struct snap *dev, const char *dir,
			    char *err, size_t errsz)
{
	const struct backend *b = k->be;
	struct snap *host;
	struct snap_open_opts o = {.verify = true};
	int rc = snap_open(dir, &o, &host, err, errsz);
	if (rc != WK_OK)
		return rc;
	for (int r = 0; rc == WK_OK && r < snap_world(dev); r++) {
		uint64_t n, m;
		const void *d = snap_image(dev, r, &n), *h = snap_image(host, r, &m);
		void *back = malloc(n ? n : 1);
		if (!back) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		} else {
			if (b->attach)
				b->attach(k->rctx[r]);
			if (n)
				b->to_host(k->rctx[r], back, d, n);
			if (n != m || memcmp(back, h, n))
				rc = wk_errf(err, errsz, WK_EFORMAT, "rank %d: the device's image differs "
					     "from the host restore's", r);
		}
		free(back);
	}
	if (rc == WK_OK && b->sync)
		for (int r = 0; rc == WK_OK && r < snap_world(dev); r++)
			rc = b->sync(k->rctx[r], err, errsz);
	snap_close(host);
	return rc;
}

/* The link alone, one device: bytes copied to dev in pieces from one pinned buffer. */
struct link_job {
	const struct backend *b;
	void *ctx, *dev, *stage;
	uint64_t dev_bytes, piece, bytes;
	int rc;
	char err[WK_ERRSZ];
};

static void *link_run(void *arg)
{
	struct link_job *j = arg;
	if (j->b->attach)
		j->b->attach(j->ctx);
	j->rc = WK_OK;
	for (uint64_t off = 0; off < j->bytes && j->rc == WK_OK; off += j->piece) {
		uint64_t n = j->bytes - off < j->piece ? j->bytes - off : j->piece;
		uint64_t at = off % j->dev_bytes;
		if (at + n > j->dev_bytes)
			at = 0;
		j->rc = j->b->stage_put(j->ctx, (char *)j->dev + at, j->stage, n, j->err,
					sizeof j->err);
	}
	if (j->rc == WK_OK)
		j->rc = j->b->stage_wait(j->ctx, j->stage, j->err, sizeof j->err);
	return NULL;
}

/* Every rank's link at once, one thread per device (a sharded restore fills them all at
 * once): seconds from the first copy to the last device done, or < 0 with the message. */
static double link_once(struct link_job *jobs, int world, char *err, size_t errsz)
{
	pthread_t th[BE_SINK_MAX];
	bool started[BE_SINK_MAX] = {false};
	double t0 = wk_now();
	for (int r = 1; r < world; r++)
		started[r] = pthread_create(&th[r], NULL, link_run, &jobs[r]) == 0;
	link_run(&jobs[0]);
	for (int r = 1; r < world; r++) {
		if (started[r])
			pthread_join(th[r], NULL);
		else
			link_run(&jobs[r]);
	}
	double dt = wk_now() - t0;
	for (int r = 0; r < world; r++)
		if (jobs[r].rc != WK_OK) {
			wk_errf(err, errsz, jobs[r].rc, "%s", jobs[r].err);
			return -1;
		}
	return dt;
}

int bench_restore_device(const char *dir, const struct backend *b, int runs, int threads,
			 struct bench_device *out, char *err, size_t errsz)
{
	void *ctx;
	struct be_config bc = {.threads = 1, .device = 0};
	int rc = b->init(&ctx, &bc, err, errsz);
	if (rc != WK_OK)
		return rc;
	/* a sharded snapshot: the sink starts rank r's context on device r, kept for every run */
	struct be_sink k = {.be = b, .ctx = ctx, .raw = b, .threads = 1};
	struct snap_sink sk = be_snap_sink(&k);
	struct snap_open_opts o = {.verify = true, .threads = threads, .sink = &sk};
	double *v = calloc((size_t)4 * runs, sizeof *v), *vo, *vr, *vv; /* snap_timings' parts */
	const uint64_t piece = 64u << 20;
	struct link_job jobs[BE_SINK_MAX];
	memset(jobs, 0, sizeof jobs);
	int world = 1;
	if (!v) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		goto done;
	}
	vo = v + runs, vr = v + 2 * runs, vv = v + 3 * runs;
	/* run -1, not timed: starts the other ranks' contexts and checks every device's bytes */
	for (int r = -1; r < runs; r++) {
		struct snap *s;
		double t0 = wk_now();
		if ((rc = snap_open(dir, &o, &s, err, errsz)) != WK_OK)
			goto done;
		if (r >= 0) {
			const struct snap_timings *tm = snap_timings(s);
			v[r] = wk_now() - t0;
			vo[r] = tm->open_s;
			vr[r] = tm->read_s;
			vv[r] = tm->verify_s;
			out->threads = tm->threads;
		}
		world = snap_world(s);
		if (!snap_on_sink(s)) {
			rc = wk_errf(err, errsz, WK_EUNSUPPORTED, "a snapshot of %d ranks is "
				     "restored into %d %s devices, one a rank, and they could not "
				     "all be started (too few visible?)", world, world, b->name);
			snap_close(s);
			goto done;
		}
		out->bytes = 0;
		for (int i = 0; i < world; i++) {
			snap_image(s, i, &jobs[i].bytes);
			out->bytes += jobs[i].bytes;
		}
		if (r < 0)
			rc = device_identical(&k, s, dir, err, errsz);
		snap_close(s);
		if (rc != WK_OK)
			goto done;
	}
	out->devices = world;
	out->restore_s = cmd_median(v, runs);
	out->open_s = cmd_median(vo, runs);
	out->read_s = cmd_median(vr, runs);
	out->verify_s = cmd_median(vv, runs);
	/* The same with ALT_READERS readers where the default took another number: a warm
	 * restore may be bound by the host's copies and hashing rather than the link, and the
	 * one H200 run that found 4 readers beat 16 had each pin two whole 16 MiB items (the
	 * readers now pin 3 pieces of 2 MiB). One table, so the next GPU run can choose. */
	if (threads <= 0 && out->threads != ALT_READERS) {
		o.threads = ALT_READERS;
		for (int r = 0; r < runs; r++) {
			struct snap *s;
			double t0 = wk_now();
			if ((rc = snap_open(dir, &o, &s, err, errsz)) != WK_OK)
				goto done;
			v[r] = wk_now() - t0;
			out->alt_threads = snap_timings(s)->threads;
			snap_close(s);
		}
		out->alt_s = cmd_median(v, runs);
	}
	for (int i = 0; i < world; i++) {
		struct link_job *j = &jobs[i];
		*j = (struct link_job){.b = b, .ctx = k.rctx[i], .piece = piece,
				       .bytes = j->bytes, .dev_bytes = j->bytes ? j->bytes : 1};
		j->stage = b->stage_alloc(j->ctx, piece);
		j->dev = b->mem_alloc(j->ctx, j->dev_bytes);
		if (!j->stage || !j->dev) {
			rc = wk_errf(err, errsz, WK_ENOMEM, "no memory on device %d for the "
				     "pinned-copy baseline", i);
			goto done;
		}
		memset(j->stage, 0x5a, piece);
	}
	for (int r = 0; r < runs; r++)
		if ((v[r] = link_once(jobs, world, err, errsz)) < 0) {
			rc = WK_EIO;
			goto done;
		}
	out->link_s = cmd_median(v, runs);
	/* What the restore's staging costs to pin, timed alone: each reader thread's piece
	 * buffers (SNAP_SINK_SLOTS of SNAP_SINK_PIECE: the snapshot's raw chunks), allocated,
	 * then freed. */
	out->pins = SNAP_SINK_SLOTS * (out->threads > 0 ? out->threads : 1);
	if (out->pins > 64)
		out->pins = 64;
	{
		void *pin[64] = {0};
		double t0 = wk_now();
		for (int i = 0; i < out->pins; i++)
			if (!(pin[i] = b->stage_alloc(k.rctx[0], SNAP_SINK_PIECE)))
				rc = wk_errf(err, errsz, WK_ENOMEM, "cannot pin %d staging buffers of "
					     "%u bytes", out->pins, SNAP_SINK_PIECE);
		double t1 = wk_now();
		for (int i = 0; i < out->pins; i++)
			if (pin[i])
				b->stage_free(k.rctx[0], pin[i]);
		out->pin_s = t1 - t0;
		out->unpin_s = wk_now() - t1;
	}
done:
	for (int i = 0; i < world; i++) {
		if (jobs[i].stage)
			b->stage_free(jobs[i].ctx, jobs[i].stage);
		if (jobs[i].dev)
			b->mem_free(jobs[i].ctx, jobs[i].dev);
	}
	free(v);
	be_sink_close(&k);
	b->shutdown(ctx);
	return rc;
}

/* One child `wick generate SNAP --tokens 0 -n 0 --verbose`: seconds from spawn to ready, and
 * the seconds it spent reading. Returns 0 or -1. */
static int startup_once(const char *dir, double *to_ready, double *reading)
{
	int pfd[2];
	if (pipe(pfd) != 0)
		return -1;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
	posix_spawn_file_actions_addclose(&fa, pfd[0]);
	char *args[] = {"wick", "generate", (char *)dir, "--tokens", "0", "-n", "0", "--verbose",
			NULL};
	pid_t pid;
	double t0 = wk_now();
	int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	if (rc != 0) {
		close(pfd[0]);
		return -1;
	}
	char buf[8192];
	size_t len = 0;
	ssize_t r;
	while (len < sizeof buf - 1 && (r = read(pfd[0], buf + len, sizeof buf - 1 - len)) > 0)
		len += (size_t)r;
	buf[len] = 0;
	close(pfd[0]);
	int st;
	waitpid(pid, &st, 0);
	char *line = strstr(buf, "{\"startup\"");
	json_t *j = line ? json_loads(line, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
	json_t *s = json_object_get(j, "startup");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !s) {
		fprintf(stderr, "wick bench restore: the start-up child failed: %s\n", buf);
		json_decref(j);
		return -1;
	}
	*to_ready = json_number_value(json_object_get(s, "ready_mono")) - t0;
	*reading = json_number_value(json_object_get(s, "read_s"));
	json_decref(j);
	return 0;
}

/* A whole number in [lo, hi] for flag; 0, or 1 with a message naming it. */
static int count_arg(const char *flag, const char *arg, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(arg, &end, 10);
	if (end == arg || *end || v < lo || v > hi) {
		fprintf(stderr, "wick bench restore: %s wants a whole number from %d to %d, not '%s'\n",
			flag, lo, hi, arg);
		return 1;
	}
	*out = (int)v;
	return 0;
}

int bench_restore(int argc, char **argv)
{
	enum { O_SOURCE = 256, O_RUNS, O_NOCOLD, O_THREADS, O_SRUNS, O_MAP, O_BACKEND };
	static const struct option opts[] = {
		{"source", required_argument, 0, O_SOURCE}, {"runs", required_argument, 0, O_RUNS},
		{"no-cold", no_argument, 0, O_NOCOLD}, {"threads", required_argument, 0, O_THREADS},
		{"startup-runs", required_argument, 0, O_SRUNS}, {"map", required_argument, 0, O_MAP},
		{"backend", required_argument, 0, O_BACKEND},
		{"help", no_argument, 0, 'h'}, CMD_MODEL_OPTIONS,
		{0, 0, 0, 0}};
	const char *source = NULL, *backend = "cpu", *given = NULL;
	int runs = 3, cold = 1, threads = 0, sruns = 5, c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_SOURCE: source = optarg; break;
		case O_RUNS:
			if (count_arg("--runs", optarg, 1, 100, &runs))
				return 2;
			break;
		case O_NOCOLD: cold = 0; break;
		case O_THREADS:
			if (count_arg("--threads", optarg, 0, 1024, &threads))
				return 2;
			break;
		case O_SRUNS:
			if (count_arg("--startup-runs", optarg, 0, 1000, &sruns))
				return 2;
			break;
		case O_BACKEND: backend = optarg; break;
		case 'M': given = optarg; break;
		case O_MAP:
			if (strcmp(optarg, "auto") && strcmp(optarg, "always") && strcmp(optarg, "never")) {
				fprintf(stderr, "wick bench restore: --map is auto, always or never, not "
						"'%s'\n", optarg);
				return 2;
			}
			map_mode = !strcmp(optarg, "always") ? 1 : !strcmp(optarg, "never") ? -1 : 0;
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	const char *dir = cmd_one_model(given, argc, argv, optind);
	if (!dir) {
		usage(stderr);
		return 2;
	}
	char err[WK_ERRSZ], path[4096];
	const struct backend *be = be_find(backend);
	if (!be) {
		fprintf(stderr, "wick bench restore: unknown backend '%s' (cpu, cuda, null)\n",
			backend);
		return 2;
	}
	struct snap *man;
	struct snap_open_opts mo = {.manifest_only = true};
	if (snap_open(dir, &mo, &man, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench restore: %s\n", err);
		return 1;
	}
	json_t *m = snap_manifest(man);
	struct eng_snap_opts so = {.tp = (int)json_integer_value(json_object_get(m, "tp")),
				   .ep = (int)json_integer_value(json_object_get(m, "ep")),
				   .dtype = json_string_value(json_object_get(m, "dtype"))};
	char src[4096];
	snprintf(src, sizeof src, "%s",
		 source ? source : json_string_value(json_object_get(json_object_get(m, "source"), "dir")));
	struct files rank = {0}, hf = {0};
	size_t i;
	json_t *rk;
	int rc = 1;
	json_array_foreach(json_object_get(m, "ranks"), i, rk) {
		snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(rk, "file")));
		if (add_file(&rank, path))
			goto out;
	}
	struct hf_model *h;
	if (hf_open(src, &h, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench restore: the source checkpoint: %s\n", err);
		goto out;
	}
	for (i = 0; i < hf_shard_count(h); i++)
		if (add_file(&hf, st_path(hf_shard(h, i)))) {
			hf_close(h);
			goto out;
		}
	hf_close(h);

	uint64_t bytes;
	if (check_identical(dir, src, &so, &bytes))
		goto out;

	double t[3][2] = {{0}}; /* [plain, naive, restore][warm, cold] */
	double *v = calloc((size_t)runs, sizeof *v);
	if (!v)
		goto out;
	for (int mode = 0; mode < 1 + cold; mode++) {
		for (int which = 0; which < 3; which++) {
			for (int r = 0; r < runs; r++) {
				const struct files *f = which == 1 ? &hf : &rank;
				if (mode == 1)
					drop_cache(f);
				else if (r == 0)
					plain_read(f); /* warm it */
				v[r] = which == 0 ? plain_read(f)
				       : which == 1 ? do_naive(src, &so, err, sizeof err)
						    : do_restore(dir, threads, err, sizeof err);
				if (v[r] < 0) {
					fprintf(stderr, "wick bench restore: %s\n", err);
					free(v);
					goto out;
				}
			}
			t[which][mode] = cmd_median(v, runs);
		}
	}
	free(v);

	struct bench_device db = {0};
	if (be_streams(be) && bench_restore_device(dir, be, runs, threads, &db, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick bench restore: into %s memory: %s\n", be->name, err);
		goto out;
	}

	double fixed = -1, ready = -1, reading = 0;
	if (sruns > 0) {
		double *a = calloc((size_t)sruns, sizeof *a), *b = calloc((size_t)sruns, sizeof *b);
		double *fx = calloc((size_t)sruns, sizeof *fx);
		int ok = a && b && fx;
		startup_once(dir, &ready, &reading); /* warm-up: the binary and the files */
		for (int r = 0; ok && r < sruns; r++) {
			ok = startup_once(dir, &a[r], &b[r]) == 0;
			if (ok)
				fx[r] = a[r] - b[r];
		}
		if (ok) {
			fixed = cmd_median(fx, sruns);
			ready = cmd_median(a, sruns);
			reading = cmd_median(b, sruns);
		}
		free(a);
		free(b);
		free(fx);
		if (!ok)
			goto out;
	}

	const char *names[3] = {"plain read (1 MiB buffered, rank files)",
				"naive (mmap safetensors + transform)", "restore (wick snapshot)"};
	printf("snapshot       %s: %.1f MB of weights in %d rank file(s) (%.1f MB on disk)\n", dir,
	       bytes / 1e6, rank.n, rank.bytes / 1e6);
	printf("source         %s: %.1f MB in %d file(s)\n", src, hf.bytes / 1e6, hf.n);
	printf("identical      restore and naive leave the same bytes in memory\n");
	printf("%-42s %10s %8s %10s %8s\n", "median of runs", "warm s", "GB/s", "cold s", "GB/s");
	for (int w = 0; w < 3; w++) {
		printf("%-42s %10.3f %8.2f", names[w], t[w][0], bytes / t[w][0] / 1e9);
		if (cold)
			printf(" %10.3f %8.2f", t[w][1], bytes / t[w][1] / 1e9);
		printf("\n");
	}
	printf("restore / plain   warm %.2fx%s", t[0][0] / t[2][0], cold ? "" : "\n");
	if (cold)
		printf("   cold %.2fx\n", t[0][1] / t[2][1]);
	printf("restore / naive   warm %.2fx%s", t[1][0] / t[2][0], cold ? "" : "\n");
	if (cold)
		printf("   cold %.2fx\n", t[1][1] / t[2][1]);
	if (db.restore_s > 0) {
		printf("into %s memory (warm, %.1f MB of images on %d device%s, one a rank; every "
		       "device's bytes checked against the host restore)\n", be->name,
		       db.bytes / 1e6, db.devices, db.devices == 1 ? "" : "s");
		printf("%-42s %10.3f %8.2f\n", "restore through pinned staging", db.restore_s,
		       db.bytes / db.restore_s / 1e9);
		if (db.alt_s > 0)
			printf("restore through pinned staging, %2d readers %10.3f %8.2f   (%.2fx the "
			       "speed of the default's %d)\n", db.alt_threads, db.alt_s,
			       db.bytes / db.alt_s / 1e9, db.restore_s / db.alt_s, db.threads);
		printf("  of which: open %.3f s (manifest, files, device images), readers %.3f s "
		       "(%d threads; hashing %.3f s summed over them)\n", db.open_s, db.read_s,
		       db.threads, db.verify_s);
		printf("  pinning its staging alone (%d x %u MiB): %.3f s, unpinning %.3f s\n",
		       db.pins, SNAP_SINK_PIECE >> 20, db.pin_s, db.unpin_s);
		printf("%-42s %10.3f %8.2f\n", db.devices == 1 ? "pinned copy (one buffer, no disk)"
		       : "pinned copies (a buffer a device, no disk)", db.link_s,
		       db.bytes / db.link_s / 1e9);
		printf("restore / pinned copy   %.2f of the link\n", db.link_s / db.restore_s);
	} else if (strcmp(be->name, "cpu")) {
		printf("into %s memory: not measured (the backend keeps weights in host memory)\n",
		       be->name);
	}
	if (fixed >= 0)
		printf("cold-start fixed cost  %.1f ms (spawn to ready %.1f ms, minus %.1f ms moving "
		       "bytes; median of %d)\n", fixed * 1e3, ready * 1e3, reading * 1e3, sruns);
	json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:{s:f, s:f, s:f}, s:{s:f, s:f, s:f},"
			      " s:f, s:f, s:f, s:f, s:f}",
			      "bench", "restore", "snapshot", dir, "bytes", (json_int_t)bytes, "runs", runs,
			      "warm_s", "plain", t[0][0], "naive", t[1][0], "restore", t[2][0],
			      "cold_s", "plain", t[0][1], "naive", t[1][1], "restore", t[2][1],
			      "warm_restore_vs_plain", t[0][0] / t[2][0],
			      "cold_restore_vs_plain", cold ? t[0][1] / t[2][1] : 0.0,
			      "warm_restore_vs_naive", t[1][0] / t[2][0],
			      "cold_restore_vs_naive", cold ? t[1][1] / t[2][1] : 0.0,
			      "fixed_startup_ms", fixed * 1e3);
	/* what was not measured is null, not a number that reads as one (-1000 ms, ratio 0) */
	if (j && !cold) {
		json_object_set_new(j, "cold_restore_vs_plain", json_null());
		json_object_set_new(j, "cold_restore_vs_naive", json_null());
	}
	if (j && fixed < 0)
		json_object_set_new(j, "fixed_startup_ms", json_null());
	if (j && db.restore_s > 0)
		json_object_set_new(j, "device", json_pack("{s:s, s:i, s:I, s:f, s:f, s:f, s:f}",
							   "backend", be->name, "devices",
							   db.devices, "bytes", (json_int_t)db.bytes,
							   "restore_s", db.restore_s, "link_s",
							   db.link_s, "restore_gbps",
							   db.bytes / db.restore_s / 1e9,
							   "restore_vs_link",
							   db.link_s / db.restore_s));
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
	if (s)
		printf("%s\n", s);
	free(s);
	json_decref(j);
	rc = 0;
out:
	free_files(&rank);
	free_files(&hf);
	snap_close(man);
	return rc;
}
