/*
 * cmd_submit.c - `wick submit --queue URL`: enqueue one job, and with --wait print its result.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/wk.h"
#include "worker/cmd.h"
#include "worker/job.h"
#include "worker/queue.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wick submit --queue URL (-p TEXT | --file JOB.json | --stdin) [options]\n"
		"       wick submit --queue URL --cancel ID\n\n"
		"Enqueues one job and prints its id, or with --wait its result JSON.\n"
		"A job file holds {\"id\", \"tenant\", \"input\": {\"prompt\" | \"messages\", ...}, \"timeout_s\"};\n"
		"an id is made when it has none.\n\n"
		"  -q, --queue URL        spool:DIR, redis://HOST:PORT/STREAM?group=G, ...\n"
		"  -p, --prompt TEXT      a job with this prompt\n"
		"      --file JOB.json    the job from a file\n"
		"      --stdin            the job from standard input\n"
		"      --id ID            the job id ([A-Za-z0-9._-]{1,128}; default: made up)\n"
		"      --tenant T         the job's tenant\n"
		"  -n, --max-tokens N     input.max_tokens\n"
		"      --temperature T    input.temperature\n"
		"      --seed S           input.seed\n"
		"      --no-check         enqueue the job even when it would fail validation\n"
		"  -w, --wait             wait for the result and print it (exit 1 unless COMPLETED)\n"
		"      --stream           --wait, with input.stream true: first the text as it is made,\n"
		"                         a line {\"output\": {\"text\": PIECE}, \"attempt\": N} a piece\n"
		"                         (a job run again starts again: attempt N+1), then the result\n"
		"                         (redis:// queues)\n"
		"      --timeout S        how long --wait waits (default 600)\n"
		"      --cancel ID        ask that job ID be cancelled, and exit\n");
}

/* job-<ms since epoch, hex>-<8 random hex digits>: sortable by time, unique enough */
static void make_id(char *out, size_t outsz)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned r = 0;
	if (getrandom(&r, sizeof r, 0) != sizeof r)
		r = (unsigned)ts.tv_nsec ^ (unsigned)rand();
	snprintf(out, outsz, "job-%llx-%08x", (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000, r);
}

static char *read_stream(FILE *f, size_t max, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *p = malloc(cap);
	while (p) {
		if (n + 1 >= cap) {
			if (cap > max + 1) {
				free(p);
				return NULL;
			}
			char *q = realloc(p, cap * 2);
			if (!q) {
				free(p);
				return NULL;
			}
			p = q;
			cap *= 2;
		}
		size_t r = fread(p + n, 1, cap - n - 1, f);
		n += r;
		if (r == 0)
			break;
	}
	if (p && n > max) {
		free(p);
		return NULL;
	}
	if (p)
		p[n] = 0;
	*len = n;
	return p;
}

struct sub_opts {
	const char *prompt, *file, *id, *tenant;
	bool from_stdin, no_check, wait, stream;
	json_int_t max_tokens, seed;
	double temperature;
	bool has_max_tokens, has_seed, has_temperature;
};

