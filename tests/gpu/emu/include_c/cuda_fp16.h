/* tests/gpu/emu/include_c: NCCL's nccl.h includes it; nothing here uses half floats */
#pragma once
