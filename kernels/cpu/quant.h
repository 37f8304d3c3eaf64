/* GGUF block formats (ggml's layouts): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL (32 weights a block) and Q4_K, Q5_K, Q6_K, IQ4_XS (256) kept
 * quantized in memory, and the matmul that reads them; Q2_K and Q3_K only
 * dequantized at load.
 *
 * As ggml's vec_dot does for these types, the activations are quantized
 * per 32-block to int8 (cpu_q8_block) and each block's dot product is an
 * integer sum scaled by the two block scales; so a quantized matmul is not
 * the f32 matmul of the dequantized weights: each activation is off by at
 * most half its block's step (max|x| / 254). The plain C dot products
 * (quant.c) are the oracle; kernels.h's tables point at one per level. */
#ifndef POLAR_CPU_QUANT_H
#define POLAR_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"

/* How a weight matrix is stored; the values of the block types are not
 * ggml's (see loader/gguf.h for those). */
typedef enum {
    CPU_W_BF16 = 0, CPU_W_Q8_0, CPU_W_Q4_0, CPU_W_Q4_1, CPU_W_Q5_0, CPU_W_Q5_1, CPU_W_Q4_K, CPU_W_Q5_K, CPU_W_Q6_K,
    CPU_W_Q2_K, CPU_W_Q3_K, CPU_W_IQ4_NL, CPU_W_IQ4_XS,
    CPU_W_Q8_0_X16, CPU_W_Q4_0_X16, CPU_W_Q4_1_X16, CPU_W_Q4_K_X16, CPU_W_Q5_K_X16, CPU_W_Q6_K_X16, /* interleaved
                                                                                                        by 16 rows (below) */
    CPU_W_IQ4_NL_X16, CPU_W_IQ4_XS_X16, CPU_W_Q5_0_X16, CPU_W_Q5_1_X16,
    CPU_W_N
} cpu_wtype;

#define CPU_QK 32 /* activations per block; weights unpack 32 at a time */

/* One 32-block of activations: x[i] ~= d * q[i]; half_sum = the sums of
 * q[0..15] and q[16..31] (|sum| <= 2032), s = d * their sum (the offset
 * types' term needs s, the zero points of the interleaved types the exact
 * sums, per half for Q6_K's two scales). */
typedef struct {
    float d, s;
    int16_t half_sum[2];
    int8_t q[CPU_QK];
} cpu_q8_block;

/* Bytes and weights of one block of t (bf16: 2 and 1), bytes of a row of
 * cols weights (cols a multiple of the block), whether t stays quantized
 * (has dot products). */
size_t cpu_wtype_block_bytes(cpu_wtype t);
int cpu_wtype_block_elems(cpu_wtype t);
size_t cpu_wtype_row_bytes(cpu_wtype t, size_t cols);
int cpu_wtype_kept(cpu_wtype t);
const char *cpu_wtype_name(cpu_wtype t);

/* Facts of the kept block types as inline constants, for the SIMD levels'
 * per-block code (the switches fold at each call): bytes of one block (as
 * cpu_wtype_block_bytes), whether it is a 256-weight k-quant (IQ4_XS's
 * 256-blocks are laid out as one), whether its weights carry an offset
 * (w = a q + m: Q4_1, Q5_1, Q4_K, Q5_K), whether its unpacked weights are
 * signed bytes with no zero point (Q8_0's bytes, IQ4's levels). */
/* CPU_HOST_DEVICE: the facts below are also device functions where CUDA
 * code includes this header (kernels/cuda/blocks.cuh). */
#ifdef __CUDACC__
#define CPU_HOST_DEVICE __host__ __device__
#else
#define CPU_HOST_DEVICE
#endif
static inline CPU_HOST_DEVICE size_t cpu_kept_block_bytes(cpu_wtype t) {
    switch (t) {
    case CPU_W_Q8_0: return 34;
    case CPU_W_Q4_0:
    case CPU_W_IQ4_NL: return 18;
    case CPU_W_Q4_1: return 20;
    case CPU_W_Q5_0: return 22;
    case CPU_W_Q5_1: return 24;
    case CPU_W_Q4_K: return 144;
    case CPU_W_Q5_K: return 176;
    case CPU_W_IQ4_XS: return 136;
    default: return 210; /* Q6_K */
    }
}
static inline int cpu_kept_is_k(cpu_wtype t) {
    return t == CPU_W_Q4_K || t == CPU_W_Q5_K || t == CPU_W_Q6_K || t == CPU_W_IQ4_XS;
}
static inline int cpu_kept_has_offset(cpu_wtype t) {
    return t == CPU_W_Q4_1 || t == CPU_W_Q5_1 || t == CPU_W_Q4_K || t == CPU_W_Q5_K;
}
static inline int cpu_kept_signed_bytes(cpu_wtype t) {
    return t == CPU_W_Q8_0 || t == CPU_W_IQ4_NL || t == CPU_W_IQ4_XS;
}

