/* AVX2 block dot products for Q8_0, Q4_0, Q4_1 weights against int8
 * activation blocks (quant.h). Compiled with -mavx2 -mfma -mf16c; called
 * only on CPUs that report avx2 and fma. Each block's integer sum is exact
 * (as in quant.c); only the order of the f32 sum over blocks differs. */
#include <immintrin.h>

#include "quant.h"

#define INLINE static inline __attribute__((always_inline))

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float load_f16(const uint8_t *p) { return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8)); }

/* 8 int32 partial sums of 32 signed w times 32 signed x. maddubs wants an
 * unsigned operand: |w| against x with w's sign (|w| <= 128, |x| <= 127, so
 * a pair sum stays within int16). */
INLINE __m256i dot_i8(__m256i w, __m256i x) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* 16 bytes of nibbles -> 32 bytes 0..15 in element order (low nibbles are
 * elements 0..15, high nibbles 16..31). */
INLINE __m256i nibbles(const uint8_t *p) {
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

static float dot_q8_0(const void *w, const cpu_q8_block *x, int nb) {
    const uint8_t *b = w;
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < nb; k++, b += 34) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)(b + 2));
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[k].q);
        __m256 d = _mm256_set1_ps(load_f16(b) * x[k].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(wq, xq)), acc);
    }
    return hsum8(acc);
}

static float dot_q4_0(const void *w, const cpu_q8_block *x, int nb) {
    const uint8_t *b = w;
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < nb; k++, b += 18) {
        __m256i wq = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[k].q);
        __m256 d = _mm256_set1_ps(load_f16(b) * x[k].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(wq, xq)), acc);
    }
    return hsum8(acc);
}

static float dot_q4_1(const void *w, const cpu_q8_block *x, int nb) {
    const uint8_t *b = w;
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f; /* sum of m * xs */
    for (int k = 0; k < nb; k++, b += 20) {
        __m256i xq = _mm256_loadu_si256((const __m256i *)x[k].q);
        /* nibbles are unsigned: maddubs takes them as they are */
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles(b + 4), xq), _mm256_set1_epi16(1));
        __m256 d = _mm256_set1_ps(load_f16(b) * x[k].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
        off += load_f16(b + 2) * x[k].s;
    }
    return hsum8(acc) + off;
}

const cpu_dot_q_fn cpu_dot_q_avx2[CPU_W_N] = {NULL, dot_q8_0, dot_q4_0, dot_q4_1};
