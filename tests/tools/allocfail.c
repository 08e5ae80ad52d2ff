/*
 * allocfail - allocation-failure injection, the way curl and sqlite test: run an operation
 * with its Nth allocation failing, for every N from 1 until a run makes fewer than N
 * allocations. Every run must end without a crash, return either success or a clean error
 * (a WK_E* code and a message), and leave no allocation behind (the live byte count after
 * the operation's cleanup equals the count before it).
 *
 *   allocfail safetensors FILE        st_open + st_close
 *   allocfail hf DIR                  hf_open + hf_close (config.json + shards)
 *   allocfail tokenizer TOKENIZER_JSON  tok_load, an encode and a decode, tok_free
 *   allocfail tokenizer-prepared FILE   the same with tok_load_prepared: FILE (a snapshot's
 *                                     tokenizer.prepared) checked against the tokenizer.json
 *                                     beside it
 *   allocfail snapshot SNAP           snap_open (restore, verify) + snap_close
 *   allocfail engine MODEL            eng_open (a Hugging Face dir or a snapshot) + eng_close
 *   allocfail engine-notok MODEL      the same, tokenizer.json left unread (no_tokenizer)
 *   allocfail job FILE                job_decode + job_free
 *
 * ALLOCFAIL_ONLY=N runs the one failure in-process, for a debugger.
 *
 * malloc, calloc, realloc and free are replaced for the whole process (glibc routes its own
 * internal allocations, strdup's included, through them) and forward to glibc's __libc_*.
 * Built without sanitizers only: ASan owns malloc.
 *
 * Each N runs in a forked child, so one crash cannot hide the next. A crash after a failure
 * injected inside jansson's parser (json_loadb, json_loads: this tool wraps them to know) is
 * not ours and is counted apart: jansson 2.14's parser is not safe against allocation failure
 * (its lexer ignores a failed append to its token buffer and trips assert(0) in
 * lex_scan_string, or reports a NUL byte it never read and leaks; its error path can free a
 * half-built value twice, which crashes later).
 * Any other crash, leak, or error without a message fails the run.
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <jansson.h>
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coldstart/hfmodel.h"
#include "coldstart/safetensors.h"
#include "coldstart/snapshot.h"
#include "common/wk.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "worker/job.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#endif

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static atomic_long n_alloc;     /* allocations counted since arming */
static atomic_long fail_at;     /* fail the allocation with this count; 0 = never */
static atomic_long live_bytes;  /* usable bytes of every block not yet freed */
static atomic_int failed;       /* the injected failure happened */
static _Thread_local volatile sig_atomic_t in_parser; /* this thread is in jansson's json_load* */
static volatile sig_atomic_t failed_in_parser; /* the injected failure hit jansson's parser */

#ifndef SANITIZED
static bool should_fail(void)
{
	long f = atomic_load(&fail_at);
	if (!f)
		return false;
	long k = atomic_fetch_add(&n_alloc, 1) + 1;
	if (k == f) {
		atomic_store(&failed, 1);
		failed_in_parser = in_parser;
		return true;
	}
	return false;
}

static void *track(void *p)
{
	if (p)
		atomic_fetch_add(&live_bytes, (long)malloc_usable_size(p));
	return p;
}

void *malloc(size_t n)
{
	return should_fail() ? NULL : track(__libc_malloc(n));
}

void *calloc(size_t a, size_t b)
{
	return should_fail() ? NULL : track(__libc_calloc(a, b));
}

void *realloc(void *p, size_t n)
{
	if (!p)
		return malloc(n);
	if (n == 0) {
		free(p);
		return NULL;
	}
	if (should_fail())
		return NULL; /* p stays valid, as realloc promises */
	long old = (long)malloc_usable_size(p);
	void *q = __libc_realloc(p, n);
	if (q)
		atomic_fetch_add(&live_bytes, (long)malloc_usable_size(q) - old);
	return q;
}

void free(void *p)
{
	if (p)
		atomic_fetch_sub(&live_bytes, (long)malloc_usable_size(p));
	__libc_free(p);
}
#endif

json_t *json_loadb(const char *buf, size_t len, size_t flags, json_error_t *error)
{
	static json_t *(*real)(const char *, size_t, size_t, json_error_t *);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "json_loadb");
	in_parser++;
	json_t *j = real(buf, len, flags, error);
	in_parser--;
	return j;
}

json_t *json_loads(const char *str, size_t flags, json_error_t *error)
{
	static json_t *(*real)(const char *, size_t, json_error_t *);
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "json_loads");
	in_parser++;
	json_t *j = real(str, flags, error);
	in_parser--;
	return j;
}

