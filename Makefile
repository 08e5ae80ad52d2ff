# wick: one binary, build/wick. Non-recursive; objects live under $(BUILD), never beside sources.
#
#   make               build build/wick (CUDA kernels too when nvcc is found)
#   make test          build, then run every test stage (tests/run); ends with "N passed, N failed"
#   make demo          stories260K converted and snapshotted, four jobs through a spool queue
#                      served in one batch by `wick worker`, which idles, exits and bills
#   make MODE=asan     AddressSanitizer + UBSan build under build/asan (make MODE=asan test);
#                      plain `make test` runs the unit tests and fuzz corpora under it too
#   make CUDA=0        CPU-only build, even where nvcc exists
#   make simt          the CUDA kernels' tests and a wick with the CUDA backend, under the CPU
#                      emulator tests/simt (make test runs both)

MODE ?= release
CUDA ?= auto
SHARED ?= ../shared

ifeq ($(MODE),asan)
BUILD    ?= build/asan
MODEFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else ifeq ($(MODE),release)
BUILD    ?= build
MODEFLAGS := -O2 -g
else
$(error MODE must be release or asan, not '$(MODE)')
endif

# Dependencies install themselves: when pkg-config cannot find one, run scripts/install-deps.
PKGS := jansson libcurl libevent liblz4 libxxhash hiredis openssl criterion
ifneq ($(shell pkg-config --exists $(PKGS) 2>/dev/null && echo ok),ok)
ifneq ($(shell scripts/install-deps 1>&2 && echo ok),ok)
$(error scripts/install-deps failed; see the messages above)
endif
endif

CC      ?= cc
CFLAGS  := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpointer-arith -Werror -pthread -I. $(MODEFLAGS) \
           $(shell pkg-config --cflags jansson liblz4 libxxhash libcurl libevent) $(EXTRA_CFLAGS)
LDFLAGS := -pthread $(MODEFLAGS) $(EXTRA_LDFLAGS)
CPU_LDLIBS := $(shell pkg-config --libs jansson liblz4 libxxhash hiredis openssl libcurl \
                libevent) -lm
LDLIBS  := $(CPU_LDLIBS)

# Files named *_avx2.c are compiled for AVX2/FMA/F16C and only called after a runtime CPU check.
AVX2FLAGS := -mavx2 -mfma -mf16c

# ---- CUDA: compiled whenever nvcc exists, unless CUDA=0 ------------------------------------
NVCC := $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
ifeq ($(CUDA),0)
NVCC :=
endif
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found on PATH or in /usr/local/cuda/bin)
endif
endif
# The toolkit root: $(CUDA_HOME) when set, else the one nvcc reports (nvcc may be a wrapper
# script elsewhere on PATH), else /usr/local/cuda. It must hold the CUDA runtime in lib64/ or
# lib/ (a pip-installed toolkit's layout): libcudart_static.a, or else libcudart.so*, then
# found at run time through an rpath.
cudart_in = $(firstword $(foreach l,lib64 lib,$(wildcard $(1)/$(l)/libcudart_static.a)) \
                        $(foreach l,lib64 lib,$(wildcard $(1)/$(l)/libcudart.so*)))
ifneq ($(NVCC),)
ifeq ($(origin CUDA_HOME),undefined)
CUDA_HOME := $(shell for d in "$$($(NVCC) --dryrun -x cu /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p' | head -n1)" \
                 "$(patsubst %/bin/nvcc,%,$(NVCC))" /usr/local/cuda; do \
                 [ -n "$$d" ] && ls "$$d"/lib64/libcudart* "$$d"/lib/libcudart* >/dev/null 2>&1 && \
                 { cd "$$d" && pwd -P; break; }; done)
endif
CUDART := $(call cudart_in,$(CUDA_HOME))
ifeq ($(CUDART),)
ifeq ($(CUDA),1)
$(error CUDA=1 but no CUDA toolkit with libcudart in lib64/ or lib/ was found (nvcc: $(NVCC)); set CUDA_HOME)
endif
$(warning nvcc found at $(NVCC) but no libcudart beside it; building without CUDA)
NVCC :=
endif
endif
NVCCFLAGS := -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I. -Xcompiler -Wall,-Wextra,-Werror \
             $(EXTRA_NVCCFLAGS)