/* IQ4_NL's and IQ4_XS's 16 non-uniform levels, which a 4-bit code picks
 * (every SIMD level looks them up as a table). */
static const int8_t cpu_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ4_XS: the 6-bit scale (minus 32) of sub-block j (0..7) of a 256-block. */
static inline int cpu_iq4xs_scale(const uint8_t *block, int j) {
    int low = (block[4 + j / 2] >> (4 * (j % 2))) & 0xF, high = ((block[2] | block[3] << 8) >> (2 * j)) & 3;
    return (low | high << 4) - 32;
}

/* The format's definition: weights 32k..32k+31 of a row of block type t
 * are w[i] = a[i / 16] * q[i] - m[i / 16]. */
void cpu_unpack32(cpu_wtype t, const void *row, int k, int8_t q[32], float a[2], float m[2]);

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) of a 256-block
 * from its 12 packed bytes (inline: every SIMD level unpacks with it). */
static inline void cpu_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63, *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* x[n] (n a multiple of 32) -> n/32 blocks: the plain C definition. Each
 * level's quantize_q8 (kernels.h) gives the same blocks bit for bit, so all
 * levels see the same integers. A block holding inf or NaN gets d = NaN. */
void cpu_quantize_q8(cpu_q8_block *out, const float *x, int n);
void cpu_quantize_q8_avx2(cpu_q8_block *out, const float *x, int n);

/* n weights (a multiple of the block) of a row of type t -> f32, by the
 * format's definition. bf16 rows are widened. Not for the x16 layouts,
 * whose rows are not contiguous (cpu_dequantize_matrix_row reads those). */
void cpu_dequantize_row(cpu_wtype t, const void *w, float *out, int n);

/* The dot product of the first 32 * nb weights of a row with nb activation
 * blocks. */
typedef float (*cpu_dot_q_fn)(const void *w, const cpu_q8_block *x, int nb);

/* The plain C dot product of any block type, straight from cpu_unpack32. */
float cpu_dot_q_plain(cpu_wtype t, const void *w, const cpu_q8_block *x, int nb);

/* Rows r0..r1-1 of y[T, rows] (+ bias, or added into y) for all T tokens
 * (T * nb activation blocks), on the calling thread; equal bit for bit to
 * the same level's dot product of each row (for the x16 layouts, which
 * have no dot products, to the same rows' outputs for any T; r0 must then
 * be a multiple of 16). The AVX-512 VNNI level's row-major tiles use up to
 * 44 KB of the calling thread's stack (rows unpacked once for all tokens). */
typedef void (*cpu_rows_q_fn)(float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,
                              int T, int rows, int nb, int accumulate, int r0, int r1);

/* Plain C dot products and row ranges, indexed by cpu_wtype (the bf16
 * entries are NULL), the AVX2 ones (x86-64 only; for CPUs with avx2 and
 * fma), the same by AVX-VNNI (avx2vnni: and avxvnni), the AVX-512 VNNI
 * ones (x86-64; avx512f/bw/vl and avx512vnni) and the NEON ones (aarch64,
 * baseline armv8.0-a). */
extern const cpu_dot_q_fn cpu_dot_q_generic[CPU_W_N];
extern const cpu_rows_q_fn cpu_rows_q_generic[CPU_W_N];
#if defined(__x86_64__)
extern const cpu_dot_q_fn cpu_dot_q_avx2[CPU_W_N];
extern const cpu_rows_q_fn cpu_rows_q_avx2[CPU_W_N];
extern const cpu_dot_q_fn cpu_dot_q_avx2vnni[CPU_W_N];
extern const cpu_rows_q_fn cpu_rows_q_avx2vnni[CPU_W_N];
extern const cpu_dot_q_fn cpu_dot_q_avx512vnni[CPU_W_N];
extern const cpu_rows_q_fn cpu_rows_q_avx512vnni[CPU_W_N];
#endif
#if defined(__aarch64__)
extern const cpu_dot_q_fn cpu_dot_q_neon[CPU_W_N];
extern const cpu_rows_q_fn cpu_rows_q_neon[CPU_W_N];
#endif


