#!/usr/bin/env python3
"""runpod_server.py - a small RunPod-like serverless job API on loopback, for wick's tests.

The worker's side (the paths of runpod-python 1.12; EP is any endpoint name):
  GET  /v2/EP/job-take/WORKER?job_in_progress=0|1     one job {"id", "input"}, or 204 (long-poll)
  GET  /v2/EP/job-take-batch/WORKER?batch_size=N&...  a list of up to N jobs, or 204
  GET  /v2/EP/job-stop/WORKER                         {"jobsToStop": [ids]}, or 204 (long-poll)
  POST /v2/EP/job-done/WORKER/JOB?isStream=false      {"output"} | {"error", "output"} |
                                                      {"error", "retry": true} (requeued)
  POST /v2/EP/job-stream/WORKER/JOB?isStream=false   {"output": PIECE}, kept in order
  GET  /v2/EP/ping/WORKER?job_id=a,b&runpod_version=V
The test's side:
  POST /admin/enqueue        a job {"id", "input"} or a list of them
  POST /admin/cancel/JOB     a queued job ends CANCELLED; a running one also gets a stop signal
  POST /admin/fail_done?n=N  the next N job-done posts get HTTP 500 (nothing is recorded)
  POST /admin/refuse_done?n=N&code=C&min=B  the next N job-done posts of at least B bytes
                             get HTTP C (default 413), as a platform refuses a large result
  POST /admin/fail_stream?n=N&code=C  the next N stream posts get HTTP C (default 500)
  GET  /v2/EP/stream/JOB     the client's side of a stream, as RunPod's /stream/ID: the
                             pieces not read before, {"status", "stream": [{"output"}]}
  GET  /admin/state          jobs (each with its "stream" pieces), takes, pings and posts
Options: --port P; --long-poll S (default 2) holds an empty take or stop poll that long;
--lease S (default 0 = off) puts a running job back in the queue when its worker's pings
have not listed it for S seconds (the ping is the lease); --api-key KEY makes every worker
call carry "Authorization: KEY" (else 401); --delay-ms D holds every job-done and
job-stream post D ms before it is handled, as a platform's API at a distance answers
(a round trip the worker's posts pay; wick bench queue's --step-ms and this show what the
worker's thread would wait).
"""
import argparse
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

lock = threading.Condition()
queue = []          # job ids waiting, in order
jobs = {}           # id -> {"id", "input", "status", "worker", "last_seen", "deliveries", "results", ...}
stops = {}          # worker -> [job ids to stop]
log = {"takes": [], "pings": [], "posts": [], "expired": [], "unauthorized": 0, "failed_posts": 0}
fail_next = 0
refuse = {"n": 0, "code": 413, "min": 0}
fail_stream = {"n": 0, "code": 500}
opts = None


