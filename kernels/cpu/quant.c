/* Quantized weights: block sizes, activation quantization, dequantization,
 * the plain C block dot products (the oracle) and the threaded matmul that
 * runs the active level's dot product over a row range. */
#include "quant.h"

#include <math.h>
#include <omp.h>

#include "kernels.h"
#include "ops.h"

void cpu_quantize_q8(cpu_q8_block *out, const float *x, int n) {
    for (int b = 0; b < n / CPU_QK; b++, x += CPU_QK) {
        float amax = 0.0f;
        for (int i = 0; i < CPU_QK; i++) amax = fmaxf(amax, fabsf(x[i]));
        int finite = 1;
        for (int i = 0; i < CPU_QK; i++) finite &= isfinite(x[i]) != 0; /* fmaxf drops NaN */
        cpu_q8_block *o = &out[b];
        if (!finite) { /* NaN out, as the f32 product would give; no float->int of NaN */
            o->d = o->s = NAN;
            o->half_sum[0] = o->half_sum[1] = 0;
            for (int i = 0; i < CPU_QK; i++) o->q[i] = 0;
            continue;
        }
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        if (id == INFINITY) id = 0.0f; /* amax under 127 / FLT_MAX: the block is 0 (every level alike) */
        int sum[2] = {0, 0};
        for (int i = 0; i < CPU_QK; i++) {
            int q = (int)lrintf(x[i] * id);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            o->q[i] = (int8_t)q;
            sum[i / 16] += q;
        }
        o->d = d;
        o->half_sum[0] = (int16_t)sum[0], o->half_sum[1] = (int16_t)sum[1];
        o->s = d * (float)(sum[0] + sum[1]);
    }
}

void cpu_embed_q(float *out, const void *table, cpu_wtype t, int token, int hidden) {
    if (t == CPU_W_BF16) {
        cpu_embed(out, table, token, hidden);
        return;
    }
    cpu_dequantize_matrix_row(t, table, (size_t)hidden, token, out);
}

/* ---------------------------------------------- plain C dot products */

#define PLAIN(name, type)                                                                                          \
    static float dot_##name(const void *w, const cpu_q8_block *x, int nb) { return cpu_dot_q_plain(type, w, x, nb); }
#define KEPT_TYPES(X) X(q8_0, CPU_W_Q8_0) X(q4_0, CPU_W_Q4_0) X(q4_1, CPU_W_Q4_1) X(q5_0, CPU_W_Q5_0) X(q5_1, CPU_W_Q5_1) \
    X(q4_k, CPU_W_Q4_K) X(q5_k, CPU_W_Q5_K) X(q6_k, CPU_W_Q6_K) X(iq4_nl, CPU_W_IQ4_NL) X(iq4_xs, CPU_W_IQ4_XS)
KEPT_TYPES(PLAIN)

const cpu_dot_q_fn cpu_dot_q_generic[CPU_W_N] = {
    [CPU_W_Q8_0] = dot_q8_0, [CPU_W_Q4_0] = dot_q4_0, [CPU_W_Q4_1] = dot_q4_1, [CPU_W_Q5_0] = dot_q5_0,
    [CPU_W_Q5_1] = dot_q5_1, [CPU_W_Q4_K] = dot_q4_k, [CPU_W_Q5_K] = dot_q5_k, [CPU_W_Q6_K] = dot_q6_k,
    [CPU_W_IQ4_NL] = dot_iq4_nl, [CPU_W_IQ4_XS] = dot_iq4_xs,
};

/* ------------------------------------------------------------- matmul */

/* Rows r0..r1-1 for all T tokens: each weight row is read once and dotted
 * with every token's blocks while it is in cache. */
static void rows_with(cpu_dot_q_fn dot, float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes,
                      const bf16 *bias, int T, int rows, int nb, int accumulate, int r0, int r1) {
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
        float b = bias ? bf16_to_f32(bias[r]) : 0.0f;
        for (int t = 0; t < T; t++) {
            float s = dot(wr, xq + (size_t)t * nb, nb);
            float *dst = &y[(size_t)t * rows + r];
            *dst = accumulate ? *dst + (s + b) : s + b;
        }
    }
}

