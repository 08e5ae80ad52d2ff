/*
 * redis_conn.c - one blocking Redis connection over a socket of our own, plain or TLS
 * (OpenSSL); hiredis's formatter writes the commands and its reader parses the replies.
 *
 * The socket connects without blocking, within the caller's deadline, and is blocking after
 * that, with SO_RCVTIMEO and SO_SNDTIMEO as the limit on each wait (as hiredis's
 * redisSetTimeout does). Writes use MSG_NOSIGNAL, so a server that went away is an EPIPE, not
 * a SIGPIPE. Under TLS the same timeouts reach SSL_read and SSL_write through the socket, and
 * a fresh SSL_CTX is built for each connection, so rotated certificate files are read again.
 */
#include "worker/redis_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/wk.h"

#define READ_CHUNK 16384

struct rconn {
	int fd;
	SSL_CTX *ctx;
	SSL *ssl;
	redisReader *rd;
	char *obuf;
	size_t olen, ocap;
	bool broken, tls_refused;
	double timeout_s;
	char errstr[200];
};

static void fail(struct rconn *c, bool tls_refused, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void fail(struct rconn *c, bool tls_refused, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->errstr, sizeof c->errstr, fmt, ap);
	va_end(ap);
	c->broken = true;
	c->tls_refused = tls_refused;
}

/* OpenSSL writes to the socket with write(2), so a server gone would raise SIGPIPE, which
 * ends the process. Around each TLS call SIGPIPE is blocked in this thread, and one that the
 * call raised is taken back before it is unblocked (libpq does the same). errno is kept. */
struct nopipe {
	sigset_t old;
	bool pending;
};

static void nopipe_begin(struct nopipe *p)
{
	sigset_t s, pend;
	sigemptyset(&s);
	sigaddset(&s, SIGPIPE);
	sigpending(&pend);
	p->pending = sigismember(&pend, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &s, &p->old);
}

static void nopipe_end(struct nopipe *p)
{
	int eno = errno;
	sigset_t s, pend;
	sigemptyset(&s);
	sigaddset(&s, SIGPIPE);
	sigpending(&pend);
	if (!p->pending && sigismember(&pend, SIGPIPE)) {
		struct timespec zero = {0};
		while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR)
			;
	}
	pthread_sigmask(SIG_SETMASK, &p->old, NULL);
	errno = eno;
}

/* OpenSSL's reason for the last failure on this thread, and its queue cleared. */
static const char *ssl_reason(char *buf, size_t n)
{
	unsigned long e = ERR_peek_last_error();
	const char *r = e ? ERR_reason_error_string(e) : NULL;
	snprintf(buf, n, "%s", r ? r : e ? "error" : "no reason given");
	ERR_clear_error();
	return buf;
}

static void set_wait(int fd, double s)
{
	struct timeval tv = {.tv_sec = (time_t)s,
			     .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6)};
	if (tv.tv_sec == 0 && tv.tv_usec == 0)
		tv.tv_usec = 1000; /* 0 would mean no limit */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void rconn_set_timeout(struct rconn *c, double s)
{
	c->timeout_s = s;
	if (c->fd >= 0)
		set_wait(c->fd, s);
}

/* One address: a non-blocking connect, waited for until deadline, then blocking. */
static int connect_one(const struct addrinfo *ai, double deadline, char *why, size_t whysz)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
			ai->ai_protocol);
	if (fd < 0) {
		snprintf(why, whysz, "socket: %s", strerror(errno));
		return -1;
	}
	int e = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
	while (e == EINPROGRESS || e == EINTR) {
		double left = deadline - wk_now();
		if (left <= 0) {
			e = ETIMEDOUT;
			break;
		}
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		int pr = poll(&p, 1, (int)(left * 1000) + 1);
		if (pr < 0 && errno != EINTR) {
			e = errno;
		} else if (pr > 0) {
			socklen_t l = sizeof e;
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) != 0)
				e = errno;
		}
	}
	if (e) {
		snprintf(why, whysz, "%s", strerror(e));
		close(fd);
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

static int tcp_connect(const char *host, int port, double deadline, int *fd, char *err,
		       size_t errsz)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
	int g = getaddrinfo(host, ps, &hints, &res);
	if (g != 0)
		return wk_errf(err, errsz, WK_EIO, "%s: %s", host,
			       g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
	char why[160] = "no address";
	*fd = -1;
	for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next)
		*fd = connect_one(a, deadline, why, sizeof why);
	freeaddrinfo(res);
	return *fd >= 0 ? WK_OK : wk_errf(err, errsz, WK_EIO, "%s", why);
}

