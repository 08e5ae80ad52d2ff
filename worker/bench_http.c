/*
 * bench_http.c - `wick bench http MODEL`: what the HTTP server's parsers
 * (--http-parse-threads) buy. The server thread writes every stream's chunks; a big request
 * (an agent's long conversation) parsed and made into its jobs on that thread holds them all
 * up meanwhile. The bench runs a real `wick worker --listen` with streams decoding while big
 * requests arrive, with --http-parse-threads 0 and 1 in turn, and times, as a client, the
 * gaps between the chunks each stream receives.
 */
#include <curl/curl.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/wk.h"
#include "engine/tokenizer.h"
#include "worker/cmd.h"
#include "worker/job.h"

extern char **environ;

static void usage(FILE *f)
{
	fprintf(f, "usage: wick bench http MODEL [--steady C] [-n TOKENS] [--big B] [--kb K]\n"
		   "                     [--every S] [--rounds R] [--backend B] [--threads T]\n\n"
		   "Runs a real `wick worker --listen` (on a free loopback port) with C streams of\n"
		   "TOKENS tokens (default 4 of 400, the stop ids banned) while B big requests\n"
		   "arrive, one each time the first stream has S more tokens (default 8 every 40):\n"
		   "bodies of K KB (default 512; a long prediction, which the server parses and\n"
		   "checks as it would a long conversation, and which does not take the model's\n"
		   "context). Each round runs the worker with --http-parse-threads 0 (big requests\n"
		   "parsed on the server's thread, which writes the streams' chunks) and 1 (beside\n"
		   "it), both with --prepare-threads 1, R rounds (default 2), and reports the gaps\n"
		   "between two reads that brought a stream's client bytes: the median, the 99th\n"
		   "percentile and the longest. --threads T and --backend B go to the worker.\n");
}

struct http_cfg {
	struct bench_load l;
	int eos, bos;
	const char *filler;
};

struct stream {
	CURL *e;
	struct curl_slist *hd;
	char *body;
	bool big, done, pending;
	long chunks;              /* the reads that brought it bytes (curl_multi_perform's) */
	long events;              /* its SSE events ("data:") */
	double last;              /* wk_now() of its last chunk, or < 0 */
	double sent, answered;    /* wk_now() when it was sent and when its answer ended */
	double *gaps;             /* ms, steady streams' */
	size_t n_gaps, cap;
	char head[256];           /* the start of what came, for errors */
	size_t head_len;
};

/* A read's time: a stream that got bytes in it (pending) records the gap since its last. */
static bool arrived(struct stream *s, double now)
{
	if (!s->pending)
		return true;
	s->pending = false;
	if (s->last >= 0) {
		if (s->n_gaps == s->cap) {
			size_t cap = s->cap ? 2 * s->cap : 1024;
			double *g = realloc(s->gaps, cap * sizeof *g);
			if (!g)
				return false;
			s->gaps = g;
			s->cap = cap;
		}
		s->gaps[s->n_gaps++] = (now - s->last) * 1e3;
	}
	s->last = now;
	s->chunks++;
	return true;
}

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
	struct stream *s = arg;
	size_t k = sz * n;
	if (s->head_len + 1 < sizeof s->head) {
		size_t c = k < sizeof s->head - 1 - s->head_len ? k : sizeof s->head - 1 - s->head_len;
		memcpy(s->head + s->head_len, p, c);
		s->head[s->head_len += c] = 0;
	}
	if (s->big)
		return k;
	s->pending = true;
	for (const char *q = p; (q = memmem(q, (size_t)(p + k - q), "data:", 5)); q += 5)
		s->events++;
	return k;
}

