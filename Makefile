# ftk — build, test, demo, bench, install.
#
#   make                 build every tool into bin/ (and the HDF5 zstd plugin)
#   make test            install missing packages, build, run the whole test suite
#                        (unit, CLI golden, reference, fault tests, then the ASan+UBSan build)
#   make test-slow       the slow cases (full-size fault trials, multi-GB inputs): not in make test
#   make demo            install, build, run the demo pipeline on the embedded example
#   make bench           speed ratios against peers in the same run: tokenizer vs SentencePiece,
#                        import/export vs cp, CPU training vs PyTorch, reshard vs cp -r, the
#                        HDF5 read beside a background write (h5_wait) vs one write call per array
#   make gpu-check       on a GPU machine: every GPU check and benchmark in one command (under 9
#                        minutes), one markdown report in REPORT (default build/gpu-check/report.md)
#   make gpu-bundle      here, no GPU needed: GPU_BUNDLE (gpu/, at most 48 MiB) holds everything a
#                        bare GPU machine needs for them; there: sh gpu/run.sh OUTDIR [BUDGET_S]
#   make asan            the sanitizer build only (build/asan/bin)
#   make install PREFIX=/usr/local
#
# CUDA parts (kernels/cuda) are built when nvcc is found; nothing else needs them.

PREFIX   ?= /usr/local
CC       ?= gcc
PYTHON   ?= /usr/bin/python3

ifeq ($(SAN),1)
O        := build/asan
BINDIR   := build/asan/bin
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
OPT      := -O1
else
O        := build
BINDIR   := bin
SANFLAGS :=
OPT      := -O2
endif

HDF5_CFLAGS := $(shell pkg-config --cflags hdf5 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs hdf5 2>/dev/null)

# -ffp-contract=off: no fused multiply-adds the C standard does not ask for (gcc's C11 mode
# already; clang contracts by default): the CPU reference's bits are the GPU's target.
CFLAGS  := -std=c11 $(OPT) -g -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -fPIC -ffp-contract=off $(SANFLAGS) \
           $(HDF5_CFLAGS) -MMD -MP $(EXTRA_CFLAGS)
LDFLAGS := -fopenmp $(SANFLAGS)
# -ldl: the CUDA library's loader (engine/cuda_load.c) in libftk.a (dlopen is in libc from
# glibc 2.34, in libdl before).
LIBS    := $(HDF5_LIBS) -lzstd -lxxhash -lopenblas -lyaml -lm -ldl

# MPI (Open MPI): only engine/comm.c includes it and only the distributed programs link it.
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags ompi 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null || pkg-config --libs ompi 2>/dev/null)
MPI_BINS   := $(BINDIR)/ftk-train

