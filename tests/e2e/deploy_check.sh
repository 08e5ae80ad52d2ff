# deploy/ against the code: tests/tools/deploy_check.py checks every manifest, unit, script and
# app file (YAML parses, required fields, every wick flag in `wick SUB --help`, every env var
# read by a getenv, KEDA triggers on the worker's own stream/group/queue, grace > drain), and
# runs each worker/dev/prefetch command line on stories260K with a one-job spool queue. Then:
# broken copies of deploy/ must fail (a renamed flag among them), the Dockerfiles are linted
# (dockerfile-utils from npm, cached in $WICK_BUILD/node-deploy), the systemd units verified
# and the scripts shellchecked where those tools exist, wick-scale.sh is run against a real
# redis-server and a spool, and the README's quoted bills are recomputed.
source tests/e2e/lib.sh
# python3 with yaml: the one on PATH, else Debian's (python3-yaml) when PATH has another python
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || fail "no python3 can import yaml: install python3-yaml (Debian) for the deploy check"
CHECK=("$PY" tests/tools/deploy_check.py --wick "$WICK" --src .)
t0=$EPOCHREALTIME
section() { echo "== $* (at $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s)"; }

m=$(stories)
"$WICK" snapshot "$m" -o "$TMPD/snap" >/dev/null 2>&1 || fail "wick snapshot of stories260K"

section "deploy/ as it is"
mkdir -p "$TMPD/smoke"
"${CHECK[@]}" --deploy deploy --dockerignore .dockerignore --smoke-model "$TMPD/snap" \
  --smoke-dir "$TMPD/smoke" >"$TMPD/ok.txt" 2>&1 || { cat "$TMPD/ok.txt"; fail "deploy check"; }
cat "$TMPD/ok.txt"
"$PY" - "$TMPD/ok.txt" <<'PY' || fail "the check saw too little (a parser went blind?)"
import re, sys
s = open(sys.argv[1]).read()
m = re.search(r"checked: (\d+) wick command lines \((\d+) flags\), (\d+) YAML documents, "
              r"(\d+) ScaledJobs \((\d+) triggers\), (\d+) Dockerfiles, (\d+) systemd units, "
              r"(\d+) environment variables read by wick; (\d+) command lines run", s)
assert m, s
lines, flags, docs, sj, trig, df, units, env, ran = map(int, m.groups())
assert lines >= 20 and flags >= 80 and docs >= 8 and sj == 2 and trig >= 3, m.groups()
assert df == 2 and units == 2 and env >= 8 and ran >= 10, m.groups()
PY

section "a renamed flag breaks the check"
cp -r deploy "$TMPD/d1"
sed -i 's/"--concurrency", "\$(CONCURRENCY)"/"--concurency", "$(CONCURRENCY)"/' "$TMPD/d1/k8s/scaledjob-sqs.yaml"
grep -q -- '--concurency' "$TMPD/d1/k8s/scaledjob-sqs.yaml" || fail "the sed did not rename the flag"
if "${CHECK[@]}" --deploy "$TMPD/d1" >"$TMPD/d1.txt" 2>&1; then
  cat "$TMPD/d1.txt"; fail "the check passed a manifest with --concurency"
fi
grep -q 'scaledjob-sqs.yaml: .*flag --concurency is not in `wick worker --help`' "$TMPD/d1.txt" ||
  { cat "$TMPD/d1.txt"; fail "no message naming --concurency"; }
grep 'FAIL' "$TMPD/d1.txt"

section "each kind of break is caught"
cp -r deploy "$TMPD/d2"
d=$TMPD/d2
sed -i 's/^              - --drain-timeout$/              - --drain-timeuot/' "$d/k8s/scaledjob-redis.yaml"
sed -i 's/^        stream: jobs$/        stream: jobz/' "$d/k8s/scaledjob-redis.yaml"
sed -i 's/terminationGracePeriodSeconds: 150 /terminationGracePeriodSeconds: 100 /' "$d/k8s/scaledjob-sqs.yaml"
sed -i 's/"--idle-timeout", str(IDLE_S), "--drain-timeout"/"--idle-timout", str(IDLE_S), "--drain-timeout"/' "$d/modal/wick_app.py"
sed -i 's/^DRAIN_S = 25 /DRAIN_S = 45 /' "$d/modal/wick_app.py"
sed -i 's/--lease 60 --drain-timeout 120/--leese 60 --drain-timeout 120/; s/^Restart=on-failure/Restart=always/' \
  "$d/systemd/wick-worker@.service"
