/* bf16 <-> f32. bf16 is the top half of an IEEE f32: widening is exact,
 * narrowing rounds to nearest even as torch does. */
#ifndef POLAR_BF16_H
#define POLAR_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

static inline float bf16_to_f32(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16 f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return (bf16)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

/* IEEE half -> f32, exact (subnormals and inf/nan included). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3FFu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7F800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
