/*
 * aws_creds.c - the AWS credential sources of aws_creds.h, over libcurl (one easy handle a
 * request: they are rare) and jansson.
 */
#include "worker/aws_creds.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/wk.h"

#define BODY_MAX (64 * 1024) /* any credentials answer is far smaller */
#define REFRESH_S 300        /* fetch again this long before the expiry */

static size_t on_body(char *d, size_t sz, size_t nm, void *u)
{
	struct wk_buf *b = u;
	size_t n = sz * nm;
	if (b->len + n > BODY_MAX)
		return 0; /* CURLE_WRITE_ERROR: over the limit */
	wk_buf_add(b, d, n);
	return b->oom ? 0 : n;
}

/* One request: method (GET, PUT or POST with body), headers (NULL-terminated), timeouts in ms.
 * WK_OK with the body in *out (malloc'd, NUL-terminated, "" when empty) and the HTTP status
 * in *code; WK_EIO when no answer came (*connect_failed: the connection itself failed or
 * timed out, not an answer that did not come once connected). */
static int http(const char *method, const char *url, const char *const *hdrs, const char *body,
		long connect_ms, long total_ms, char **out, long *code, bool *connect_failed,
		char *err, size_t errsz)
{
	*out = NULL;
	*code = 0;
	if (connect_failed)
		*connect_failed = false;
	CURL *c = curl_easy_init();
	struct curl_slist *h = NULL;
	struct wk_buf b = {0};
	if (!c)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	for (int i = 0; hdrs && hdrs[i]; i++) {
		struct curl_slist *h2 = curl_slist_append(h, hdrs[i]);
		if (!h2) {
			curl_slist_free_all(h);
			curl_easy_cleanup(c);
			return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
		}
		h = h2;
	}
	char cerr[CURL_ERROR_SIZE] = "";
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, total_ms);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	if (!strcmp(method, "POST")) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
	} else if (!strcmp(method, "PUT")) {
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
	}
	CURLcode cc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, code);
	curl_off_t connect_us = 0;
	curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	int rc = WK_OK;
	if (cc != CURLE_OK) {
		if (connect_failed)
			*connect_failed = cc == CURLE_COULDNT_CONNECT ||
					  cc == CURLE_COULDNT_RESOLVE_HOST ||
					  (cc == CURLE_OPERATION_TIMEDOUT && connect_us == 0);
		rc = cc == CURLE_WRITE_ERROR
			     ? wk_errf(err, errsz, b.oom ? WK_ENOMEM : WK_ELIMIT, "%s: %s", url,
				       b.oom ? "out of memory" : "the answer is over 64 KiB")
			    : wk_errf(err, errsz, WK_EIO, "%s: %s", url,
				      cerr[0] ? cerr : curl_easy_strerror(cc));
		free(b.p);
		return rc;
	}
	*out = b.p ? b.p : strdup("");
	return *out ? WK_OK : wk_errf(err, errsz, WK_ENOMEM, "out of memory");
}

time_t aws_creds_parse_time(const char *s)
{
	struct tm tm = {0};
	const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (!end)
		return -1;
	if (*end == '.')
		for (end++; *end >= '0' && *end <= '9'; end++)
			;
	if (strcmp(end, "Z") != 0 && strcmp(end, "+00:00") != 0)
		return -1;
	return timegm(&tm);
}


void aws_creds_free(struct aws_creds *c)
{
	wk_free_secret(c->key);
	wk_free_secret(c->secret);
	wk_free_secret(c->token);
	memset(c, 0, sizeof *c);
}

bool aws_creds_due(const struct aws_creds *c, time_t now)
{
	return c->expires > 0 && now >= c->expires - REFRESH_S;
}

/* Where v (a key, secret or token) has a byte that cannot stand in a request header (a space,
 * a control character such as the newline a Secret made from a file keeps, or a non-ASCII
 * byte), an error naming what and where, never the value; else WK_OK. */
static int header_safe(const char *v, const char *what, const char *source, char *err,
		       size_t errsz)
{
	for (size_t i = 0; v && v[i]; i++) {
		unsigned char ch = (unsigned char)v[i];
		if (ch > 0x20 && ch < 0x7f)
			continue;
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): the %s has %s at byte %zu "
			       "(a value read from a file with its newline?)", source, what,
			       ch == '\n' || ch == '\r' ? "a line break" : ch == ' ' ? "a space" :
			       "a control or non-ASCII byte", i);
	}
	return WK_OK;
}