#define GENERIC_ROWS(name, type)                                                                                       \
    static void rows_##name(float *y, const cpu_q8_block *xq, const void *w, size_t row_bytes, const bf16 *bias,  \
                            int T, int rows, int nb, int accumulate, int r0, int r1) {                             \
        rows_with(dot_##name, y, xq, w, row_bytes, bias, T, rows, nb, accumulate, r0, r1);                         \
    }
KEPT_TYPES(GENERIC_ROWS)
const cpu_rows_q_fn cpu_rows_q_generic[CPU_W_N] = {
    [CPU_W_Q8_0] = rows_q8_0, [CPU_W_Q4_0] = rows_q4_0, [CPU_W_Q4_1] = rows_q4_1, [CPU_W_Q5_0] = rows_q5_0,
    [CPU_W_Q5_1] = rows_q5_1, [CPU_W_Q4_K] = rows_q4_k, [CPU_W_Q5_K] = rows_q5_k, [CPU_W_Q6_K] = rows_q6_k,
    [CPU_W_IQ4_NL] = rows_iq4_nl, [CPU_W_IQ4_XS] = rows_iq4_xs,
};

/* Row blocks of 16 (whole cache lines of every row block per thread) of
 * the outputs one after another; a thread runs a contiguous range of them
 * (a chunk) at a time. */
static void run_blocks(const cpu_kernels *k, const cpu_q_out *outs, int n_outs, const cpu_q8_block *xq, int T, int cols,
                       int accumulate, long b0, long b1) {
    long base = 0;
    for (int i = 0; i < n_outs && base < b1; i++) {
        const cpu_q_out *o = &outs[i];
        long blocks = (o->rows + 15) / 16;
        long lo = b0 > base ? b0 - base : 0, hi = b1 - base < blocks ? b1 - base : blocks;
        if (lo < hi) {
            int r0 = (int)lo * 16, r1 = (int)hi * 16 < o->rows ? (int)hi * 16 : o->rows;
            k->rows_q[o->t](o->y, xq, o->w, cpu_wtype_row_bytes(o->t, (size_t)cols), o->bias, T, o->rows,
                            cols / CPU_QK, accumulate, r0, r1);
        }
        base += blocks;
    }
}

/* The reference level's rows: the weights dequantized as the format
 * defines them, CHUNK at a time for all T tokens, times the f32
 * activations, summed in double. */
static void rows_f32(const cpu_q_out *o, const float *x, int T, int cols, int accumulate, int r0, int r1) {
    enum { CHUNK = 1024, MAX_T = 64 };
    size_t row_bytes = cpu_wtype_row_bytes(o->t, (size_t)cols);
    float w[CHUNK];
    double sum[MAX_T];
    for (int r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)o->w + (size_t)r * row_bytes;
        for (int t0 = 0; t0 < T; t0 += MAX_T) {
            int nt = T - t0 < MAX_T ? T - t0 : MAX_T;
            for (int t = 0; t < nt; t++) sum[t] = 0;
            for (int c0 = 0; c0 < cols; c0 += CHUNK) {
                int n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
                for (int k = 0; k < n / CPU_QK; k++) {
                    int8_t q[32];
                    float a[2], m[2];
                    cpu_unpack32(o->t, wr, c0 / CPU_QK + k, q, a, m);
                    for (int i = 0; i < 32; i++) w[32 * k + i] = a[i / 16] * (float)q[i] - m[i / 16];
                }
                for (int t = 0; t < nt; t++) {
                    const float *xt = x + (size_t)(t0 + t) * cols + c0;
                    double s[8] = {0}; /* eight chains: a sum's latency, not its adds, would bound it */
                    for (int i = 0; i < n; i += 8)
                        for (int j = 0; j < 8; j++) s[j] += (double)w[i + j] * xt[i + j];
                    sum[t] += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
                }
            }
            for (int t = 0; t < nt; t++) {
                float v = (float)sum[t] + (o->bias ? bf16_to_f32(o->bias[r]) : 0.0f);
                float *dst = &o->y[(size_t)(t0 + t) * o->rows + r];
                *dst = accumulate ? *dst + v : v;
            }
        }
    }
}