# ---- sources -------------------------------------------------------------------------------
LIB_SRC := $(wildcard common/*.c coldstart/*.c engine/*.c kernels/*.c kernels/cpu/*.c worker/*.c)
LIB_SRC := $(filter-out worker/main.c kernels/cuda/%,$(LIB_SRC))
# The kernel lab (kernels/cuda/lab*.cu) is linked into build/tools/cuda_lab alone, with
# cuBLASLt (its matrix ceilings) when the toolkit has it: wick and libwick never depend on it.
LAB_CU  := kernels/cuda/lab.cu kernels/cuda/lab_attention.cu
comma   := ,
ifneq ($(NVCC),)
CU_SRC  := $(filter-out $(LAB_CU),$(wildcard kernels/cuda/*.cu))
CFLAGS  += -DWICK_CUDA=1
LDLIBS  += $(CUDART) $(if $(filter %.a,$(CUDART)),,-Wl$(comma)-rpath$(comma)$(dir $(CUDART))) \
           -ldl -lrt -lstdc++
# Where the toolkit lacks them, Python's NVIDIA packages may hold cuBLASLt and NCCL's header
# (nvidia-cublas, nvidia-nccl: nvidia/cu13, nvidia/cublas, nvidia/nccl, each with include/
# and lib/)
PY_NVIDIA := $(shell python3 -c 'import nvidia, os; \
               print(*[os.path.join(p, d) for p in nvidia.__path__ for d in sorted(os.listdir(p))])' \
               2>/dev/null)
# cuBLASLt (the lab's matrix ceilings): the toolkit's, else Python's, else none (the lab says so)
CUBLASLT := $(strip $(firstword $(foreach r,$(CUDA_HOME) $(PY_NVIDIA),$(if $(wildcard $(r)/include/cublasLt.h),\
              $(firstword $(foreach l,lib64 lib,$(wildcard $(r)/$(l)/libcublasLt.so $(r)/$(l)/libcublasLt.so.*)))))))
# nccl.h (comm_nccl.cu: types and signatures; the library is loaded at run time): the
# toolkit's, the system's, else Python's
NCCL_INC := $(strip $(if $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h),,\
              $(firstword $(foreach r,$(PY_NVIDIA),$(if $(wildcard $(r)/include/nccl.h),$(r)/include)))))
LAB_LIBS := $(if $(CUBLASLT),$(CUBLASLT) -Wl$(comma)-rpath$(comma)$(dir $(CUBLASLT)))
else
LIB_SRC += $(wildcard kernels/cuda/*_none.c)
CU_SRC  :=
endif

# Whether $(BUILD) holds a CUDA build: every object depends on $(BUILD)/.cuda-on or .cuda-off,
# and making one removes the other, so `make CUDA=0` after a CUDA build (or the reverse)
# rebuilds everything instead of finding nothing to do and keeping the other binary. Only
# that switch: flags such as gpu-check's EXTRA_CFLAGS=-Wno-error rebuild nothing (make test
# runs that build beside its other tests), and `make -n` writes nothing. The stamp is made as
# the Makefile is read, before any object is looked at (as a goal's prerequisite it would race
# the objects under -j, and .SECONDARY leaves a missing prerequisite of an object unmade).
STAMP := $(BUILD)/.cuda-$(if $(NVCC),on,off)
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
$(shell [ -e $(STAMP) ] || { mkdir -p $(BUILD) && rm -f $(BUILD)/.cuda-on $(BUILD)/.cuda-off && \
          touch $(STAMP); })
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
MAIN_OBJ := $(BUILD)/obj/worker/main.o
TEST_SRC := $(wildcard tests/unit/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TOOL_SRC := $(wildcard tests/tools/*.c)
TOOLS    := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)

# Fuzz targets (tests/fuzz/NAME.c): replayed over their committed corpora in `make test`;
# `make fuzz FUZZ_SECONDS=60` runs each under libFuzzer (clang) in build/fuzz.
FUZZ_TARGETS := $(basename $(notdir $(filter-out tests/fuzz/replay.c,$(wildcard tests/fuzz/*.c))))
FUZZ_REPLAY  := $(FUZZ_TARGETS:%=$(BUILD)/fuzz-replay/%)
FUZZ_SECONDS ?= 60
FUZZ_LIBS    := $(shell pkg-config --libs jansson liblz4 libxxhash hiredis openssl libcurl \
                  libevent) -lm

.PHONY: all test demo clean unit tools fuzz asan-unit simt analyze
.SECONDARY:
all: $(BUILD)/wick

$(BUILD)/libwick.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/wick: $(MAIN_OBJ) $(BUILD)/libwick.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/unit: $(TEST_OBJ) $(BUILD)/libwick.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(shell pkg-config --libs criterion)

$(BUILD)/tools/%: $(BUILD)/obj/tests/tools/%.o $(BUILD)/libwick.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

ifneq ($(NVCC),)
$(BUILD)/tools/cuda_lab: $(BUILD)/obj/tests/tools/cuda_lab.o $(LAB_CU:%.cu=$(BUILD)/obj/%.cu.o) \
                         $(BUILD)/libwick.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(LAB_LIBS)

$(BUILD)/obj/kernels/cuda/comm_nccl.cu.o: NVCCFLAGS += $(if $(NCCL_INC),-I$(NCCL_INC))
$(LAB_CU:%.cu=$(BUILD)/obj/%.cu.o): NVCCFLAGS += $(if $(CUBLASLT),-DWICK_CUBLASLT=1 \
                                                   -I$(dir $(CUBLASLT))../include)
endif

$(BUILD)/.cuda-%:
	@mkdir -p $(dir $@)
	@rm -f $(BUILD)/.cuda-on $(BUILD)/.cuda-off
	@touch $@

$(BUILD)/obj/%_avx2.o: %_avx2.c $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2FLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/obj/%.o: %.c $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

# ptxas's report of each kernel's registers, shared memory and spills is kept beside its
# object ($@.ptxas): tests/simt/launch_fit.py checks the emulated tests' launches against it.
# Anything else the compilers say is still printed.
$(BUILD)/obj/%.cu.o: %.cu $(STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xptxas -v -MMD -MP -c -o $@ $< 2>$@.ptxas || { cat $@.ptxas >&2; exit 1; }
	@grep -v -E '^(ptxas info *:|    [0-9]+ bytes stack frame)' $@.ptxas >&2 || true

$(BUILD)/fuzz-replay/%: $(BUILD)/obj/tests/fuzz/%.o $(BUILD)/obj/tests/fuzz/replay.o $(BUILD)/libwick.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

fuzz:
	$(MAKE) BUILD=build/fuzz CC=clang CUDA=0 \
	  EXTRA_CFLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -Wno-error" \
	  build/fuzz/libwick.a $(FUZZ_TARGETS:%=build/fuzz/obj/tests/fuzz/%.o)
	@for t in $(FUZZ_TARGETS); do \
	  clang -fsanitize=fuzzer,address,undefined -o build/fuzz/$$t build/fuzz/obj/tests/fuzz/$$t.o \
	    build/fuzz/libwick.a $(FUZZ_LIBS) -pthread || exit 1; \
	  mkdir -p build/fuzz/corpus/$$t && cp -n tests/fuzz/corpus/$$t/* build/fuzz/corpus/$$t/; \
	  echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
	  build/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus/$$t || exit 1; \
	done

unit: $(BUILD)/tests/unit
tools: $(TOOLS)

# ---- CUDA on the CPU, under the emulator in tests/simt (no nvcc) ----------------------------
# cu2cpp.py rewrites each CUDA file into C++ under $(BUILD)/simt and g++ compiles it against
# tests/simt/simt.h (-w: the generated code keeps CUDA's idioms, #pragma unroll among them).
# The emulator itself, $(SIMT_EMU) (tests/simt/*.cpp), is compiled with the warnings as errors.
# $(BUILD)/simt/unit is the CUDA kernels' tests (tests/unit/test_cuda*.c and their helpers
# cuda_test.c, $(CUDA_TEST_OBJ): the unit tests' own objects, project flags) on the emulated
# CUDA files (backend_cuda.cu's cuda_device_count among them) and the CPU library's objects:
# libwick's, less everything CUDA and cuda_none.o, archived again so that only what the tests
# use is linked. $(BUILD)/simt/wick is the whole wick with the CUDA
# backend (backend_cuda.cu) emulated, and tests/simt/comm_simt.c for the collectives (NCCL's
# entry, comm_cpu's work: the emulated devices share host memory, so a sharded engine runs
# there with a thread per rank); tests/e2e/cuda_emulated.sh runs it.
SIMT_CU       := kernels/cuda/kernels.cu kernels/cuda/attention.cu kernels/cuda/glm_kernels.cu \
                 kernels/cuda/moe_kernels.cu \
                 kernels/cuda/sample_kernels.cu \
                 kernels/cuda/gemm_fp8.cu kernels/cuda/gemm_wgmma.cu kernels/cuda/gemm_fp8w.cu \
                 kernels/cuda/backend_cuda.cu
SIMT_CUH      := $(patsubst %,$(BUILD)/simt/%,$(wildcard kernels/cuda/*.cuh))
SIMT_EMU      := simt simt_mem simt_runtime mma wgmma
SIMT_OBJ      := $(SIMT_CU:%.cu=$(BUILD)/simt/%.o) $(SIMT_EMU:%=$(BUILD)/simt/%.o)
CUDA_TEST_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/unit/test_cuda*.c) \
                   tests/unit/cuda_test.c)
SIMT_CXXFLAGS := -std=c++17 -pthread -Itests/simt/include -Itests/simt -I$(BUILD)/simt -I. $(MODEFLAGS)

$(BUILD)/simt/%.cpp: %.cu tests/simt/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 tests/simt/cu2cpp.py $< $@

$(SIMT_CUH): $(BUILD)/simt/%.cuh: %.cuh tests/simt/cu2cpp.py
	@mkdir -p $(dir $@)
	python3 tests/simt/cu2cpp.py $< $@

$(BUILD)/simt/%.o: $(BUILD)/simt/%.cpp $(SIMT_CUH)
	$(CXX) $(SIMT_CXXFLAGS) -w -MMD -MP -c -o $@ $<

$(SIMT_EMU:%=$(BUILD)/simt/%.o): $(BUILD)/simt/%.o: tests/simt/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(SIMT_CXXFLAGS) -Wall -Wextra -Werror -MMD -MP -c -o $@ $<

$(BUILD)/simt/libwick-cpu.a: $(filter-out $(BUILD)/obj/kernels/cuda/%,$(LIB_OBJ))
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/simt/unit: $(CUDA_TEST_OBJ) $(SIMT_OBJ) $(BUILD)/simt/libwick-cpu.a
	$(CXX) $(LDFLAGS) -o $@ $^ $(CPU_LDLIBS) $(shell pkg-config --libs criterion)

$(BUILD)/simt/comm_simt.o: tests/simt/comm_simt.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/simt/wick: $(MAIN_OBJ) $(SIMT_OBJ) $(BUILD)/simt/comm_simt.o \
                    $(BUILD)/simt/libwick-cpu.a
	$(CXX) $(LDFLAGS) -o $@ $^ $(CPU_LDLIBS)

simt: $(BUILD)/simt/unit $(BUILD)/simt/wick

# In release mode `make test` also builds the unit tests, the fuzz replayers and wick under
# ASan+UBSan (build/asan, CPU-only); tests/run runs them as the unit-asan and fuzz-asan
# stages and a few e2e scripts against that wick (asan-*).
# It also runs the CUDA kernels' tests under the emulator (the cuda-simt stage) and the
# emulated wick (e2e/cuda_emulated), in release mode only: under ASan they pass, but ASan
# warns at each fiber's first stack switch that it cannot follow it, and they take minutes
# instead of seconds.
ifeq ($(MODE),release)
ASAN_STAGE := asan-unit
ASAN_ENV   := WICK_ASAN_BUILD=build/asan
SIMT_STAGE := $(BUILD)/simt/unit $(BUILD)/simt/wick
SIMT_ENV   := WICK_SIMT=$(BUILD)/simt/unit WICK_SIMT_WICK=$(BUILD)/simt/wick
endif

asan-unit:
	$(MAKE) MODE=asan CUDA=0 build/asan/tests/unit build/asan/wick \
	  $(FUZZ_TARGETS:%=build/asan/fuzz-replay/%)

test: $(BUILD)/wick $(BUILD)/tests/unit $(TOOLS) $(FUZZ_REPLAY) $(ASAN_STAGE) $(SIMT_STAGE)
	@WICK_BUILD=$(BUILD) WICK_SHARED=$(SHARED) MODE=$(MODE) $(ASAN_ENV) $(SIMT_ENV) tests/run

# clang's static analyzer (scan-build, Debian's clang-tools) over the CPU build, in its own
# build directory; the reports go to build/analyze/report, one HTML page each.
analyze:
	@command -v scan-build >/dev/null || \
	  { echo "make analyze: no scan-build (apt-get install clang-tools)"; exit 1; }
	rm -rf build/analyze
	scan-build -o build/analyze/report $(MAKE) BUILD=build/analyze CUDA=0 all tools

demo: $(BUILD)/wick
	@scripts/demo $(BUILD) $(SHARED)

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj $(BUILD)/simt -name '*.d' 2>/dev/null)
