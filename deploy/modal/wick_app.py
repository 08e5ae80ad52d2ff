"""deploy/modal/wick_app.py - wick on Modal: the wick binary in an 8xH200 container, the
snapshot on a Modal Volume, the prefetch in the container's start hook.

Not run here (no modal package, no network, no GPU): tests/e2e/deploy_check.sh compiles it and
checks every wick flag in it against `wick --help`. Needs the Modal SDK >= 1.1.4
(startup_timeout, scaledown_window).

    # once: push the image built from deploy/Dockerfile, create the secrets, build the snapshot
    docker build -f deploy/Dockerfile -t REGISTRY/wick:TAG . && docker push REGISTRY/wick:TAG
    modal secret create wick-queue WICK_QUEUE_URL='redis://HOST:6379/jobs?group=wick'
    modal secret create wick-api WICK_API_KEY=...
    WICK_IMAGE=REGISTRY/wick:TAG modal run deploy/modal/wick_app.py::build_snapshot \
        --hf-dir /snapshots/hf/GLM-5-FP8
    # then
    WICK_IMAGE=REGISTRY/wick:TAG modal deploy deploy/modal/wick_app.py

Two ways to run, sharing the image, the volumes and the numbers below:

  QueueWorker  pulls jobs from WICK_QUEUE_URL (redis://, sqs:// or a RunPod-style http(s)://
               job API) until the queue has been quiet for IDLE_S seconds, then returns. The
               idle window lives inside wick, where jobs are still pulled, so Modal's own
               scaledown_window is kept short (SCALEDOWN_AFTER_EXIT_S): it only covers the gap
               between wick's exit and the container's stop. `kick` (a CPU cron, every
               KICK_PERIOD_S) starts one more QueueWorker while the queue has waiting work.
  DevServer    an interactive session: wick's OpenAI API behind a Modal web endpoint. Modal
               routes the requests, so Modal's scaledown_window owns the idle window
               (IDLE_S); wick's --idle-timeout is a backstop set past it.

Preemption: Modal interrupts the container and runs @modal.exit with a 30 s grace. The exit
hook sends SIGTERM to wick, which finishes what it can within DRAIN_S (< 30 s) and hands the
rest back to the queue, then writes its last ledger line. Modal bills the container while it
is up, start-up and idle included, per second: $0.001261 per H200-second, so
--price-per-gpu-second makes wick's ledger (`wick usage`) match the invoice.
"""

import os
import signal
import subprocess
import time

import modal

APP_NAME = "wick"
WICK_IMAGE = os.environ.get("WICK_IMAGE", "REPLACE-ME/wick:latest")
SNAPSHOT_DIR = "/snapshots"
LEDGER_DIR = "/ledgers"
SESSIONS_DIR = "/sessions"  # DevServer: what a session leaves for the next one
SNAPSHOT = SNAPSHOT_DIR + "/glm5-fp8"
GPU = "H200:8"
H200_PER_SECOND = "0.001261"  # Modal's published H200 price, $/GPU-second
CONCURRENCY = 4       # with MAX_SEQ: within what `wick plan` says fits on 8 x H200 (10 in bf16 KV)
MAX_SEQ = 32768       # positions a sequence holds (GLM-5's full 200K fits one, in bf16 KV)
STEP_TIMEOUT_S = 20   # < Modal's 30 s grace: a hung GPU exits 3 before the container is killed
LEASE_S = 60
IDLE_S = 120                  # the idle window (>= LEASE_S: an idle worker reclaims dead leases)
DRAIN_S = 25                  # < Modal's 30 s exit grace on preemption
STARTUP_S = 1800              # snapshot restore from the Volume, with margin
MAX_LIFETIME_S = 6 * 3600     # a QueueWorker recycles itself; Modal's timeout is past it
SCALEDOWN_AFTER_EXIT_S = 2    # QueueWorker: the container stops right after wick's idle exit
KICK_PERIOD_S = 30
START_WINDOW_S = 900          # a QueueWorker's start: prefetch and restore, with margin

app = modal.App(APP_NAME)
# The image from deploy/Dockerfile. Modal adds a Python and its build steps, which want root
# (the image's USER 10001 is for Kubernetes and RunPod; Modal sandboxes the container itself),
# and calls its own entrypoint instead of `wick worker`.
image = modal.Image.from_registry(WICK_IMAGE, setup_dockerfile_commands=["USER root"],
                                  add_python="3.12").entrypoint([])
