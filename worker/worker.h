/*
 * worker.h - the production worker (worker.c) and what it is told: `wick worker`'s and
 * `wick dev`'s options, parsed and checked by cmd_worker.c. The lifecycle, the exit statuses
 * and the threads are described at the top of worker.c.
 */
#ifndef WORKER_H
#define WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/cmd.h"
#include "worker/http_api.h"
#include "worker/sched.h"

#define WORKER_MAX_CONCURRENCY 1024
#define WORKER_MAX_PREPARERS 16
/* A job document of this many bytes or more is prepared (decoded, its prompt rendered and
 * encoded) by a preparer thread while the engine has work, not between its steps. */
#define WORKER_PREPARE_MIN (16u << 10)

/* Every field is checked by the caller (cmd_worker.c): worker_run trusts them. The strings
 * are borrowed for the run. */
struct worker_opts {
	struct cmd_engine ce;   /* the model and the engine's flags */
	const char *queue_url;  /* NULL: --listen alone */
	const char *step_log_path, *name_opt;
	const char *done_url, *ping_url, *stream_url; /* http(s):// queues (RunPod) */
	int concurrency, max_jobs; /* [1, WORKER_MAX_CONCURRENCY]; 0: no limit */
	int speculate;          /* sched_set_speculate's max_draft: 0 off */
	int prepare_threads;    /* --prepare-threads: preparers (0: jobs are prepared between
				 * the engine's steps) */
	int speculate_max_batch; /* sched_set_speculate_max_batch: 0 no limit */
	double draft_cost;      /* sched_set_draft_cost: SCHED_COST_AUTO measured */
	bool no_prefix_cache;   /* --prefix-cache off: sched_set_prefix_cache stays off */
	int prefix_wait;        /* --prefix-wait: sched_set_prefix_wait (-1: its default) */
	const char *prefix_dir; /* --prefix-cache-dir: the cache kept across restarts
				 * (prefix_store.h), or NULL */
	uint64_t prefix_max;    /* --prefix-cache-max: its file's bytes at most (0: no bound) */
	double idle_timeout, startup_timeout, drain_timeout, max_lifetime, lease_s, step_timeout;
	double queue_outage;    /* --queue-outage: how long a queue outage is ridden out */
	bool json_logs;
	/* usage accounting (worker/ledger.h) */
	const char *ledger_path, *usage_url, *gpu_type;
	int64_t price_micro;    /* per hour of the whole worker */
	int gpus;
	double tick_s;
	struct http_api_opts ho; /* the OpenAI endpoint: ho.listen NULL for none */
};

/* The defaults of `wick worker` (its --help): 8 jobs at once, 60 s idle, 8 x H200 at $36.31
 * an hour. */
#define WORKER_OPTS_DEFAULT                                                                    \
	{ .concurrency = 8, .idle_timeout = 60, .startup_timeout = 600, .step_timeout = 300,     \
	  .drain_timeout = 30, .lease_s = 60, .queue_outage = 60, .gpus = 8, .gpu_type = "H200",  \
	  .price_micro = 36310000, .draft_cost = SCHED_COST_AUTO,                               \
	  .prefix_wait = -1, .prepare_threads = 1 }

/* Runs the worker from its start to its exit: starts the engine, takes and runs jobs until
 * it is idle, drained or told to stop, hands back what it holds and closes its books. The
 * options are copied. Returns the process's exit status: 0 (idle, drained, recycled), 1 (the
 * start failed), 2 (a bad --listen address), 3 (the engine failed: its jobs went back), 4
 * (the queue was lost). Installs SIGTERM and SIGINT handlers and a watchdog thread: one run
 * per process. */
int worker_run(const struct worker_opts *o);

#endif