static int add_stream(CURLM *m, struct stream *s, const char *base, json_t *req)
{
	char url[320];
	snprintf(url, sizeof url, "%s/v1/completions", base);
	s->body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	s->last = -1;
	s->sent = wk_now();
	s->hd = curl_slist_append(NULL, "Content-Type: application/json");
	if (!s->body || !s->hd || !(s->e = curl_easy_init()))
		return 1;
	curl_easy_setopt(s->e, CURLOPT_URL, url);
	curl_easy_setopt(s->e, CURLOPT_HTTPHEADER, s->hd);
	curl_easy_setopt(s->e, CURLOPT_POSTFIELDS, s->body);
	curl_easy_setopt(s->e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(s->e, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(s->e, CURLOPT_PRIVATE, s);
	curl_easy_setopt(s->e, CURLOPT_TIMEOUT, 120L);
	curl_easy_setopt(s->e, CURLOPT_TCP_NODELAY, 1L);
	return curl_multi_add_handle(m, s->e) != CURLM_OK;
}

struct buf {
	char *p;
	size_t len, cap;
};

static size_t on_buf(char *p, size_t sz, size_t n, void *arg)
{
	struct buf *b = arg;
	size_t k = sz * n, c = k < b->cap - 1 - b->len ? k : b->cap - 1 - b->len;
	memcpy(b->p + b->len, p, c);
	b->p[b->len += c] = 0;
	return k;
}

/* GET base/path's status, its body (up to n - 1 bytes) into out. */
static long get(const char *base, const char *path, char *out, size_t n)
{
	struct buf b = {.p = out, .cap = n};
	char url[320];
	snprintf(url, sizeof url, "%s%s", base, path);
	CURL *e = curl_easy_init();
	long status = 0;
	out[0] = 0;
	if (!e)
		return 0;
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_buf);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 5L);
	if (curl_easy_perform(e) == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(e);
	return status;
}

/* The address the worker logged it serves at ("listen"), within 60 s, or false. */
static bool served_at(const char *logpath, pid_t pid, char *base, size_t n)
{
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(logpath, "r");
		char line[4096];
		while (f && fgets(line, sizeof line, f)) {
			json_t *j = json_loads(line, 0, NULL);
			const char *ev = json_string_value(json_object_get(j, "event"));
			const char *msg = json_string_value(json_object_get(j, "msg"));
			const char *at = msg ? strstr(msg, "http://") : NULL;
			if (ev && !strcmp(ev, "listen") && at) {
				snprintf(base, n, "%.*s", (int)strcspn(at, " "), at);
				size_t l = strlen(base);
				if (l > 3 && !strcmp(base + l - 3, "/v1"))
					base[l - 3] = 0;
			}
			json_decref(j);
		}
		if (f)
			fclose(f);
		char out[256];
		if (*base && get(base, "/health", out, sizeof out) == 200)
			return true;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return false;
		usleep(10000);
	}
	return false;
}

static void free_streams(CURLM *m, struct stream *s, int n)
{
	for (int i = 0; i < n; i++) {
		if (s[i].e) {
			if (m)
				curl_multi_remove_handle(m, s[i].e);
			curl_easy_cleanup(s[i].e);
		}
		curl_slist_free_all(s[i].hd);
		free(s[i].body);
		free(s[i].gaps);
	}
}