/* Takes the four values into *c (copies; token may be NULL). */
static int set(struct aws_creds *c, const char *key, const char *secret, const char *token,
	       const char *expiration, const char *source, char *err, size_t errsz)
{
	if (!key || !*key || !secret || !*secret)
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): the answer lacks an "
			       "access key id or a secret key", source);
	int rc;
	if ((rc = header_safe(key, "access key id", source, err, errsz)) != WK_OK ||
	    (rc = header_safe(secret, "secret access key", source, err, errsz)) != WK_OK ||
	    (rc = header_safe(token, "session token", source, err, errsz)) != WK_OK)
		return rc;
	time_t exp = 0;
	if (expiration && (exp = aws_creds_parse_time(expiration)) < 0)
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): expiration '%.40s' is "
			       "not an ISO 8601 UTC time", source, expiration);
	struct aws_creds n = {.key = strdup(key), .secret = strdup(secret),
			      .token = token && *token ? strdup(token) : NULL, .expires = exp,
			      .source = source};
	if (!n.key || !n.secret || (token && *token && !n.token)) {
		aws_creds_free(&n);
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	*c = n;
	return WK_OK;
}

/* The {AccessKeyId, SecretAccessKey, Token, Expiration} JSON of the container endpoint and
 * of instance metadata. */
static int from_json(struct aws_creds *c, const char *body, const char *source, char *err,
		     size_t errsz)
{
	json_t *j = json_loads(body, 0, NULL);
	if (!json_is_object(j)) {
		json_decref(j);
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): the answer is not a "
			       "JSON object", source);
	}
#define S(k) json_string_value(json_object_get(j, k))
	int rc = set(c, S("AccessKeyId"), S("SecretAccessKey"), S("Token"), S("Expiration"), source,
		     err, errsz);
#undef S
	json_decref(j);
	return rc;
}

/* The text of <tag>...</tag> in xml, malloc'd; NULL when absent. */
static char *xml_text(const char *xml, const char *tag)
{
	char open[64], close[64];
	snprintf(open, sizeof open, "<%s>", tag);
	snprintf(close, sizeof close, "</%s>", tag);
	const char *a = strstr(xml, open), *b;
	if (!a || !(b = strstr(a += strlen(open), close)))
		return NULL;
	return strndup(a, (size_t)(b - a));
}

/* A token file's text, trailing newlines cut; NULL with err set when it cannot be read or is
 * empty. */
static char *read_file(const char *path, char *err, size_t errsz, const char *what)
{
	char *s, e2[WK_ERRSZ];
	size_t n;
	if (wk_read_file(path, BODY_MAX, &s, &n, e2, sizeof e2) != WK_OK) {
		wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): %s", what, e2);
		return NULL;
	}
	while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
		s[--n] = 0;
	if (n == 0) {
		free(s);
		wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): %s is empty", what, path);
		return NULL;
	}
	return s;
}

static const char *nonempty(const char *v) { return v && *v ? v : NULL; }

