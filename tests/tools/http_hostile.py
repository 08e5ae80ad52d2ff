#!/usr/bin/env python3
"""http_hostile.py - malformed and hostile HTTP requests against `wick dev`.

Sends at least 100 bad requests over raw sockets (bad JSON, wrong types, out-of-range values,
a huge body, huge headers, missing or wrong keys, junk paths and methods, broken HTTP, a
slowloris connection trickling its headers, a body that never finishes) and checks that each
gets a 4xx or is cut by the server's timeout, that every 4xx our handler writes is an OpenAI
error object, and that the server still answers a good request afterwards.

    http_hostile.py --port PORT --key KEY --model NAME --timeout S [--max-connections N]
"""
import argparse
import json
import socket
import sys
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--key", required=True)
p.add_argument("--model", required=True)
p.add_argument("--timeout", type=float, required=True, help="the server's --http-timeout")
p.add_argument("--max-connections", type=int, help="the server's --max-connections")
a = p.parse_args()

HOST = "127.0.0.1"
results = []  # (name, outcome)
failures = []


def raw(data, read_timeout=10.0, pause=None):
    """Sends bytes (a list of chunks with pauses, or one blob); returns (status, body) or
    ('closed', b'') when the server closes without an answer."""
    s = socket.create_connection((HOST, a.port), timeout=read_timeout)
    try:
        chunks = data if isinstance(data, list) else [data]
        for c in chunks:
            try:
                s.sendall(c)
            except (BrokenPipeError, ConnectionResetError):
                break
            if pause:
                time.sleep(pause)
        buf = b""
        while True:
            try:
                d = s.recv(65536)
            except ConnectionResetError:
                break
            except socket.timeout:
                return "hung", buf
            if not d:
                break
            buf += d
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                hdr = head.decode("latin-1").lower()
                if "content-length:" in hdr:
                    n = int(hdr.split("content-length:")[1].split("\r\n")[0])
                    if len(body) >= n:
                        break
        if not buf:
            return "closed", b""
        status = int(buf.split(b" ", 2)[1])
        return status, buf.partition(b"\r\n\r\n")[2]
    finally:
        s.close()


def req(method, path, body=None, key=True, headers=None, ctype="application/json"):
    h = [f"{method} {path} HTTP/1.1", f"Host: {HOST}", "Connection: close"]
    if key is True:
        h.append(f"Authorization: Bearer {a.key}")
    elif key:
        h.append(f"Authorization: {key}")
    if body is not None:
        if isinstance(body, str):
            body = body.encode()
        h.append(f"Content-Type: {ctype}")
        h.append(f"Content-Length: {len(body)}")
    h += headers or []
    return ("\r\n".join(h) + "\r\n\r\n").encode() + (body or b"")


def expect(name, data, want=None, openai_body=True, **kw):
    st, body = raw(data, **kw)
    ok = isinstance(st, int) and 400 <= st < 500 if want is None else st == want
    if ok and isinstance(st, int) and openai_body:
        try:
            e = json.loads(body)["error"]
            ok = isinstance(e["message"], str) and e["message"] and "type" in e and "code" in e
        except (ValueError, KeyError, TypeError):
            ok = False
            st = f"{st} without an OpenAI error body: {body[:120]!r}"
    results.append((name, st))
    if not ok:
        failures.append(f"{name}: got {st}, want {want or '4xx'}")


CHAT, COMPL = "/v1/chat/completions", "/v1/completions"
good_msgs = [{"role": "user", "content": "Once upon a time"}]

# 1. Bodies that are not JSON objects (x2 routes).
for i, b in enumerate(["", "{", "not json", "[1,2,3]", "\"a string\"", "null", "{\"a\":1,}",
                       "{\"messages\": [}", "\xff\xfe", "{\"model\": \"x\" \"y\"}"]):
    for route in (CHAT, COMPL):
        expect(f"bad json {i} {route}", req("POST", route, b.encode("latin-1")))