snapshots = modal.Volume.from_name("wick-snapshots", create_if_missing=True)
ledgers = modal.Volume.from_name("wick-ledgers", create_if_missing=True)
sessions = modal.Volume.from_name("wick-sessions", create_if_missing=True)
volumes = {SNAPSHOT_DIR: snapshots, LEDGER_DIR: ledgers}


def _prefetch():
    # Reads the snapshot once through the page cache: the restore that follows copies from
    # memory, and a container reused by Modal skips the pieces still cached.
    subprocess.run(["wick", "prefetch", "--threads", "32", SNAPSHOT], check=True)


def _stop(proc, *vols):
    """SIGTERM wick (drain), wait for it, and commit what it wrote (its ledger, and a
    session's kept responses and prefix cache) to the volumes."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=DRAIN_S + 3)
        except subprocess.TimeoutExpired:
            proc.kill()
    for v in vols:
        v.commit()


@app.cls(image=image, gpu=GPU, volumes=volumes,
         secrets=[modal.Secret.from_name("wick-queue")],
         scaledown_window=SCALEDOWN_AFTER_EXIT_S, startup_timeout=STARTUP_S,
         timeout=MAX_LIFETIME_S + DRAIN_S + 60, max_containers=4)
class QueueWorker:
    proc = None

    @modal.enter()
    def start(self):
        _prefetch()

    @modal.method()
    def run(self) -> int:
        """Runs one wick worker until it idles out; returns its exit status (0: idle)."""
        worker_id = "modal-" + os.environ.get("MODAL_TASK_ID", str(os.getpid()))
        self.proc = subprocess.Popen([
            "wick", "worker", "--model", SNAPSHOT,
            "--queue", os.environ["WICK_QUEUE_URL"],
            "--backend", "cuda", "--concurrency", str(CONCURRENCY), "--max-seq", str(MAX_SEQ),
            "--step-timeout", str(STEP_TIMEOUT_S), "--lease", str(LEASE_S),
            "--idle-timeout", str(IDLE_S), "--drain-timeout", str(DRAIN_S),
            "--startup-timeout", str(STARTUP_S), "--max-lifetime", str(MAX_LIFETIME_S),
            "--worker-id", worker_id,
            "--ledger", LEDGER_DIR + "/" + worker_id + ".jsonl",
            "--price-per-gpu-second", H200_PER_SECOND, "--gpus", "8", "--gpu-type", "H200",
            "--log-format", "json",
        ])
        rc = self.proc.wait()
        ledgers.commit()
        if rc != 0:  # 1 start-up, 2 usage, 3 engine, 4 queue lost: a failed call, not a result
            raise RuntimeError(f"wick worker exited {rc}")
        return rc

    @modal.exit()
    def stop(self):
        _stop(self.proc, ledgers)


@app.cls(image=image, gpu=GPU, volumes={**volumes, SESSIONS_DIR: sessions},
         secrets=[modal.Secret.from_name("wick-api")],
         scaledown_window=IDLE_S, startup_timeout=STARTUP_S, timeout=24 * 3600,
         max_containers=1)
@modal.concurrent(max_inputs=256)
class DevServer:
    proc = None

    @modal.enter()
    def start(self):
        _prefetch()
        # --listen on all addresses needs a key: WICK_API_KEY comes from the wick-api secret.
        # --idle-timeout past Modal's window: Modal stops the container first; wick's own timer
        # only ends a session that Modal failed to stop. The next session goes on where this
        # one ended: its agents' kept responses (previous_response_id, for 30 days) and their
        # turns' KV cache stay on the sessions volume. Claude Code comes with its own model
        # names (claude-*), served as the snapshot's model.
        self.proc = subprocess.Popen([
            "wick", "dev", "--model", SNAPSHOT, "--listen", "0.0.0.0:8000",
            "--backend", "cuda", "--concurrency", str(CONCURRENCY), "--max-seq", str(MAX_SEQ),
            "--step-timeout", str(STEP_TIMEOUT_S),
            "--idle-timeout", str(IDLE_S + 60), "--drain-timeout", str(DRAIN_S),
            "--ledger", LEDGER_DIR + "/dev-" + os.environ.get("MODAL_TASK_ID", "local") + ".jsonl",
            "--price-per-gpu-second", H200_PER_SECOND, "--gpus", "8", "--gpu-type", "H200",
            "--responses-dir", SESSIONS_DIR + "/responses", "--responses-max", "4GB",
            "--responses-max-age", str(30 * 86400),
            "--prefix-cache-dir", SESSIONS_DIR + "/prefix", "--prefix-cache-max", "8GB",
            "--model-alias", "claude-*",
        ])

    @modal.web_server(8000, startup_timeout=STARTUP_S)
    def api(self):
        pass  # wick serves /v1/chat/completions, /v1/responses, /v1/models, /health, ...

    @modal.exit()
    def stop(self):
        _stop(self.proc, ledgers, sessions)


def _queue_work(url: str, lease_s: int) -> int:
    """Jobs that need a worker: never delivered, or pending longer than a lease (their worker
    died or drained them back); the rules of deploy/k8s and deploy/systemd/wick-scale.sh."""
    if url.startswith("redis://"):
        import urllib.parse

        import redis  # in kick_image only

        u = urllib.parse.urlsplit(url)
        stream = u.path.lstrip("/")
        group = urllib.parse.parse_qs(u.query).get("group", ["wick"])[0]
        r = redis.Redis(host=u.hostname, port=u.port or 6379)
        try:
            groups = r.xinfo_groups(stream)
        except redis.ResponseError:
            return 0  # no stream yet
        lag = sum(int(g.get("lag") or 0) for g in groups if g["name"].decode() == group)
        stale = r.xpending_range(stream, group, min="-", max="+", count=1000, idle=lease_s * 1000)
        return lag + len(stale)
    if url.startswith("sqs://"):
        import urllib.parse

        import boto3  # in kick_image only

        u = urllib.parse.urlsplit(url)
        account, queue = u.path.strip("/").split("/")[:2]
        region = urllib.parse.parse_qs(u.query)["region"][0]
        sqs = boto3.client("sqs", region_name=region)
        qurl = sqs.get_queue_url(QueueName=queue, QueueOwnerAWSAccountId=account)["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=qurl,
                                         AttributeNames=["ApproximateNumberOfMessages"])
        return int(attrs["Attributes"]["ApproximateNumberOfMessages"])
    raise ValueError(url + ": kick knows redis:// and sqs:// queues (RunPod scales its own)")


kick_image = modal.Image.debian_slim().pip_install("redis", "boto3")
kick_starts = modal.Dict.from_name("wick-kick-starts", create_if_missing=True)


@app.function(image=kick_image, secrets=[modal.Secret.from_name("wick-queue")],
              schedule=modal.Period(seconds=KICK_PERIOD_S), timeout=60)
def kick() -> bool:
    """Starts one QueueWorker when the queue has outstanding work that the workers already
    starting will not take. A running worker with free slots takes new jobs within a second,
    so work still waiting one period later means the running workers are full or gone; but a
    worker takes minutes to start (prefetch, restore), so the starts of the last
    START_WINDOW_S count as CONCURRENCY slots each (a modal.Dict keeps their times): one job
    at zero starts one worker, not one every period until the first is up."""
    work = _queue_work(os.environ["WICK_QUEUE_URL"], LEASE_S)
    now = time.time()
    recent = [t for t in kick_starts.get("starts", []) if now - t < START_WINDOW_S]
    if work == 0 or len(recent) * CONCURRENCY >= work:
        kick_starts["starts"] = recent
        return False
    QueueWorker().run.spawn()
    kick_starts["starts"] = recent + [now]
    return True


@app.function(image=image, volumes={SNAPSHOT_DIR: snapshots}, cpu=16, memory=65536,
              timeout=6 * 3600)
def build_snapshot(hf_dir: str):
    """Builds the snapshot once from a Hugging Face checkpoint already on the volume."""
    tmp = SNAPSHOT + ".tmp"
    subprocess.run(["wick", "inspect", hf_dir], check=True)
    subprocess.run(["rm", "-rf", tmp], check=True)
    subprocess.run(["wick", "snapshot", hf_dir, "-o", tmp, "--tp", "8", "--ep", "8",
                    "--dtype", "keep"], check=True)
    subprocess.run(["rm", "-rf", SNAPSHOT], check=True)
    os.rename(tmp, SNAPSHOT)
    snapshots.commit()
    print("snapshot written to", SNAPSHOT, "at", time.strftime("%Y-%m-%d %H:%M:%S"))
