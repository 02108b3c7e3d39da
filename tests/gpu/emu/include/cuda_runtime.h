/* tests/gpu/emu: the CUDA runtime on the host (emu_runtime.h) */
#pragma once
#include "../emu_runtime.h"
