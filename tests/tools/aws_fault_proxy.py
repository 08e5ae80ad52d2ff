#!/usr/bin/env python3
"""aws_fault_proxy.py - a forwarding proxy in front of moto_server that makes SQS say, when
told to, that the credentials expired, for the SQS driver's refresh-and-retry (tests/unit/
test_queue_sqs.c).

Every request is forwarded to --target as it came (method, path, headers, body) and its
answer returned, except the first SQS request (one with an X-Amz-Target header) after a GET
/__arm, which gets HTTP 400 with SQS's JSON error for an expired session token instead.
With --creds-expire-in S the credential documents it passes on expire S seconds from now,
and with --fail-creds-after N every credential document request after the first N gets
HTTP 500 (a refresh that fails). With --imds-token 405 the IMDSv2 token request (PUT
/latest/api/token) gets HTTP 405, and with --imds-token hang no answer for 5 s (what a
container sees behind a bridge when the instance's PUT response hop limit is 1): only IMDSv1
answers. GET /__counts answers {"sqs": N, "expired": N, "creds": N, "v1": N}: SQS requests
seen, expiries sent, instance-metadata credential documents fetched (GETs of
/latest/meta-data/iam/security-credentials/ROLE), so a test can see the credentials fetched
again after the expiry, and metadata GETs without a token (IMDSv1). With --delay-ms D every
SQS request is answered D ms later than moto answered it (each on its own connection's
thread, as a distant endpoint's round trip: wick bench queue against real SQS's latency).
"""
import argparse
import http.client
import http.server
import datetime
import json
import threading
import time

counts = {"sqs": 0, "expired": 0, "creds": 0, "v1": 0}
armed = [False]
lock = threading.Lock()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--target", type=int, required=True, help="moto_server's port on 127.0.0.1")
    ap.add_argument("--creds-expire-in", type=int, default=0)
    ap.add_argument("--fail-creds-after", type=int, default=-1)
    ap.add_argument("--imds-token", choices=("ok", "405", "hang"), default="ok")
    ap.add_argument("--delay-ms", type=float, default=0)
    a = ap.parse_args()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, code, body, ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            if self.command == "GET" and self.path == "/__counts":
                with lock:
                    return self.reply(200, json.dumps(counts).encode())
            if self.command == "GET" and self.path == "/__arm":
                with lock:
                    armed[0] = True
                return self.reply(200, b"{}")
            if self.headers.get("X-Amz-Target"):
                with lock:
                    counts["sqs"] += 1
                    expire = armed[0]
                    armed[0] = False
                    counts["expired"] += expire
                if expire:
                    err = {"__type": "com.amazon.coral.service#ExpiredTokenException",
                           "message": "The security token included in the request is expired"}
                    return self.reply(400, json.dumps(err).encode(), "application/x-amz-json-1.0")
            if self.command == "PUT" and self.path == "/latest/api/token" and a.imds_token != "ok":
                if a.imds_token == "hang":
                    time.sleep(5)
                    return
                return self.reply(405, b"", "text/plain")
            if self.path.startswith("/latest/meta-data/") and not self.headers.get("X-aws-ec2-metadata-token"):
                with lock:
                    counts["v1"] += 1
            prefix = "/latest/meta-data/iam/security-credentials/"
            creds = self.command == "GET" and self.path.startswith(prefix) and len(self.path) > len(prefix)
            if creds:
                with lock:
                    counts["creds"] += 1
                    failing = 0 <= a.fail_creds_after < counts["creds"]
                if failing:
                    return self.reply(500, b"unavailable", "text/plain")
            c = http.client.HTTPConnection("127.0.0.1", a.target, timeout=30)
            hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            c.request(self.command, self.path, body=body, headers=hdrs)
            r = c.getresponse()
            data = r.read()
            if a.delay_ms > 0 and self.headers.get("X-Amz-Target"):
                time.sleep(a.delay_ms / 1e3)
            if creds and a.creds_expire_in and r.status == 200:
                doc = json.loads(data)
                at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=a.creds_expire_in)
                doc["Expiration"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
                data = json.dumps(doc).encode()
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            c.close()

        do_GET = do_POST = do_PUT = forward

    http.server.ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()


if __name__ == "__main__":
    main()
