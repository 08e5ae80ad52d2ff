# Sourced by the e2e tests. Provides the paths and a converted stories260K.
set -euo pipefail
: "${WICK:=build/wick}" "${WICK_BUILD:=build}" "${WICK_SHARED:=../shared}" "${WICK_TOOLS:=$WICK_BUILD/tools}"
STORIES_SRC=$WICK_SHARED/models/stories260K
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/wick-test.XXXXXX")
trap 'rm -rf "$TMPD"' EXIT

# Converts stories260K into $WICK_BUILD/models/stories260K (once; reused while up to date).
stories() {
  local out=$WICK_BUILD/models/stories260K
  if [ ! -f "$out/model.safetensors" ] || [ "$WICK" -nt "$out/model.safetensors" ]; then
    mkdir -p "$WICK_BUILD/models"
    rm -rf "$out.tmp.$$"
    "$WICK" convert llama2c "$STORIES_SRC/stories260K.bin" "$STORIES_SRC/tok512.bin" -o "$out.tmp.$$" >&2
    rm -rf "$out"; mv "$out.tmp.$$" "$out"
  fi
  echo "$out"
}

fail() { echo "FAIL: $*" >&2; exit 1; }
