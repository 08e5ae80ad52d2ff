# scripts/gpu-kit: what scripts/gpu-check needs on a GPU machine that reaches no package
# archive, packed to carry. Checked here so that it is whole when a GPU is lent:
#   1. the kit is made (SKIP when Debian's archive cannot be reached: it downloads);
#   2. gpu-kit --check builds wick and its unit tests against the kit alone and finds every
#      header and library in it or in libc's and gcc's packages (a dependency added to the
#      Makefile but not to install-deps, or a package whose files the kit lacks, fails here);
#   3. a link in the kit to an absolute path (it would name the GPU machine's file) fails
#      --check.
source tests/e2e/lib.sh
case ${MODE:-release} in asan) echo "SKIP: a release-mode check"; exit 0 ;; esac
command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 ||
  { echo "SKIP: gpu-kit packs Debian packages: no apt-get here"; exit 0; }
export WICK_GPU_KIT_DIR=$TMPD/kit
set +e
scripts/gpu-kit "$WICK_SHARED" >"$TMPD/kit.txt" 2>&1
rc=$?
set -e
[ "$rc" = 77 ] && { tail -n 3 "$TMPD/kit.txt"; echo "SKIP: Debian's archive cannot be reached"; exit 0; }
[ "$rc" = 0 ] || { cat "$TMPD/kit.txt"; fail "gpu-kit exited $rc"; }
echo "   $(tail -n 1 "$TMPD/kit.txt")"
[ -f "$TMPD/kit/shared/models/stories260K/stories260K.bin" ] || fail "no stories260K in the kit"
[ -x "$TMPD/kit/bin/make" ] && [ -x "$TMPD/kit/bin/pkg-config" ] || fail "no make or pkg-config in the kit's bin"
for p in libjansson-dev libcurl4-openssl-dev libevent-dev liblz4-dev libxxhash-dev \
         libhiredis-dev libcriterion-dev pkgconf make; do
  grep -qx "$p" "$TMPD/kit/PACKAGES" || fail "$p is not in the kit"
done

scripts/gpu-kit --check >"$TMPD/check.txt" 2>&1 || { cat "$TMPD/check.txt"; fail "gpu-kit --check"; }
grep -q 'Synthesis: Tested: [1-9].*Failing: 0 | Crashing: 0' "$TMPD/check.txt" ||
  { cat "$TMPD/check.txt"; fail "the unit tests built against the kit did not pass"; }
echo "   $(tail -n 1 "$TMPD/check.txt")"

ln -sfn /lib/x86_64-linux-gnu/libz.so.1 "$TMPD/kit/root/usr/lib/x86_64-linux-gnu/libz.so"
if scripts/gpu-kit --check >"$TMPD/bad.txt" 2>&1; then
  fail "--check passed a kit with a link to /lib/x86_64-linux-gnu/libz.so.1"
fi
grep -q 'libz.so -> /lib/x86_64-linux-gnu/libz.so.1 would not resolve inside the kit' "$TMPD/bad.txt" ||
  { cat "$TMPD/bad.txt"; fail "--check did not name the link"; }
echo "   an absolute link: $(tail -n 1 "$TMPD/bad.txt")"
echo ok