/* The streams and big requests against the worker at base; false on a failure (said). */
static bool drive(const struct http_cfg *c, const char *base, struct stream *s, int round,
		  int parsers)
{
	CURLM *m = curl_multi_init();
	bool ok = m != NULL;
	for (int i = 0; ok && i < c->l.steady; i++) {
		json_t *req = json_pack("{s:s, s:i, s:b, s:i, s:i}", "prompt", "Once upon a time",
					"max_tokens", c->l.tokens, "stream", 1, "temperature", 1,
					"seed", i + 1000 * round);
		/* it runs its tokens to the end: the model's stop ids (EOS, and the BOS a
		 * llama2.c model also ends at) are banned */
		json_t *bias = json_object();
		char id[16];
		for (int k = 0; bias && k < 2; k++) {
			snprintf(id, sizeof id, "%d", k ? c->bos : c->eos);
			if ((k ? c->bos : c->eos) >= 0)
				json_object_set_new(bias, id, json_integer(-100));
		}
		if (!req || !bias || json_object_set_new(req, "logit_bias", bias))
			ok = false;
		ok = ok && !add_stream(m, &s[i], base, req);
	}
	int sent = 0, running = 1;
	while (ok && (running || sent < c->l.big)) {
		while (sent < c->l.big && s[0].events >= (long)(sent + 1) * c->l.every) {
			struct stream *b = &s[c->l.steady + sent];
			b->big = true;
			char id[64];
			snprintf(id, sizeof id, "%d-%d-%d ", round, parsers, sent);
			json_t *req = json_pack("{s:s, s:i, s:{s:s, s:s+}}", "prompt",
						"Once upon a time", "max_tokens", 1, "prediction",
						"type", "content", "content", id, c->filler);
			if ((ok = !add_stream(m, b, base, req)) == false)
				break;
			sent++;
		}
		if (curl_multi_perform(m, &running) != CURLM_OK)
			ok = false;
		double now = wk_now();
		for (int i = 0; i < c->l.steady; i++)
			ok = ok && arrived(&s[i], now);
		if (ok && curl_multi_poll(m, NULL, 0, 5, NULL) != CURLM_OK)
			ok = false;
		if (!running && sent < c->l.big && s[0].done) {
			fprintf(stderr, "wick bench http: the first stream ended after %ld events, "
					"before the %d big requests were sent\n", s[0].events, c->l.big);
			ok = false;
		}
		CURLMsg *msg;
		int left;
		while ((msg = curl_multi_info_read(m, &left))) {
			struct stream *d;
			long status = 0;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&d);
			curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
			d->done = true;
			d->answered = wk_now();
			if (msg->data.result != CURLE_OK || status != 200) {
				fprintf(stderr, "wick bench http: a %s request: %s, HTTP %ld: %.200s\n",
					d->big ? "big" : "streamed",
					curl_easy_strerror(msg->data.result), status, d->head);
				ok = false;
			}
		}
	}
	for (int i = 0; m && i < c->l.steady + c->l.big; i++)
		if (s[i].e)
			curl_multi_remove_handle(m, s[i].e);
	curl_multi_cleanup(m);
	return ok;
}

/* A counter's value in a /metrics text, or -1. */
static long long metric(const char *text, const char *name)
{
	char key[128];
	snprintf(key, sizeof key, "\n%s ", name);
	const char *p = strstr(text, key);
	return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* One worker run with `parsers`: the chunk gaps into *o. */
static int one_run(const struct http_cfg *c, int parsers, int round, struct bench_gaps *o,
		   double *big_ms)
{
	char dir[] = "/tmp/wick-bench-http-XXXXXX";
	if (!mkdtemp(dir))
		return 1;
	char logpath[128], nconc[16], npar[16];
	snprintf(logpath, sizeof logpath, "%s/worker.log", dir);
	snprintf(nconc, sizeof nconc, "%d", c->l.steady + c->l.big);
	snprintf(npar, sizeof npar, "%d", parsers);
	char *args[] = {"wick", "worker", "--model", (char *)c->l.model, "--listen", "127.0.0.1:0",
			"--backend", (char *)c->l.backend, "--concurrency", nconc, "--idle-timeout",
			"120", "--log-format", "json", "--prepare-threads", "1",
			"--http-parse-threads", npar, NULL, NULL, NULL};
	if (c->l.threads) {
		args[sizeof args / sizeof *args - 3] = "--threads";
		args[sizeof args / sizeof *args - 2] = (char *)c->l.threads;
	}
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 2, logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	pid_t pid;
	int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		rmdir(dir);
		return 1;
	}
	char base[300] = "";
	int n = c->l.steady + c->l.big;
	struct stream *s = calloc((size_t)n, sizeof *s);
	char *metrics = malloc(1 << 16);
	bool ok = s && metrics && served_at(logpath, pid, base, sizeof base);
	if (s && metrics && !ok)
		fprintf(stderr, "wick bench http: the worker (--http-parse-threads %d) did not "
				"serve (its log: %s)\n", parsers, logpath);
	double t0 = wk_now();
	ok = ok && drive(c, base, s, round, parsers);
	*o = (struct bench_gaps){.run_s = wk_now() - t0, .beside = -1};
	if (ok && get(base, "/metrics", metrics, 1 << 16) == 200)
		o->beside = metric(metrics, "wick_http_requests_parsed_beside_total");
	free(metrics);
	kill(pid, SIGTERM);
	int st;
	waitpid(pid, &st, 0);
	/* the big requests' own time, sent to answered (median) */
	double bt[256];
	for (int i = 0; ok && i < c->l.big; i++)
		bt[i] = (s[c->l.steady + i].answered - s[c->l.steady + i].sent) * 1e3;
	*big_ms = ok && c->l.big ? cmd_median(bt, c->l.big) : 0;
	/* every steady stream's gaps, together */
	size_t total = 0;
	for (int i = 0; ok && i < c->l.steady; i++) {
		total += s[i].n_gaps;
		o->count += s[i].chunks;
	}
	double *t = ok && total > 1 ? malloc(total * sizeof *t) : NULL;
	size_t k = 0;
	for (int i = 0; t && i < c->l.steady; i++)
		for (size_t g = 0; g < s[i].n_gaps; g++)
			t[k++] = s[i].gaps[g];
	if (s)
		free_streams(NULL, s, n);
	free(s);
	if (!t) {
		if (ok)
			fprintf(stderr, "wick bench http: the streams got no chunks\n");
		fprintf(stderr, "wick bench http: the worker's log is %s\n", logpath);
		return 1;
	}
	unlink(logpath);
	rmdir(dir);
	bench_gaps_of(t, total, o);
	free(t);
	return 0;
}

