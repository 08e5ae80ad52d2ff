# The prefix cache kept across restarts (--prefix-cache-dir), through wick dev on stories260K:
#   1. a first session answers a long prompt (nothing cached) and at its exit writes its
#      entries to DIR/prefix-<id>.wpc (mode 0600)
#   2. the next session reads them at its start (/metrics counts the entry before any
#      request): the same request has all but its last prompt token cached, and the same
#      answer; a longer prompt reuses the shared part
#   3. another KV cache type is another cache: it starts empty, and both files stay
#   4. a damaged file (one byte flipped) is said and passed over: the session serves, caches
#      nothing from it, and its exit writes the file whole again, which the next start reads
#   5. --prefix-cache off leaves the file alone; a session with nothing of its own to write
#      leaves it too (damaged), and the next one's write drops the damage
#   6. --prefix-cache-max keeps the most recent entries that fit; a SIGTERM whose drain
#      deadline has passed writes none and leaves the file as it was; a bad size is refused
#   7. two sessions sharing the directory: the second one out keeps the first one's entry
#      beside its own
source tests/e2e/lib.sh
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$TMPD"' EXIT
m=$(stories)
PC=$TMPD/pc
PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside in the \
park with her friends. One day, she saw a big red ball under a tree. She ran to get it, but a \
small dog was already playing with it. Lily asked the dog if she could play too, and the dog"

# session ARGS...: starts wick dev (log $TMPD/dev.N.log), waits for it; S is its port
N=0
session() {
  N=$((N + 1))
  S=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
  "$WICK" dev --model "$m" --listen 127.0.0.1:$S --idle-timeout 60 --prefix-cache-dir "$PC" \
    "$@" 2>"$TMPD/dev.$N.log" &
  SPID=$!
  wait_dev $S $SPID "$TMPD/dev.$N.log"
}
# stop: SIGTERM, and the session's exit status 0
stop() {
  kill -TERM $SPID
  wait $SPID || fail "session $N exited $?: $(tail -n 3 "$TMPD/dev.$N.log")"
}
# ask PROMPT OUT: a greedy completion of 12 tokens; prints "cached prompt_tokens"
ask() {
  python3 - "$1" >"$TMPD/req.json" <<'EOF'
import json, sys
print(json.dumps({"model": "stories260K", "prompt": sys.argv[1], "max_tokens": 12, "temperature": 0}))
EOF
  curl -sf "http://127.0.0.1:$S/v1/completions" -H 'Content-Type: application/json' \
    -d @"$TMPD/req.json" >"$2" || fail "the request to session $N"
  python3 - "$2" <<'EOF'
import json, sys
u = json.load(open(sys.argv[1]))["usage"]
print((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0), u["prompt_tokens"])
EOF
}
text() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$1"; }

# 1. the first session
session
read -r c0 p0 < <(ask "$PROMPT" "$TMPD/a0.json")
[ "$c0" = 0 ] || fail "a first session had $c0 tokens cached"
[ "$p0" -gt 60 ] || fail "the prompt is $p0 tokens"
stop
has "wrote 1 entries" <"$TMPD/dev.$N.log" || fail "no entries written: $(grep prefix_cache "$TMPD/dev.$N.log")"
f=$(ls "$PC"/prefix-*.wpc) || fail "no file in $PC: $(ls -la "$PC")"
[ "$(stat -c %a "$f")" = 600 ] || fail "$f has mode $(stat -c %a "$f")"
echo "1. written: $f, $(stat -c %s "$f") bytes"

# 2. the next session reads it
session
has "read 1 entries" <"$TMPD/dev.$N.log" || fail "not read: $(grep prefix_cache "$TMPD/dev.$N.log")"
metrics=$(curl -sf "http://127.0.0.1:$S/metrics") || fail "/metrics"
grep -q '^wick_prefix_cache_entries 1$' <<<"$metrics" ||
  fail "/metrics before a request: $(grep entries <<<"$metrics")"
read -r c1 p1 < <(ask "$PROMPT" "$TMPD/a1.json")
[ "$p1" = "$p0" ] && [ "$c1" = $((p0 - 1)) ] ||
  fail "after the restart, $c1 of $p1 tokens cached (want $((p0 - 1)) of $p0)"
[ "$(text "$TMPD/a1.json")" = "$(text "$TMPD/a0.json")" ] ||
  fail "another answer from the kept cache: '$(text "$TMPD/a1.json")' vs '$(text "$TMPD/a0.json")'"
read -r c2 p2 < <(ask "$PROMPT said yes. They played" "$TMPD/a2.json")
[ "$c2" -ge $((p0 - 2)) ] && [ "$c2" -lt "$p2" ] || fail "a longer prompt: $c2 of $p2 cached"
stop
echo "2. read back: $c1 of $p1 prompt tokens cached, the same answer; a longer prompt $c2 of $p2"

# 3. another KV cache type: another file
session --kv-dtype bf16
has "none kept at" <"$TMPD/dev.$N.log" || fail "bf16 read a cache: $(grep prefix_cache "$TMPD/dev.$N.log")"
read -r c3 _ < <(ask "$PROMPT" "$TMPD/a3.json")
[ "$c3" = 0 ] || fail "bf16 had $c3 tokens cached"
stop
[ "$(ls "$PC"/prefix-*.wpc | wc -l)" = 2 ] || fail "files: $(ls "$PC")"
echo "3. bf16: its own file, nothing cached at its start"

