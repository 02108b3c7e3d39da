/* tests/gpu/emu: the bf16 type, as storage only (the kernels convert with their own bit
 * arithmetic) */
#pragma once
#include <stdint.h>
struct __nv_bfloat16 {
    uint16_t x;
};
