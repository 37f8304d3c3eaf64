/* Which CPU kernels run: the best level the CPU reports, chosen once, and
 * the cpu_* entry points of ops.h that call through it. */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

static const char *level_names[CPU_N_LEVELS] = {"generic", "avx2", "avx2vnni", "avx512", "avx512vnni", "neon"};

const char *cpu_level_name(cpu_level level) { return level >= 0 && level < CPU_N_LEVELS ? level_names[level] : "?"; }

const cpu_kernels *cpu_kernels_for(cpu_level level, const char **why) {
    const char *dummy;
    if (!why) why = &dummy;
    *why = "not built for this target";
    switch (level) {
    case CPU_GENERIC:
        return &cpu_kernels_generic;
#if defined(__x86_64__)
    case CPU_AVX2:
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx2")) return *why = "CPU lacks avx2", NULL;
        if (!__builtin_cpu_supports("fma")) return *why = "CPU lacks fma", NULL;
        if (!__builtin_cpu_supports("f16c")) return *why = "CPU lacks f16c", NULL;
        return &cpu_kernels_avx2;
    case CPU_AVX2VNNI:
        if (!cpu_kernels_for(CPU_AVX2, why)) return NULL;
        if (!__builtin_cpu_supports("avxvnni")) return *why = "CPU lacks avxvnni", NULL;
        return &cpu_kernels_avx2vnni;
    case CPU_AVX512:
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx512f")) return *why = "CPU lacks avx512f", NULL;
        if (!__builtin_cpu_supports("avx512bw")) return *why = "CPU lacks avx512bw", NULL;
        if (!__builtin_cpu_supports("avx512vl")) return *why = "CPU lacks avx512vl", NULL;
        if (!cpu_kernels_for(CPU_AVX2, why)) return NULL; /* its block dots and quantizer are AVX2's */
        return &cpu_kernels_avx512;
    case CPU_AVX512VNNI:
        if (!cpu_kernels_for(CPU_AVX512, why)) return NULL;
        if (!__builtin_cpu_supports("avx512vnni")) return *why = "CPU lacks avx512vnni", NULL;
        return &cpu_kernels_avx512vnni;
#endif
#if defined(__aarch64__)
    case CPU_NEON: /* baseline on aarch64 */
        return &cpu_kernels_neon;
#endif
    default:
        return NULL;
    }
}

/* Written once by pthread_once and only read afterwards: the one piece of
 * process-wide state, a fact about the CPU rather than about any model. */
static const cpu_kernels *active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *want = getenv("POLAR_CPU");
    if (want && !strcmp(want, "reference")) {
        active = &cpu_kernels_reference;
        return;
    }
    if (want && *want) {
        int level = -1;
        for (int l = 0; l < CPU_N_LEVELS; l++)
            if (!strcmp(want, level_names[l])) level = l;
        const char *why = "not a level (generic|avx2|avx2vnni|avx512|avx512vnni|neon|reference)";
        if (level >= 0 && (active = cpu_kernels_for((cpu_level)level, &why))) return;
        for (int l = CPU_N_LEVELS - 1; !active; l--) active = cpu_kernels_for((cpu_level)l, NULL);
        fprintf(stderr, "polar: POLAR_CPU=%s refused (%s); using %s kernels\n", want, why, active->name);
        return;
    }
    for (int l = CPU_N_LEVELS - 1; !active; l--) active = cpu_kernels_for((cpu_level)l, NULL);
}

const cpu_kernels *cpu_kernels_active(void) {
    pthread_once(&active_once, choose);
    return active;
}

cpu_wtype cpu_x16_active(cpu_wtype t) {
    const char *repack = getenv("POLAR_REPACK");
    if (repack && !strcmp(repack, "0")) return CPU_W_BF16;
    cpu_wtype x = cpu_x16_of(t);
    return x != CPU_W_BF16 && cpu_kernels_active()->rows_q[x] ? x : CPU_W_BF16;
}


/* Each thread gets one contiguous range of rows, a multiple of the level's
 * row block, so it streams its share of the weights front to back. */
void cpu_matmul_with(const cpu_kernels *k, float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows,
                     int cols, int accumulate, int n_threads) {
    int blocks = (rows + k->row_block - 1) / k->row_block;
    if (n_threads > blocks) n_threads = blocks;
    if (n_threads <= 1) {
        k->matmul_bf16(y, x, w, bias, T, rows, cols, accumulate, 0, rows);
        return;
    }
#pragma omp parallel num_threads(n_threads)
    {
        int n = omp_get_num_threads(), id = omp_get_thread_num();
        int r0 = (int)((long)blocks * id / n) * k->row_block, r1 = (int)((long)blocks * (id + 1) / n) * k->row_block;
        if (r1 > rows) r1 = rows;
        if (r0 < r1) k->matmul_bf16(y, x, w, bias, T, rows, cols, accumulate, r0, r1);
    }
}

void cpu_matmul(float *y, const float *x, const bf16 *w, const bf16 *bias, int T, int rows, int cols,
                int accumulate, int n_threads) {
    cpu_matmul_with(cpu_kernels_active(), y, x, w, bias, T, rows, cols, accumulate, n_threads);
}

void cpu_rmsnorm(float *out, const float *x, const bf16 *w, int n, float eps) {
    cpu_kernels_active()->rmsnorm(out, x, w, n, eps);
}

void cpu_rope(float *x, const float *cs, const float *sn, int n_heads, int head_dim) {
    cpu_kernels_active()->rope(x, cs, sn, n_heads, head_dim);
}

void cpu_attention_head(float *out, const float *q, const float *k_cache, const float *v_cache, const int *blocks, int pos, int h,
                        int n_heads, int n_kv, int hd, float *scores) {
    cpu_kernels_active()->attention_head(out, q, k_cache, v_cache, blocks, pos, h, n_heads, n_kv, hd, scores);
}

void cpu_attention_rows(float *out, const float *q, size_t q_stride, int n_q, const float *k_cache,
                        const float *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,
                        int hd, float *scores, size_t scores_stride) {
    cpu_kernels_active()->attention_rows(out, q, q_stride, n_q, k_cache, v_cache, blocks, pos, h0, n_h, n_heads, n_kv,
                                         hd, scores, scores_stride);
}

void cpu_attention_rows_bf16(float *out, const float *q, size_t q_stride, int n_q, const bf16 *k_cache,
                             const bf16 *v_cache, const int *blocks, int pos, int h0, int n_h, int n_heads, int n_kv,
                             int hd, float *scores, size_t scores_stride) {
    cpu_kernels_active()->attention_rows_bf16(out, q, q_stride, n_q, k_cache, v_cache, blocks, pos, h0, n_h, n_heads,
                                              n_kv, hd, scores, scores_stride);
}

void cpu_swiglu(float *g, const float *u, int n) { cpu_kernels_active()->swiglu(g, u, n); }
