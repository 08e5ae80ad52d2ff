# Sourced by the e2e tests. Provides the paths and a converted stories260K.
set -euo pipefail
: "${WICK:=build/wick}" "${WICK_BUILD:=build}" "${WICK_SHARED:=../shared}" "${WICK_TOOLS:=$WICK_BUILD/tools}"
STORIES_SRC=$WICK_SHARED/models/stories260K
# npm must trust the system CA store (it may hold a TLS proxy's certificate)
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/wick-test.XXXXXX")
trap 'rm -rf "$TMPD"' EXIT

# Converts stories260K into $WICK_BUILD/models/stories260K (once; reused while up to date).
# Under a lock: tests run side by side, and one must not replace the directory while another
# converts or reads it.
stories() {
  local out=$WICK_BUILD/models/stories260K
  mkdir -p "$WICK_BUILD/models"
  (
    flock 9
    if [ ! -f "$out/model.safetensors" ] || [ "$WICK" -nt "$out/model.safetensors" ]; then
      rm -rf "$out.tmp.$$"
      "$WICK" convert llama2c "$STORIES_SRC/stories260K.bin" "$STORIES_SRC/tok512.bin" -o "$out.tmp.$$" >&2
      rm -rf "$out"; mv "$out.tmp.$$" "$out"
    fi
  ) 9>"$WICK_BUILD/models/.stories.lock"
  echo "$out"
}

fail() { echo "FAIL: $*" >&2; exit 1; }

# Waits up to 20 s for a wick dev (process PID, its stderr in LOG) to answer /health on PORT.
wait_dev() { # PORT PID LOG
  for _ in $(seq 1 200); do
    curl -sf -o /dev/null "http://127.0.0.1:$1/health" && return 0
    kill -0 "$2" 2>/dev/null || fail "wick dev exited: $(tail -n 3 "$3")"
    sleep 0.1
  done
  fail "wick dev did not answer /health on port $1 within 20 s"
}

# Submits each job file to the spool queue QDIR, then runs a worker on MODEL until it is idle
# (0.5 s); its log is QDIR.log, and each result QDIR/done/ID.json.
spool_jobs() { # MODEL QDIR JOB_FILE...
  local model=$1 q=$2 f
  shift 2
  for f in "$@"; do
    "$WICK" submit --queue "spool:$q" --file "$f" >/dev/null || fail "submit $f"
  done
  "$WICK" worker --model "$model" --queue "spool:$q" --idle-timeout 0.5 2>"$q.log" ||
    fail "the worker on $model exited $?: $(tail -n 3 "$q.log")"
}

# npm_pkg DIR SPEC NAME: the npm package SPEC, installed from the registry into
# $WICK_BUILD/DIR (once, under a lock: scripts run side by side); sets PKG to its directory.
npm_pkg() {
  command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed"
  local d=$WICK_BUILD/$1
  mkdir -p "$d"
  (
    flock 9
    [ -f "$d/node_modules/$3/package.json" ] ||
      npm install --prefix "$d" --no-audit --no-fund --no-save "$2" >&2
  ) 9>"$d/.lock" || fail "npm install $2 into $d failed"
  PKG=$(realpath "$d/node_modules/$3")
}

# The official clients: `openai` (OPENAI, its package directory) and `@anthropic-ai/sdk`
# (ANTHROPIC: require(ANTHROPIC) gives the module, its client class .default).
need_openai() { npm_pkg node-openai openai@6 openai; OPENAI=$PKG; }
need_anthropic() { npm_pkg node-anthropic @anthropic-ai/sdk@1 @anthropic-ai/sdk; ANTHROPIC=$PKG; }

# `cmd | has PATTERN`: grep -q over the whole of stdin. Under pipefail, `cmd | grep -q` fails
# now and then: grep exits at its first match, and cmd's next write dies of SIGPIPE (bash's
# echo writes a line at a time). CI failed once on just that.
has() { local in; in=$(cat); grep -q "$@" <<<"$in"; }

# The wick with the CUDA backend under the emulator (make build/simt/wick) into $EMU; the
# script ends with SKIP in an ASan build, where the emulator is not built.
simt_wick() {
  case ${MODE:-release} in asan) echo "SKIP: the emulator is built in release mode only"; exit 0 ;; esac
  EMU=${WICK_SIMT_WICK:-$WICK_BUILD/simt/wick}
  [ -x "$EMU" ] || fail "$EMU is missing (make build/simt/wick)"
}

# submit_jobs QUEUE PREFIX N: jobs PREFIX-1 .. PREFIX-N, each 40 greedy tokens of stories260K
# (greedy: on the null backend's zero logits a sampled job may draw EOS at any step)
submit_jobs() {
  local i
  for i in $(seq 1 "$3"); do
    "$WICK" submit --queue "$1" --id "$2-$i" -p "Once upon a time" -n 40 --temperature 0 \
      >/dev/null || fail "submit $2-$i"
  done
}

# idle_exit_within LOG IDLE_TIMEOUT: the worker's log shows an idle exit no later than
# IDLE_TIMEOUT + 1 s after its last transition to IDLE (or READY, when it never ran a job).
idle_exit_within() {
  python3 - "$1" "$2" <<'PY' || fail "idle exit of $1"
import datetime, re, sys
log, idle = sys.argv[1], float(sys.argv[2])
t = lambda l: datetime.datetime.strptime(l[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
quiet = exit_ = None
for l in open(log):
    if re.search(r"state: \w+ -> (IDLE|READY)", l): quiet = t(l)
    if "exit: reason idle" in l: exit_ = t(l)
assert quiet and exit_, "no idle exit in the log"
d = exit_ - quiet
assert d <= idle + 1.0, f"exited {d:.2f} s after going quiet (idle timeout {idle} s)"
print(f"{log.rsplit('/', 1)[-1]}: idle exit {d:.2f} s after going quiet (idle timeout {idle} s)")
PY
}
