/*
 * cmd_worker.c - `wick worker`'s command line (and `wick dev`'s, through cmd_worker_as):
 * parses and checks every option into a struct worker_opts, then runs the worker
 * (worker.c). A bad option is a usage error (exit 2) named before anything starts.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/wk.h"
#include "worker/cmd.h"
#include "worker/job.h"
#include "worker/ledger.h"
#include "worker/plan.h"
#include "worker/queue.h"
#include "worker/sched.h"
#include "worker/worker.h"

static const char *cmd_name = "wick worker"; /* its messages' name: wick dev's through it */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick worker --model MODEL (--queue URL | --listen HOST:PORT) [options]\n\n"
		"Pulls jobs from URL (spool:DIR, redis://HOST:PORT/STREAM?group=G,\n"
		"sqs://HOST[:PORT]/ACCOUNT/QUEUE?region=R&results=Q, or a RunPod job-take URL\n"
		"http(s)://.../job-take/$RUNPOD_POD_ID), runs them\n"
		"continuously batched, stores each result before acknowledging the job, and exits 0\n"
		"when the queue has been quiet for --idle-timeout seconds. With --listen it also\n"
		"serves the OpenAI API; its requests share the batch with the queue's jobs.\n"
		"When the engine fails a step, the jobs held go back to the queue and it exits 3.\n"
		"  --concurrency N       jobs held and batched at once (default 8)\n"
		"  --prepare-threads N   threads that decode a big job (16 KB or more) and render\n"
		"                        and encode its prompt while the engine steps, so that\n"
		"                        the batch does not wait on it (0-16; default 1; 0: each\n"
		"                        job between the engine's steps)\n"
		"  --speculate N         jobs draft up to N tokens a step from their prediction and\n"
		"                        their own text (1-16; default 0: off): fewer steps where\n"
		"                        the output repeats them; greedy, the same output\n"
		"  --drafter D           with --speculate, where drafts come from after a job's\n"
		"                        prediction: mtp (the model's MTP layer, loaded for it),\n"
		"                        lookup (the job's own text) or auto (default: mtp where\n"
		"                        the model has one)\n"
		"  --speculate-max-batch N  no drafts in a step of more than N jobs (default 0:\n"
		"                        no limit): a big batch is bound by compute, not by\n"
		"                        reading the weights\n"
		"  --draft-cost C        a draft token's cost against a step's, for how many\n"
		"                        drafts pay (0-16; default auto: measured from the\n"
		"                        steps)\n"
		"  --prefix-cache on|off a finished job's KV cache is kept until its sequence is\n"
		"                        needed, and a later job of the same tenant that begins\n"
		"                        with its tokens runs only the rest (default on)\n"
		"  --prefix-wait N|auto  a job that shares N or more prompt tokens (and half its\n"
		"                        prompt) with a running job's prefill waits a step to\n"
		"                        copy it instead of running them beside it (0 never;\n"
		"                        default auto: 1024 on a GPU, where a step runs short\n"
		"                        prompts nearly free, 2 on the CPU backend)\n"
		"  --prefix-cache-dir DIR  the prefix cache is written to DIR at exit and read\n"
		"                        back at start, so a cold start's first requests reuse\n"
		"                        what the last worker of this model prefilled (a file\n"
		"                        per model, backend and KV cache type; default: none)\n"
		"  --prefix-cache-max SIZE  at most SIZE bytes of it (e.g. 4GB), the most recent\n"
		"                        entries first; after SIGTERM, what the drain's deadline\n"
		"                        leaves (default: no bound)\n"
		"  --idle-timeout S      exit after S quiet seconds (default 60; 0 never)\n"
		"  --startup-timeout S   exit 1 if restore + init take longer (default 600)\n"
		"  --step-timeout S      a step running longer is taken for a hung engine: the\n"
		"                        jobs go back to the queue and it exits 3 (default 300;\n"
		"                        0 never)\n"
		"  --drain-timeout S     on SIGTERM, finish in-flight jobs within S, then hand the\n"
		"                        rest back (default 30)\n"
		"  --max-lifetime S      drain and exit after S seconds (default 0: never)\n"
		"  --max-jobs N          drain and exit after taking N jobs (default 0: no limit)\n"
		"  --lease S             job lease, extended while a job runs (default 60)\n"
		"  --queue-outage S      exit 4 once every call on the queue has failed for S\n"
		"                        seconds (default 60); engine steps go on meanwhile\n"
		"  --ledger PATH         usage ledger (JSON Lines, fsync'd; see `wick usage`)\n"
		"  --ledger-tick S       ledger tick period while running (default 1)\n"
		"  --price-per-hour USD  price of the whole worker (default 36.31: 8xH200)\n"
		"  --price-per-gpu-second USD   instead: price per GPU-second x --gpus\n"
		"  --gpus N, --gpu-type NAME    what is billed (default 8 x H200)\n"
		"  --usage-url URL       post the ledger's events as CloudEvents (needs --ledger)\n"
		"  --worker-id NAME      this worker's name (default HOST-PID)\n"
		"  --step-log PATH       the scheduler's step log, one JSON line per step\n"
		"  --log-format json     one JSON object per log line (default: text)\n"
		"  --done-url URL, --ping-url URL\n"
		"                        http(s):// (RunPod) queues: job-done and ping URLs\n"
		"                        (default: RUNPOD_WEBHOOK_POST_OUTPUT, RUNPOD_WEBHOOK_PING)\n"
		"  --stream-url URL      http(s):// (RunPod) queues: where a job with \"stream\": true\n"
		"                        posts its text as it is made (default:\n"
		"                        RUNPOD_WEBHOOK_POST_STREAM; neither: results come whole)\n"
		"  --backend null        answers at once, no arithmetic (for measuring the queue);\n"
		"                        cpu, cuda and auto as below\n"
		HTTP_API_HELP CMD_ENGINE_HELP);
}