sed -i 's/--startup-timeout 1800/--startup-timout 1800/' "$d/runpod/start.sh"
sed -i 's/^# wick-env: WICK_GLM_MLA /# wick-env: WICK_NOT_READ /; s/^USER 10001:10001/USER root/' "$d/Dockerfile"
sed -i 's/^ENTRYPOINT \["\/usr\/local\/bin\/wick-runpod"\]/ENTRYPOINT \/usr\/local\/bin\/wick-runpod/' "$d/runpod/Dockerfile"
sed -i 's/^| `WICK_QUEUE` |/| `WICK_QUEUES` |/' "$d/README.md"
"${CHECK[@]}" --deploy "$d" >"$TMPD/d2.txt" 2>&1 && { cat "$TMPD/d2.txt"; fail "the broken copy passed"; }
grep "^FAIL" "$TMPD/d2.txt" || true
while IFS= read -r want; do
  grep -q -F -- "$want" "$TMPD/d2.txt" || { cat "$TMPD/d2.txt"; fail "not caught: $want"; }
done <<'EOF'
scaledjob-redis.yaml: `wick worker` (ScaledJob wick-redis, container worker): flag --drain-timeuot is not in `wick worker --help`
scaledjob-redis.yaml: ScaledJob wick-redis: trigger stream 'jobz' != the worker's stream 'jobs'
scaledjob-sqs.yaml: ScaledJob wick-sqs: terminationGracePeriodSeconds 100 must exceed the worker's --drain-timeout 120
wick_app.py: `wick worker` (line 
flag --idle-timout is not in `wick worker --help`
--drain-timeout 45 must be under Modal's 30 s exit grace
wick-worker@.service: `wick worker` (ExecStart): flag --leese is not in `wick worker --help`
wick-worker@.service: Restart=always restarts the idle exit
start.sh: `wick worker`: flag --startup-timout is not in `wick worker --help`
'# wick-env: WICK_NOT_READ': no getenv("WICK_NOT_READ") in the C sources
wick reads WICK_GLM_MLA (engine/glm5.c
the final stage runs as root
runpod/Dockerfile: line 
ENTRYPOINT is not in exec form
WICK_QUEUE is neither read by wick (getenv) nor listed
EOF
echo "   $(grep -c '^FAIL' "$TMPD/d2.txt") problems found in the broken copy, each expected one among them"

section "Dockerfile lint (dockerfile-utils)"
NODE_DIR=$WICK_BUILD/node-deploy
LINT=$NODE_DIR/node_modules/.bin/dockerfile-utils
if [ ! -x "$LINT" ]; then
  command -v npm >/dev/null || fail "npm is needed to install the Dockerfile linter"
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save dockerfile-utils@0.16.3 \
    >"$TMPD/npm.txt" 2>&1 || { cat "$TMPD/npm.txt"; fail "npm install dockerfile-utils failed"; }
fi
for f in deploy/Dockerfile deploy/runpod/Dockerfile; do
  out=$("$LINT" lint "$f" 2>&1) || { echo "$out"; fail "dockerfile-utils lint $f"; }
  [ -z "$out" ] || { echo "$out"; fail "dockerfile-utils lint $f printed warnings"; }
  echo "   $f: clean"
done
printf 'FROM nvidia/cuda:13.0.1-base-ubuntu24.04\nUSERR wick\nHEALTHCHECK --interval=5 CMD true\n' >"$TMPD/Dockerfile.bad"
if "$LINT" lint "$TMPD/Dockerfile.bad" >"$TMPD/lint-bad.txt" 2>&1; then
  fail "the linter passed a Dockerfile with an unknown instruction"
fi
grep -q 'Unknown instruction: USERR' "$TMPD/lint-bad.txt" || { cat "$TMPD/lint-bad.txt"; fail "lint message"; }

section "systemd units"
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$TMPD/units"
  abs=$(cd "$(dirname "$WICK")" && pwd)/$(basename "$WICK")
  sed "s#/usr/local/bin/wick#$abs#g" 'deploy/systemd/wick-worker@.service' >"$TMPD/units/wick-worker@jobs.service"
  cp 'deploy/systemd/wick-worker@.path' "$TMPD/units/wick-worker@jobs.path"
  out=$(cd "$TMPD/units" && systemd-analyze verify --man=no ./wick-worker@jobs.service ./wick-worker@jobs.path 2>&1) ||
    { echo "$out"; fail "systemd-analyze verify"; }
  [ -z "$out" ] || { echo "$out"; fail "systemd-analyze verify printed warnings"; }
  echo "   systemd-analyze verify: clean"
else
  echo "   SKIP systemd-analyze verify: systemd is not installed (the unit's rules were checked above)"
fi
if command -v shellcheck >/dev/null; then
  shellcheck deploy/systemd/wick-scale.sh || fail "shellcheck wick-scale.sh"
  shellcheck -s sh deploy/runpod/start.sh || fail "shellcheck start.sh"
  echo "   shellcheck: clean"
else
  echo "   SKIP shellcheck: not installed"
fi

section "wick-scale.sh against a real redis-server and a spool"
command -v redis-server >/dev/null || fail "redis-server is not installed (scripts/install-deps)"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMPD" >/dev/null &
rpid=$!
trap 'kill $rpid 2>/dev/null; wait $rpid 2>/dev/null; rm -rf "$TMPD"' EXIT
for _ in $(seq 200); do redis-cli -p "$port" ping 2>/dev/null | has PONG && break; sleep 0.05; done
S=deploy/systemd/wick-scale.sh
Q="redis://127.0.0.1:$port/jobs?group=wick"
scale() { # EXPECTED_RC EXPECTED_TEXT ARGS...
  local want=$1 text=$2 out rc
  shift 2
  out=$("$S" --once --dry-run "$@" 2>&1) && rc=0 || rc=$?
  [ "$rc" = "$want" ] && [[ $out == *"$text"* ]] || fail "wick-scale.sh $*: exit $rc, printed: $out (want $want, '$text')"
  echo "   $* -> $(head -n 1 <<<"$out")"
}
scale 1 idle --queue "$Q"                                  # no stream yet
"$WICK" submit --queue "$Q" -p "Once upon a time" -n 4 >/dev/null
"$WICK" submit --queue "$Q" -p "Once upon a time" -n 4 >/dev/null
scale 0 "work 2 (lag=2 idle_pending=0)" --queue "$Q"
redis-cli -p "$port" XREADGROUP GROUP wick dead-worker COUNT 2 STREAMS jobs '>' >/dev/null
scale 1 idle --queue "$Q" --lease 3600                     # held by a live lease
scale 0 "work 2 (lag=0 idle_pending=2)" --queue "$Q" --lease 0   # the lease ran out
scale 1 idle --queue "redis://127.0.0.1:$port/jobs?group=other"
scale 2 "only spool: and redis://" --queue "sqs://sqs.us-east-1.amazonaws.com/1/q"
"$WICK" submit --queue "spool:$TMPD/spool" -p "Once upon a time" -n 4 >/dev/null
scale 0 "work 1 (new=1 reclaimable=0)" --queue "spool:$TMPD/spool"
scale 1 idle --queue "spool:$TMPD/empty"
# a Redis with a password: wick's variable reaches redis-cli (off its command line)
redis-cli -p "$port" CONFIG SET requirepass scale-pw >/dev/null
scale 2 "NOAUTH" --queue "$Q"
WICK_REDIS_PASSWORD=scale-pw scale 0 "work 2 (lag=0 idle_pending=2)" --queue "$Q" --lease 0
# the same Redis over TLS (a second server on the same data would need persistence: this one
# is restarted with a TLS port beside its plain one), its certificate checked as wick does
tests/tools/tls_certs.sh "$TMPD/pki" || fail "tls_certs.sh"
kill $rpid; wait $rpid 2>/dev/null
tport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMPD" \
  --tls-port "$tport" --tls-cert-file "$TMPD/pki/server.pem" --tls-key-file "$TMPD/pki/server.key" \
  --tls-ca-cert-file "$TMPD/pki/ca.pem" --tls-auth-clients no >/dev/null &
rpid=$!
for _ in $(seq 200); do redis-cli -p "$port" ping 2>/dev/null | has PONG && break; sleep 0.05; done
T="rediss://localhost:$tport/jobs?group=wick"
WICK_REDIS_CA_FILE=$TMPD/pki/ca.pem "$WICK" submit --queue "$T" -p "Once upon a time" -n 4 \
  >/dev/null || fail "wick submit over TLS"
WICK_REDIS_CA_FILE=$TMPD/pki/ca.pem scale 0 "work 1 (lag=1 idle_pending=0)" --queue "$T"
WICK_REDIS_CA_FILE=$TMPD/pki/other-ca.pem scale 2 "certificate verify failed" --queue "$T"

section "the README's quoted bills"
grep -E '^wick usage --quote [0-9]+ --price-per-hour [0-9.]+ +# .*\$[0-9.]+$' deploy/README.md >"$TMPD/quotes.txt"
[ -s "$TMPD/quotes.txt" ] || fail "no quoted bills found in deploy/README.md"
while IFS= read -r line; do
  read -r -a argv <<<"${line%%#*}"
  want=${line##*\$}
  got=$("$WICK" "${argv[@]:1}") || fail "$line"
  [[ $got == *": \$$want ("* ]] || fail "README says \$$want for '${line%%#*}', wick says: $got"
  echo "   ${line%%#*}-> \$$want"
done <"$TMPD/quotes.txt"
section "deploy check: ok"
