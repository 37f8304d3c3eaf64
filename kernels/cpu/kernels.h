/* The CPU kernel table: one set of function pointers per instruction-set
 * level, each in its own translation unit compiled with that level's flags
 * (ops.c plain C, ops_avx2.c, ops_avx512.c, ops_neon.c). dispatch.c picks
 * one at start-up from what the CPU reports, and the cpu_* functions of
 * ops.h call through it, so callers never see the level.
 *
 * The plain C table is the oracle: every other level is tested against it.
 * Within one level a matmul output element is summed in the same order
 * whatever T, the row range or the thread split, so decode and prefill
 * agree bit for bit on every level. */
#ifndef POLAR_CPU_KERNELS_H
#define POLAR_CPU_KERNELS_H

#include "bf16.h"
#include "ops.h" /* the paged KV layout attention_head reads */
#include "quant.h"

/* avx2vnni is the avx2 level with its quantized dot products by AVX-VNNI's
 * 256-bit vpdpbusd (Intel client CPUs from Alder Lake, which lack AVX-512);
 * avx512vnni is the avx512 level with those of quant_avx512.c (512-bit
 * vpdpbusd); plain avx512 (Skylake-SP) keeps AVX2's. */
typedef enum { CPU_GENERIC, CPU_AVX2, CPU_AVX2VNNI, CPU_AVX512, CPU_AVX512VNNI, CPU_NEON, CPU_N_LEVELS } cpu_level;

typedef struct cpu_kernels {
    const char *name; /* as POLAR_CPU spells it */
    /* Rows r0..r1-1 of cpu_matmul's y for all T tokens, on the calling
     * thread (cpu_matmul splits rows among threads in row_block multiples).
     * Quantized weights (GGUF blocks kept in memory) go through dot_q. */
    void (*matmul_bf16)(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                        int accumulate, int r0, int r1);
    int row_block;
    void (*rmsnorm)(float *out, const float *x, const bf16 *w, int n, float eps);
    void (*rope)(float *x, const float *cs, const float *sn, int n_heads, int head_dim);
    void (*attention_head)(float *out, const float *q, const float *k_cache, const float *v_cache, const int *blocks, int pos, int h,
                           int n_heads, int n_kv, int hd, float *scores);
    /* n_q queries of one sequence at positions pos.., heads h0..h0+n_h-1,
     * each giving attention_head's bits (the plain C level: query by
     * query). */
    void (*attention_rows)(float *out, const float *q, size_t q_stride, int n_q, const float *k_cache,
                           const float *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,
                           int hd, float *scores, size_t scores_stride);
    /* attention_rows over a bf16 pool: the bits attention_rows gives over
     * f32 rows holding the same values (every level has it). */
    void (*attention_rows_bf16)(float *out, const float *q, size_t q_stride, int n_q, const bf16 *k_cache,
                                const bf16 *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads,
                                int n_kv, int hd, float *scores, size_t scores_stride);
    void (*swiglu)(float *g, const float *u, int n);
    /* Block dot products by cpu_wtype (quant.h); a level without its own
     * points at the plain C ones or at another level it implies. */
    const cpu_dot_q_fn *dot_q;
    const cpu_rows_q_fn *rows_q;
    /* Activations into int8 blocks for dot_q / rows_q: cpu_quantize_q8's
     * blocks exactly (quant.h). */
    void (*quantize_q8)(cpu_q8_block *out, const float *x, int n);
    /* The reference level (POLAR_CPU=reference, never chosen by itself):
     * quantized weights meet f32 activations, each block dequantized by
     * the format's definition and the products summed in double: the
     * exact math the other levels' int8 activations approximate (what
     * polar perplexity's KL divergence of a level is measured against). */
    int f32_activations;
} cpu_kernels;

/* The K/V rows a level reads are f32, or bf16 (a bf16 pool) when kv16:
 * a constant in every call, so each copy of a kernel reads one type, and
 * the widened bf16 values give the bits f32 rows holding them would. */
static inline __attribute__((always_inline)) const void *kv_elems(const void *rows, size_t i, int kv16) {
    return (const char *)rows + i * (kv16 ? sizeof(bf16) : sizeof(float));
}
static inline __attribute__((always_inline)) float kv_scalar(const void *rows, size_t i, int kv16) {
    return kv16 ? bf16_to_f32(((const bf16 *)rows)[i]) : ((const float *)rows)[i];
}

/* One table per level; only those built for the target exist. */
extern const cpu_kernels cpu_kernels_generic, cpu_kernels_reference;
#if defined(__x86_64__)
extern const cpu_kernels cpu_kernels_avx2, cpu_kernels_avx2vnni, cpu_kernels_avx512, cpu_kernels_avx512vnni;
#endif
#if defined(__aarch64__)
extern const cpu_kernels cpu_kernels_neon;
#endif

/* The table the cpu_* functions use: the best level this CPU runs, or the
 * one POLAR_CPU names (generic|avx2|avx2vnni|avx512|avx512vnni|neon) when the CPU
 * can run it, or reference. */
const cpu_kernels *cpu_kernels_active(void);

/* A level's name, as POLAR_CPU spells it. */
const char *cpu_level_name(cpu_level level);

/* The table of a level, or NULL with *why set ("not built for this target",
 * "CPU lacks avx512f") when this machine cannot run it. */
const cpu_kernels *cpu_kernels_for(cpu_level level, const char **why);

/* cpu_matmul through a given table (the tests compare levels with it). */
void cpu_matmul_with(const cpu_kernels *k, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows,
                     int cols, int accumulate, int n_threads);

/* cpu_matmul_q_multi through a given table. */
void cpu_matmul_q_multi_with(const cpu_kernels *k, const cpu_q_out *outs, int n_outs, const float *x, int T, int cols,
                             int accumulate, int n_threads, cpu_q8_block *xq);

#endif