static bool is_ip(const char *host)
{
	unsigned char b[sizeof(struct in6_addr)];
	return inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1;
}

/* Whether a TLS file can be opened: OpenSSL's own reason for a missing one is "system lib". */
static int readable(const char *what, const char *path, char *err, size_t errsz)
{
	FILE *f = fopen(path, "r");
	if (f) {
		fclose(f);
		return WK_OK;
	}
	return wk_errf(err, errsz, WK_EINVAL, "TLS: cannot read %s %s: %s", what, path,
		       strerror(errno));
}

/* The client context: TLS 1.2+, the peer verified against ca_file or the system's store,
 * the client certificate when given. WK_EINVAL names the file that cannot be used. */
static int tls_context(const struct rconn_tls *t, SSL_CTX **out, char *err, size_t errsz)
{
	char why[120];
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx)
		return wk_errf(err, errsz, WK_ENOMEM, "TLS: %s", ssl_reason(why, sizeof why));
	*out = ctx;
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	int rc = t->ca_file ? readable("WICK_REDIS_CA_FILE", t->ca_file, err, errsz) : WK_OK;
	if (rc == WK_OK && t->cert_file)
		rc = readable("WICK_REDIS_CERT_FILE", t->cert_file, err, errsz);
	if (rc == WK_OK && t->key_file)
		rc = readable("WICK_REDIS_KEY_FILE", t->key_file, err, errsz);
	if (rc != WK_OK)
		return rc;
	if (t->ca_file ? SSL_CTX_load_verify_locations(ctx, t->ca_file, NULL) != 1
		       : SSL_CTX_set_default_verify_paths(ctx) != 1)
		return wk_errf(err, errsz, WK_EINVAL, "TLS: cannot load the CA certificates %s%s: %s",
			       t->ca_file ? "of WICK_REDIS_CA_FILE " : "of the system's store",
			       t->ca_file ? t->ca_file : "", ssl_reason(why, sizeof why));
	if (!t->cert_file)
		return WK_OK;
	if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) != 1)
		return wk_errf(err, errsz, WK_EINVAL, "TLS: cannot load WICK_REDIS_CERT_FILE %s: %s",
			       t->cert_file, ssl_reason(why, sizeof why));
	if (SSL_CTX_use_PrivateKey_file(ctx, t->key_file, SSL_FILETYPE_PEM) != 1)
		return wk_errf(err, errsz, WK_EINVAL, "TLS: cannot load WICK_REDIS_KEY_FILE %s: %s",
			       t->key_file, ssl_reason(why, sizeof why));
	if (SSL_CTX_check_private_key(ctx) != 1)
		return wk_errf(err, errsz, WK_EINVAL, "TLS: WICK_REDIS_KEY_FILE %s is not the key of "
			       "WICK_REDIS_CERT_FILE %s", t->key_file, t->cert_file);
	return WK_OK;
}

