# The Makefile's search for the CUDA runtime and cuBLASLt in the layouts a GPU machine may
# have: a toolkit's own (lib64/, the static runtime), or pip's (lib/, only the shared
# runtime, cuBLASLt only in Python's nvidia package). A GPU machine's minutes must not go on
# a build that silently left CUDA out. Checked through make's own resolution (make -pn:
# nothing is built) on fake toolkit roots made of links to this machine's toolkit, and one
# real link and run of a program against the shared runtime they resolve to. SKIP without
# nvcc.
source tests/e2e/lib.sh
case ${MODE:-release} in asan) echo "SKIP: a release-mode check"; exit 0 ;; esac
# make's value of variable $1, with the remaining arguments on make's command line
var() {
  local v=$1
  shift
  make -s -pn "$@" 2>/dev/null | sed -n "s/^$v :\{0,1\}= //p" | head -n 1
}
real=$(var CUDA_HOME CUDA=auto)
[ -n "$real" ] && [ -f "$real/include/cuda_runtime_api.h" ] ||
  { echo "SKIP: no CUDA toolkit here (nvcc)"; exit 0; }
so=$(ls "$real"/lib64/libcudart.so.* 2>/dev/null | head -n 1)
lt=$(ls "$real"/lib64/libcublasLt.so.* 2>/dev/null | head -n 1)
[ -n "$so" ] && [ -n "$lt" ] || { echo "SKIP: the toolkit has no shared libcudart / libcublasLt"; exit 0; }
export PYTHONPATH=$TMPD/none # no Python nvidia package unless a case puts one there

# 1. pip's layout: lib/ with the shared runtime only, no cuBLASLt, no nccl.h
tk=$TMPD/pip-toolkit
mkdir -p "$tk/lib" "$tk/include"
for f in "$real"/include/*; do
  case $f in */nccl.h|*/cublasLt.h) ;; *) ln -s "$f" "$tk/include/" ;; esac
done
ln -s "$so" "$tk/lib/$(basename "$so")"
got=$(var CUDART CUDA=1 CUDA_HOME="$tk")
[ "$got" = "$tk/lib/$(basename "$so")" ] || fail "pip layout: CUDART is '$got'"
ldlibs=$(var LDLIBS CUDA=1 CUDA_HOME="$tk")
case $ldlibs in *"-Wl,-rpath,$tk/lib/"*) ;; *) fail "pip layout: no rpath to $tk/lib in LDLIBS: $ldlibs" ;; esac
[ -z "$(var CUBLASLT CUDA=1 CUDA_HOME="$tk")" ] || fail "pip layout: a cuBLASLt found where there is none"
echo "   a toolkit with lib/libcudart.so only: $got, with an rpath"

# ... and a program linked with those flags loads that runtime and runs (no GPU needed)
cat >"$TMPD/rt.c" <<'CEOF'
#include <cuda_runtime_api.h>
#include <stdio.h>
int main(void)
{
	int v = 0;
	if (cudaRuntimeGetVersion(&v) != cudaSuccess)
		return 1;
	printf("%d\n", v);
	return 0;
}
CEOF
# shellcheck disable=SC2086 # LDLIBS is a list of flags
cc -I"$tk/include" -o "$TMPD/rt" "$TMPD/rt.c" $ldlibs || fail "cannot link against $got"
loads=$(ldd "$TMPD/rt")
grep -q "libcudart.so.* => $tk/lib/" <<<"$loads" || { echo "$loads"; fail "the runtime did not load from $tk/lib"; }
v=$("$TMPD/rt") || fail "the program linked against $got did not run"
echo "   linked with them, a program loads $tk/lib's runtime: cudaRuntimeGetVersion = $v"

# 2. cuBLASLt and nccl.h from Python's nvidia packages (nvidia/cu13/{include,lib},
#    nvidia/nccl/include)
py=$TMPD/py
mkdir -p "$py/nvidia/cu13/include" "$py/nvidia/cu13/lib" "$py/nvidia/nccl/include"
ln -s "$real/include/cublasLt.h" "$py/nvidia/cu13/include/cublasLt.h"
ln -s "$lt" "$py/nvidia/cu13/lib/$(basename "$lt")"
[ -f /usr/include/nccl.h ] || [ ! -f "$real/include/nccl.h" ] ||
  ln -s "$real/include/nccl.h" "$py/nvidia/nccl/include/nccl.h"
got=$(PYTHONPATH=$py var CUBLASLT CUDA=1 CUDA_HOME="$tk")
[ "$got" = "$py/nvidia/cu13/lib/$(basename "$lt")" ] || fail "cuBLASLt from Python: CUBLASLT is '$got'"
lab=$(PYTHONPATH=$py make -s -n CUDA=1 CUDA_HOME="$tk" BUILD="$TMPD/b" "$TMPD/b/tools/cuda_lab" 2>/dev/null)
grep -q -- "-DWICK_CUBLASLT=1 -I$py/nvidia/cu13/lib/../include" <<<"$lab" ||
  fail "the lab is not compiled against Python's cuBLASLt header"
grep -q -- "$got -Wl,-rpath,$py/nvidia/cu13/lib/" <<<"$lab" || fail "the lab is not linked with $got"
echo "   cuBLASLt from Python's nvidia package: $got (the lab compiled and linked with it)"
if [ -e "$py/nvidia/nccl/include/nccl.h" ]; then
  cmd=$(PYTHONPATH=$py make -s -n CUDA=1 CUDA_HOME="$tk" BUILD="$TMPD/b" \
        "$TMPD/b/obj/kernels/cuda/comm_nccl.cu.o" 2>/dev/null)
  grep -q -- "-I$py/nvidia/nccl/include " <<<"$cmd" ||
    fail "comm_nccl.cu is not compiled against Python's nccl.h: $cmd"
  echo "   nccl.h from Python's nvidia package: $py/nvidia/nccl/include"
fi

# 3. the static runtime is preferred where both are there
tk2=$TMPD/both
mkdir -p "$tk2/lib" "$tk2/lib64"
ln -s "$so" "$tk2/lib64/$(basename "$so")"
ln -s "$real/lib64/libcudart_static.a" "$tk2/lib/libcudart_static.a"
got=$(var CUDART CUDA=1 CUDA_HOME="$tk2")
[ "$got" = "$tk2/lib/libcudart_static.a" ] || fail "static and shared: CUDART is '$got'"
echo "   static and shared runtimes: the static one"

# 4. no runtime at all: CUDA=1 stops and names it; the default builds without CUDA, saying so
mkdir -p "$TMPD/empty"
out=$(make -s -n CUDA=1 CUDA_HOME="$TMPD/empty" 2>&1) && fail "CUDA=1 with no runtime went on"
grep -q "no CUDA toolkit with libcudart in lib64/ or lib/" <<<"$out" || fail "CUDA=1, no runtime: $out"
out=$(make -s -n CUDA=auto CUDA_HOME="$TMPD/empty" 2>&1) || fail "CUDA=auto with no runtime failed: $out"
grep -q "no libcudart beside it; building without CUDA" <<<"$out" ||
  fail "CUDA=auto with no runtime did not say it builds without CUDA"
grep -q -- "-DWICK_CUDA=1" <<<"$out" && fail "CUDA=auto with no runtime still compiles for CUDA"
echo "   no runtime: CUDA=1 stops with a message, the default builds without CUDA and says so"
echo ok