def now():
    return time.time()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, obj=None):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(code)
        if code != 204:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def client_gone(self):
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            return bool(r) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def parts(self):
        u = urlsplit(self.path)
        return [unquote(p) for p in u.path.split("/") if p], {k: v[-1] for k, v in parse_qs(u.query, keep_blank_values=True).items()}

    def authorized(self):
        if opts.api_key and self.headers.get("Authorization") != opts.api_key:
            with lock:
                log["unauthorized"] += 1
            self.reply(401, {"error": "unauthorized"})
            return False
        return True

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    # ---- worker side ----

    def wait_for(self, ready):
        """Holds the request until ready() (under the lock) or the long-poll ends."""
        deadline = time.monotonic() + opts.long_poll
        while not ready():
            if time.monotonic() >= deadline or self.client_gone():
                return False
            lock.wait(0.05)
        return True

    def take(self, worker, n, q):
        with lock:
            self.wait_for(lambda: queue)
            got = [queue.pop(0) for _ in range(min(n, len(queue)))]
            for i in got:
                j = jobs[i]
                j.update(status="IN_PROGRESS", worker=worker, last_seen=now())
                j["deliveries"] += 1
            log["takes"].append({"t": now(), "worker": worker, "ids": got, "batch_size": n,
                                 "job_in_progress": q.get("job_in_progress")})
        if not got:
            try:
                return self.reply(204)
            except OSError:
                return
        out = [{"id": i, **({} if jobs[i]["input"] is None else {"input": jobs[i]["input"]})}
               for i in got]
        try:
            self.reply(200, out if n > 1 or "batch_size" in q else out[0])
        except OSError:  # the worker left: nobody has them
            with lock:
                for i in reversed(got):
                    jobs[i].update(status="IN_QUEUE", worker=None)
                    queue.insert(0, i)
                lock.notify_all()

    def stop(self, worker):
        with lock:
            self.wait_for(lambda: stops.get(worker))
            ids = stops.pop(worker, [])
        try:
            self.reply(200, {"jobsToStop": ids}) if ids else self.reply(204)
        except OSError:  # the worker left: signal it again on its next poll
            with lock:
                stops.setdefault(worker, [])[:0] = ids

    def done(self, worker, job_id, raw):
        global fail_next
        with lock:
            if fail_next > 0:
                fail_next -= 1
                log["failed_posts"] += 1
                log["posts"].append({"t": now(), "worker": worker, "id": job_id, "code": 500})
                return self.reply(500, {"error": "injected failure"})
            if refuse["n"] > 0 and len(raw) >= refuse["min"]:
                refuse["n"] -= 1
                log["posts"].append({"t": now(), "worker": worker, "id": job_id, "code": refuse["code"]})
                return self.reply(refuse["code"], {"error": "refused"})
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return self.reply(400, {"error": "the body is not a JSON object"})
        with lock:
            j = jobs.get(job_id)
            if j is None:
                return self.reply(404, {"error": "no such job"})
            log["posts"].append({"t": now(), "worker": worker, "id": job_id, "code": 200,
                                 "body": body, "stream": self.parts()[1].get("isStream")})
            if body.get("retry") is True:
                j["released"] += 1
                if j["status"] == "IN_PROGRESS":
                    j.update(status="IN_QUEUE", worker=None)
                    queue.append(job_id)
                    lock.notify_all()
            else:
                j["results"].append({"t": now(), "worker": worker, "body": body})
                if j["status"] != "CANCELLED":
                    j["status"] = "FAILED" if "error" in body else "COMPLETED"
        self.reply(200, {})

    def stream_piece(self, worker, job_id, raw, q):
        with lock:
            if fail_stream["n"] > 0:
                fail_stream["n"] -= 1
                log["stream_failures"] = log.get("stream_failures", 0) + 1
                return self.reply(fail_stream["code"], {"error": "injected failure"})
            j = jobs.get(job_id)
            if j is None:
                return self.reply(404, {"error": "no such job"})
            try:
                body = json.loads(raw)
                assert isinstance(body, dict) and "output" in body
            except (ValueError, AssertionError):
                return self.reply(400, {"error": "the body is not {\"output\": ...}"})
            j["stream"].append({"t": now(), "worker": worker, "output": body["output"],
                                "isStream": q.get("isStream"),
                                "done_before": bool(j["results"])})
            lock.notify_all()
        self.reply(200, {})

    def client_stream(self, job_id):
        with lock:
            j = jobs.get(job_id)
            if j is None:
                return self.reply(404, {"error": "no such job"})
            new = j["stream"][j["read"]:]
            j["read"] = len(j["stream"])
            status = j["status"]
        self.reply(200, {"status": status, "stream": [{"output": p["output"]} for p in new]})

    def ping(self, worker, q):
        ids = [i for i in q.get("job_id", "").split(",") if i]
        with lock:
            log["pings"].append({"t": now(), "worker": worker, "job_ids": ids,
                                 "runpod_version": q.get("runpod_version")})
            for i in ids:
                j = jobs.get(i)
                if j and j["status"] in ("IN_PROGRESS", "CANCELLED") and j["worker"] == worker:
                    j["last_seen"] = now()
        self.reply(200, {})

    # ---- test side ----

    def admin(self, p, q, raw):
        global fail_next
        with lock:
            if p[1] == "enqueue":
                new = json.loads(raw)
                for j in new if isinstance(new, list) else [new]:
                    jobs[j["id"]] = {"id": j["id"], "input": j.get("input"), "status": "IN_QUEUE",
                                     "worker": None, "last_seen": 0, "deliveries": 0,
                                     "released": 0, "results": [], "stream": [], "read": 0}
                    queue.append(j["id"])
                lock.notify_all()
                return self.reply(200, {"queued": len(queue)})
            if p[1] == "cancel" and len(p) == 3 and p[2] in jobs:
                j = jobs[p[2]]
                if j["status"] == "IN_QUEUE":
                    queue.remove(p[2])
                elif j["status"] == "IN_PROGRESS":
                    stops.setdefault(j["worker"], []).append(p[2])
                j["status"] = "CANCELLED"
                lock.notify_all()
                return self.reply(200, {})
            if p[1] == "refuse_done":
                refuse.update(n=int(q.get("n", "1")), code=int(q.get("code", "413")), min=int(q.get("min", "0")))
                return self.reply(200, {})
            if p[1] == "fail_stream":
                fail_stream.update(n=int(q.get("n", "1")), code=int(q.get("code", "500")))
                return self.reply(200, {})
            if p[1] == "fail_done":
                fail_next = int(q.get("n", "1"))
                return self.reply(200, {})
            if p[1] == "state":
                return self.reply(200, {"jobs": jobs, "queue": queue, **log})
        self.reply(404, {"error": "unknown admin call"})

    def route(self, method):
        p, q = self.parts()
        raw = self.body() if method == "POST" else b""
        if p and p[0] == "admin" and len(p) >= 2:
            return self.admin(p, q, raw)
        if len(p) < 4 or p[0] != "v2":
            return self.reply(404, {"error": "unknown path"})
        if not self.authorized():
            return
        kind, worker = p[2], p[3]
        if opts.delay_ms > 0 and method == "POST":
            time.sleep(opts.delay_ms / 1e3)
        if method == "GET" and kind == "job-take":
            return self.take(worker, 1, q)
        if method == "GET" and kind == "job-take-batch":
            return self.take(worker, max(1, int(q.get("batch_size", "1"))), q)
        if method == "GET" and kind == "job-stop":
            return self.stop(worker)
        if method == "GET" and kind == "ping":
            return self.ping(worker, q)
        if method == "POST" and kind == "job-done" and len(p) == 5:
            return self.done(worker, p[4], raw)
        if method == "POST" and kind == "job-stream" and len(p) == 5:
            return self.stream_piece(worker, p[4], raw, q)
        if method == "GET" and kind == "stream":
            return self.client_stream(p[3])
        self.reply(404, {"error": "unknown path"})

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")


def reaper():
    while True:
        time.sleep(0.1)
        with lock:
            for j in jobs.values():
                if j["status"] == "IN_PROGRESS" and now() - j["last_seen"] > opts.lease:
                    log["expired"].append({"t": now(), "id": j["id"], "worker": j["worker"]})
                    j.update(status="IN_QUEUE", worker=None)
                    queue.append(j["id"])
                    lock.notify_all()


def main():
    global opts
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--long-poll", type=float, default=2.0)
    ap.add_argument("--lease", type=float, default=0)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--delay-ms", type=float, default=0)
    opts = ap.parse_args()
    ThreadingHTTPServer.request_queue_size = 128  # the default 5 drops SYNs of parallel posts
    srv = ThreadingHTTPServer(("127.0.0.1", opts.port), Handler)
    srv.daemon_threads = True
    if opts.lease > 0:
        threading.Thread(target=reaper, daemon=True).start()
    print(f"listening on 127.0.0.1:{opts.port}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