# 4. a damaged file (a byte of the first entry's caches: past the two headers and its tokens)
size=$(stat -c %s "$f")
python3 - "$f" <<'EOF'
import os, sys
with open(sys.argv[1], "r+b") as h:
    h.seek(64 + 4 * 120)
    b = h.read(1)
    h.seek(-1, 1)
    h.write(bytes([b[0] ^ 0x40]))
EOF
session
has "checksum does not match" <"$TMPD/dev.$N.log" ||
  fail "the damage not said: $(grep prefix_cache "$TMPD/dev.$N.log")"
read -r c4 _ < <(ask "$PROMPT" "$TMPD/a4.json")
[ "$c4" = 0 ] || fail "$c4 tokens cached from a damaged file"
[ "$(text "$TMPD/a4.json")" = "$(text "$TMPD/a0.json")" ] || fail "another answer after the damage"
stop
session
has "read 1 entries" <"$TMPD/dev.$N.log" || fail "not written whole again: $(grep prefix_cache "$TMPD/dev.$N.log")"
read -r c5 _ < <(ask "$PROMPT" "$TMPD/a5.json")
[ "$c5" = $((p0 - 1)) ] || fail "$c5 tokens cached after the rewrite"
stop
echo "4. damaged: said, passed over, written whole again at the exit (was $size bytes)"

# 5. --prefix-cache off leaves the file alone; a session that reads a damaged file and runs
#    nothing has nothing of its own to write, and leaves it; the next one that runs a request
#    writes its own entry, and none of the damaged file's
session --prefix-cache off
stop
[ -f "$f" ] || fail "--prefix-cache off removed the file"
printf 'WICKPFX1' | dd of="$f" bs=1 seek=40 conv=notrunc status=none
damaged=$(md5sum <"$f")
session
has "entry 1:" <"$TMPD/dev.$N.log" || fail "the damage not said: $(grep prefix_cache "$TMPD/dev.$N.log")"
stop
has "no entries of its own" <"$TMPD/dev.$N.log" || fail "$(grep prefix_cache "$TMPD/dev.$N.log")"
[ "$(md5sum <"$f")" = "$damaged" ] || fail "a session with nothing to write changed the file"
session
ask "$PROMPT" "$TMPD/a6.json" >/dev/null
stop
has "wrote 1 entries, 0 of them kept" <"$TMPD/dev.$N.log" ||
  fail "after the damage: $(grep prefix_cache "$TMPD/dev.$N.log")"
echo "5. off: the file stays; nothing of its own: the file stays; then written whole"

# 6. bounds: --prefix-cache-max keeps the most recent entries that fit; a drain whose
#    deadline has passed writes none, and the file stays as it was
session --prefix-cache-max 100KB
ask "$PROMPT" "$TMPD/b1.json" >/dev/null
ask "The dog ran to the park. It saw a big red ball and" "$TMPD/b2.json" >/dev/null
stop
has "wrote 1 entries" <"$TMPD/dev.$N.log" && has "older ones left out" <"$TMPD/dev.$N.log" ||
  fail "--prefix-cache-max 100KB: $(grep prefix_cache "$TMPD/dev.$N.log")"
[ "$(stat -c %s "$f")" -le 100000 ] || fail "$f is $(stat -c %s "$f") bytes"
kept=$(md5sum <"$f")
session --drain-timeout 0
ask "$PROMPT" "$TMPD/b3.json" >/dev/null
stop
has "none of 2 entries written" <"$TMPD/dev.$N.log" ||
  fail "past the drain's deadline: $(grep prefix_cache "$TMPD/dev.$N.log")"
[ "$(md5sum <"$f")" = "$kept" ] || fail "the file changed after a drain past its deadline"
"$WICK" dev --model "$m" --prefix-cache-max 12XB 2>"$TMPD/bad.log" && fail "12XB taken"
has "prefix-cache-max" <"$TMPD/bad.log" || fail "12XB: $(cat "$TMPD/bad.log")"
echo "6. bounded: the most recent entry within 100KB; none after a drain past its deadline"

# 7. two sessions sharing the directory at once, each with a prompt of its own: the file the
#    second one out writes holds both (its own, then the first one's it does not hold)
rm -f "$PC"/prefix-*.wpc
session
S1=$S P1=$SPID N1=$N
session
ask "$PROMPT" "$TMPD/c1.json" >/dev/null
S2=$S P2=$SPID N2=$N
S=$S1
ask "The dog ran to the park. It saw a big red ball and" "$TMPD/c2.json" >/dev/null
kill -TERM $P1 && wait $P1 || fail "the first session's exit"
kill -TERM $P2 && wait $P2 || fail "the second session's exit"
has "wrote 1 entries, 0 of them kept" <"$TMPD/dev.$N1.log" ||
  fail "the first out: $(grep prefix_cache "$TMPD/dev.$N1.log")"
has "wrote 2 entries, 1 of them kept" <"$TMPD/dev.$N2.log" ||
  fail "the second out: $(grep prefix_cache "$TMPD/dev.$N2.log")"
session
has "read 2 entries" <"$TMPD/dev.$N.log" ||
  fail "the union: $(grep prefix_cache "$TMPD/dev.$N.log")"
read -r c7 p7 < <(ask "The dog ran to the park. It saw a big red ball and" "$TMPD/c3.json")
[ "$c7" = $((p7 - 1)) ] || fail "the first session's entry: $c7 of $p7 cached"
stop
echo "7. shared: the second session out kept the first one's entry beside its own"
echo "prefix_persist: ok"
