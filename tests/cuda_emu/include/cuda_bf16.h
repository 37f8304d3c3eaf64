// CUDA emulation: __nv_bfloat16 and the conversions the kernels use. The
// float -> bf16 conversion rounds to nearest even, as the device does
// (NaN stays NaN, made quiet).
#ifndef POLAR_CUDA_EMU_BF16_H
#define POLAR_CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    unsigned short __x;
};

static inline unsigned short emu_float_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{emu_float_to_bf16_bits(f)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }

#endif