# 2. Wrong types and values (chat).
wrong = [
    {"messages": "hi"}, {"messages": [1]}, {"messages": []}, {"messages": [{"content": "x"}]},
    {"messages": [{"role": 5, "content": "x"}]}, {"messages": [{"role": "wizard", "content": "x"}]},
    {"messages": [{"role": "user", "content": 7}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
    {"messages": good_msgs, "stream": "yes"}, {"messages": good_msgs, "max_tokens": "10"},
    {"messages": good_msgs, "max_tokens": 1.5}, {"messages": good_msgs, "max_tokens": 0},
    {"messages": good_msgs, "max_tokens": -1}, {"messages": good_msgs, "max_tokens": 10 ** 12},
    {"messages": good_msgs, "temperature": "hot"}, {"messages": good_msgs, "temperature": 9},
    {"messages": good_msgs, "top_p": 5}, {"messages": good_msgs, "top_k": -3},
    {"messages": good_msgs, "seed": "s"}, {"messages": good_msgs, "stop": 7},
    {"messages": good_msgs, "stop": [""]}, {"messages": good_msgs, "stop": ["a"] * 40},
    {"messages": good_msgs, "n": 129}, {"messages": good_msgs, "n": 0},
    {"messages": good_msgs, "model": 5},
    {"messages": good_msgs, "logprobs": "yes"}, {"messages": good_msgs, "tools": [{"type": "function"}]},
    {"messages": good_msgs, "logprobs": True, "top_logprobs": 99}, {"messages": good_msgs, "top_logprobs": 3},
    {"messages": good_msgs, "stream_options": 3}, {"messages": [{"role": "user", "content": "a\u0000b"}]},
    {"messages": good_msgs, "presence_penalty": 3}, {"messages": good_msgs, "logit_bias": {"5": 900}},
    {"messages": good_msgs, "logit_bias": {"99999999": 1}}, {"messages": good_msgs, "repetition_penalty": -1},
    {"messages": good_msgs, "response_format": {"type": "xml"}},
    {"messages": good_msgs, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(?=a)"}}}},
    {"messages": good_msgs, "response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}},
]
for i, b in enumerate(wrong):
    expect(f"wrong chat {i} {json.dumps(b)[:60]}", req("POST", CHAT, json.dumps(b)))

# 3. Wrong types (completions).
for i, b in enumerate([{}, {"prompt": 5}, {"prompt": [1, -2, 3]}, {"prompt": ["a", 5]},
                       {"prompt": ["a", "b"], "n": 65}, {"prompt": [[1], [1, -1]]},
                       {"prompt": [1, 99999]}, {"prompt": []}, {"prompt": [[]]},
                       {"prompt": [1, 2.5]}, {"prompt": "x", "echo": 1},
                       {"prompt": "x", "echo": True, "max_tokens": -1},
                       {"prompt": "x", "suffix": "y"},
                       {"prompt": "x", "best_of": 3}, {"prompt": "x", "max_tokens": 0},
                       {"prompt": "x", "stream": 1}, {"prompt": None},
                       {"prompt": "x", "logprobs": 99}, {"prompt": "x", "logprobs": "2"}]):
    expect(f"wrong completion {i}", req("POST", COMPL, json.dumps(b)))

# 3b. /tokenize and /detokenize (vLLM's): bodies that are not objects, wrong types.
for i, b in enumerate(["", "[]", "{", "5", json.dumps({}), json.dumps({"prompt": 5}),
                       json.dumps({"prompt": "x", "messages": good_msgs}),
                       json.dumps({"messages": "hi"}), json.dumps({"messages": [{"role": "x"}]}),
                       json.dumps({"prompt": "x", "add_special_tokens": "no"}),
                       json.dumps({"messages": good_msgs, "add_generation_prompt": 1}),
                       json.dumps({"prompt": "x", "return_token_strs": 2}),
                       json.dumps({"prompt": "x" * (2 << 20)})]):
    expect(f"tokenize {i}", req("POST", "/tokenize", b))
for i, b in enumerate(["", "[]", json.dumps({}), json.dumps({"tokens": "1"}),
                       json.dumps({"tokens": [1, -1]}), json.dumps({"tokens": [1, 2.5]}),
                       json.dumps({"tokens": [1, 10 ** 12]}), json.dumps({"tokens": [None]})]):
    expect(f"detokenize {i}", req("POST", "/detokenize", b))

# 4. Another model: 404 model_not_found.
for m in ("gpt-4o", "", a.model + "x", a.model.upper()):
    expect(f"model {m!r}", req("POST", CHAT, json.dumps({"model": m, "messages": good_msgs})), 404)
expect("models/other", req("GET", "/v1/models/gpt-4o"), 404)

# 5. Keys: missing, wrong, malformed, on every authenticated route.
for route, method, body in ((CHAT, "POST", json.dumps({"messages": good_msgs})),
                            ("/v1/models", "GET", None), ("/metrics", "GET", None),
                            ("/tokenize", "POST", json.dumps({"prompt": "x"}))):
    expect(f"no key {route}", req(method, route, body, key=None), 401)
    expect(f"wrong key {route}", req(method, route, body, key="Bearer nope"), 401)
    expect(f"basic auth {route}", req(method, route, body, key="Basic dXNlcjpwYXNz"), 401)
    expect(f"key prefix {route}", req(method, route, body, key=f"Bearer {a.key[:-1]}"), 401)
    expect(f"key suffix {route}", req(method, route, body, key=f"Bearer {a.key}x"), 401)

# 6. Junk paths and wrong methods.
for path in ("/", "/v1", "/v2/chat/completions", "/admin", "/../../etc/passwd", "/v1/chat",
             "/v1/completions/x", "/health/x", "/v1/models/../../x", "/%00", "/" + "a" * 2000):
    expect(f"junk path {path[:30]}", req("GET", path), 404)
for method, path in (("GET", CHAT), ("PUT", CHAT), ("DELETE", "/v1/models"), ("POST", "/v1/models"),
                     ("POST", "/health"), ("GET", COMPL), ("PATCH", "/metrics"),
                     ("GET", "/tokenize"), ("PUT", "/detokenize")):
    expect(f"method {method} {path}", req(method, path, "{}" if method != "GET" else None), 405)

# 7. Broken HTTP and size limits (past twice the body limit, and for broken HTTP, libevent
#    answers itself, with an HTML page; a body just over the limit gets an OpenAI error).
# (the limit is 4 MiB, http_api.c's BODY_MAX; libevent's own is twice that)
over = json.dumps({"messages": [{"role": "user", "content": "x" * (9 << 19)}]}).encode()
expect("body over the limit", req("POST", CHAT, over), 413)
big = json.dumps({"messages": [{"role": "user", "content": "x" * (9 << 20)}]}).encode()
expect("huge body", req("POST", CHAT, big), 413, openai_body=False)
expect("huge content-length", req("POST", CHAT, b"{}", headers=[]).replace(
    b"Content-Length: 2", b"Content-Length: 99999999999"), None, openai_body=False)
expect("huge chunked body", (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {a.key}\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n").encode() +
       b"".join(b"100000\r\n" + b"a" * 0x100000 + b"\r\n" for _ in range(9)), None, openai_body=False)
expect("huge header", req("GET", "/v1/models", headers=["X-Big: " + "a" * 40000]), None,
       openai_body=False)
expect("many headers", req("GET", "/v1/models", headers=[f"X-{i}: {'b' * 50}" for i in range(600)]),
       None, openai_body=False)
expect("garbage request line", b"GARBAGE\r\n\r\n", None, openai_body=False)
expect("bad version", b"GET /health HTTP/9.9\r\n\r\n", None, openai_body=False)
expect("header without colon", b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", None, openai_body=False)
expect("bad chunk size", (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "zz\r\nabc\r\n0\r\n\r\n").encode(), None, openai_body=False)

# 8. Slow clients: each must be cut by the server (a 4xx or the connection closed) within
#    about --http-timeout, although it keeps sending.
def slow(name, chunks, pause):
    """Sends chunks one by one, pause seconds apart, watching for the server's answer or
    close in between; chunks=[] sends nothing at all."""
    import select
    t0 = time.time()
    s = socket.create_connection((HOST, a.port))
    st = None
    limit = a.timeout * 3 + 2
    try:
        i = 0
        while time.time() - t0 < limit + 5:
            if i < len(chunks):
                try:
                    s.sendall(chunks[i])
                except (BrokenPipeError, ConnectionResetError):
                    st = "closed"
                    break
                i += 1
            r, _, _ = select.select([s], [], [], pause)
            if r:
                try:
                    d = s.recv(65536)
                except ConnectionResetError:
                    d = b""
                st = int(d.split(b" ", 2)[1]) if d.startswith(b"HTTP/") else "closed"
                break
    finally:
        s.close()
    took = time.time() - t0
    ok = (st == "closed" or (isinstance(st, int) and 400 <= st < 500)) and took < limit
    results.append((name, f"{st} after {took:.1f} s"))
    if not ok:
        failures.append(f"{name}: {st} after {took:.1f} s (timeout {a.timeout} s)")


lines = [b"GET /v1/models HTTP/1.1\r\n", b"Host: x\r\n"] + [f"X-{i}: y\r\n".encode() for i in range(200)]
trickle = b"GET /v1/models HTTP/1.1\r\nX-Long: " + b"a" * 2000
stalled = req("POST", CHAT, "{" * 100)[:-50]
slow_threads = [
    threading.Thread(target=slow, args=("slowloris headers", lines, a.timeout / 4)),
    threading.Thread(target=slow, args=("slowloris bytes", [bytes([c]) for c in trickle],
                                        a.timeout / 8)),
    threading.Thread(target=slow, args=("stalled body", [stalled], 0.2)),
    threading.Thread(target=slow, args=("silent connection", [], 0.2)),
]
for t in slow_threads:
    t.start()
# While they trickle, the server serves.
st, body = raw(req("POST", CHAT, json.dumps({"model": a.model, "messages": good_msgs, "max_tokens": 8})))
if st != 200:
    failures.append(f"a good request during the slowloris: {st} {body[:200]!r}")
for t in slow_threads:
    t.join()

# 9. Connections past --max-connections are closed at once (well before the timeout); the
#    ones within the limit stay open until the timeout.
if a.max_connections:
    import select
    socks = [socket.create_connection((HOST, a.port)) for _ in range(a.max_connections + 5)]
    time.sleep(min(1.0, a.timeout / 2))
    closed = 0
    for s in socks:
        r, _, _ = select.select([s], [], [], 0)
        if r:
            try:
                closed += s.recv(1) == b""
            except ConnectionResetError:
                closed += 1
    for s in socks:
        s.close()
    print(f"  connection limit {a.max_connections}: {closed} of {len(socks)} connections closed at once")
    if closed != 5:
        failures.append(f"{len(socks)} connections with a limit of {a.max_connections}: "
                        f"{closed} were closed at once, want 5")
    time.sleep(0.6)  # the server's sweep notices the closed ones

# 10. And after all that, a good request still works.
st, body = raw(req("POST", CHAT, json.dumps({"model": a.model, "messages": good_msgs, "max_tokens": 8})))
good = st == 200 and json.loads(body)["choices"][0]["message"]["content"]
if not good:
    failures.append(f"the good request afterwards: {st} {body[:200]!r}")
st, _ = raw(req("GET", "/health", key=None))
if st != 200:
    failures.append(f"/health afterwards: {st}")

codes = {}
for _, st in results:
    k = str(st).split(" ")[0]
    codes[k] = codes.get(k, 0) + 1
print(f"{len(results)} hostile requests: {json.dumps(codes, sort_keys=True)}")
for name, st in results:
    if "slow" in name or "stalled" in name or "silent" in name:
        print(f"  {name}: {st}")
if len(results) < 100:
    failures.append(f"only {len(results)} hostile requests were sent")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
print("the server kept serving: a good request afterwards got 200")