/* role: AWS_ROLE_ARN, file: AWS_WEB_IDENTITY_TOKEN_FILE (both set). */
static int web_identity(struct aws_creds *c, const char *role, const char *file,
			const char *region, char *err, size_t errsz)
{
	const char *src = "web identity";
	const char *name = nonempty(getenv("AWS_ROLE_SESSION_NAME"));
	char *tok = read_file(file, err, errsz, src);
	if (!tok)
		return WK_EINVAL;
	char url[512], sess[64];
	const char *ep = nonempty(getenv("AWS_ENDPOINT_URL_STS")) ? nonempty(getenv("AWS_ENDPOINT_URL_STS"))
						      : nonempty(getenv("AWS_ENDPOINT_URL"));
	if (ep)
		snprintf(url, sizeof url, "%s", ep);
	else
		snprintf(url, sizeof url, "https://sts.%s.amazonaws.com/", region);
	if (!name) {
		snprintf(sess, sizeof sess, "wick-%ld", (long)time(NULL));
		name = sess;
	}
	char *r = curl_easy_escape(NULL, role, 0), *n = curl_easy_escape(NULL, name, 0);
	char *t = curl_easy_escape(NULL, tok, 0);
	wk_free_secret(tok);
	size_t len = (r ? strlen(r) : 0) + (n ? strlen(n) : 0) + (t ? strlen(t) : 0) + 200;
	char *body = r && n && t ? malloc(len) : NULL;
	int rc;
	if (!body) {
		rc = wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	} else {
		snprintf(body, len, "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=%s"
			 "&RoleSessionName=%s&WebIdentityToken=%s", r, n, t);
		const char *h[] = {"Content-Type: application/x-www-form-urlencoded",
				   "Accept: text/xml", NULL};
		char *out;
		long code;
		rc = http("POST", url, h, body, 5000, 15000, &out, &code, NULL, err, errsz);
		if (rc == WK_OK && code != 200) {
			char *ec = xml_text(out, "Code"), *em = xml_text(out, "Message");
			rc = wk_errf(err, errsz, WK_EINVAL, "aws credentials (web identity): STS "
				     "AssumeRoleWithWebIdentity of %s at %s: %s: %.200s (HTTP %ld)",
				     role, url, ec ? ec : "error", em ? em : "no message", code);
			free(ec);
			free(em);
		} else if (rc == WK_OK) {
			char *k = xml_text(out, "AccessKeyId"), *s = xml_text(out, "SecretAccessKey");
			char *st = xml_text(out, "SessionToken"), *ex = xml_text(out, "Expiration");
			rc = set(c, k, s, st, ex, src, err, errsz);
			wk_free_secret(k);
			wk_free_secret(s);
			wk_free_secret(st);
			free(ex);
		} else {
			char msg[WK_ERRSZ];
			snprintf(msg, sizeof msg, "%s", err);
			rc = wk_errf(err, errsz, WK_EINVAL, "aws credentials (web identity): STS: %s",
				     msg);
		}
		if (out) {
			memset(out, 0, strlen(out));
			free(out);
		}
		memset(body, 0, strlen(body));
	}
	free(body);
	curl_free(r);
	curl_free(n);
	if (t) {
		memset(t, 0, strlen(t));
		curl_free(t);
	}
	return rc;
}

/* Where the container endpoint may be (the AWS SDKs' rule, since the Authorization token
 * goes there): any https URL; plain http only to a loopback address or ECS's / EKS Pod
 * Identity's link-local ones. */
static bool container_host_ok(const char *url)
{
	CURLU *u = curl_url();
	char *scheme = NULL, *host = NULL;
	bool ok = false;
	if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
		static const char *const allowed[] = {"localhost", "[::1]", "169.254.170.2",
						      "169.254.170.23", "[fd00:ec2::23]"};
		ok = !strcasecmp(scheme, "https") || !strncmp(host, "127.", 4);
		for (size_t i = 0; !ok && i < sizeof allowed / sizeof allowed[0]; i++)
			ok = !strcasecmp(host, allowed[i]);
		ok &= !strcasecmp(scheme, "https") || !strcasecmp(scheme, "http");
	}
	curl_free(scheme);
	curl_free(host);
	curl_url_cleanup(u);
	return ok;
}

