/* tests/gpu/emu: cuBLASLt's products on the host (emu_runtime.h) */
#pragma once
#include "../emu_runtime.h"
