/* Random rows of GGUF blocks for the tests of the block kernels (CPU
 * levels in quant_checks.h, CUDA in cuda_block_checks.h). */
#ifndef POLAR_TEST_BLOCK_UTIL_H
#define POLAR_TEST_BLOCK_UTIL_H

#include <stdint.h>

#include "../kernels/cpu/quant.h"

/* rows x cols weights of a kept type t: bytes from next() with finite f16
 * scales of realistic size (2^-10 .. 2^-4, either sign) where the formats
 * keep them (the fields make_quant_blocks.py sets). */
static void rand_block_rows(cpu_wtype t, int rows, int cols, uint8_t *w, uint32_t (*next)(void)) {
    size_t bb = cpu_wtype_block_bytes(t), n = (size_t)rows * cols / (size_t)cpu_wtype_block_elems(t);
    int first = t == CPU_W_Q6_K ? 208 : 0, second = t == CPU_W_Q4_1 || t == CPU_W_Q5_1 || t == CPU_W_Q4_K || t == CPU_W_Q5_K;
    for (size_t b = 0; b < n; b++, w += bb) {
        for (size_t i = 0; i < bb; i++) w[i] = (uint8_t)next();
        for (int f = 0; f <= second; f++) {
            uint16_t h = (uint16_t)((5 + next() % 7) << 10 | (next() & 0x3FF));
            if (next() & 1) h |= 0x8000;
            w[first + 2 * f] = (uint8_t)h, w[first + 2 * f + 1] = (uint8_t)(h >> 8);
        }
    }
}

#endif