static int parse_num(const char *arg, const char *flag, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(arg, &end);
	if (end == arg || *end || !(v >= lo && v <= hi)) {
		fprintf(stderr, "%s: %s wants a number in [%g, %g], not '%s'\n", cmd_name, flag, lo,
			hi, arg);
		return 2;
	}
	*out = v;
	return 0;
}

int cmd_worker_as(const char *name, int argc, char **argv)
{
	cmd_name = name;
	return cmd_worker(argc, argv);
}

int cmd_worker(int argc, char **argv)
{
	enum { O_QUEUE = 256, O_CONC, O_IDLE, O_STARTUP, O_STEP, O_DRAIN, O_LIFE, O_MAXJOBS, O_LEASE,
	       O_PRICE, O_ID, O_STEPLOG, O_LOGFMT, O_DONE_URL, O_PING_URL, O_STREAM_URL,
	       O_LEDGER, O_TICK, O_PRICE_GPU_S, O_GPUS, O_GPU_TYPE, O_USAGE_URL, O_OUTAGE,
	       O_SPEC, O_DRAFTER, O_SPEC_BATCH, O_DRAFT_COST, O_PREFIX, O_PREFIX_WAIT,
	       O_PREFIX_DIR, O_PREFIX_MAX, O_PREPARE };
	static const struct option opts[] = {
		{"queue", required_argument, 0, O_QUEUE}, {"concurrency", required_argument, 0, O_CONC},
		{"idle-timeout", required_argument, 0, O_IDLE},
		{"startup-timeout", required_argument, 0, O_STARTUP},
		{"step-timeout", required_argument, 0, O_STEP},
		{"drain-timeout", required_argument, 0, O_DRAIN},
		{"max-lifetime", required_argument, 0, O_LIFE},
		{"max-jobs", required_argument, 0, O_MAXJOBS}, {"lease", required_argument, 0, O_LEASE},
		{"queue-outage", required_argument, 0, O_OUTAGE},
		{"speculate", required_argument, 0, O_SPEC},
		{"drafter", required_argument, 0, O_DRAFTER},
		{"speculate-max-batch", required_argument, 0, O_SPEC_BATCH},
		{"draft-cost", required_argument, 0, O_DRAFT_COST},
		{"prefix-cache", required_argument, 0, O_PREFIX},
		{"prefix-wait", required_argument, 0, O_PREFIX_WAIT},
		{"prefix-cache-dir", required_argument, 0, O_PREFIX_DIR},
		{"prefix-cache-max", required_argument, 0, O_PREFIX_MAX},
		{"prepare-threads", required_argument, 0, O_PREPARE},
		{"price-per-hour", required_argument, 0, O_PRICE},
		{"worker-id", required_argument, 0, O_ID}, {"step-log", required_argument, 0, O_STEPLOG},
		{"log-format", required_argument, 0, O_LOGFMT}, {"help", no_argument, 0, 'h'},
		{"done-url", required_argument, 0, O_DONE_URL},
		{"ping-url", required_argument, 0, O_PING_URL},
		{"stream-url", required_argument, 0, O_STREAM_URL},
		{"ledger", required_argument, 0, O_LEDGER},
		{"ledger-tick", required_argument, 0, O_TICK},
		{"price-per-gpu-second", required_argument, 0, O_PRICE_GPU_S},
		{"gpus", required_argument, 0, O_GPUS},
		{"gpu-type", required_argument, 0, O_GPU_TYPE},
		{"usage-url", required_argument, 0, O_USAGE_URL},
		CMD_ENGINE_OPTIONS, HTTP_API_OPTIONS, {0, 0, 0, 0}};
	struct worker_opts w = WORKER_OPTS_DEFAULT;
	int64_t price_gpu_s = 0;
	bool have_gpu_price = false, seen_price = false;
	double v = 0; /* read only when its flag parsed */
	int c, bad = 0;
	const char *drafter = NULL;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case O_QUEUE: w.queue_url = optarg; break;
		case O_CONC:
			bad = parse_num(optarg, "--concurrency", 1, WORKER_MAX_CONCURRENCY, &v);
			w.concurrency = (int)v;
			break;
		case O_SPEC:
			bad = parse_num(optarg, "--speculate", 0, SCHED_DRAFT_MAX, &v);
			w.speculate = (int)v;
			break;
		case O_PREPARE:
			bad = parse_num(optarg, "--prepare-threads", 0, WORKER_MAX_PREPARERS, &v);
			w.prepare_threads = (int)v;
			break;
		case O_SPEC_BATCH:
			bad = parse_num(optarg, "--speculate-max-batch", 0, WORKER_MAX_CONCURRENCY, &v);
			w.speculate_max_batch = (int)v;
			break;
		case O_DRAFT_COST:
			if (strcmp(optarg, "auto"))
				bad = parse_num(optarg, "--draft-cost", 0, SCHED_COST_MAX,
						&w.draft_cost);
			else
				w.draft_cost = SCHED_COST_AUTO;
			break;
		case O_PREFIX:
			if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
				fprintf(stderr, "%s: --prefix-cache is on or off, not '%s'\n", cmd_name,
					optarg);
				return 2;
			}
			w.no_prefix_cache = !strcmp(optarg, "off");
			break;
		case O_PREFIX_DIR: w.prefix_dir = optarg; break;
		case O_PREFIX_MAX: {
			char perr[WK_ERRSZ];
			if (plan_parse_size(optarg, &w.prefix_max, perr, sizeof perr) != WK_OK) {
				fprintf(stderr, "%s: --prefix-cache-max: %s\n", cmd_name, perr);
				return 2;
			}
			break;
		}
		case O_PREFIX_WAIT:
			if (strcmp(optarg, "auto")) {
				bad = parse_num(optarg, "--prefix-wait", 0, 1 << 30, &v);
				w.prefix_wait = (int)v;
			} else {
				w.prefix_wait = -1;
			}
			break;
		case O_DRAFTER:
			if (strcmp(optarg, "auto") && strcmp(optarg, "mtp") && strcmp(optarg, "lookup")) {
				fprintf(stderr, "%s: --drafter is auto, mtp or lookup, not '%s'\n",
					cmd_name, optarg);
				return 2;
			}
			drafter = optarg;
			break;
		case O_IDLE: bad = parse_num(optarg, "--idle-timeout", 0, 1e9, &w.idle_timeout); break;
		case O_STARTUP:
			bad = parse_num(optarg, "--startup-timeout", 0.001, 1e9, &w.startup_timeout);
			break;
		case O_STEP: bad = parse_num(optarg, "--step-timeout", 0, 1e9, &w.step_timeout); break;
		case O_DRAIN: bad = parse_num(optarg, "--drain-timeout", 0, 1e9, &w.drain_timeout); break;
		case O_LIFE: bad = parse_num(optarg, "--max-lifetime", 0, 1e12, &w.max_lifetime); break;
		case O_MAXJOBS: bad = parse_num(optarg, "--max-jobs", 0, 1e12, &v); w.max_jobs = (int)v; break;
		case O_LEASE: bad = parse_num(optarg, "--lease", 1, 86400, &w.lease_s); break;
		case O_OUTAGE: bad = parse_num(optarg, "--queue-outage", 1, 86400, &w.queue_outage); break;
		case O_PRICE:
		case O_PRICE_GPU_S:
			if (money_parse_micro(optarg, c == O_PRICE ? &w.price_micro : &price_gpu_s) !=
			    WK_OK) {
				fprintf(stderr, "%s: %s wants a dollar amount like 36.31 "
						"(at most 6 decimals), not '%s'\n", cmd_name,
					c == O_PRICE ? "--price-per-hour" : "--price-per-gpu-second",
					optarg);
				return 2;
			}
			if (seen_price && (c == O_PRICE_GPU_S) != have_gpu_price) {
				fprintf(stderr, "%s: give --price-per-hour or "
						"--price-per-gpu-second, not both\n", cmd_name);
				return 2;
			}
			seen_price = true;
			have_gpu_price = c == O_PRICE_GPU_S;
			break;
		case O_LEDGER: w.ledger_path = optarg; break;
		case O_TICK: bad = parse_num(optarg, "--ledger-tick", 0.01, 3600, &w.tick_s); break;
		case O_GPUS: bad = parse_num(optarg, "--gpus", 1, 1024, &v); w.gpus = (int)v; break;
		case O_GPU_TYPE: w.gpu_type = optarg; break;
		case O_USAGE_URL: w.usage_url = optarg; break;
		case O_ID: w.name_opt = optarg; break;
		case O_STEPLOG: w.step_log_path = optarg; break;
		case O_DONE_URL: w.done_url = optarg; break;
		case O_PING_URL: w.ping_url = optarg; break;
		case O_STREAM_URL: w.stream_url = optarg; break;
		case O_LOGFMT:
			if (strcmp(optarg, "json") && strcmp(optarg, "text")) {
				fprintf(stderr, "%s: --log-format is json or text\n", cmd_name);
				return 2;
			}
			w.json_logs = !strcmp(optarg, "json");
			break;
		case 'h': usage(stdout); return 0;
		default:
			if (c >= HTTP_OPT_BASE) {
				if (http_api_flag(&w.ho, c, optarg))
					return 2;
				break;
			}
			if (c < CMD_OPT_BASE || cmd_engine_flag(&w.ce, c, optarg)) {
				usage(stderr);
				return 2;
			}
		}
		if (bad)
			return 2;
	}
	if (drafter && strcmp(drafter, "auto") && !w.speculate) {
		fprintf(stderr, "%s: --drafter %s drafts for --speculate N, which is off\n", cmd_name,
			drafter);
		return 2;
	}
	/* the MTP layer is loaded only to draft with */
	w.ce.o.mtp = !w.speculate || (drafter && !strcmp(drafter, "lookup")) ? ENG_MTP_OFF
		     : drafter && !strcmp(drafter, "mtp")			 ? ENG_MTP_ON
										 : ENG_MTP_AUTO;
	if (cmd_engine_model(&w.ce, argc, argv, optind, 0) || (!w.queue_url && !w.ho.listen)) {
		if (!w.queue_url && !w.ho.listen)
			fprintf(stderr, "%s: --queue URL or --listen HOST:PORT is required\n", cmd_name);
		usage(stderr);
		return 2;
	}
	if (w.queue_url) {
		char qerr[WK_ERRSZ];
		if (queue_check_url(w.queue_url, qerr, sizeof qerr) != WK_OK) {
			fprintf(stderr, "%s: --queue: %s\n", cmd_name, qerr);
			return 2;
		}
	}
	if (w.usage_url && !w.ledger_path) {
		fprintf(stderr, "%s: --usage-url needs --ledger PATH (events are sent from "
				"it)\n", cmd_name);
		return 2;
	}
	if (w.name_opt && !job_id_valid(w.name_opt)) {
		fprintf(stderr, "%s: --worker-id must match [A-Za-z0-9._-]{1,128}\n", cmd_name);
		return 2;
	}
	if (have_gpu_price) {
		__int128 hourly = (__int128)price_gpu_s * 3600 * w.gpus;
		if (hourly > (__int128)MONEY_MAX_DOLLARS * 1000000) {
			fprintf(stderr, "%s: --price-per-gpu-second x 3600 x --gpus is more "
					"than $%lld an hour\n", cmd_name, MONEY_MAX_DOLLARS);
			return 2;
		}
		w.price_micro = (int64_t)hourly;
	}
	return worker_run(&w);
}