# engine/comm_nccl.c needs NCCL and the CUDA runtime, engine/cuda_lib.c names the backend:
# both go with the CUDA library's objects (CUDA_LIB_OBJS, below), not into libftk.a.
LIB_SRC   := $(filter-out engine/comm_nccl.c engine/cuda_lib.c,\
             $(wildcard libcommon/*.c formats/*.c kernels/*.c kernels/cpu/*.c kernels/plan/*.c engine/*.c))
LIB_OBJ   := $(patsubst %.c,$(O)/%.o,$(LIB_SRC))
LIBFTK    := $(O)/libftk.a
TOOLS     := ftk ftk-tokenize ftk-pack ftk-info ftk-verify ftk-import-hf ftk-export-hf ftk-init ftk-import-llama2c ftk-plot \
             ftk-train ftk-generate ftk-reshard ftk-merge
TOOL_BINS := $(addprefix $(BINDIR)/,$(TOOLS))
TEST_SRC  := $(wildcard tests/unit/*.c)
TEST_BINS := $(patsubst tests/unit/%.c,$(O)/tests/%,$(TEST_SRC))
# helper programs the test and bench scripts run (not tests themselves)
TESTTOOL_SRC  := $(wildcard tests/tools/*.c)
TESTTOOL_BINS := $(patsubst tests/tools/%.c,$(O)/tests/%,$(TESTTOOL_SRC))
PLUGIN    := $(O)/plugin/libh5zstd.so
# tests/fault/lock.sh's LD_PRELOAD shim: one for both builds (preloaded into the sanitizer
# build's programs too, ahead of their runtime).
LOCK_SHIM := build/tests/lock_delay.so
H5_WAIT   := $(O)/tests/h5_wait
# The CUDA backend's sources run on the host (tests/gpu/emu): not in the sanitizer build.
EMU_BINS  := $(if $(filter 1,$(SAN)),,$(O)/tests/flash_emu $(O)/tests/gpu_ops_emu $(O)/tests/emu/bin/ftk-train \
             $(O)/tests/emu/bin/ftk-generate $(O)/tests/emu/bin/test_comm $(O)/tests/gpu_opbench_emu)

# --- CUDA detection: build kernels/cuda where nvcc exists (CI compiles it, cannot run it).
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),)
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
CUDA_BINS :=
# The CUDA backend: a file per op family over kernels/cuda/cuda_internal.cuh, and cuda.cu (the
# instance, the op table); device.cu, the probe and smoke kernel, is apart. The host
# emulation (tests/gpu/emu/emu.mk) builds the same list.
CUDA_BACKEND_SRC := $(filter-out kernels/cuda/device.cu,$(wildcard kernels/cuda/*.cu))
ifneq ($(SAN),1)
ifneq ($(NVCC),)
# -ffp-contract=off for the host compiler: host arithmetic the CPU backend shares (AdamW's
# factors) must round as in C11, also where the host has FMA (aarch64: Grace Hopper).
# -Xptxas -warn-spills: ptxas names every kernel that spills registers to local memory (a
# warning, not an error: a spill costs speed, not correctness, and another ptxas may differ).
NVCCFLAGS := -O2 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 -Xptxas -warn-spills \
             -Xcompiler -Wall,-Wextra,-Werror,-ffp-contract=off,-fPIC
CUDA_SRC  := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ  := $(patsubst %.cu,$(O)/%.o,$(CUDA_SRC))
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcublasLt -lcudart -ldl -Wl,-rpath,$(CUDA_HOME)/lib64
CUDA_BINS := $(O)/tests/gpu_smoke $(O)/tests/gpu_ops $(O)/tests/gpu_opbench $(O)/tests/cudnn_graphs
endif
endif

# The CUDA library: each of its names is defined once, and every program reaches it through
# one loader, engine/cuda_load.c (in libftk.a; its header gives the design), which returns
# the table of entry points engine/cuda_lib.c defines (cuda_lib_entry: the backend's
# constructor and device count, NCCL's table). Which table a program gets is no matter of
# link order but of what it was linked with:
#  - the tools that take --device (DEVICE_BINS) link no CUDA: CUDA_SO, the library's objects
#    (CUDA_LIB_OBJS: the backend, engine/comm_nccl.c, engine/cuda_lib.c) linked against
#    libcudart and libcublasLt, in lib/ beside bin/, is what the loader opens at run time (it
#    looks in $ORIGIN/../lib, then in PREFIX/lib/ftk, where make install puts it; compiled
#    with CUDA_LOAD_LIB=1 where CUDA_SO is built), so that they start where the CUDA
#    libraries are not installed (docs/gpu.md, "Without the CUDA libraries"). They export
#    their symbols (-rdynamic): the library's calls into libftk reach the tool's copies;
#  - test_comm and the host emulation's programs link the library's objects themselves and
#    export its one name (CUDA_LIB_EXPORT), which the loader finds in the program first;
#  - where there is no CUDA (no nvcc, the sanitizer build) there is no library: the loader
#    answers "this build has no CUDA backend (…)".
# The GPU op tests link the backend's objects and call backend_cuda_new themselves. Without
# CUDA the GPU op test is still compiled (not linked), so it keeps up with the headers.
# NCCL (engine/comm_nccl.c) is in the library where nccl.h is found (engine/cuda_lib.c is
# then compiled with CUDA_LIB_NCCL=1); libnccl.so.2 itself is opened at run time (dlopen),
# so these programs also start where it is not installed.
DEVICE_BINS := $(BINDIR)/ftk-train $(BINDIR)/ftk-generate
CUDA_LIB_EXPORT := -Wl,--export-dynamic-symbol=cuda_lib_entry
CUDA_SO       :=
CUDA_LIB_OBJS :=
NCCL_OBJ      :=
BACKEND_LIBS  :=
DEVICE_LIBS   :=
GPU_CHECK     := $(O)/tests/gpu/gpu_ops.o
ifneq ($(CUDA_BINS),)
CUDA_SO       := $(patsubst %bin,%lib,$(BINDIR))/libftk-cuda.so
NCCL_OBJ      := $(if $(NCCL_H),$(O)/engine/comm_nccl.o)
CUDA_LIB_OBJS := $(CUDA_OBJ) $(NCCL_OBJ) $(O)/engine/cuda_lib.o
BACKEND_LIBS  := $(CUDA_LIBS) -lstdc++
DEVICE_LIBS   := -rdynamic
GPU_CHECK     :=
endif

.SECONDARY:
.PHONY: all deps deps-build test test-slow check demo bench gpu-check gpu-bundle asan fuzz install clean config
all: config $(TOOL_BINS) $(CUDA_SO) $(PLUGIN) $(LOCK_SHIM) $(H5_WAIT) $(TEST_BINS) $(TESTTOOL_BINS) $(CUDA_BINS) $(GPU_CHECK) $(EMU_BINS)

config:
	@echo "ftk: HDF5: $(if $(HDF5_LIBS),$(HDF5_LIBS),NOT FOUND (run scripts/install-deps.sh))"
	@echo "ftk: CUDA: $(if $(NVCC),nvcc at $(NVCC) -> building kernels/cuda,nvcc not found -> CPU only)$(if $(filter 1,$(SAN)), (not in the sanitizer build),)"
	@echo "ftk: NCCL: $(if $(NCCL_OBJ),$(NCCL_H) -> building engine/comm_nccl.c,$(if $(NCCL_H),$(NCCL_H) (not used without nvcc),not found) -> no NCCL)"
	@echo "ftk: MPI: $(if $(MPI_LIBS),$(MPI_LIBS),NOT FOUND (run scripts/install-deps.sh))"

# The builds that test, demo and bench start: on every core unless make was given its own -j
# (on CI's 2 cores the two builds take ~100 s instead of ~150 s of make test's 15 minutes)
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
BUILD  = $(MAKE) --no-print-directory $(if $(findstring -j,$(MAKEFLAGS)),,-j$(JOBS))

deps:
	@sh scripts/install-deps.sh test
deps-build:
	@sh scripts/install-deps.sh build

$(O)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# --version says what this build holds (libcommon/version.c) and the commit it was built from:
# $(O)/commit, rewritten as the Makefile is read and only when HEAD has moved, so a new commit
# rebuilds version.o (and relinks) and nothing else, and make -n shows no rebuild that will
# not happen; outside a git checkout it is empty and --version names none.
FTK_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
$(shell mkdir -p $(O) && [ "$$(cat $(O)/commit 2>/dev/null)" = "$(FTK_COMMIT)" ] || echo "$(FTK_COMMIT)" >$(O)/commit)
$(O)/libcommon/version.o: $(O)/commit
$(O)/libcommon/version.o: CFLAGS += -DFTK_COMMIT=\"$(FTK_COMMIT)\" -DFTK_BUILD_MPI=\"$(shell pkg-config --modversion ompi 2>/dev/null)\" \
    -DFTK_BUILD_NCCL=$(if $(NCCL_OBJ),1,0) \
    -DFTK_BUILD_CUDA=\"$(if $(CUDA_BINS),$(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p'),)\"

# The CPU kernels are the hot loops: -O3 lets GCC vectorise them (still IEEE: no fast-math).
ifneq ($(SAN),1)
$(O)/kernels/cpu/%.o: CFLAGS += -O3
endif

$(O)/engine/comm.o: CFLAGS += $(MPI_CFLAGS)
$(MPI_BINS): LIBS += $(MPI_LIBS)
# The trainer's unit test drives engine/trainer.c, hence comm.c (a world of one at run time).
$(O)/tests/test_trainer: LIBS += $(MPI_LIBS)
$(DEVICE_BINS): LIBS += $(DEVICE_LIBS)
$(O)/engine/cuda_load.o: CFLAGS += -DFTK_LIBDIR=\"$(PREFIX)/lib/ftk\" -DCUDA_LOAD_LIB=$(if $(CUDA_SO),1,0)
$(O)/engine/cuda_lib.o: CFLAGS += -DCUDA_LIB_NCCL=$(if $(NCCL_H),1,0)
# The communication contract test (tests/unit/test_comm.c): MPI everywhere, NCCL on GPUs.
$(O)/tests/test_comm: EXTRA_OBJ := $(CUDA_LIB_OBJS)
$(O)/tests/test_comm: LIBS += $(MPI_LIBS) $(BACKEND_LIBS)
$(O)/tests/test_comm: LDFLAGS += $(if $(CUDA_LIB_OBJS),$(CUDA_LIB_EXPORT))
$(O)/tests/test_comm: $(CUDA_LIB_OBJS)
$(O)/tests/unit/test_comm.o: CFLAGS += $(MPI_CFLAGS)
$(O)/engine/comm_nccl.o: CFLAGS += -I$(CUDA_HOME)/include -I$(dir $(NCCL_H))

$(LIBFTK): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BINDIR)/%: $(O)/tools/%.o $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(EXTRA_OBJ) $(LIBFTK) $(LIBS) -o $@

$(O)/tests/%: $(O)/tests/unit/%.o $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(EXTRA_OBJ) $(LIBFTK) $(LIBS) -o $@

$(TESTTOOL_BINS): $(O)/tests/%: $(O)/tests/tools/%.o $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(EXTRA_OBJ) $(LIBFTK) $(LIBS) -o $@

# The op table (tests/ops: the cases, one descriptor per op, the gradient checks' machinery) is
# shared by test_ops and test_prof (CPU), gpu_ops (CUDA against CPU), flash_emu and gpu_opbench.
OPS_TABLE_OBJ := $(addprefix $(O)/tests/ops/,ops_table.o ops_defs.o ops_grad.o)
$(O)/tests/test_ops $(O)/tests/test_prof: $(O)/tests/%: $(O)/tests/unit/%.o $(OPS_TABLE_OBJ) $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $(filter %.o,$^) $(LIBFTK) $(LIBS) -o $@

# The zstd filter as an HDF5 plugin: HDF5_PLUGIN_PATH=$(O)/plugin lets h5py/h5dump read
# compressed ftk files. Built from the same source as the in-process filter.
$(O)/plugin/h5zstd.o: formats/h5zstd.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DH5ZSTD_PLUGIN -c $< -o $@
$(PLUGIN): $(O)/plugin/h5zstd.o
	$(CC) -shared $(LDFLAGS) $< -lzstd -o $@

# The CUDA backend run on the host (tests/gpu/emu): its rules and their reasons are there.
include tests/gpu/emu/emu.mk

# make bench's probe of the HDF5 lock during a background write (tests/bench/h5_wait.c).
$(H5_WAIT): $(O)/tests/bench/h5_wait.o $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(LIBFTK) $(LIBS) -o $@

# tests/fault/lock.sh's LD_PRELOAD shim (LOCK_SHIM, above): never sanitized.
$(LOCK_SHIM): tests/fault/lock_delay.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared $< -ldl -o $@

ifneq ($(CUDA_BINS),)
$(O)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
# nvcc writes no dependency files here: the headers the CUDA sources include, by hand, each
# object its own (a family's edit rebuilds that family; the shared header, all of them)
$(patsubst %.cu,$(O)/%.o,$(CUDA_BACKEND_SRC)): kernels/cuda/cuda_internal.cuh kernels/cuda/common.cuh \
        kernels/backend.h libcommon/dtype.h kernels/sround.h libcommon/log.h
$(O)/kernels/cuda/attention.o: kernels/cuda/flash_attn.cuh kernels/cuda/mma_sync.cuh kernels/cuda/flash_mma.cuh
$(O)/kernels/cuda/device.o: kernels/cuda/device.h
# FTK_CUDA_ATTN=cudnn's graphs checked by cuDNN without a GPU: the test includes the source
$(O)/tests/gpu/cudnn_graphs.o: tests/gpu/cudnn_graphs.cu kernels/cuda/attention_cudnn.cu kernels/cuda/cuda_internal.cuh \
        kernels/cuda/common.cuh kernels/backend.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(O)/tests/cudnn_graphs: $(O)/tests/gpu/cudnn_graphs.o $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LIBS) $(CUDA_LIBS) -lstdc++ -o $@
$(O)/tests/gpu_smoke: $(O)/tests/gpu/gpu_smoke.o $(O)/kernels/cuda/device.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(CUDA_LIBS) -lstdc++ -o $@
# CUDA_SO: what the backend needs of libftk.a is linked in; where the tool that opens it has
# the same (exported) symbols, the tool's are the ones called. Its CUDA libraries are found as
# the GPU tests find theirs (rpath), or on LD_LIBRARY_PATH.
$(CUDA_SO): $(CUDA_LIB_OBJS) $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libftk-cuda.so -Wl,--no-undefined $(CUDA_LIB_OBJS) $(LIBFTK) \
	    -Wl,--as-needed $(LIBS) $(CUDA_LIBS) -lstdc++ -o $@
$(O)/tests/gpu_%: $(O)/tests/gpu/gpu_%.o $(CUDA_OBJ) $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LIBS) $(CUDA_LIBS) -lstdc++ -o $@
$(O)/tests/gpu_ops $(O)/tests/gpu_opbench: $(O)/tests/%: $(O)/tests/gpu/%.o $(OPS_TABLE_OBJ) $(CUDA_OBJ) $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LIBS) $(CUDA_LIBS) -lstdc++ -o $@
endif

asan:
	@$(MAKE) --no-print-directory SAN=1 all

test: deps
	@$(BUILD) all
	@$(BUILD) SAN=1 all
	@sh tests/run.sh

test-slow: deps
	@$(BUILD) all
	@$(BUILD) SAN=1 all
	@sh tests/run.sh slow

check: test

demo: deps
	@$(BUILD) all
	@sh pipelines/demo.sh

bench: deps
	@$(BUILD) all
	@sh tests/bench/run.sh

# Every GPU check in one command (tests/gpu/check.sh). No package installation: GPU nodes
# often cannot; on one without the libraries, see scripts/bundle-runtime.sh.
REPORT ?= build/gpu-check
gpu-check:
	@$(BUILD) all
	@sh tests/gpu/check.sh $(REPORT)

# The GPU bundle (scripts/gpu-bundle.sh; docs/gpu.md): the built programs, the libraries a bare
# GPU machine lacks, Open MPI's run time, the scripts and data, one entry point (run.sh).
GPU_BUNDLE ?= gpu
gpu-bundle:
	@$(BUILD) all
	@sh scripts/gpu-bundle.sh $(GPU_BUNDLE)

# The long fuzz run of the safetensors header parser (make test runs 10 s of it, from the seeds
# alone); build/fuzz/corpus keeps what each run found for the next.
FUZZ_SECONDS ?= 600
fuzz: deps
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS) build/fuzz

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/hdf5/plugin
	install -m 755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(PLUGIN) $(DESTDIR)$(PREFIX)/lib/hdf5/plugin
ifneq ($(CUDA_SO),)
	install -d $(DESTDIR)$(PREFIX)/lib/ftk
	install -m 755 $(CUDA_SO) $(DESTDIR)$(PREFIX)/lib/ftk
endif

clean:
	rm -rf build bin lib

# The compilers' dependency files (-MMD: each object's .d beside it), read from the object
# folders only: build/ also holds what the tests, the demo and the benchmarks leave (their
# scratch, a namespace test's empty folders, Python packages), and none of it is a makefile.
OBJ_DIRS := libcommon formats kernels engine tools tests plugin
-include $(shell find $(addprefix $(O)/,$(OBJ_DIRS)) -name '*.d' -type f 2>/dev/null)
