/* tests/gpu/emu/include_c: see cuda_runtime_api.h */
#pragma once
#include "cuda_runtime_api.h"