static int tls_handshake(struct rconn *c, const char *host, const struct rconn_tls *t,
			 double deadline, char *err, size_t errsz)
{
	int rc = tls_context(t, &c->ctx, err, errsz);
	if (rc != WK_OK)
		return rc;
	char why[120];
	c->ssl = SSL_new(c->ctx);
	if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1)
		return wk_errf(err, errsz, WK_ENOMEM, "TLS: %s", ssl_reason(why, sizeof why));
	if (is_ip(host)) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host) != 1)
			return wk_errf(err, errsz, WK_EINVAL, "TLS: bad address %s", host);
	} else if (SSL_set_tlsext_host_name(c->ssl, host) != 1 || SSL_set1_host(c->ssl, host) != 1) {
		return wk_errf(err, errsz, WK_EINVAL, "TLS: bad host name %s", host);
	}
	double left = deadline - wk_now();
	set_wait(c->fd, left > 0 ? left : 0.001);
	ERR_clear_error();
	errno = 0;
	struct nopipe np;
	nopipe_begin(&np);
	int r = SSL_connect(c->ssl);
	nopipe_end(&np);
	if (r == 1)
		return WK_OK;
	int se = SSL_get_error(c->ssl, r), eno = errno;
	long v = SSL_get_verify_result(c->ssl);
	if (v != X509_V_OK) {
		ERR_clear_error();
		bool name = v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH;
		return wk_errf(err, errsz, WK_EINVAL, "TLS: the server's certificate %s: %s (%s)",
			       name ? "is not for this host" : "is not trusted",
			       X509_verify_cert_error_string(v),
			       name ? "the URL's host must be one of its names"
			       : t->ca_file ? "checked against WICK_REDIS_CA_FILE"
			       : "checked against the system's CAs; set WICK_REDIS_CA_FILE to its CA");
	}
	if (se == SSL_ERROR_WANT_READ || se == SSL_ERROR_WANT_WRITE ||
	    (se == SSL_ERROR_SYSCALL && (eno == EAGAIN || eno == EWOULDBLOCK)))
		return wk_errf(err, errsz, WK_EIO, "TLS handshake: no answer in time (a plain "
			       "redis:// port does not answer one)");
	if (se == SSL_ERROR_SSL) {
		ssl_reason(why, sizeof why);
		return wk_errf(err, errsz, WK_EINVAL, "TLS handshake refused: %s%s", why,
			       strstr(why, "wrong version") || strstr(why, "packet length")
			       ? " (a plain redis:// port?)" : "");
	}
	ERR_clear_error();
	return wk_errf(err, errsz, WK_EIO, "TLS handshake: the connection was %s",
		       eno ? strerror(eno) : "closed by the server");
}

