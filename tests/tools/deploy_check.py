#!/usr/bin/env python3
"""tests/tools/deploy_check.py - checks deploy/ against the wick binary and the C sources.

    deploy_check.py --wick build/wick [--deploy deploy] [--src .] [--dockerignore .dockerignore]

What it checks (each failure is one line "FILE: problem"; exit 1 when there is any):
  * every YAML file parses; every document has apiVersion, kind and metadata.name;
  * every `wick SUB ...` command line in deploy/ (YAML command/args with $(VAR) resolved from
    the ConfigMaps, Dockerfile ENTRYPOINT+CMD and RUN lines, shell scripts, systemd Exec*=
    lines, list literals in Python, fenced code in Markdown) names a subcommand of
    `wick --help` and only flags that `wick SUB --help` prints (`wick dev` also takes every
    `wick worker` flag: worker/cmd_dev.c);
  * ScaledJobs: a `wick worker` container with 8 nvidia.com/gpu, terminationGracePeriodSeconds
    above --drain-timeout, a `wick prefetch` init container on the same snapshot, the snapshot
    on a PVC or hostPath, non-empty triggers whose redis-streams stream/consumerGroup/address
    (or aws-sqs-queue queueURL/awsRegion) are those of the worker's --queue URL, and targets
    equal to --concurrency; --idle-timeout >= --lease; activeDeadlineSeconds past
    max-lifetime + startup + drain;
  * systemd: KillSignal=SIGTERM, TimeoutStopSec above --drain-timeout, a Restart= that does
    not restart the idle exit (exit 0);
  * Modal: the app compiles, asks for 8 GPUs, has a scaledown_window, prefetches in an
    @modal.enter hook, and drains within Modal's 30 s exit grace;
  * Dockerfiles: structure (multi-stage CUDA 13 devel -> runtime/base, non-root USER in the
    final stage, exec-form ENTRYPOINT, no ADD of a URL, no compilers in the final stage);
  * environment variables: the names wick reads (getenv("NAME") in the C sources, outside
    tests/) equal the "# wick-env:" list of deploy/Dockerfile and the wick table of
    deploy/README.md; every WICK_/RUNPOD_/AWS_ name used in deploy/ is in one of the README's
    two tables (read by wick / read by the deploy files), and the tables do not overlap.
The last line is a summary: how many command lines, flags, manifests and variables were checked.
"""

import argparse
import ast
import json
import os
import py_compile
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.parse

try:
    import yaml
except ImportError:
    sys.exit("deploy_check: python3's yaml module is missing (Debian: apt-get install python3-yaml)")

FAIL = []
STATS = {"command_lines": 0, "flags": 0, "yaml_docs": 0, "scaledjobs": 0, "triggers": 0,
         "dockerfiles": 0, "units": 0, "env_names": 0}
ENV_RE = re.compile(r"\b(?:WICK|RUNPOD|AWS)_[A-Z0-9_]*[A-Z0-9]\b")
SHELLS = {"sh", "bash", "dash"}
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "\n", "then", "do", "else", "elif", "exec",
              "!", "time", "if", "while", "until", "nohup", "env"}
MODAL_EXIT_GRACE_S = 30  # Modal runs @modal.exit with a 30 s grace on preemption
DEPLOY_ROOT = "deploy"   # --deploy


def fail(path, msg):
    FAIL.append(f"{path}: {msg}")


# ---- the binary: subcommands and their flags ------------------------------------------------