/* Builds the job JSON (malloc'd) and its id into id[]. Returns 0, or 1/2 with a message. */
static int build(const struct sub_opts *o, char *id, size_t idsz, char **out, size_t *outlen)
{
	json_t *job = NULL;
	char *raw = NULL;
	size_t rawlen = 0;
	int rc = 1;
	if (o->prompt) {
		job = json_pack("{s:{s:s}}", "input", "prompt", o->prompt);
		if (!job) {
			fprintf(stderr, "wick: the prompt is not valid UTF-8\n");
			return 1;
		}
	} else {
		char err[WK_ERRSZ];
		if (o->file) {
			if (wk_read_file(o->file, JOB_BODY_MAX, &raw, &rawlen, err, sizeof err) != WK_OK) {
				fprintf(stderr, "wick: %s\n", err);
				return 1;
			}
		} else if (!(raw = read_stream(stdin, JOB_BODY_MAX, &rawlen))) {
			fprintf(stderr, "wick: could not read the job from stdin (at most %u bytes)\n", JOB_BODY_MAX);
			return 1;
		}
		json_error_t jerr;
		job = json_loadb(raw, rawlen, 0, &jerr);
		if (!job || !json_is_object(job)) {
			if (!o->no_check) {
				fprintf(stderr, "wick: the job is not a JSON object%s%s\n", job ? "" : ": ", job ? "" : jerr.text);
				goto out;
			}
			/* --no-check: send the bytes as they are (to test how workers fail them) */
			json_decref(job);
			job = NULL;
		}
	}
	if (job) {
		json_t *jid = json_object_get(job, "id");
		if (jid && !json_is_null(jid) && !json_is_string(jid) && !o->no_check) {
			/* a number here would have been swapped for a made-up id, silently */
			fprintf(stderr, "wick: the job's \"id\" must be a string\n");
			goto out;
		}
		if (json_is_string(jid) && o->id && strcmp(o->id, json_string_value(jid))) {
			fprintf(stderr, "wick: --id %s but the job's id is %s\n", o->id, json_string_value(jid));
			goto out;
		}
		if (json_is_string(jid))
			snprintf(id, idsz, "%s", json_string_value(jid));
		else if (o->id)
			snprintf(id, idsz, "%s", o->id);
		else
			make_id(id, idsz);
		/* id first, then the rest in their order, for people reading the spool */
		json_t *ordered = json_object();
		json_object_set_new(ordered, "id", json_string(id));
		json_object_del(job, "id");
		json_object_update(ordered, job);
		json_decref(job);
		job = ordered;
		json_t *in = json_object_get(job, "input");
		if (o->tenant)
			json_object_set_new(job, "tenant", json_string(o->tenant));
		if (json_is_object(in)) {
			if (o->has_max_tokens)
				json_object_set_new(in, "max_tokens", json_integer(o->max_tokens));
			if (o->has_seed)
				json_object_set_new(in, "seed", json_integer(o->seed));
			if (o->has_temperature)
				json_object_set_new(in, "temperature", json_real(o->temperature));
			if (o->stream)
				json_object_set_new(in, "stream", json_true());
		}
		*out = json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!*out) {
			fprintf(stderr, "wick: out of memory\n");
			goto out;
		}
		*outlen = strlen(*out);
	} else {
		if (o->id)
			snprintf(id, idsz, "%s", o->id);
		else
			make_id(id, idsz);
		*out = raw;
		*outlen = rawlen;
		raw = NULL;
	}
	if (!job_id_valid(id)) {
		fprintf(stderr, "wick: job id '%.140s' must match [A-Za-z0-9._-]{1,%d}\n", id, JOB_ID_MAX);
		free(*out);
		*out = NULL;
		goto out;
	}
	if (!o->no_check) {
		struct job j;
		char err[WK_ERRSZ];
		enum job_err e = job_decode(*out, *outlen, id, &j, err, sizeof err);
		job_free(&j);
		if (e != JOB_OK) {
			fprintf(stderr, "wick: the job would fail with %s: %s (--no-check sends it anyway)\n",
				job_err_code(e), err);
			free(*out);
			*out = NULL;
			goto out;
		}
	}
	rc = 0;
out:
	json_decref(job);
	free(raw);
	return rc;
}

/* --stream: a piece of the text as it comes, one JSON line. */
static void print_piece(void *ctx, const char *text, size_t len, int attempt)
{
	(void)ctx;
	size_t n = 0;
	char *line = job_stream_chunk(text, len, attempt, &n);
	if (line) {
		fwrite(line, 1, n, stdout);
		putchar('\n');
		fflush(stdout);
	}
	free(line);
}

static int number(const char *arg, const char *flag, double lo, double hi, double *v)
{
	char *end;
	errno = 0;
	*v = strtod(arg, &end);
	if (end == arg || *end || errno || !(*v >= lo && *v <= hi)) {
		fprintf(stderr, "wick: %s wants a number from %g to %g, not '%s'\n", flag, lo, hi, arg);
		return 2;
	}
	return 0;
}