static int container(struct aws_creds *c, char *err, size_t errsz)
{
	const char *src = "container";
	char url[1024];
	if (nonempty(getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI")))
		snprintf(url, sizeof url, "%s", nonempty(getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI")));
	else
		snprintf(url, sizeof url, "http://169.254.170.2%s",
			 nonempty(getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")));
	if (!container_host_ok(url))
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (container): %.300s: plain "
			       "http only to loopback or the ECS / EKS Pod Identity addresses "
			       "(169.254.170.2, 169.254.170.23, fd00:ec2::23), as the AWS SDKs allow "
			       "(else https)", url);
	char *auth = NULL, *hdr = NULL;
	if (nonempty(getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"))) {
		if (!(auth = read_file(nonempty(getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")), err, errsz,
				       src)))
			return WK_EINVAL;
	} else if (nonempty(getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN")) &&
		   !(auth = strdup(nonempty(getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN"))))) {
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	}
	if (auth && (hdr = malloc(strlen(auth) + 32)))
		snprintf(hdr, strlen(auth) + 32, "Authorization: %s", auth);
	wk_free_secret(auth);
	if (auth && !hdr)
		return wk_errf(err, errsz, WK_ENOMEM, "out of memory");
	const char *h[] = {hdr, NULL};
	char *out;
	long code;
	int rc = http("GET", url, hdr ? h : NULL, NULL, 2000, 5000, &out, &code, NULL, err, errsz);
	wk_free_secret(hdr);
	if (rc != WK_OK) {
		char msg[WK_ERRSZ];
		snprintf(msg, sizeof msg, "%s", err);
		return wk_errf(err, errsz, WK_EINVAL, "aws credentials (container): %s", msg);
	}
	if (code != 200)
		rc = wk_errf(err, errsz, WK_EINVAL, "aws credentials (container): %s: HTTP %ld: "
			     "%.200s", url, code, out);
	else
		rc = from_json(c, out, src, err, errsz);
	memset(out, 0, strlen(out));
	free(out);
	return rc;
}

/* Whether a metadata request's outcome says there is no metadata service (not on EC2): no
 * connection, or a 4xx. */
static bool no_service(int rc, bool connect_failed, long code)
{
	return (rc != WK_OK && connect_failed) || (rc == WK_OK && code >= 400 && code < 500);
}

/* IMDSv2, falling back to IMDSv1 (requests without a token) as the AWS SDKs do when the
 * token request is refused (HTTP 403, 404, 405) or times out once connected: a container
 * behind a bridge on an instance whose PUT response hop limit is 1 never sees the token's
 * answer, while its GETs come back. AWS_EC2_METADATA_V1_DISABLED=true turns the fallback
 * off. *absent: no metadata service answered (not on EC2): the chain's end, not an error of
 * its own. */
static int imds(struct aws_creds *c, bool *absent, char *err, size_t errsz)
{
	const char *src = "instance metadata";
	char base[512], url[1024], tokhdr[200];
	*absent = false;
	snprintf(base, sizeof base, "%s", nonempty(getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"))
						  ? nonempty(getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"))
						  : "http://169.254.169.254");
	size_t bl = strlen(base);
	while (bl > 0 && base[bl - 1] == '/')
		base[--bl] = 0;
	char *tok, *role = NULL, *out = NULL;
	long code;
	bool nc;
	const char *th[] = {"X-aws-ec2-metadata-token-ttl-seconds: 21600", NULL};
	snprintf(url, sizeof url, "%s/latest/api/token", base);
	char e2[WK_ERRSZ];
	int rc = http("PUT", url, th, NULL, 1000, 2000, &tok, &code, &nc, e2, sizeof e2);
	const char *v1off = nonempty(getenv("AWS_EC2_METADATA_V1_DISABLED"));
	bool v1 = false;
	if (rc != WK_OK || code != 200) {
		if (rc == WK_OK) {
			snprintf(e2, sizeof e2, "%.300s: HTTP %ld", url, code);
			free(tok);
		}
		v1 = !(v1off && !strcasecmp(v1off, "true")) && rc != WK_ENOMEM &&
		     ((rc == WK_OK && (code == 403 || code == 404 || code == 405)) ||
		      (rc != WK_OK && !nc));
		/* no answer, or no IMDSv2 token (another cloud's metadata service, or IMDS turned
		 * off): not on EC2 as far as credentials go, the chain's end; unless IMDSv1 answers
		 * below */
		*absent = no_service(rc, nc, code);
		if (!v1)
			return wk_errf(err, errsz, rc == WK_ENOMEM ? rc : WK_EINVAL, "aws "
				       "credentials (instance metadata): %s", e2);
		tokhdr[0] = 0;
	} else {
		snprintf(tokhdr, sizeof tokhdr, "X-aws-ec2-metadata-token: %.150s", tok);
		wk_free_secret(tok);
	}
	const char *h[] = {v1 ? NULL : tokhdr, NULL};
	char e1[WK_ERRSZ];
	snprintf(e1, sizeof e1, "%s", e2); /* the token request's failure, for a v1 that fails */
	snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/", base);
	rc = http("GET", url, h, NULL, 1000, 2000, &role, &code, &nc, e2, sizeof e2);
	if (v1 && (rc != WK_OK || code != 200)) { /* IMDSv1 does not answer either */
		*absent = *absent || no_service(rc, nc, code);
		free(role);
		return wk_errf(err, errsz, rc == WK_ENOMEM ? rc : WK_EINVAL, "aws credentials "
			       "(instance metadata): %s; without a token (IMDSv1): %s", e1,
			       rc == WK_OK ? "no role list" : e2);
	}
	*absent = false;
	if (v1)
		src = "instance metadata (IMDSv1)";
	if (rc != WK_OK)
		rc = wk_errf(err, errsz, rc == WK_ENOMEM ? rc : WK_EINVAL, "aws credentials "
			     "(instance metadata): %s", e2);
	else if (code != 200)
		rc = wk_errf(err, errsz, WK_EINVAL, "aws credentials (instance metadata): %s: HTTP "
			     "%ld (no IAM role attached to the instance?)", url, code);
	if (rc == WK_OK) {
		role[strcspn(role, "\r\n")] = 0;
		if (!role[0] || strchr(role, '/')) {
			rc = wk_errf(err, errsz, WK_EINVAL, "aws credentials (instance metadata): "
				     "no IAM role attached to the instance");
		} else {
			snprintf(url, sizeof url, "%s/latest/meta-data/iam/security-credentials/%s",
				 base, role);
			rc = http("GET", url, h, NULL, 1000, 2000, &out, &code, NULL, e2, sizeof e2);
			if (rc != WK_OK)
				rc = wk_errf(err, errsz, rc == WK_ENOMEM ? rc : WK_EINVAL, "aws "
					     "credentials (instance metadata): %s", e2);
			else
				rc = code == 200 ? from_json(c, out, src, err, errsz)
						 : wk_errf(err, errsz, WK_EINVAL, "aws credentials "
							   "(instance metadata): %s: HTTP %ld", url,
							   code);
		}
	}
	if (out) {
		memset(out, 0, strlen(out));
		free(out);
	}
	free(role);
	memset(tokhdr, 0, sizeof tokhdr);
	return rc;
}

/* Two variables that go together (a named an, b named bn; NULL when unset): WK_EINVAL
 * naming the one set alone, else WK_OK. */
static int both_or_neither(const char *a, const char *an, const char *b, const char *bn,
			   const char *source, char *err, size_t errsz)
{
	if (!a == !b)
		return WK_OK;
	return wk_errf(err, errsz, WK_EINVAL, "aws credentials (%s): %s and %s go together; only "
		       "%s is set", source, an, bn, a ? an : bn);
}

int aws_creds_load(struct aws_creds *c, const char *region, char *err, size_t errsz)
{
	const char *key = nonempty(getenv("AWS_ACCESS_KEY_ID"));
	const char *secret = nonempty(getenv("AWS_SECRET_ACCESS_KEY"));
	const char *role = nonempty(getenv("AWS_ROLE_ARN"));
	const char *file = nonempty(getenv("AWS_WEB_IDENTITY_TOKEN_FILE"));
	int rc;
	if (key || secret) {
		if ((rc = both_or_neither(key, "AWS_ACCESS_KEY_ID", secret, "AWS_SECRET_ACCESS_KEY",
					  "environment", err, errsz)) != WK_OK)
			return rc;
		return set(c, key, secret, nonempty(getenv("AWS_SESSION_TOKEN")), NULL,
			   "environment", err, errsz);
	}
	if (role || file) {
		if ((rc = both_or_neither(role, "AWS_ROLE_ARN", file, "AWS_WEB_IDENTITY_TOKEN_FILE",
					  "web identity", err, errsz)) != WK_OK)
			return rc;
		return web_identity(c, role, file, region && *region ? region : "us-east-1", err,
				    errsz);
	}
	if (nonempty(getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI")) ||
	    nonempty(getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")))
		return container(c, err, errsz);
	const char *off = nonempty(getenv("AWS_EC2_METADATA_DISABLED"));
	bool absent = off && !strcasecmp(off, "true");
	char e2[WK_ERRSZ] = "disabled by AWS_EC2_METADATA_DISABLED";
	if (!absent) {
		int rc = imds(c, &absent, e2, sizeof e2);
		if (rc == WK_OK || !absent)
			return rc == WK_OK ? rc : wk_errf(err, errsz, rc, "%s", e2);
	}
	return wk_errf(err, errsz, WK_EINVAL,
		       "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
		       "AWS_SESSION_TOKEN for temporary ones), or run with a role: web identity "
		       "(AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE), a container endpoint "
		       "(AWS_CONTAINER_CREDENTIALS_FULL_URI or _RELATIVE_URI) or EC2 instance "
		       "metadata (none answered: %.300s)", e2);
}