class Wick:
    def __init__(self, exe):
        self.exe = exe
        top = self._help([])
        self.subs = set(re.findall(r"^\s*wick ([a-z]+)", top, re.M))
        if "worker" not in self.subs:
            sys.exit(f"deploy_check: `{exe} --help` lists no worker subcommand:\n{top}")
        self.cache = {}

    def _help(self, sub):
        r = subprocess.run([self.exe, *sub, "--help"], capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            sys.exit(f"deploy_check: `{self.exe} {' '.join(sub)} --help` exited {r.returncode}")
        return r.stdout + r.stderr

    def flags(self, sub):
        if sub not in self.cache:
            text = self._help([sub])
            if sub == "dev":  # "Every `wick worker` flag applies too" (worker/cmd_dev.c)
                text += self._help(["worker"])
            longs = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", text))
            shorts = set(re.findall(r"(?<![\w-])(-[A-Za-z])(?![\w-])", text))
            self.cache[sub] = longs | shorts | {"--help", "-h"}
        return self.cache[sub]


class Invocation:
    """One `wick SUB ARGS...` command line found in a deploy file."""

    def __init__(self, path, sub, args, where=""):
        self.path, self.sub, self.args, self.where = path, sub, list(args), where

    def opts(self):
        """{flag: value or None}; the last value of a flag wins, as with getopt."""
        out, i = {}, 0
        while i < len(self.args):
            a = self.args[i]
            if isinstance(a, str) and a.startswith("--") and "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif isinstance(a, str) and a.startswith("-") and len(a) > 1 and not _num(a):
                nxt = self.args[i + 1] if i + 1 < len(self.args) else None
                if isinstance(nxt, str) and nxt.startswith("-") and not _num(nxt):
                    nxt = None
                out[a] = nxt
                if nxt is not None:
                    i += 1
            i += 1
        return out

    def flags(self):
        return [a.split("=", 1)[0] for a in self.args
                if isinstance(a, str) and a.startswith("-") and len(a) > 1 and not _num(a)]

    def num(self, flag, default=None):
        v = self.opts().get(flag, default)
        try:
            return float(v)
        except (TypeError, ValueError):
            return None


def _num(s):
    return re.fullmatch(r"-?[0-9.]+", s) is not None


def check_invocation(wick, inv, found):
    STATS["command_lines"] += 1
    found.append(inv)
    where = f" ({inv.where})" if inv.where else ""
    if inv.sub not in wick.subs:
        fail(inv.path, f"`wick {inv.sub}`{where}: no such subcommand in `wick --help`")
        return
    known = wick.flags(inv.sub)
    for f in inv.flags():
        STATS["flags"] += 1
        if f not in known:
            fail(inv.path, f"`wick {inv.sub}`{where}: flag {f} is not in `wick {inv.sub} --help`")


# ---- finding command lines ------------------------------------------------------------------

def strip_comments(text):
    """Drops shell comments: an unquoted # at the start of a word, to the end of its line."""
    out, i, q, n = [], 0, None, len(text)
    while i < n:
        c = text[i]
        if q:
            out.append(c)
            if c == "\\" and q == '"' and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == q:
                q = None
        elif c == "\\" and i + 1 < n:
            out.append(c + text[i + 1])
            i += 1
        elif c in "'\"":
            q = c
            out.append(c)
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|("):
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def shell_tokens(text):
    """Tokens of a shell text; newlines, ;, &&, || and | are tokens; comments dropped."""
    text = strip_comments(re.sub(r"\\\n", " ", text))
    lx = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>\n")
    lx.whitespace = " \t\r"
    lx.whitespace_split = True
    lx.commenters = ""
    out = []
    for t in lx:
        if t and all(ch in ";&|()<>\n" for ch in t) and "\n" in t:
            t = "\n"  # shlex groups runs of punctuation: ";\n", "\n\n"
        out.append(t)
    return out


def is_wick(tok):
    return os.path.basename(tok) == "wick"


def shell_invocations(path, text, where=""):
    try:
        toks = shell_tokens(text)
    except ValueError as e:
        fail(path, f"cannot tokenize as shell{' (' + where + ')' if where else ''}: {e}")
        return []
    out = []
    for i, t in enumerate(toks):
        if not is_wick(t):
            continue
        k = i - 1
        if k >= 1 and toks[k - 1] == "-u" and k >= 2 and toks[k - 2] == "sudo":
            k -= 2  # sudo -u USER wick ...
        if k >= 0 and toks[k] not in SEPARATORS and toks[k] != "sudo":
            continue
        j, args = i + 1, []
        while j < len(toks) and toks[j] not in {";", "&&", "||", "|", "&", ")", "\n", ">", "<",
                                               ">>", "2>", "2>&1"}:
            args.append(toks[j])
            j += 1
        if not args or args[0].startswith("-"):
            continue  # `wick --help`: the top level, no subcommand
        out.append(Invocation(path, args[0], args[1:], where))
    return out


def argv_invocations(path, argv, where):
    """An exec-form argv: wick SUB ... or sh -c 'SCRIPT'."""
    if not argv:
        return []
    if os.path.basename(argv[0]) in SHELLS and len(argv) >= 3 and argv[1] == "-c":
        return shell_invocations(path, argv[2], where)
    if is_wick(argv[0]) and len(argv) >= 2 and not argv[1].startswith("-"):
        return [Invocation(path, argv[1], argv[2:], where)]
    return []


# ---- Dockerfiles ----------------------------------------------------------------------------

def dockerfile_instructions(text):
    """[(INSTRUCTION, rest, line)] with continuation lines joined and comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        parts = buf.split(None, 1)
        out.append((parts[0].upper(), parts[1] if len(parts) > 1 else "", start))
        buf = ""
    return out


def exec_form(rest):
    try:
        v = json.loads(rest)
    except ValueError:
        return None
    return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None


def check_dockerfile(path, text, wick, found, entrypoints):
    STATS["dockerfiles"] += 1
    ins = dockerfile_instructions(text)
    args = {k: v for k, v in (re.match(r"(\w+)=?(.*)", r).groups() for i, r, _ in ins
                              if i == "ARG" and "=" in r)}
    stages = []
    for i, rest, line in ins:
        if i == "FROM":
            img = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)),
                         rest.split()[0] if not rest.startswith("--") else rest.split()[1])
            stages.append({"image": img, "ins": [], "line": line})
        elif stages:
            stages[-1]["ins"].append((i, rest, line))
        elif i not in ("ARG",):
            fail(path, f"line {line}: {i} before the first FROM")
    if not stages:
        fail(path, "no FROM")
        return
    for i, rest, line in ins:
        if i == "ADD" and re.search(r"(?:^|\s)(?:https?|git)://", rest):
            fail(path, f"line {line}: ADD of a remote URL (download in a RUN step with a checksum)")
        if i == "MAINTAINER":
            fail(path, f"line {line}: MAINTAINER is deprecated (use a LABEL)")
    final = stages[-1]
    users = [r for i, r, _ in final["ins"] if i == "USER"]
    if not users:
        fail(path, "the final stage sets no USER: it would run as root")
    elif users[-1].split(":")[0] in ("root", "0"):
        fail(path, f"the final stage runs as {users[-1]}")
    eps = [(r, line) for i, r, line in final["ins"] if i == "ENTRYPOINT"]
    cmds = [(r, line) for i, r, line in final["ins"] if i == "CMD"]
    ep = None
    if not eps:
        fail(path, "the final stage has no ENTRYPOINT")
    else:
        ep = exec_form(eps[-1][0])
        if ep is None:
            fail(path, f"line {eps[-1][1]}: ENTRYPOINT is not in exec form (JSON array): signals "
                       "would go to a shell, not to wick")
    cmd = exec_form(cmds[-1][0]) if cmds else []
    if cmds and cmd is None:
        fail(path, f"line {cmds[-1][1]}: CMD is not in exec form (JSON array)")
    if ep:
        entrypoints[path] = ep
        found_ep = argv_invocations(path, ep + (cmd or []), "ENTRYPOINT + CMD")
        for inv in found_ep:
            check_invocation(wick, inv, found)
    for st in stages:
        for i, rest, line in st["ins"]:
            if i == "RUN":
                for inv in shell_invocations(path, rest, f"RUN, line {line}"):
                    check_invocation(wick, inv, found)
    if os.path.normpath(path) == os.path.normpath(os.path.join(DEPLOY_ROOT, "Dockerfile")):
        # the main image: the brief's shape
        if len(stages) < 2:
            fail(path, "not a multi-stage build")
        first, last = stages[0]["image"], final["image"]
        if not re.match(r"nvidia/cuda:13\.[0-9.]+-devel-", first):
            fail(path, f"the build stage is {first}, not a CUDA 13 devel image")
        if not re.match(r"nvidia/cuda:13\.[0-9.]+-(runtime|base)-", last):
            fail(path, f"the final stage is {last}, not a CUDA 13 runtime or base image")
        if ep != ["wick", "worker"]:
            fail(path, f"ENTRYPOINT is {ep}, not [\"wick\", \"worker\"]")
        runs = " ".join(r for i, r, _ in final["ins"] if i == "RUN")
        for tok in sorted(set(runs.split())):
            if tok.endswith("-dev") or tok in ("build-essential", "gcc", "g++", "make", "nvcc") \
                    or tok.startswith("cuda-toolkit"):
                fail(path, f"the final stage installs {tok}: build tools belong in the build stage")
        for lib in ("libcurl", "libjansson", "libevent", "liblz4", "libxxhash", "libhiredis"):
            if lib not in runs:
                fail(path, f"the final stage does not install {lib}")
        if not any(i == "COPY" and "--from=" in r for i, r, _ in final["ins"]):
            fail(path, "the final stage copies nothing from the build stage")


# ---- YAML (Kubernetes, KEDA) ----------------------------------------------------------------

def k8s_docs(paths):
    docs = []
    for p in paths:
        try:
            with open(p) as f:
                for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                    if d is not None:
                        docs.append((p, d))
        except yaml.YAMLError as e:
            fail(p, f"YAML does not parse: {e}")
    return docs


def pod_specs(doc):
    k = doc.get("kind")
    spec = doc.get("spec") or {}
    if k == "ScaledJob":
        return [((spec.get("jobTargetRef") or {}).get("template") or {}).get("spec") or {}]
    if k == "Job":
        return [(spec.get("template") or {}).get("spec") or {}]
    if k in ("Deployment", "StatefulSet", "DaemonSet"):
        return [(spec.get("template") or {}).get("spec") or {}]
    if k == "Pod":
        return [spec]
    return []


class Env:
    """A container's environment as the kubelet builds it, for $(VAR) expansion."""

    def __init__(self, path, c, configmaps, secrets):
        self.vals, self.path = {}, path
        for ef in c.get("envFrom") or []:
            ref = ef.get("configMapRef") or ef.get("secretRef") or {}
            src = configmaps if "configMapRef" in ef else secrets
            if ref.get("name") not in src:
                fail(path, f"container {c.get('name')}: envFrom names {ref.get('name')}, "
                           "which no file in this directory defines")
                continue
            self.vals.update(src[ref["name"]])
        for e in c.get("env") or []:
            name, vf = e.get("name"), e.get("valueFrom") or {}
            if "value" in e:
                self.vals[name] = str(e["value"])
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                ref = vf.get("configMapKeyRef") or vf.get("secretKeyRef")
                src = configmaps if "configMapKeyRef" in vf else secrets
                if ref.get("name") not in src or ref.get("key") not in src[ref["name"]]:
                    fail(path, f"container {c.get('name')}: env {name} refers to "
                               f"{ref.get('name')}/{ref.get('key')}, which is not defined here")
                    continue
                self.vals[name] = src[ref["name"]][ref["key"]]
            elif "fieldRef" in vf or "resourceFieldRef" in vf:
                self.vals[name] = f"<{name}>"  # known only at run time

    def expand(self, s, where):
        def sub(m):
            if m.group(1) not in self.vals:
                fail(self.path, f"{where}: $({m.group(1)}) is not defined in the container's env")
                return m.group(0)
            return self.vals[m.group(1)]
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def redis_url(u):
    p = urllib.parse.urlsplit(u)
    q = urllib.parse.parse_qs(p.query)
    return {"host": p.hostname, "port": p.port or 6379, "stream": p.path.lstrip("/"),
            "group": q.get("group", ["wick"])[0]}


def sqs_url(u):
    p = urllib.parse.urlsplit(u)
    q = urllib.parse.parse_qs(p.query)
    parts = p.path.strip("/").split("/")
    return {"host": p.hostname, "account": parts[0] if parts else "",
            "queue": parts[1] if len(parts) > 1 else "", "region": q.get("region", [""])[0]}


def check_k8s(paths, wick, found, entrypoints):
    docs = k8s_docs(paths)
    STATS["yaml_docs"] += len(docs)
    configmaps, secrets = {}, {}
    for p, d in docs:
        if not isinstance(d, dict):
            fail(p, "a YAML document that is not a mapping")
            continue
        for k in ("apiVersion", "kind"):
            if not d.get(k):
                fail(p, f"a document without {k}")
        if not (d.get("metadata") or {}).get("name"):
            fail(p, f"a {d.get('kind')} without metadata.name")
        name = (d.get("metadata") or {}).get("name")
        if d.get("kind") == "ConfigMap":
            configmaps[name] = {k: str(v) for k, v in (d.get("data") or {}).items()}
        if d.get("kind") == "Secret":
            secrets[name] = {k: str(v) for k, v in {**(d.get("data") or {}),
                                                     **(d.get("stringData") or {})}.items()}
    ep = entrypoints.get(os.path.join(DEPLOY_ROOT, "Dockerfile"))
    for p, d in docs:
        if not isinstance(d, dict):
            continue
        kind, name = d.get("kind"), (d.get("metadata") or {}).get("name")
        for ps in pod_specs(d):
            workers, prefetches = [], []
            for role in ("initContainers", "containers"):
                for c in ps.get(role) or []:
                    env = Env(p, c, configmaps, secrets)
                    where = f"{kind} {name}, container {c.get('name')}"
                    argv = [str(x) for x in (c.get("command") or [])]
                    if not argv and ep:
                        argv = list(ep)  # the image's ENTRYPOINT (deploy/Dockerfile)
                    argv += [str(x) for x in (c.get("args") or [])]
                    argv = [env.expand(a, where) for a in argv]
                    for inv in argv_invocations(p, argv, where):
                        check_invocation(wick, inv, found)
                        inv.container = c
                        if inv.sub == "worker" and role == "containers":
                            workers.append(inv)
                        if inv.sub == "prefetch" and role == "initContainers":
                            prefetches.append(inv)
            if kind == "ScaledJob":
                check_scaledjob(p, d, ps, workers, prefetches)
    return docs


def check_scaledjob(p, d, ps, workers, prefetches):
    STATS["scaledjobs"] += 1
    name = d["metadata"]["name"]
    spec = d.get("spec") or {}
    if "template" not in (spec.get("jobTargetRef") or {}):
        fail(p, f"ScaledJob {name}: no jobTargetRef.template")
    if len(workers) != 1:
        fail(p, f"ScaledJob {name}: {len(workers)} containers run `wick worker`, want 1")
        return
    w = workers[0]
    o = w.opts()
    lim = ((w.container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
    if str(lim) != "8":
        fail(p, f"ScaledJob {name}: the worker's nvidia.com/gpu limit is {lim}, want 8")
    drain = w.num("--drain-timeout", 30)
    tgp = ps.get("terminationGracePeriodSeconds")
    if drain is None:
        fail(p, f"ScaledJob {name}: --drain-timeout {o.get('--drain-timeout')} is not a number")
    elif not isinstance(tgp, int) or tgp <= drain:
        fail(p, f"ScaledJob {name}: terminationGracePeriodSeconds {tgp} must exceed the worker's "
                f"--drain-timeout {drain:g}, else the kubelet kills the drain")
    idle, lease = w.num("--idle-timeout", 60), w.num("--lease", 60)
    if idle is not None and lease is not None and 0 < idle < lease:
        fail(p, f"ScaledJob {name}: --idle-timeout {idle:g} < --lease {lease:g}: an idle worker "
                "exits before a dead worker's leases expire, and nobody reclaims them")
    ads = (spec.get("jobTargetRef") or {}).get("activeDeadlineSeconds")
    life = w.num("--max-lifetime", 0)
    if ads is not None and life:
        floor = life + w.num("--startup-timeout", 600) + drain
        if ads <= floor:
            fail(p, f"ScaledJob {name}: activeDeadlineSeconds {ads} kills the worker before "
                    f"--max-lifetime + --startup-timeout + --drain-timeout ({floor:g} s)")
    model = o.get("--model") or o.get("--snapshot") or (w.args[0] if w.args else None)
    if not prefetches:
        fail(p, f"ScaledJob {name}: no init container runs `wick prefetch`")
    elif model not in [x for inv in prefetches for x in inv.args]:
        fail(p, f"ScaledJob {name}: the prefetch warms {prefetches[0].args}, not the worker's "
                f"model {model}")
    mounts = {m.get("mountPath"): m.get("name") for m in w.container.get("volumeMounts") or []}
    vols = {v.get("name"): v for v in ps.get("volumes") or []}
    mp = next((m for m in mounts if model and model.startswith(m.rstrip("/") + "/")), None)
    if mp is None:
        fail(p, f"ScaledJob {name}: the model {model} is on no volume mount")
    elif not ({"persistentVolumeClaim", "hostPath"} & set(vols.get(mounts[mp], {}))):
        fail(p, f"ScaledJob {name}: the snapshot volume {mounts[mp]} is not a PVC or hostPath")
    triggers = spec.get("triggers") or []
    if not triggers:
        fail(p, f"ScaledJob {name}: no triggers")
    queue = o.get("--queue") or ""
    conc = o.get("--concurrency", "8")
    for t in triggers:
        STATS["triggers"] += 1
        md, ty = t.get("metadata") or {}, t.get("type")
        if ty == "redis-streams":
            if not queue.startswith("redis://"):
                fail(p, f"ScaledJob {name}: a redis-streams trigger, but the worker's queue is {queue}")
                continue
            u = redis_url(queue)
            if md.get("stream") != u["stream"]:
                fail(p, f"ScaledJob {name}: trigger stream {md.get('stream')!r} != the worker's "
                        f"stream {u['stream']!r} ({queue})")
            if md.get("consumerGroup") != u["group"]:
                fail(p, f"ScaledJob {name}: trigger consumerGroup {md.get('consumerGroup')!r} != "
                        f"the worker's group {u['group']!r} ({queue})")
            addr = md.get("address") or f"{md.get('host')}:{md.get('port', 6379)}"
            if addr != f"{u['host']}:{u['port']}":
                fail(p, f"ScaledJob {name}: trigger address {addr} != the worker's "
                        f"{u['host']}:{u['port']}")
            target = md.get("lagCount") or md.get("pendingEntriesCount")
            if target is None:
                fail(p, f"ScaledJob {name}: a redis-streams trigger without lagCount or "
                        "pendingEntriesCount (streamLength never shrinks: wick acks, never deletes)")
            elif str(target) != str(conc):
                fail(p, f"ScaledJob {name}: trigger target {target} != --concurrency {conc}")
            if "lagCount" in md and "activationLagCount" not in md:
                fail(p, f"ScaledJob {name}: lagCount without activationLagCount")
        elif ty == "aws-sqs-queue":
            if not queue.startswith("sqs://"):
                fail(p, f"ScaledJob {name}: an aws-sqs-queue trigger, but the worker's queue is {queue}")
                continue
            u, k = sqs_url(queue), urllib.parse.urlsplit(md.get("queueURL") or "")
            kp = k.path.strip("/").split("/")
            if k.hostname != u["host"] or kp != [u["account"], u["queue"]]:
                fail(p, f"ScaledJob {name}: trigger queueURL {md.get('queueURL')} is not the "
                        f"worker's queue {u['host']}/{u['account']}/{u['queue']}")
            if md.get("awsRegion") != u["region"]:
                fail(p, f"ScaledJob {name}: trigger awsRegion {md.get('awsRegion')} != "
                        f"region={u['region']} in {queue}")
            if str(md.get("queueLength")) != str(conc):
                fail(p, f"ScaledJob {name}: queueLength {md.get('queueLength')} != --concurrency {conc}")
        else:
            fail(p, f"ScaledJob {name}: trigger type {ty} is not one this check knows")


# ---- systemd --------------------------------------------------------------------------------

def unit_keys(text):
    text = re.sub(r"\\\n", " ", text)
    out, sect = [], None
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            sect = s.strip("[]")
            continue
        if "=" in s:
            k, v = s.split("=", 1)
            out.append((sect, k.strip(), v.strip()))
    return out


def seconds(v):
    m = re.fullmatch(r"\s*(\d+)\s*(s|sec|min|m)?\s*", v or "")
    if not m:
        return None
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def check_unit(path, text, wick, found, files):
    STATS["units"] += 1
    keys = unit_keys(text)
    get = lambda k: [v for s, kk, v in keys if kk == k]  # noqa: E731
    invs = []
    for s, k, v in keys:
        if k.startswith("Exec"):
            for inv in shell_invocations(path, v.lstrip("-@:+!"), k):
                check_invocation(wick, inv, found)
                invs.append(inv)
    if path.endswith(".path"):
        for u in get("Unit"):
            tmpl = re.sub(r"@[^.]*\.", "@.", u)
            if os.path.basename(tmpl) not in {os.path.basename(f) for f in files}:
                fail(path, f"Unit={u}: no {tmpl} in deploy/")
        return
    workers = [i for i in invs if i.sub == "worker"]
    if not workers:
        fail(path, "no ExecStart runs `wick worker`")
        return
    w = workers[0]
    if (get("KillSignal") or ["SIGTERM"])[-1] not in ("SIGTERM", "TERM", "15"):
        fail(path, f"KillSignal={get('KillSignal')[-1]}: wick drains on SIGTERM")
    drain = w.num("--drain-timeout", 30)
    stop = seconds((get("TimeoutStopSec") or [""])[-1])
    if stop is None or drain is None or stop <= drain:
        fail(path, f"TimeoutStopSec={(get('TimeoutStopSec') or ['(default 90)'])[-1]} must exceed "
                   f"--drain-timeout {w.opts().get('--drain-timeout', 30)}: systemd would "
                   "SIGKILL the drain")
    restart = (get("Restart") or ["no"])[-1]
    if restart in ("always", "on-success"):
        fail(path, f"Restart={restart} restarts the idle exit (status 0): the worker never "
                   "scales to zero; use on-failure")
    idle, lease = w.num("--idle-timeout", 60), w.num("--lease", 60)
    if idle is not None and lease is not None and 0 < idle < lease:
        fail(path, f"--idle-timeout {idle:g} < --lease {lease:g}")


# ---- Python (Modal) -------------------------------------------------------------------------

def py_const(node, consts):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" \
            and len(node.args) == 1:
        v = py_const(node.args[0], consts)
        return None if v is None else str(v)
    if isinstance(node, ast.BinOp):
        a, b = py_const(node.left, consts), py_const(node.right, consts)
        if a is None or b is None:
            return None
        try:
            return {ast.Add: lambda: a + b, ast.Mult: lambda: a * b,
                    ast.Sub: lambda: a - b}[type(node.op)]()
        except (KeyError, TypeError):
            return None
    return None


def check_python(path, text, wick, found):
    try:
        with tempfile.TemporaryDirectory() as td:
            py_compile.compile(path, cfile=os.path.join(td, "x.pyc"), doraise=True)
    except py_compile.PyCompileError as e:
        fail(path, f"does not compile: {e.msg}")
        return
    tree = ast.parse(text, path)
    consts = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            v = py_const(n.value, consts)
            if v is not None:
                consts[n.targets[0].id] = v
    invs = []
    for n in ast.walk(tree):
        if isinstance(n, ast.List) and len(n.elts) >= 2:
            a, b = (py_const(e, consts) for e in n.elts[:2])
            if a == "wick" and isinstance(b, str):
                args = []
                for e in n.elts[2:]:
                    v = py_const(e, consts)
                    args.append(str(v) if v is not None else "<expr>")
                inv = Invocation(path, b, args, f"line {n.lineno}")
                check_invocation(wick, inv, found)
                invs.append(inv)
    if "modal" not in text:
        return
    # Modal specifics: 8 GPUs, scaledown_window, prefetch in @modal.enter, drain < exit grace
    decos = {d.attr if isinstance(d, ast.Attribute) else getattr(getattr(d, "func", None), "attr", None)
             for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
             for d in n.decorator_list}
    if "enter" not in decos:
        fail(path, "no @modal.enter() hook (the prefetch belongs there)")
    if not any(i.sub == "prefetch" for i in invs):
        fail(path, "no `wick prefetch` command line")
    kw = {k.arg: py_const(k.value, consts) for n in ast.walk(tree) if isinstance(n, ast.Call)
          for k in n.keywords if k.arg in ("gpu", "scaledown_window")}
    if "scaledown_window" not in kw:
        fail(path, "no scaledown_window: the idle window is not mapped")
    if not str(kw.get("gpu") or "").endswith(":8"):
        fail(path, f"gpu={kw.get('gpu')!r}: want 8 GPUs (e.g. \"H200:8\")")
    for inv in invs:
        if inv.sub in ("worker", "dev"):
            d = inv.num("--drain-timeout", 30)
            o_drain = inv.opts().get("--drain-timeout")
            if d is None or d >= MODAL_EXIT_GRACE_S:
                fail(path, f"`wick {inv.sub}` ({inv.where}): --drain-timeout "
                           f"{o_drain if d is None else format(d, 'g')} must be under "
                           f"Modal's {MODAL_EXIT_GRACE_S} s exit grace")


# ---- environment variables ------------------------------------------------------------------

def code_getenv(src):
    """Names of getenv("NAME") in the C sources outside tests/, and where each is read."""
    names, where = set(), {}
    for top in ("common", "coldstart", "engine", "kernels", "worker"):
        for dp, _, fs in os.walk(os.path.join(src, top)):
            for f in sorted(fs):
                if not f.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                p = os.path.join(dp, f)
                with open(p, errors="replace") as fh:
                    text = fh.read()
                if "getenv" not in text:
                    continue
                for n, line in enumerate(text.splitlines(), 1):
                    for m in re.finditer(r"\b(?:secure_)?getenv\s*\(\s*([^)]*)\)", line):
                        lit = re.fullmatch(r'"([A-Za-z_][A-Za-z0-9_]*)"', m.group(1).strip())
                        if not lit:
                            fail(p, f"line {n}: getenv({m.group(1)}) is not a literal name; "
                                    "the deploy check cannot list it")
                            continue
                        names.add(lit.group(1))
                        where.setdefault(lit.group(1), f"{os.path.relpath(p, src)}:{n}")
    if not names:
        fail(src, "no getenv() found in the C sources: wrong --src?")
    return names, where


def readme_table(text, tag):
    m = re.search(rf"<!-- env-table:{tag} -->(.*?)<!-- /env-table:{tag} -->", text, re.S)
    if not m:
        return None
    return set(re.findall(r"^\|\s*`([A-Z][A-Z0-9_]*)`", m.group(1), re.M))


def check_env(deploy, src, texts):
    code, where = code_getenv(src)
    STATS["env_names"] = len(code)
    df = os.path.join(deploy, "Dockerfile")
    listed = set(re.findall(r"^#\s*wick-env:\s*([A-Z][A-Z0-9_]*)", texts.get(df, ""), re.M))
    for n in sorted(code - listed):
        fail(df, f"wick reads {n} ({where[n]}) but the '# wick-env:' list does not name it")
    for n in sorted(listed - code):
        fail(df, f"'# wick-env: {n}': no getenv(\"{n}\") in the C sources")
    rd = os.path.join(deploy, "README.md")
    readme = texts.get(rd, "")
    wick_t, dep_t = readme_table(readme, "wick"), readme_table(readme, "deploy")
    if wick_t is None or dep_t is None:
        fail(rd, "missing <!-- env-table:wick --> or <!-- env-table:deploy --> table")
        return
    for n in sorted(code - wick_t):
        fail(rd, f"wick reads {n} ({where[n]}) but the wick env table does not list it")
    for n in sorted(wick_t - code):
        fail(rd, f"the wick env table lists {n}, which no getenv() in the C sources reads")
    for n in sorted(dep_t & code):
        fail(rd, f"{n} is read by wick: it belongs in the wick table, not the deploy table")
    used = {}
    for p, t in texts.items():
        for n in ENV_RE.findall(t):
            used.setdefault(n, p)
    for n, p in sorted(used.items()):
        if n not in wick_t and n not in dep_t:
            fail(p, f"{n} is neither read by wick (getenv) nor listed in deploy/README.md's "
                    "deploy env table")
    for n in sorted(dep_t):
        if not any(n in t for p, t in texts.items() if p != rd):
            fail(rd, f"the deploy env table lists {n}, which no deploy file uses")


# ---- smoke: run the command lines for real, on a small model and a local spool -------------

SMOKE_DROP = {"--model", "--snapshot", "--queue", "--listen", "--ledger", "--step-log",
              "--usage-url", "--done-url", "--ping-url", "--stream-url", "--backend",
              "--threads", "--idle-timeout", "--source"}
UNRESOLVED = re.compile(r"[$<%{}]")
# directories a deployment puts on its volumes: run in the scratch directory instead
SMOKE_DIRS = {"--responses-dir", "--prefix-cache-dir"}


def smoke_one(wick, k, inv, model, workdir):
    """Returns (ran, dropped) after recording failures."""
    tag = f"`wick {inv.sub}`" + (f" ({inv.where})" if inv.where else "")
    args, dropped, i = [], 0, 0
    if inv.sub == "prefetch":
        o = inv.opts()
        args = [x for f, v in o.items() if f in ("--threads", "-j") and v for x in (f, v)]
        args.append(model)
    else:
        a = inv.args
        while i < len(a):
            f, val = a[i], None
            if f.startswith("-") and "=" in f:
                f, val = f.split("=", 1)
            elif f.startswith("-") and i + 1 < len(a) and not (a[i + 1].startswith("-")
                                                                 and not _num(a[i + 1])):
                val = a[i + 1]
                i += 1
            elif not f.startswith("-"):
                i += 1
                continue  # positional MODEL
            i += 1
            if f in SMOKE_DROP:
                continue
            if val is not None and UNRESOLVED.search(val):
                dropped += 1
                continue
            if f in SMOKE_DIRS and val is not None:
                val = os.path.join(workdir, f"{k}{f.replace('--', '-')}")
            args += [f] if val is None else [f, val]
        q = os.path.join(workdir, f"q{k}")
        r = subprocess.run([wick.exe, "submit", "--queue", "spool:" + q, "--id", f"smoke-{k}",
                            "-p", "Once upon a time", "-n", "8"], capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            fail(inv.path, f"{tag}: smoke: wick submit failed: {r.stderr.strip()}")
            return 0, dropped
        args = ["--model", model, "--queue", "spool:" + q, "--ledger",
                os.path.join(workdir, f"ledger{k}.jsonl"), *args, "--backend", "cpu",
                "--threads", "1", "--idle-timeout", "0.15"]
        if inv.sub == "dev":
            args += ["--listen", "127.0.0.1:0"]
    cmd = f"wick {inv.sub} {' '.join(args)}"
    try:
        r = subprocess.run([wick.exe, inv.sub, *args], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail(inv.path, f"{tag}: smoke: `{cmd}` did not exit in 60 s")
        return 0, dropped
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(inv.path, f"{tag}: smoke: `{cmd}` exited {r.returncode}: {last}")
        return 0, dropped
    if inv.sub != "prefetch":
        res = os.path.join(workdir, f"q{k}", "done", f"smoke-{k}.json")
        try:
            with open(res) as fh:
                status = json.load(fh).get("status")
        except (OSError, ValueError) as e:
            status = f"no result ({e})"
        if status != "COMPLETED":
            fail(inv.path, f"{tag}: smoke: the job ended {status}, not COMPLETED")
            return 0, dropped
    return 1, dropped


def smoke(wick, found, model, workdir):
    """Runs each `wick worker`, `wick dev` and `wick prefetch` line with its own flags and
    values, but on MODEL, a spool queue holding one job, a ledger in WORKDIR, the CPU backend
    and a short idle timeout; the directories a deployment keeps on its volumes
    (--responses-dir, --prefix-cache-dir) in WORKDIR. Flags whose values are only known at
    run time ($VAR, %i, a Python expression) are left out. Each must exit 0; each worker must complete its job.
    The runs mostly sleep through their idle timeout, so four go at once."""
    from concurrent.futures import ThreadPoolExecutor
    todo = [(k, inv) for k, inv in enumerate(found) if inv.sub in ("worker", "dev", "prefetch")]
    with ThreadPoolExecutor(max_workers=4) as ex:
        res = list(ex.map(lambda t: smoke_one(wick, t[0], t[1], model, workdir), todo))
    STATS["smoke"] = sum(r[0] for r in res)
    STATS["smoke_dropped"] = sum(r[1] for r in res)
    return len(todo)


# ---- main -----------------------------------------------------------------------------------

GPUS = 8  # the node every deploy file targets


def check_gpu_runs(found):
    """What a GPU node's command lines need beyond valid flags: a snapshot cut for the node's
    GPUs (the worker runs the layout the snapshot holds: one rank would put the whole model
    on one GPU), and workers that never fall back to the CPU and whose hung steps end before
    the platform's grace period (the grace checks are per platform, above)."""
    for inv in found:
        o = inv.opts()
        if inv.sub == "snapshot":
            tp, ep = inv.num("--tp", 1), inv.num("--ep", 1)
            if tp is None or ep is None or max(tp, ep) != GPUS:
                fail(inv.path, f"`wick snapshot` {inv.where}: --tp {o.get('--tp', 1)} --ep "
                               f"{o.get('--ep', 1)} is not a layout for {GPUS} GPUs")
        if inv.sub in ("worker", "dev") and not inv.path.endswith(".md"):
            if o.get("--backend") != "cuda":
                fail(inv.path, f"`wick {inv.sub}` {inv.where}: --backend "
                               f"{o.get('--backend', 'auto')}: a GPU worker must run cuda (auto "
                               "falls back to the CPU when CUDA does not start)")
            if "--step-timeout" not in o or "--max-seq" not in o:
                fail(inv.path, f"`wick {inv.sub}` {inv.where}: no --step-timeout / --max-seq "
                               "(defaults 300 s, past every grace period, and the model's "
                               "whole context per slot)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wick", required=True)
    ap.add_argument("--deploy", default="deploy")
    ap.add_argument("--src", default=".")
    ap.add_argument("--dockerignore", default=None)
    ap.add_argument("--list", action="store_true", help="print every command line found")
    ap.add_argument("--smoke-model", help="also run the worker/dev/prefetch lines on this model")
    ap.add_argument("--smoke-dir", help="scratch directory for --smoke-model")
    a = ap.parse_args()
    if not os.access(a.wick, os.X_OK):
        sys.exit(f"deploy_check: {a.wick} is not an executable")
    if not os.path.isdir(a.deploy):
        sys.exit(f"deploy_check: {a.deploy} is not a directory")
    global DEPLOY_ROOT
    DEPLOY_ROOT = a.deploy
    wick = Wick(a.wick)
    files, texts = [], {}
    for dp, dns, fs in os.walk(a.deploy):
        dns[:] = [d for d in dns if d != "__pycache__"]
        for f in sorted(fs):
            p = os.path.join(dp, f)
            files.append(p)
            with open(p, errors="replace") as fh:
                texts[p] = fh.read()
    found, entrypoints = [], {}
    kinds = {"yaml": [], "docker": [], "unit": [], "py": [], "sh": [], "md": []}
    for p in files:
        b = os.path.basename(p)
        if b.endswith((".yaml", ".yml")):
            kinds["yaml"].append(p)
        elif b.startswith("Dockerfile"):
            kinds["docker"].append(p)
        elif b.endswith((".service", ".path", ".timer", ".socket")):
            kinds["unit"].append(p)
        elif b.endswith(".py"):
            kinds["py"].append(p)
        elif b.endswith(".md"):
            kinds["md"].append(p)
        elif b.endswith(".sh") or texts[p].startswith("#!"):
            kinds["sh"].append(p)
    for p in kinds["docker"]:
        check_dockerfile(p, texts[p], wick, found, entrypoints)
    check_k8s(kinds["yaml"], wick, found, entrypoints)
    for p in kinds["unit"]:
        check_unit(p, texts[p], wick, found, files)
    for p in kinds["py"]:
        check_python(p, texts[p], wick, found)
    for p in kinds["sh"]:
        for inv in shell_invocations(p, texts[p]):
            check_invocation(wick, inv, found)
    for p in kinds["md"]:
        for m in re.finditer(r"^```[a-z]*\n(.*?)^```", texts[p], re.S | re.M):
            block = re.sub(r"^\$ ", "", m.group(1), flags=re.M)
            line = texts[p][:m.start()].count("\n") + 1
            for inv in shell_invocations(p, block, f"code block at line {line}"):
                check_invocation(wick, inv, found)
    if a.dockerignore is not None:
        try:
            di = open(a.dockerignore).read().split()
        except OSError:
            di = None
            fail(a.dockerignore, "missing")
        if di is not None:
            for must in ("build/", ".git"):
                if must not in di:
                    fail(a.dockerignore, f"does not exclude {must}")
    check_env(a.deploy, a.src, texts)
    check_gpu_runs(found)
    # each kind of deploy file must have yielded command lines, else the parser went blind
    for kind, want in (("yaml", "worker"), ("docker", "worker"), ("unit", "worker"),
                       ("py", "worker"), ("sh", "worker")):
        ps = set(kinds[kind])
        if ps and not any(inv.path in ps and inv.sub == want for inv in found):
            fail(a.deploy, f"no `wick {want}` command line found in the {kind} files "
                           f"({', '.join(sorted(ps))})")
    if a.smoke_model:
        if not a.smoke_dir:
            sys.exit("deploy_check: --smoke-model needs --smoke-dir")
        if smoke(wick, found, a.smoke_model, a.smoke_dir) == 0:
            fail(a.deploy, "smoke: no worker, dev or prefetch command line to run")
    if a.list:
        for inv in found:
            print(f"{inv.path}: wick {inv.sub} {' '.join(inv.args)}"
                  + (f"   [{inv.where}]" if inv.where else ""))
    for line in FAIL:
        print("FAIL " + line)
    print("checked: {command_lines} wick command lines ({flags} flags), {yaml_docs} YAML documents, "
          "{scaledjobs} ScaledJobs ({triggers} triggers), {dockerfiles} Dockerfiles, {units} "
          "systemd units, {env_names} environment variables read by wick".format(**STATS)
          + (f"; {STATS['smoke']} command lines run on the smoke model ({STATS['smoke_dropped']} "
             "run-time values left out)" if "smoke" in STATS else "")
          + f"; {len(FAIL)} problems")
    return 1 if FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
