# emu.mk — the host emulation of the CUDA backend (tests/gpu/emu, README.md there), included
# by the Makefile after its CUDA section (CUDA_BACKEND_SRC, OPS_TABLE_OBJ, LIBFTK, NCCL_H).
# Neither a GPU nor nvcc is needed. Not in the sanitizer build (EMU_BINS is empty there):
# the fibers switch stacks under the sanitizers' feet.
#
# The backend's sources (CUDA_BACKEND_SRC: every op family and cuda.cu) and the attention
# headers made plain C++ by launches.pl into tests/emu/, beside each other so that their
# includes find the rewritten files first (the others, cuda_internal.cuh, common.cuh, come
# from kernels/cuda), built over the emulated CUDA runtime and cuBLASLt
# (tests/gpu/emu/include) as one translation unit, cuda_emu.o: the emulator's state
# (emu.h, emu_runtime.h) is one per unit, and a process has one CUDA runtime. gpu_ops_emu
# is gpu_ops linked with it, gpu_opbench_emu the op benchmark at small shapes, tests/emu/bin
# the tools that take --device (and test_comm), flash_emu flash_mma.cuh's kernels alone.
EMU_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -ffp-contract=off -U_FORTIFY_SOURCE \
                -Itests/gpu/emu/include -Itests/gpu/emu -I$(O)/tests/emu -Ikernels/cuda
EMU_DEPS := $(wildcard tests/gpu/emu/*.h tests/gpu/emu/include/*.h tests/gpu/emu/include_c/*.h) \
            kernels/cuda/common.cuh kernels/backend.h kernels/cuda_mem.h libcommon/dtype.h kernels/sround.h libcommon/log.h
EMU_BACKEND := $(addprefix $(O)/tests/emu/,$(notdir $(CUDA_BACKEND_SRC)))
$(O)/tests/emu/%: kernels/cuda/% tests/gpu/emu/launches.pl
	@mkdir -p $(dir $@)
	perl tests/gpu/emu/launches.pl $< > $@.tmp && mv $@.tmp $@
# the emulated programs' link: their objects in the order given (tools/%.o or the test's
# first, the emulated backend, the emulated NCCL layer where it is a prerequisite), then libftk
EMU_LINK = mkdir -p $(dir $@) && $(CXX) $(LDFLAGS) $(filter %.o,$^) $(LIBFTK) $(LIBS) -o $@
# every rewritten source, included ahead of cuda_emu.cc's own text (-include)
$(O)/tests/emu/cuda_emu.o: tests/gpu/emu/cuda_emu.cc $(EMU_BACKEND) \
                           $(addprefix $(O)/tests/emu/,flash_attn.cuh flash_mma.cuh) kernels/cuda/cuda_internal.cuh \
                           $(EMU_DEPS)
	$(CXX) $(EMU_CXXFLAGS) $(addprefix -include ,$(EMU_BACKEND)) -c $< -o $@
$(O)/tests/gpu_ops_emu: $(O)/tests/gpu/gpu_ops.o $(OPS_TABLE_OBJ) $(O)/tests/emu/cuda_emu.o $(LIBFTK)
	$(EMU_LINK)
# gpu_opbench at small shapes: a run of the benchmark harness (its figures mean nothing)
$(O)/tests/emu/gpu_opbench_small.o: tests/gpu/gpu_opbench.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DOPBENCH_SMALL -c $< -o $@
$(O)/tests/gpu_opbench_emu: $(O)/tests/emu/gpu_opbench_small.o $(OPS_TABLE_OBJ) $(O)/tests/emu/cuda_emu.o $(LIBFTK)
	$(EMU_LINK)
# NCCL emulated too, where NCCL's nccl.h is found: engine/comm_nccl.c over the emulated
# runtime's C face (include_c), and tests/emu/lib/libnccl.so.2 (emu_nccl.c), which the
# programs linked with it open (dlopen) before any other NCCL: their DT_RPATH, searched
# ahead of LD_LIBRARY_PATH, is $ORIGIN/../lib. They export emu_c_cudaGetDevice, the device
# the emulated NCCL checks for duplicates.
EMU_NCCL_OBJ := $(if $(NCCL_H),$(O)/tests/emu/comm_nccl.o)
EMU_NCCL_LIB := $(if $(NCCL_H),$(O)/tests/emu/lib/libnccl.so.2)
EMU_NCCL_LDFLAGS :=
ifneq ($(NCCL_H),)
EMU_NCCL_LDFLAGS := -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/../lib' -Wl,--export-dynamic-symbol=emu_c_cudaGetDevice
endif
EMU_C_FLAGS := -Itests/gpu/emu/include_c $(if $(NCCL_H),-I$(dir $(NCCL_H)))
$(O)/tests/emu/comm_nccl.o: engine/comm_nccl.c $(wildcard tests/gpu/emu/include_c/*.h) tests/gpu/emu/emu_cuda_types.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(EMU_C_FLAGS) -c $< -o $@
$(O)/tests/emu/lib/libnccl.so.2: tests/gpu/emu/emu_nccl.c $(wildcard tests/gpu/emu/include_c/*.h) libcommon/dtype.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(EMU_C_FLAGS) -fPIC -shared -fvisibility=hidden -Wl,-soname,libnccl.so.2 $< -pthread -o $@
# ftk-train and ftk-generate on the emulated backend (--device cuda), and the communication
# contract test (tests/unit/test_comm.c) there: each carries the CUDA library's table
# (engine/cuda_lib.c over the emulated backend and NCCL) and exports its name, which the
# loader (engine/cuda_load.h) finds in the program before any libftk-cuda.so
EMU_DEVICE_BINS := $(addprefix $(O)/tests/emu/bin/,ftk-train ftk-generate test_comm)
$(O)/tests/emu/bin/ftk-train $(O)/tests/emu/bin/test_comm: LIBS += $(MPI_LIBS)
$(EMU_DEVICE_BINS): $(O)/engine/cuda_lib.o $(EMU_NCCL_OBJ) | $(EMU_NCCL_LIB)
$(EMU_DEVICE_BINS): LDFLAGS += $(EMU_NCCL_LDFLAGS) $(CUDA_LIB_EXPORT)
$(O)/tests/emu/bin/test_comm: $(O)/tests/unit/test_comm.o $(O)/tests/emu/cuda_emu.o $(LIBFTK)
	$(EMU_LINK)
$(O)/tests/emu/bin/%: $(O)/tools/%.o $(O)/tests/emu/cuda_emu.o $(LIBFTK)
	$(EMU_LINK)
$(O)/tests/flash_emu: tests/gpu/flash_emu.cc $(O)/tests/emu/flash_mma.cuh $(EMU_DEPS) $(OPS_TABLE_OBJ) $(LIBFTK)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $< $(OPS_TABLE_OBJ) $(LIBFTK) $(LDFLAGS) $(LIBS) -o $@
