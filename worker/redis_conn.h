/*
 * redis_conn.h - one blocking connection to a Redis server, plain TCP or TLS.
 *
 * hiredis formats the commands and parses the replies; the socket, and TLS over it through
 * OpenSSL, are ours (Debian 12's hiredis 0.14 has no TLS, and no way to give its context
 * another transport). The calls mirror hiredis's blocking API: rconn_open is
 * redisConnectWithTimeout, rconn_append_argv redisAppendCommandArgv, rconn_get_reply
 * redisGetReply, rconn_command redisCommand. A failed call leaves the connection unusable:
 * free it and open another.
 */
#ifndef WICK_REDIS_CONN_H
#define WICK_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

/* TLS settings (rediss://). The server's certificate chain is always verified, against
 * ca_file (a PEM bundle) or, when it is NULL, the system's trust store; and its name against
 * the host connected to (a DNS name in its subjectAltName, also sent as SNI; an IP address
 * in an IP subjectAltName). cert_file and key_file (PEM) are a client certificate for a
 * server that asks for one (mutual TLS); both or neither. The files are read on each open,
 * so a file replaced in place is taken at the next connection. */
struct rconn_tls {
	const char *ca_file, *cert_file, *key_file;
};

struct rconn;

/* Connects to host:port within timeout_s, then, when tls is not NULL, completes a TLS
 * handshake (TLS 1.2 or newer) within what is left of it. WK_EIO: the server is not there,
 * did not answer in time or dropped the connection (worth another try); WK_EINVAL: a TLS
 * file cannot be used, or the server's certificate is not trusted or not for that host (the
 * same settings would fail again); WK_ENOMEM. err names host:port and the reason. */
int rconn_open(const char *host, int port, const struct rconn_tls *tls, double timeout_s,
	       struct rconn **out, char *err, size_t errsz);

/* The longest wait for a read or a write from now on; a slower one fails the call. */
void rconn_set_timeout(struct rconn *c, double s);

/* Adds a command to the output; nothing is sent until rconn_get_reply. */
void rconn_append_argv(struct rconn *c, int argc, const char **argv, const size_t *len);

/* Sends what was appended and reads the next reply (free it with freeReplyObject). WK_EIO
 * when the connection is lost, timed out, or sends what is not Redis's protocol;
 * rconn_errstr says which. */
int rconn_get_reply(struct rconn *c, redisReply **reply);

/* redisCommand: format (hiredis's %s and %b), send, read one reply; NULL on a failure. */
redisReply *rconn_command(struct rconn *c, const char *fmt, ...);

/* Why the last call failed ("" when none has). */
const char *rconn_errstr(const struct rconn *c);

/* Whether the last failure was the TLS peer's refusal (an alert: a client certificate it
 * wants and did not get, or does not trust) rather than a lost connection. */
bool rconn_tls_refused(const struct rconn *c);

void rconn_free(struct rconn *c);

#endif