/* The interleaved ("x16") layouts of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K, IQ4_NL and IQ4_XS, which the AVX2 and AVX-512 levels
 * multiply 16 rows at a time (one row a 32-bit lane, so a block's products
 * need no horizontal sums). Rows go in groups of 16, the last padded with
 * zero blocks; in a group, unit u of its 16 rows lies together (a unit: a
 * 32-block, or a 256-block of the k-quants and IQ4_XS), at byte (g * units
 * + u) * 16 * unit_bytes. In a unit, vectors of sixteen 4-byte lanes, lane
 * r for row r:
 * - Q8_0: 8 vectors, lane r of vector j = row r's quants 4j..4j+3; then
 *   the 16 f16 scales.
 * - Q4_0 / Q4_1: 4 vectors of the 16 nibble bytes (low nibbles: weights
 *   4j..4j+3, high: 16+4j..16+4j+3); the 16 scales; (Q4_1) the 16 offsets.
 * - Q4_K: for each pair of 32-blocks, 8 vectors of its 32 qs bytes (low
 *   nibbles: the first block's weights 4j..4j+3, high: the second's); the
 *   16 d, the 16 dmin (f16); 3 vectors of the 12 packed scale bytes.
 * - Q5_K: as Q4_K, then 8 vectors of the 32 qh bytes (bit j of byte i: the
 *   fifth bit of weight i of block j).
 * - Q6_K: for each 32-block, 4 vectors of its low 4 bits as nibble bytes
 *   (as Q4_0) and 2 vectors of its high 2 bits (byte p of the lane, bits
 *   2q..2q+1: weight 16h + 4q + p of vector h); then 4 vectors of the 16
 *   int8 scales; the 16 d.
 * - Q5_0 / Q5_1: the 4 nibble vectors of Q4_0; 1 vector of the 16 qh
 *   words (bit i: the fifth bit of weight i); the 16 scales; (Q5_1) the 16
 *   offsets.
 * - IQ4_NL: as Q4_0 (codes in place of the nibbles).
 * - IQ4_XS: for each 32-block, 4 vectors of its 16 code bytes (as Q4_0);
 *   then the 16 d (f16), the 16 scales_h (uint16), 1 vector of the 16
 *   scales_l words (sub-block j's low scale bits: bits 4j..4j+3).
 * The blocks' own values, rearranged: cpu_wtype_row_bytes is the same. */
int cpu_wtype_is_x16(cpu_wtype t);
/* The x16 layout of a row-major type, or CPU_W_BF16 when it has none. */
cpu_wtype cpu_x16_of(cpu_wtype t);
/* The x16 layout of t when the active CPU kernels multiply it (the AVX2
 * and AVX-512 levels) and POLAR_REPACK is not 0, else CPU_W_BF16: what a
 * model loader repacks to. */
cpu_wtype cpu_x16_active(cpu_wtype t);
/* Bytes of a rows x cols matrix of x16 type x (its rows padded to 16). */
size_t cpu_x16_bytes(cpu_wtype x, int rows, size_t cols);
/* w (rows x cols of row-major type t, with an x16 layout) -> out
 * (cpu_x16_bytes of it). */
void cpu_repack_x16(cpu_wtype t, const void *w, int rows, size_t cols, void *out);

/* The row-major type of t: the type an x16 layout rearranges, t itself
 * otherwise. */
cpu_wtype cpu_row_type(cpu_wtype t);
/* Row r of a matrix of cols weights of type t (row-major or x16) as the
 * file lays it out: cpu_wtype_row_bytes(cpu_row_type(t), cols) bytes of
 * row-major blocks (bf16 values for bf16), into out. */
void cpu_matrix_row_blocks(cpu_wtype t, const void *w, size_t cols, int r, void *out);
/* Row r of a matrix of cols weights of type t (row-major or x16), as f32. */
void cpu_dequantize_matrix_row(cpu_wtype t, const void *w, size_t cols, int r, float *out);

/* out[hidden] = row `token` of a table of type t, dequantized. */
void cpu_embed_q(float *out, const void *table, cpu_wtype t, int token, int hidden);

/* One output of a matmul: y[T, rows] = x W^T (+ bias) with W rows x cols
 * of type t. */
typedef struct {
    float *y;
    const void *w;
    cpu_wtype t;
    const bf16 *bias;
    int rows;
} cpu_q_out;

/* Several matmuls of one input x[T, cols] (q/k/v, gate/up) in one pass
 * of the threads: x is quantized once and the outputs' rows are split
 * among the threads together. Outputs of bf16 weights go through
 * cpu_matmul unchanged. */
void cpu_matmul_q_multi(const cpu_q_out *outs, int n_outs, const float *x, int T, int cols, int accumulate,
                        int n_threads, cpu_q8_block *xq);

/* cpu_matmul over weights of type t: bf16 goes to cpu_matmul unchanged;
 * block types quantize x (T tokens) once into xq (T * cols/32 blocks the
 * caller provides) and split the rows among threads. */
void cpu_matmul_q(float *y, const float *x, const void *w, cpu_wtype t, const bf16 *bias, int T, int rows, int cols,
                  int accumulate, int n_threads, cpu_q8_block *xq);

#endif