int rconn_open(const char *host, int port, const struct rconn_tls *tls, double timeout_s,
	       struct rconn **out, char *err, size_t errsz)
{
	*out = NULL;
	struct rconn *c = calloc(1, sizeof *c);
	if (!c || !(c->rd = redisReaderCreate())) {
		free(c);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	c->fd = -1;
	double deadline = wk_now() + timeout_s;
	int rc = tcp_connect(host, port, deadline, &c->fd, err, errsz);
	if (rc == WK_OK && tls)
		rc = tls_handshake(c, host, tls, deadline, err, errsz);
	if (rc != WK_OK) {
		rconn_free(c);
		return rc;
	}
	rconn_set_timeout(c, timeout_s);
	*out = c;
	return WK_OK;
}

/* Adds a formatted command (n bytes, freed here) to the output. */
static bool out_add(struct rconn *c, char *cmd, long long n)
{
	if (n < 0 || !cmd) {
		fail(c, false, "out of memory");
		return false;
	}
	size_t need = c->olen + (size_t)n;
	if (need > c->ocap) {
		size_t cap = c->ocap ? c->ocap : 4096;
		while (cap < need)
			cap *= 2;
		char *b = realloc(c->obuf, cap);
		if (!b) {
			redisFreeCommand(cmd);
			fail(c, false, "out of memory");
			return false;
		}
		c->obuf = b, c->ocap = cap;
	}
	memcpy(c->obuf + c->olen, cmd, (size_t)n);
	c->olen = need;
	redisFreeCommand(cmd);
	return true;
}

void rconn_append_argv(struct rconn *c, int argc, const char **argv, const size_t *len)
{
	char *cmd = NULL;
	long long n = redisFormatCommandArgv(&cmd, argc, argv, len);
	out_add(c, cmd, n);
}

/* A TLS call's failure, as this connection's error. */
static void tls_fail(struct rconn *c, int r, const char *what)
{
	int se = SSL_get_error(c->ssl, r), eno = errno;
	char why[120];
	if (se == SSL_ERROR_SSL)
		fail(c, true, "TLS: %s", ssl_reason(why, sizeof why));
	else if (se == SSL_ERROR_WANT_READ || se == SSL_ERROR_WANT_WRITE ||
		 (se == SSL_ERROR_SYSCALL && (eno == EAGAIN || eno == EWOULDBLOCK)))
		fail(c, false, "no %s in %.1f s", what, c->timeout_s);
	else if (se == SSL_ERROR_ZERO_RETURN || (se == SSL_ERROR_SYSCALL && !eno))
		fail(c, false, "the server closed the connection");
	else
		fail(c, false, "%s: %s", what, strerror(eno));
	ERR_clear_error();
}

/* One SSL_read or SSL_write with SIGPIPE held off (a read may write too: TLS 1.3 answers a
 * key update); <= 0 on a failure, errno kept. */
static int tls_call(struct rconn *c, bool wr, void *buf, size_t n)
{
	int len = n > INT_MAX ? INT_MAX : (int)n;
	ERR_clear_error();
	errno = 0;
	struct nopipe np;
	nopipe_begin(&np);
	int r = wr ? SSL_write(c->ssl, buf, len) : SSL_read(c->ssl, buf, len);
	nopipe_end(&np);
	return r;
}

/* A failed call (n <= 0) as this connection's error. */
static void io_fail(struct rconn *c, ssize_t n, const char *what)
{
	if (c->ssl)
		tls_fail(c, (int)n, what);
	else if (n == 0)
		fail(c, false, "the server closed the connection");
	else if (errno == EAGAIN || errno == EWOULDBLOCK)
		fail(c, false, "no %s in %.1f s", what, c->timeout_s);
	else
		fail(c, false, "%s: %s", what, strerror(errno));
}

static int flush_out(struct rconn *c)
{
	size_t off = 0;
	while (off < c->olen) {
		char *p = c->obuf + off;
		size_t n = c->olen - off;
		ssize_t w = c->ssl ? tls_call(c, true, p, n) : send(c->fd, p, n, MSG_NOSIGNAL);
		if (w <= 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			io_fail(c, w, "write");
			/* a TLS server that refused us (a client certificate it wanted) sent its
			 * alert before it closed: read it, for the reason */
			char one;
			int r = c->ssl && !c->tls_refused ? tls_call(c, false, &one, 1) : 1;
			if (r <= 0 && SSL_get_error(c->ssl, r) == SSL_ERROR_SSL)
				tls_fail(c, r, "reply");
			return WK_EIO;
		}
		off += (size_t)w;
	}
	c->olen = 0;
	return WK_OK;
}

/* Some bytes from the server into the reader. */
static int read_some(struct rconn *c)
{
	char buf[READ_CHUNK];
	ssize_t n;
	do
		n = c->ssl ? tls_call(c, false, buf, sizeof buf) : recv(c->fd, buf, sizeof buf, 0);
	while (n <= 0 && errno == EINTR);
	if (n <= 0) {
		io_fail(c, n, "reply");
		return WK_EIO;
	}
	if (redisReaderFeed(c->rd, buf, (size_t)n) != REDIS_OK) {
		fail(c, false, "%s", c->rd->errstr);
		return WK_EIO;
	}
	return WK_OK;
}

int rconn_get_reply(struct rconn *c, redisReply **reply)
{
	*reply = NULL;
	if (c->broken || flush_out(c) != WK_OK)
		return WK_EIO;
	for (;;) {
		void *x = NULL;
		if (redisReaderGetReply(c->rd, &x) != REDIS_OK) {
			fail(c, false, "not Redis's protocol: %s", c->rd->errstr);
			return WK_EIO;
		}
		if (x) {
			*reply = x;
			return WK_OK;
		}
		if (read_some(c) != WK_OK)
			return WK_EIO;
	}
}

redisReply *rconn_command(struct rconn *c, const char *fmt, ...)
{
	char *cmd = NULL;
	va_list ap;
	va_start(ap, fmt);
	int n = redisvFormatCommand(&cmd, fmt, ap);
	va_end(ap);
	if (!out_add(c, cmd, n))
		return NULL;
	redisReply *r;
	return rconn_get_reply(c, &r) == WK_OK ? r : NULL;
}

const char *rconn_errstr(const struct rconn *c) { return c->errstr; }

bool rconn_tls_refused(const struct rconn *c) { return c->tls_refused; }

void rconn_free(struct rconn *c)
{
	if (!c)
		return;
	if (c->ssl) {
		if (!c->broken) { /* close_notify, not waited for */
			struct nopipe np;
			nopipe_begin(&np);
			SSL_shutdown(c->ssl);
			nopipe_end(&np);
		}
		SSL_free(c->ssl);
	}
	SSL_CTX_free(c->ctx);
	ERR_clear_error();
	if (c->fd >= 0)
		close(c->fd);
	redisReaderFree(c->rd);
	free(c->obuf);
	free(c);
}