int cmd_submit(int argc, char **argv)
{
	static const struct option opts[] = {
		{"queue", required_argument, 0, 'q'},  {"prompt", required_argument, 0, 'p'},
		{"file", required_argument, 0, 'f'},   {"stdin", no_argument, 0, 'S'},
		{"id", required_argument, 0, 'i'},     {"tenant", required_argument, 0, 'T'},
		{"max-tokens", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 't'},
		{"seed", required_argument, 0, 's'},   {"no-check", no_argument, 0, 'N'},
		{"wait", no_argument, 0, 'w'},         {"timeout", required_argument, 0, 'W'},
		{"cancel", required_argument, 0, 'C'}, {"help", no_argument, 0, 'h'},
		{"stream", no_argument, 0, 'R'},
		{0, 0, 0, 0}};
	struct sub_opts o = {0};
	const char *url = NULL, *cancel = NULL;
	double timeout = 600, v;
	int c, sources = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "q:p:n:wh", opts, NULL)) != -1) {
		switch (c) {
		case 'q': url = optarg; break;
		case 'p': o.prompt = optarg, sources++; break;
		case 'f': o.file = optarg, sources++; break;
		case 'S': o.from_stdin = true, sources++; break;
		case 'i': o.id = optarg; break;
		case 'T': o.tenant = optarg; break;
		case 'n':
			if (number(optarg, "--max-tokens", -1e9, 1e9, &v))
				return 2;
			o.max_tokens = (json_int_t)v, o.has_max_tokens = true;
			break;
		case 't':
			if (number(optarg, "--temperature", 0, 100, &v))
				return 2;
			o.temperature = v, o.has_temperature = true;
			break;
		case 's':
			if (number(optarg, "--seed", 0, 9e15, &v))
				return 2;
			o.seed = (json_int_t)v, o.has_seed = true;
			break;
		case 'N': o.no_check = true; break;
		case 'w': o.wait = true; break;
		case 'R': o.stream = o.wait = true; break;
		case 'W':
			if (number(optarg, "--timeout", 0, 86400 * 7, &timeout))
				return 2;
			break;
		case 'C': cancel = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "wick: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!url) {
		fprintf(stderr, "wick: submit needs --queue URL\n");
		return 2;
	}
	if (!cancel && sources != 1) {
		fprintf(stderr, "wick: give exactly one of -p TEXT, --file JOB.json, --stdin\n");
		return 2;
	}
	char err[WK_ERRSZ];
	struct queue *q;
	if (queue_open(url, NULL, &q, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick: %s\n", err);
		return 1;
	}
	int rc = 1;
	if (cancel) {
		if (queue_cancel(q, cancel, err, sizeof err) != WK_OK)
			fprintf(stderr, "wick: %s\n", err);
		else
			rc = 0;
		queue_close(q);
		return rc;
	}
	if (o.stream && strcmp(queue_driver(q), "redis")) {
		fprintf(stderr, "wick: --stream reads the job's text from Redis as it is made; a %s "
			"queue has no such stream (--wait gets the whole result)\n", queue_driver(q));
		queue_close(q);
		return 2;
	}
	char id[JOB_ID_MAX + 16];
	char *body = NULL;
	size_t len = 0;
	if (build(&o, id, sizeof id, &body, &len) != 0)
		goto out;
	if (queue_submit(q, id, body, len, err, sizeof err) != WK_OK) {
		fprintf(stderr, "wick: %s\n", err);
		goto out;
	}
	if (!o.wait) {
		printf("%s\n", id);
		rc = 0;
		goto out;
	}
	char *res = NULL;
	size_t rlen = 0;
	if ((o.stream ? queue_wait_stream(q, id, timeout, print_piece, NULL, &res, &rlen, err,
					  sizeof err)
		      : queue_wait_result(q, id, timeout, &res, &rlen, err, sizeof err)) != WK_OK) {
		fprintf(stderr, "wick: %s\n", err);
		goto out;
	}
	fwrite(res, 1, rlen, stdout);
	if (rlen == 0 || res[rlen - 1] != '\n')
		putchar('\n');
	json_t *r = json_loadb(res, rlen, JSON_ALLOW_NUL, NULL);
	const char *st = json_string_value(json_object_get(r, "status"));
	rc = st && !strcmp(st, "COMPLETED") ? 0 : 1;
	json_decref(r);
	free(res);
out:
	free(body);
	queue_close(q);
	return rc;
}