int bench_http(int argc, char **argv)
{
	static const struct option opts[] = {BENCH_LOAD_OPTIONS, {"help", no_argument, 0, 'h'},
					     {0, 0, 0, 0}};
	struct http_cfg c = {.l = BENCH_LOAD_DEFAULT, .eos = -1, .bos = -1};
	int ch;
	while ((ch = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		if (ch == 'h') {
			usage(stdout);
			return 0;
		}
		if (bench_load_flag(&c.l, ch, optarg, "http")) {
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 2;
	}
	struct tok *tk;
	int rc = bench_load_model(&c.l, argv[optind], "http", 256, "requests", &tk);
	if (rc)
		return rc;
	c.eos = tok_eos(tk);
	c.bos = tok_bos(tk);
	tok_free(tk);
	char *filler = bench_filler(c.l.kb);
	if (!filler)
		return 1;
	c.filler = filler;
	curl_global_init(CURL_GLOBAL_DEFAULT);
	struct bench_gaps r[2][BENCH_ROUNDS_MAX];
	double big[2][BENCH_ROUNDS_MAX];
	int rounds = c.l.rounds;
	for (int i = 0; !rc && i < rounds; i++)
		for (int m = 0; !rc && m < 2; m++)
			rc = one_run(&c, m, i, &r[m][i], &big[m][i]);
	free(filler);
	curl_global_cleanup();
	if (rc)
		return 1;
	printf("model            %s (worker backend %s)\n", c.l.model, c.l.backend);
	printf("load             %d streams of %d tokens; %d requests of %d KB (a prediction) "
	       "arriving every %d tokens of the first stream\n", c.l.steady, c.l.tokens, c.l.big,
	       c.l.kb, c.l.every);
	printf("gaps between two chunks of a stream, as its client got them, ms (median of %d "
	       "rounds):\n", rounds);
	static const char *const names[2] = {"--http-parse-threads 0", "--http-parse-threads 1"};
	double mx[2];
	bench_gaps_table(names, "chunks", "parsed beside", r, rounds, mx);
	double b0 = cmd_median(big[0], rounds), b1 = cmd_median(big[1], rounds);
	printf("a big request, sent to answered (its own time, median): %.2f ms on the server's "
	       "thread, %.2f ms beside it (%.2fx)\n", b0, b1, b1 / b0);
	printf("longest gap      %.2fx with a parser (%.2f ms against %.2f)\n", mx[1] / mx[0],
	       mx[1], mx[0]);
	printf("{\"bench\":\"http\",\"steady\":%d,\"tokens\":%d,\"big\":%d,\"kb\":%d,"
	       "\"longest_ms_inline\":%.3f,\"longest_ms_parser\":%.3f,\"ratio\":%.4f,"
	       "\"big_ms_inline\":%.3f,\"big_ms_parser\":%.3f,\"rounds\":%d}\n", c.l.steady,
	       c.l.tokens, c.l.big, c.l.kb, mx[0], mx[1], mx[1] / mx[0], b0, b1, rounds);
	return 0;
}