static void on_crash(int sig)
{
	static const char msg[] = "\nallocfail: crashed after a failure inside jansson's parser\n";
	if (failed_in_parser)
		(void)!write(2, msg, sizeof msg - 1);
	void *pcs[32];
	backtrace_symbols_fd(pcs, backtrace(pcs, 32), 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

/* ---- the operations ---- */

typedef int (*op_fn)(const char *arg, char *err, size_t errsz);

#define BLAMES_THE_JOB (-1000)

static int op_safetensors(const char *arg, char *err, size_t errsz)
{
	struct st_file *f;
	int rc = st_open(arg, &f, err, errsz);
	if (rc == WK_OK)
		st_close(f);
	return rc;
}

static int op_hf(const char *arg, char *err, size_t errsz)
{
	struct hf_model *m;
	int rc = hf_open(arg, &m, err, errsz);
	if (rc == WK_OK)
		hf_close(m);
	return rc;
}

/* An encode and a decode through a loaded tokenizer, then tok_free. */
static int tok_use(struct tok *t, char *err, size_t errsz)
{
	static const char text[] = "Once upon a time, a little dog said \"hi\" \xe2\x9c\x93.";
	int *ids = NULL, n = 0;
	int rc = tok_encode(t, text, sizeof text - 1, true, &ids, &n, err, errsz);
	if (rc == WK_OK) {
		char *s = NULL;
		size_t len = 0;
		rc = tok_decode(t, ids, n, true, &s, &len, err, errsz);
		free(s);
	}
	free(ids);
	tok_free(t);
	return rc;
}

static int op_tokenizer(const char *arg, char *err, size_t errsz)
{
	struct tok *t;
	int rc = tok_load(arg, &t, err, errsz);
	return rc == WK_OK ? tok_use(t, err, errsz) : rc;
}

/* tok_load_prepared itself, not tok_load_dir: a missing or stale prepared file must fail the
 * clean run, not fall back to the tokenizer.json unnoticed. */
static int op_tokenizer_prepared(const char *arg, char *err, size_t errsz)
{
	char json[4096];
	const char *slash = strrchr(arg, '/');
	int dir = slash ? (int)(slash - arg + 1) : 0;
	if (snprintf(json, sizeof json, "%.*stokenizer.json", dir, arg) >= (int)sizeof json)
		return wk_errf(err, errsz, WK_ELIMIT, "%s: path too long", arg);
	struct tok *t;
	int rc = tok_load_prepared(arg, json, &t, err, errsz);
	return rc == WK_OK ? tok_use(t, err, errsz) : rc;
}

static int op_snapshot(const char *arg, char *err, size_t errsz)
{
	struct snap_open_opts o = {.verify = true, .threads = 2, .map = -1};
	struct snap *s;
	int rc = snap_open(arg, &o, &s, err, errsz);
	if (rc == WK_OK)
		snap_close(s);
	return rc;
}

static int engine_open(const char *arg, bool no_tokenizer, char *err, size_t errsz)
{
	struct eng_opts o = {.backend = "cpu", .threads = 1, .max_seq = 64, .max_seqs = 2,
			     .no_tokenizer = no_tokenizer};
	struct engine *e;
	int rc = eng_open(arg, &o, &e, err, errsz);
	if (rc == WK_OK)
		eng_close(e);
	return rc;
}

static int op_engine(const char *arg, char *err, size_t errsz)
{
	return engine_open(arg, false, err, errsz);
}

static int op_engine_notok(const char *arg, char *err, size_t errsz)
{
	return engine_open(arg, true, err, errsz);
}

static char *job_body;
static size_t job_len;

static int op_job(const char *arg, char *err, size_t errsz)
{
	(void)arg;
	struct job j;
	enum job_err je = job_decode(job_body, job_len, "file-stem", &j, err, errsz);
	job_free(&j);
	/* A job that cannot be decoded for lack of memory must say so (internal), not blame the
	 * job: a worker would fail it for good as invalid. */
	if (je != JOB_OK && je != JOB_EINTERNAL && atomic_load(&failed))
		return BLAMES_THE_JOB;
	return je == JOB_OK ? WK_OK : WK_ENOMEM;
}

int main(int argc, char **argv)
{
#ifdef SANITIZED
	(void)argc;
	(void)argv;
	printf("SKIP: allocfail replaces malloc, which a sanitizer build owns\n");
	return 0;
#endif
	static const struct {
		const char *name;
		op_fn fn;
	} ops[] = {{"safetensors", op_safetensors}, {"hf", op_hf},
		   {"tokenizer", op_tokenizer},       {"tokenizer-prepared", op_tokenizer_prepared},
		   {"snapshot", op_snapshot},         {"engine", op_engine},
		   {"engine-notok", op_engine_notok}, {"job", op_job}};
	if (argc != 3) {
		fprintf(stderr, "usage: allocfail safetensors|hf|tokenizer|tokenizer-prepared|"
			"snapshot|engine|engine-notok|job PATH\n");
		return 2;
	}
	op_fn fn = NULL;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		if (!strcmp(argv[1], ops[i].name))
			fn = ops[i].fn;
	if (!fn) {
		fprintf(stderr, "allocfail: unknown operation '%s'\n", argv[1]);
		return 2;
	}
	char err[WK_ERRSZ];
	if (fn == op_job) {
		char *b;
		if (wk_read_file(argv[2], 1 << 24, &b, &job_len, err, sizeof err) != WK_OK) {
			fprintf(stderr, "allocfail: %s\n", err);
			return 1;
		}
		job_body = b;
	}
	/* a clean run first: it must succeed */
	if (fn(argv[2], err, sizeof err) != WK_OK) {
		fprintf(stderr, "allocfail: %s %s fails without injection: %s\n", argv[1], argv[2], err);
		return 1;
	}
	if (getenv("ALLOCFAIL_ONLY")) { /* one N, in this process: for a debugger */
		atomic_store(&fail_at, atol(getenv("ALLOCFAIL_ONLY")));
		int rc = fn(argv[2], err, sizeof err);
		printf("rc %d: %s\n", rc, err);
		return 0;
	}
	char logpath[] = "/tmp/wick-allocfail-XXXXXX";
	int logfd = mkstemp(logpath);
	if (logfd < 0) {
		perror("allocfail: mkstemp");
		return 1;
	}
	unlink(logpath);
	long base_allocs = 0, n, errors = 0, library_aborts = 0;
	enum { C_OK, C_DONE, C_LEAK = 3, C_NOMSG, C_CLEANFAIL, C_JANSSON_LEAK };
	/* jansson seeds its hash tables at random on first use; a fixed seed, set before the
	 * children fork, makes every run of this tool take the same allocations */
	json_object_seed(0x5eed);
	for (n = 1;; n++) {
		if (ftruncate(logfd, 0) != 0 || lseek(logfd, 0, SEEK_SET) != 0)
			return 1;
		pid_t pid = fork();
		if (pid < 0) {
			perror("allocfail: fork");
			return 1;
		}
		if (pid == 0) {
			dup2(logfd, 2);
			signal(SIGSEGV, on_crash);
			signal(SIGABRT, on_crash);
			signal(SIGBUS, on_crash);
			atomic_store(&n_alloc, 0);
			long before = atomic_load(&live_bytes);
			err[0] = 0;
			atomic_store(&fail_at, n);
			int rc = fn(argv[2], err, sizeof err);
			atomic_store(&fail_at, 0);
			long after = atomic_load(&live_bytes);
			long made = atomic_load(&n_alloc);
			if (after != before) {
				fprintf(stderr, "failing allocation %ld of %ld leaks %ld bytes (rc %d: %s)\n",
					n, made, after - before, rc, err);
				/* a failure inside jansson's parser: its error path leaks (it also
				 * reports a NUL byte it never read), as it can crash; not ours */
				_exit(failed_in_parser ? C_JANSSON_LEAK : C_LEAK);
			}
			if (rc == BLAMES_THE_JOB) {
				fprintf(stderr, "failing allocation %ld makes the job look invalid: %s\n",
					n, err);
				_exit(C_NOMSG);
			}
			if (rc != WK_OK && !err[0]) {
				fprintf(stderr, "failing allocation %ld gives error %d with no message\n", n, rc);
				_exit(C_NOMSG);
			}
			if (!atomic_load(&failed)) {
				fprintf(stderr, "%ld\n", made);
				_exit(rc == WK_OK ? C_DONE : C_CLEANFAIL);
			}
			_exit(rc == WK_OK ? C_OK : C_OK + 10);
		}
		int st;
		waitpid(pid, &st, 0);
		char log[8192] = {0};
		if (pread(logfd, log, sizeof log - 1, 0) < 0)
			log[0] = 0;
		if (WIFSIGNALED(st)) {
			if (strstr(log, "crashed after a failure inside jansson's parser")) {
				library_aborts++;
				continue;
			}
			fprintf(stderr, "allocfail: %s: failing allocation %ld crashes (signal %d)\n%s",
				argv[1], n, WTERMSIG(st), log);
			return 1;
		}
		int code = WEXITSTATUS(st);
		if (code == C_JANSSON_LEAK) {
			library_aborts++;
			continue;
		}
		if (code == C_OK || code == C_OK + 10) {
			errors += code == C_OK + 10;
			continue;
		}
		if (code == C_DONE) {
			base_allocs = atol(log);
			break;
		}
		fprintf(stderr, "allocfail: %s: %s", argv[1],
			code == C_CLEANFAIL ? "a run with no failure failed\n" : log);
		return 1;
	}
	close(logfd);
	free(job_body);
	printf("allocfail %s: %ld allocations, each failed in turn: %ld clean errors, %ld "
	       "tolerated, no crash, no leak (%ld crashed or leaked after a failure inside jansson's "
	       "parser)\n", argv[1],
	       base_allocs, errors, n - 1 - errors - library_aborts, library_aborts);
	return 0;
}