static void matmul_f32_activations(const cpu_q_out *o, const float *x, int T, int cols, int accumulate, int n_threads) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int b = 0; b < (o->rows + 15) / 16; b++)
        rows_f32(o, x, T, cols, accumulate, 16 * b, 16 * b + 16 < o->rows ? 16 * b + 16 : o->rows);
}

void cpu_matmul_q_multi_with(const cpu_kernels *k, const cpu_q_out *outs, int n_outs, const float *x, int T, int cols,
                             int accumulate, int n_threads, cpu_q8_block *xq) {
    if (k->f32_activations) {
        for (int i = 0; i < n_outs; i++) {
            if (cpu_wtype_kept(outs[i].t)) matmul_f32_activations(&outs[i], x, T, cols, accumulate, n_threads);
            else cpu_matmul_with(k, outs[i].y, x, outs[i].w, outs[i].bias, T, outs[i].rows, cols, accumulate, n_threads);
        }
        return;
    }
    int quantized = 1;
    for (int i = 0; i < n_outs; i++) quantized &= cpu_wtype_kept(outs[i].t) || cpu_wtype_is_x16(outs[i].t);
    if (!quantized) { /* bf16 models keep their own matmul, bit for bit */
        for (int i = 0; i < n_outs; i++) {
            const cpu_q_out *o = &outs[i];
            if (o->t == CPU_W_BF16) cpu_matmul_with(k, o->y, x, o->w, o->bias, T, o->rows, cols, accumulate, n_threads);
            else cpu_matmul_q_multi_with(k, o, 1, x, T, cols, accumulate, n_threads, xq);
        }
        return;
    }
    int nb = cols / CPU_QK;
    long blocks = 0;
    for (int i = 0; i < n_outs; i++) blocks += (outs[i].rows + 15) / 16;
    if (n_threads > blocks) n_threads = (int)blocks;
    /* Several tokens' activations are quantized by the team (a barrier
     * after); one token's alone is quicker than the barrier. */
    int team_quantizes = n_threads > 1 && T > 1;
    if (!team_quantizes)
        for (int i = 0; i < T; i++) k->quantize_q8(xq + (size_t)i * nb, x + (size_t)i * cols, cols);
    if (n_threads <= 1) {
        run_blocks(k, outs, n_outs, xq, T, cols, accumulate, 0, blocks);
        return;
    }
    /* Chunks of about an eighth of a thread's share, taken in turn: on a
     * machine whose cores run at uneven speeds (a shared VM: 10% of a 3B
     * decode spent waiting at the end of each matmul with halves fixed in
     * advance) the faster thread takes more. A row's sums do not depend on
     * its thread, so the bits do not either. */
    long chunk = blocks / (8L * n_threads) > 8 ? blocks / (8L * n_threads) : 8, next = 0;
#pragma omp parallel num_threads(n_threads)
    {
        if (team_quantizes) {
#pragma omp for schedule(static)
            for (int i = 0; i < T; i++) k->quantize_q8(xq + (size_t)i * nb, x + (size_t)i * cols, cols);
        }
        for (;;) {
            long b0;
#pragma omp atomic capture
            {
                b0 = next;
                next += chunk;
            }
            if (b0 >= blocks) break;
            run_blocks(k, outs, n_outs, xq, T, cols, accumulate, b0, b0 + chunk < blocks ? b0 + chunk : blocks);
        }
    }
}

void cpu_matmul_q_multi(const cpu_q_out *outs, int n_outs, const float *x, int T, int cols, int accumulate,
                        int n_threads, cpu_q8_block *xq) {
    cpu_matmul_q_multi_with(cpu_kernels_active(), outs, n_outs, x, T, cols, accumulate, n_threads, xq);
}

void cpu_matmul_q(float *y, const float *x, const void *w, cpu_wtype t, const bf16 *bias, int T, int rows, int cols,
                  int accumulate, int n_threads, cpu_q8_block *xq) {
    cpu_q_out o = {y, w, t, bias, rows};
    cpu_matmul_q_multi(&o, 1, x, T, cols, accumulate, n_threads, xq);
}
