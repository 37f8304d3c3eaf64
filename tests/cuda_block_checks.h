/* test_cuda's checks of the block kernels (kernels/cuda/quant.cu): GGUF
 * blocks of every kept type, random bytes with realistic scales, multiplied
 * on the device against the f32 dot product of the rows the CPU dequantizes
 * by the formats' definition (cpu_dequantize_row, which equals gguf-py bit
 * for bit), at odd row counts, 1-11 and 64 tokens, alone, as q/k/v with the
 * norm on the fly and mixed types, as gate/up with SwiGLU; the bf16 rows of
 * the prefill GEMM's chunks and embedding rows. Planted mistakes in the
 * blocks (a swapped nibble, a dropped min, a wrong scale) must move the
 * outputs past the bound the kernels are held to. Included by test_cuda.c
 * after cuda_kernel_checks.h (to_dev, frand, from_dev). */
#ifndef POLAR_TEST_CUDA_BLOCK_CHECKS_H
#define POLAR_TEST_CUDA_BLOCK_CHECKS_H

#include "block_util.h"

static const cpu_wtype kept_types[] = {CPU_W_Q8_0, CPU_W_Q4_0, CPU_W_Q4_1,   CPU_W_Q5_0,  CPU_W_Q5_1,
                                       CPU_W_Q4_K, CPU_W_Q5_K, CPU_W_Q6_K, CPU_W_IQ4_NL, CPU_W_IQ4_XS};
#define N_KEPT (int)(sizeof kept_types / sizeof kept_types[0])

/* Relative bound of a block GEMV output to the f32 reference: of the sum of
 * |w x| over the row (f32 sums of products exact in f32, in another order). */
#define TOL_BLOCKS 2e-6

/* Whether the GEMVs multiply t by dp4a on quantized inputs, at cols a row (kernels/cuda/q8.cuh). */
static int gemv_q8(cpu_wtype t, int cols) { return t != CPU_W_BF16 && cols % 64 == 0; }

/* What such a GEMV multiplies: each row of x (times the norm weights nw
 * when given) quantized as cpu_quantize_q8 quantizes it and read back (times
 * 1/rms of the row when normed), T rows of cols. */
static float *q8_inputs(const float *x, const bf16 *nw, float eps, int T, int cols) {
    float *out = malloc((size_t)T * cols * sizeof *out), *row = malloc((size_t)cols * sizeof *row);
    cpu_q8_block *q = malloc((size_t)(cols / 32) * sizeof *q);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * cols;
        double ss = 0.0;
        for (int j = 0; j < cols; j++) row[j] = nw ? xt[j] * bf16_to_f32(nw[j]) : xt[j], ss += (double)xt[j] * xt[j];
        cpu_quantize_q8(q, row, cols);
        float inv = nw ? (float)(1.0 / sqrt(ss / cols + eps)) : 1.0f;
        for (int j = 0; j < cols; j++) out[(size_t)t * cols + j] = q[j / 32].d * (float)q[j / 32].q[j % 32] * inv;
    }
    free(row), free(q);
    return out;
}

static uint32_t block_rng = 0x9E3779B9u;
static uint32_t block_next(void) {
    block_rng ^= block_rng << 13;
    block_rng ^= block_rng >> 17;
    block_rng ^= block_rng << 5;
    return block_rng;
}

/* A rows x cols matrix of type t on the host (rand_block_rows) and its rows
 * dequantized, f[rows * cols]. */
typedef struct {
    cpu_wtype t;
    int rows, cols;
    size_t row_bytes;
    uint8_t *b;
    float *f;
} host_blocks;

static host_blocks make_blocks(cpu_wtype t, int rows, int cols) {
    host_blocks h = {t, rows, cols, cpu_wtype_row_bytes(t, (size_t)cols), NULL, NULL};
    h.b = malloc((size_t)rows * h.row_bytes);
    h.f = malloc((size_t)rows * cols * sizeof(float));
    rand_block_rows(t, rows, cols, h.b, block_next);
    for (int r = 0; r < rows; r++) cpu_dequantize_row(t, h.b + (size_t)r * h.row_bytes, h.f + (size_t)r * cols, cols);
    return h;
}

static void free_blocks(host_blocks *h) { free(h->b), free(h->f); }

static cuda_wmat dev_blocks(const host_blocks *h) {
    return (cuda_wmat){to_dev(h->b, (size_t)h->rows * h->row_bytes), (int)h->t, h->row_bytes, 0};
}

/* want[t, r] = f_r . x_t (+ bias), and scale[t, r] = sum |f_r x_t|, in double. */
static void blocks_reference(const host_blocks *h, const float *x, const bf16 *bias, int T, double *want, double *scale) {
    for (int t = 0; t < T; t++)
        for (int r = 0; r < h->rows; r++) {
            double s = bias ? bf16_to_f32(bias[r]) : 0.0, a = 0.0;
            for (int j = 0; j < h->cols; j++) {
                double p = (double)h->f[(size_t)r * h->cols + j] * x[(size_t)t * h->cols + j];
                s += p, a += fabs(p);
            }
            want[(size_t)t * h->rows + r] = s, scale[(size_t)t * h->rows + r] = a + 1e-30;
        }
}

/* The largest |got - want| / scale over T x rows outputs, got ld floats a row. */
static double blocks_error(const float *got, int ld, const double *want, const double *scale, int T, int rows) {
    double e = 0.0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < rows; r++) {
            double d = fabs((double)got[(size_t)t * ld + r] - want[(size_t)t * rows + r]) / scale[(size_t)t * rows + r];
            if (d != d) return INFINITY;
            if (d > e) e = d;
        }
    return e;
}

/* |got - silu(g) u| over its bound: g's and u's errors, each within tol of
 * its scale (sg, su: sum |w x|), carried through silu(g) u; 1 at the bound. */
static double swiglu_error(float got, double g, double u, double sg, double su, double tol) {
    double sv = g / (1.0 + exp(-g));
    return fabs(got - sv * u) / (tol * (fabs(sv) * su + fabs(u) * 1.1 * sg) + 1e-30);
}

/* y = x W^T + bias through cuda_matmul_blocks into a y of ld > rows
 * columns (the extra ones must stay as they were), then accumulated once
 * more; returns the larger error. */
static double blocks_matmul_error(const host_blocks *h, const cuda_wmat *w, const float *x, const bf16 *bias, int T) {
    int rows = h->rows, cols = h->cols, ld = rows + 3;
    double *want = malloc((size_t)T * rows * sizeof *want), *scale = malloc((size_t)T * rows * sizeof *scale);
    float *xq = gemv_q8(h->t, cols) && !w->f32_gemv ? q8_inputs(x, NULL, 0.0f, T, cols) : NULL;
    blocks_reference(h, xq ? xq : x, bias, T, want, scale);
    free(xq);
    float *y0 = malloc((size_t)T * ld * 4);
    for (size_t i = 0; i < (size_t)T * ld; i++) y0[i] = -7.0f;
    float *dy = to_dev(y0, (size_t)T * ld * 4), *dx = to_dev(x, (size_t)T * cols * 4);
    bf16 *db = bias ? to_dev(bias, (size_t)rows * 2) : NULL;
    cuda_matmul_blocks(dy, ld, dx, *w, db, T, rows, cols, 0, NULL);
    float *got = from_dev(dy, (size_t)T * ld);
    double e = blocks_error(got, ld, want, scale, T, rows);
    for (int t = 0; t < T; t++)
        for (int r = rows; r < ld; r++) CHECK(got[(size_t)t * ld + r] == -7.0f, "a column past the rows was written");
    cuda_matmul_blocks(dy, ld, dx, *w, db, T, rows, cols, 1, NULL); /* y += the same again: twice the reference */
    free(got);
    got = from_dev(dy, (size_t)T * ld);
    for (size_t i = 0; i < (size_t)T * rows; i++) want[i] *= 2, scale[i] *= 2;
    double e2 = blocks_error(got, ld, want, scale, T, rows);
    free(got), free(y0), free(want), free(scale);
    cudaFree(dy), cudaFree(dx), cudaFree(db);
    return e > e2 ? e : e2;
}

/* Every kept type at a row of 512 (both kinds of block) and, for the
 * 32-weight types, 96; 37 rows; tokens 1..11 (passes of 8 and a
 * remainder) and 64. */
static void kernel_blocks_matmul(void) {
    static const int tokens[] = {1, 2, 5, 8, 9, 11, 64};
    for (int i = 0; i < N_KEPT; i++) {
        cpu_wtype t = kept_types[i];
        for (int short_row = 0; short_row < 2; short_row++) {
            if (short_row && cpu_wtype_block_elems(t) == 256) continue;
            int rows = 37, cols = short_row ? 96 : 512;
            host_blocks h = make_blocks(t, rows, cols);
            cuda_wmat w = dev_blocks(&h);
            bf16 *bias = malloc((size_t)rows * 2);
            for (int r = 0; r < rows; r++) bias[r] = f32_to_bf16(frand());
            for (int k = 0; k < (quick ? 2 : 7); k++)
                for (int f32 = 0; f32 <= gemv_q8(t, cols); f32++) { /* the dp4a types also unpacked to f32 (f32_gemv) */
                    int T = tokens[quick ? 5 * k : k];
                    float *x = rand_floats((size_t)T * cols, 2.0f);
                    w.f32_gemv = f32;
                    double e = blocks_matmul_error(&h, &w, x, k % 2 ? bias : NULL, T);
                    CHECK(e < TOL_BLOCKS, "%s%s %dx%d T=%d: error %g of sum |w x| (bound %g)", cpu_wtype_name(t),
                          f32 ? " (f32_gemv)" : "", rows, cols, T, e, TOL_BLOCKS);
                    free(x);
                }
            free(bias), cudaFree((void *)w.p), free_blocks(&h);
        }
    }
}

/* A mistake planted in row 0's first block (its bytes changed on the
 * device only) must put the output past TOL_BLOCKS. */
static void planted(const host_blocks *h, const char *what, int byte, uint8_t (*change)(uint8_t)) {
    host_blocks bad = *h;
    bad.b = malloc((size_t)h->rows * h->row_bytes);
    memcpy(bad.b, h->b, (size_t)h->rows * h->row_bytes);
    bad.b[byte] = change(bad.b[byte]);
    cuda_wmat w = dev_blocks(&bad);
    float *x = rand_floats((size_t)h->cols, 2.0f);
    double e = blocks_matmul_error(h, &w, x, NULL, 1); /* against the unchanged blocks */
    CHECK(e > 10 * TOL_BLOCKS, "%s: %s went unnoticed (error %g)", cpu_wtype_name(h->t), what, e);
    free(x), free(bad.b), cudaFree((void *)w.p);
}

static uint8_t swap_nibbles(uint8_t b) { return (uint8_t)(b << 4 | b >> 4) == b ? (uint8_t)(b ^ 0x11) : (uint8_t)(b << 4 | b >> 4); }
static uint8_t zero_byte(uint8_t b) { return b ? 0 : 0x3C; }
static uint8_t next_scale(uint8_t b) { return (uint8_t)(b ^ 0x01); }
static uint8_t scale_off_16(uint8_t b) { return (uint8_t)(b ^ 0x10); } /* an int8 scale of up to 127: 1 may hide */

/* Row 0's first Q4_K block given d = dmin = 2^-6 (the bytes and the
 * dequantized row): random d and dmin may differ 64-fold, and a scale off
 * by one under a d 64 times smaller than dmin moves the row by less than
 * the bound, whatever the kernel does. */
static void k4_even_scales(host_blocks *h) {
    h->b[0] = 0x00, h->b[1] = 0x24, h->b[2] = 0x00, h->b[3] = 0x24; /* f16 0x2400 = 2^-6, little-endian */
    cpu_dequantize_row(h->t, h->b, h->f, h->cols);
}

static void kernel_blocks_planted(void) {
    block_rng = 0x2545F491u, rng = 0x9E3779B97F4A7C15ull; /* the same blocks and inputs whatever ran before */
    host_blocks q4k = make_blocks(CPU_W_Q4_K, 5, 256), q6k = make_blocks(CPU_W_Q6_K, 5, 256);
    k4_even_scales(&q4k);
    host_blocks q41 = make_blocks(CPU_W_Q4_1, 5, 64);
    planted(&q4k, "a swapped nibble pair", 16 + 3, swap_nibbles);
    planted(&q4k, "a dropped min (dmin's high byte)", 3, zero_byte);
    planted(&q4k, "a wrong 6-bit scale", 4 + 1, next_scale);
    planted(&q6k, "a wrong int8 scale", 192 + 9, scale_off_16);
    planted(&q41, "a dropped offset (m's high byte)", 3, zero_byte);
    host_blocks xs = make_blocks(CPU_W_IQ4_XS, 5, 256), nl = make_blocks(CPU_W_IQ4_NL, 5, 64);
    planted(&xs, "a wrong scale's high bits", 2, next_scale);
    planted(&xs, "a wrong scale's low nibble", 4, next_scale);
    planted(&xs, "a swapped code pair", 8 + 5, swap_nibbles);
    planted(&nl, "a swapped code pair", 2 + 7, swap_nibbles);
    free_blocks(&q4k), free_blocks(&q6k), free_blocks(&q41), free_blocks(&xs), free_blocks(&nl);
}

/* q/k/v of three types (with biases, the norm on the fly or not) and
 * gate/up with SwiGLU (Q5_K with IQ4_XS, then Q4_K with Q5_K), against the
 * reference of the normed x quantized as the dp4a GEMVs take it
 * (q8_inputs). */
static void kernel_blocks_fused(void) {
    const float eps = 1e-5f;
    const int cols = 512, qr = 70, kr = 21, F = 45;
    host_blocks w[3] = {make_blocks(CPU_W_Q4_K, qr, cols), make_blocks(CPU_W_Q8_0, kr, cols),
                        make_blocks(CPU_W_Q6_K, kr, cols)};
    host_blocks gate = make_blocks(CPU_W_Q5_K, F, cols), up = make_blocks(CPU_W_IQ4_XS, F, cols);
    cuda_wmat dw[3] = {dev_blocks(&w[0]), dev_blocks(&w[1]), dev_blocks(&w[2])};
    cuda_wmat dg = dev_blocks(&gate), du = dev_blocks(&up);
    bf16 *b[3], *nw = malloc((size_t)cols * 2), *db[3];
    for (int i = 0; i < 3; i++) {
        b[i] = malloc((size_t)w[i].rows * 2);
        for (int r = 0; r < w[i].rows; r++) b[i][r] = f32_to_bf16(frand());
        db[i] = to_dev(b[i], (size_t)w[i].rows * 2);
    }
    for (int i = 0; i < cols; i++) nw[i] = f32_to_bf16(1 + 0.2f * frand());
    bf16 *dnw = to_dev(nw, (size_t)cols * 2);
    for (int T = 1; T <= 11; T += (quick ? 10 : 2)) {
        for (int normed = 0; normed < 2; normed++) {
            float *x = rand_floats((size_t)T * cols, 3), *xn = malloc((size_t)T * cols * 4);
            for (int t = 0; t < T; t++)
                if (normed) cpu_rmsnorm(xn + (size_t)t * cols, x + (size_t)t * cols, nw, cols, eps);
                else memcpy(xn + (size_t)t * cols, x + (size_t)t * cols, (size_t)cols * 4);
            float *dx = to_dev(x, (size_t)T * cols * 4), *dy[3];
            for (int i = 0; i < 3; i++) dy[i] = dev_floats((size_t)T * w[i].rows);
            cuda_matmul_qkv_blocks(dy[0], dy[1], dy[2], dx, dw[0], dw[1], dw[2], db[0], db[1], db[2],
                                   normed ? dnw : NULL, eps, T, qr, kr, cols, NULL);
            for (int i = 0; i < 3; i++) {
                double *want = malloc((size_t)T * w[i].rows * 8), *scale = malloc((size_t)T * w[i].rows * 8);
                float *xq = gemv_q8(w[i].t, cols) ? q8_inputs(x, normed ? nw : NULL, eps, T, cols) : NULL;
                blocks_reference(&w[i], xq ? xq : xn, b[i], T, want, scale);
                free(xq);
                float *got = from_dev(dy[i], (size_t)T * w[i].rows);
                /* the norm in another order: 1e-5 of the row's scale */
                double e = blocks_error(got, w[i].rows, want, scale, T, w[i].rows);
                CHECK(e < (normed ? 1e-5 : TOL_BLOCKS), "qkv part %d (%s) T=%d normed %d: error %g", i,
                      cpu_wtype_name(w[i].t), T, normed, e);
                free(want), free(scale), free(got), cudaFree(dy[i]);
            }
            for (int pair = 0; pair < 2; pair++) { /* q5_k with iq4_xs, q4_k with q5_k */
                const host_blocks *hg = pair ? &w[0] : &gate, *hu = pair ? &gate : &up;
                if (pair && hg->rows < F) break;
                double *g = malloc((size_t)T * F * 8), *u = malloc((size_t)T * F * 8),
                       *sg = malloc((size_t)T * F * 8), *su = malloc((size_t)T * F * 8);
                float *xq = gemv_q8(hg->t, cols) && gemv_q8(hu->t, cols) ? q8_inputs(x, normed ? nw : NULL, eps, T, cols)
                                                                         : NULL;
                host_blocks hg_f = *hg, hu_f = *hu; /* their first F rows */
                hg_f.rows = hu_f.rows = F;
                blocks_reference(&hg_f, xq ? xq : xn, NULL, T, g, sg);
                blocks_reference(&hu_f, xq ? xq : xn, NULL, T, u, su);
                free(xq);
                float *dact = dev_floats((size_t)T * F);
                cuda_matmul_swiglu_blocks(dact, dx, normed ? dnw : NULL, eps, pair ? dw[0] : dg, pair ? dg : du, T, F,
                                          cols, NULL);
                float *got = from_dev(dact, (size_t)T * F);
                double worst = 0.0;
                for (int i = 0; i < T * F; i++) { /* silu(g) u: its error from g's and u's, each within its scale */
                    double e = swiglu_error(got[i], g[i], u[i], sg[i], su[i], 1e-5);
                    if (!(e <= worst)) worst = e;
                }
                CHECK(worst <= 1.0, "gate/up (%s, %s) swiglu T=%d normed %d: %g of the bound", cpu_wtype_name(hg->t),
                      cpu_wtype_name(hu->t), T, normed, worst);
                free(g), free(u), free(sg), free(su), free(got), cudaFree(dact);
            }
            free(x), free(xn), cudaFree(dx);
        }
    }
    for (int i = 0; i < 3; i++) free(b[i]), cudaFree(db[i]), cudaFree((void *)dw[i].p), free_blocks(&w[i]);
    free(nw), cudaFree(dnw), cudaFree((void *)dg.p), cudaFree((void *)du.p), free_blocks(&gate), free_blocks(&up);
}

/* y of cuda_matmul_blocks for T tokens through queue q (NULL: the default
 * launch), as floats on the host. */
static float *blocks_matmul_on(const cuda_wmat *w, const float *dx, int T, int rows, int cols, const cuda_queue *q) {
    float *dy = dev_floats((size_t)T * rows);
    cuda_matmul_blocks(dy, rows, dx, *w, NULL, T, rows, cols, 0, q);
    float *got = from_dev(dy, (size_t)T * rows);
    cudaFree(dy);
    return got;
}

/* Row staging (POLAR_CUDA_BLOCKS_STAGE=1: each warp's rows copied into
 * shared memory by cp.async before the block quantizes its inputs) gives
 * the bits of the rows read from global memory: every kept type, alone
 * (dp4a and f32 unpacking), rows moved in 4-, 8- and 16-byte pieces, long
 * rows on fewer warps a block, rows of no 4-byte multiple left unstaged; as
 * q/k/v of three types with the norm and gate/up with SwiGLU. The
 * emulation lands a copy only when its thread waits, so a read before the
 * wait or across lanes without the warp barrier gives other bits. */
static void kernel_blocks_staged(void) {
    const cuda_queue staged = {.stage_rows = 1};
    static const int tokens[] = {1, 3, 9};
    for (int i = 0; i < N_KEPT; i++) {
        cpu_wtype t = kept_types[i];
        int k256 = cpu_wtype_block_elems(t) == 256;
        const int widths[] = {k256 ? 512 : 96, k256 ? 1024 : 64, quick ? 0 : 8192};
        for (int c = 0; c < 3 && widths[c]; c++) {
            int rows = 21, cols = widths[c];
            host_blocks h = make_blocks(t, rows, cols);
            cuda_wmat w = dev_blocks(&h);
            for (int k = 0; k < 3; k++) {
                int T = tokens[k], warps = cuda_blocks_staged_warps(&w, 1, 1, T, cols, &staged);
                CHECK(cuda_blocks_staged_warps(&w, 1, 1, T, cols, NULL) == 0, "staged without the queue asking");
                CHECK((warps > 0) == (h.row_bytes % 4 == 0), "%s rows of %zu bytes: %d warps staged", cpu_wtype_name(t),
                      h.row_bytes, warps);
                if (cols == 8192 && t == CPU_W_Q6_K) CHECK(warps > 1 && warps < 8, "Q6_K 8192: %d warps", warps);
                float *x = rand_floats((size_t)T * cols, 2.0f), *dx = to_dev(x, (size_t)T * cols * 4);
                for (int f32 = 0; f32 < 2; f32++) {
                    w.f32_gemv = f32;
                    float *want = blocks_matmul_on(&w, dx, T, rows, cols, NULL);
                    float *got = blocks_matmul_on(&w, dx, T, rows, cols, &staged);
                    CHECK(!memcmp(want, got, (size_t)T * rows * 4), "%s %dx%d T=%d%s: staged rows gave other bits",
                          cpu_wtype_name(t), rows, cols, T, f32 ? " (f32_gemv)" : "");
                    free(want), free(got);
                }
                free(x), cudaFree(dx);
            }
            cudaFree((void *)w.p), free_blocks(&h);
        }
    }
    /* q/k/v (Q4_K, Q6_K, Q8_0: 288, 420, 544 bytes a row, 4-byte pieces) and gate/up (Q4_K, Q6_K) */
    const float eps = 1e-5f;
    const int cols = 512, qr = 40, kr = 13;
    host_blocks hw[3] = {make_blocks(CPU_W_Q4_K, qr, cols), make_blocks(CPU_W_Q6_K, kr, cols),
                         make_blocks(CPU_W_Q8_0, kr, cols)};
    cuda_wmat dw[3] = {dev_blocks(&hw[0]), dev_blocks(&hw[1]), dev_blocks(&hw[2])};
    CHECK(cuda_blocks_staged_warps(dw, 3, 1, 1, cols, &staged) == 8, "q/k/v not staged on 8 warps");
    CHECK(cuda_blocks_staged_warps(dw, 2, 2, 1, cols, &staged) == 8, "gate/up not staged on 8 warps");
    bf16 *nw = malloc((size_t)cols * 2);
    for (int i = 0; i < cols; i++) nw[i] = f32_to_bf16(1 + 0.2f * frand());
    bf16 *dnw = to_dev(nw, (size_t)cols * 2);
    for (int k = 0; k < 3; k++) {
        int T = tokens[k];
        float *x = rand_floats((size_t)T * cols, 3), *dx = to_dev(x, (size_t)T * cols * 4);
        float *out[2][4];
        for (int s = 0; s < 2; s++) {
            const cuda_queue *q = s ? &staged : NULL;
            float *dy[4];
            for (int i = 0; i < 3; i++) dy[i] = dev_floats((size_t)T * hw[i].rows);
            dy[3] = dev_floats((size_t)T * kr);
            cuda_matmul_qkv_blocks(dy[0], dy[1], dy[2], dx, dw[0], dw[1], dw[2], NULL, NULL, NULL, dnw, eps, T, qr, kr,
                                   cols, q);
            cuda_matmul_swiglu_blocks(dy[3], dx, dnw, eps, dw[0], dw[1], T, kr, cols, q);
            for (int i = 0; i < 4; i++) out[s][i] = from_dev(dy[i], (size_t)T * (i ? kr : qr)), cudaFree(dy[i]);
        }
        for (int i = 0; i < 4; i++) {
            CHECK(!memcmp(out[0][i], out[1][i], (size_t)T * (i ? kr : qr) * 4), "%s T=%d: staged rows gave other bits",
                  i < 3 ? "q/k/v" : "gate/up", T);
            free(out[0][i]), free(out[1][i]);
        }
        free(x), cudaFree(dx);
    }
    for (int i = 0; i < 3; i++) cudaFree((void *)dw[i].p), free_blocks(&hw[i]);
    free(nw), cudaFree(dnw);
}

/* Rows dequantized for the prefill GEMM (a slice from row 3) are the CPU's
 * f32 values rounded to bf16; embedding rows are the f32 values, also of
 * ids a greedy step fed back (from). */
static void kernel_blocks_rows(void) {
    for (int i = 0; i < N_KEPT; i++) {
        cpu_wtype t = kept_types[i];
        int rows = 19, cols = 512, r0 = 3, n = 11;
        host_blocks h = make_blocks(t, rows, cols);
        cuda_wmat w = dev_blocks(&h);
        bf16 *dout = NULL;
        cudaMalloc((void **)&dout, (size_t)n * cols * 2);
        cuda_dequantize_rows(dout, w, r0, n, cols, NULL);
        bf16 *got = malloc((size_t)n * cols * 2);
        cudaMemcpy(got, dout, (size_t)n * cols * 2, cudaMemcpyDeviceToHost);
        float top = 0.0f; /* an FMA in a q - m rounds once less: a difference of ~1e-7 of the terms */
        for (size_t j = 0; j < (size_t)rows * cols; j++) top = fmaxf(top, fabsf(h.f[j]));
        int off = 0;
        for (size_t j = 0; j < (size_t)n * cols; j++) {
            float want = h.f[(size_t)r0 * cols + j];
            off += got[j] != f32_to_bf16(want) && fabsf(bf16_to_f32(got[j]) - want) > fabsf(want) / 128 + 1e-6f * top;
        }
        CHECK(off == 0, "%s: %d dequantized bf16 weights off by more than a rounding", cpu_wtype_name(t), off);
        int tokens[4] = {7, 0, 18, 7}, ids[2] = {5, 11}, from[4] = {-1, 1, -1, 0};
        int *dt = to_dev(tokens, sizeof tokens), *di = to_dev(ids, sizeof ids), *df = to_dev(from, sizeof from);
        float *dx = dev_floats((size_t)4 * cols);
        cuda_embed_blocks(dx, w, dt, di, df, 4, cols, NULL);
        float *x = from_dev(dx, (size_t)4 * cols);
        int want_rows[4] = {7, 11, 18, 5};
        double e = 0.0;
        for (int k = 0; k < 4; k++)
            for (int j = 0; j < cols; j++) {
                float want = h.f[(size_t)want_rows[k] * cols + j];
                double d = fabs((double)x[(size_t)k * cols + j] - want) / (top + 1e-30);
                if (!(d <= e)) e = d;
            }
        CHECK(e <= 1e-6, "%s: embedding rows off by %g of the largest weight", cpu_wtype_name(t), e);
        free(got), free(x), cudaFree(dout), cudaFree(dt), cudaFree(di), cudaFree(df), cudaFree(dx);
        cudaFree((void *)w.p), free_blocks(&h);
    }
}

/* h's rows rounded to bf16, as the tensor-core GEMMs multiply them. */
static host_blocks bf16_rounded(const host_blocks *h) {
    host_blocks r = *h;
    r.f = malloc((size_t)h->rows * h->cols * sizeof(float));
    for (size_t i = 0; i < (size_t)h->rows * h->cols; i++) r.f[i] = bf16_to_f32(f32_to_bf16(h->f[i]));
    return r;
}

/* T rows of cols rounded to bf16: the values (xr) and their bits on the device. */
static bf16 *bf16_inputs(const float *x, int T, int cols, float *xr) {
    bf16 *b = malloc((size_t)T * cols * 2);
    for (size_t i = 0; i < (size_t)T * cols; i++) b[i] = f32_to_bf16(x[i]), xr[i] = bf16_to_f32(b[i]);
    bf16 *d = to_dev(b, (size_t)T * cols * 2);
    free(b);
    return d;
}

/* Expert e's rows of a stack of experts of `rows` rows each. */
static host_blocks expert_rows(const host_blocks *h, int e, int rows) {
    host_blocks v = *h;
    v.rows = rows, v.b += (size_t)e * rows * h->row_bytes, v.f += (size_t)e * rows * h->cols;
    return v;
}

/* The experts' tensor-core path (cuda_expert_gemm_blocks: a prefill's):
 * gate/up with SwiGLU on x rounded to bf16, then down on the activations
 * rounded to bf16, against the bf16-rounded weights, within 1e-5. */
static void experts_gemm(const host_blocks *gate, const host_blocks *up, const host_blocks *down, cuda_wmat dg,
                         cuda_wmat du, cuda_wmat dd, const float *x, const int *idx, const int *dgroups, int T, int k,
                         int E, int H, int F) {
    const double tol = 1e-5;
    int S = T * k;
    cuda_wmat none = {0};
    host_blocks gr = bf16_rounded(gate), ur = bf16_rounded(up), dr = bf16_rounded(down);
    float *xr = malloc((size_t)T * H * 4), *dact = dev_floats((size_t)S * F), *dy = dev_floats((size_t)S * H);
    bf16 *dxb = bf16_inputs(x, T, H, xr);
    cuda_expert_gemm_blocks(dact, dxb, dg, du, dgroups, T, k, E, F, H, 0, NULL);
    float *act = from_dev(dact, (size_t)S * F), *ar = malloc((size_t)S * F * 4);
    bf16 *dab = bf16_inputs(act, S, F, ar);
    cuda_expert_gemm_blocks(dy, dab, dd, none, dgroups, T, k, E, H, F, 1, NULL);
    float *y = from_dev(dy, (size_t)S * H);
    double *g = malloc((size_t)F * 8), *u = malloc((size_t)F * 8), *sg = malloc((size_t)F * 8),
           *su = malloc((size_t)F * 8), *yw = malloc((size_t)H * 8), *ys = malloc((size_t)H * 8);
    double worst = 0.0, worst_down = 0.0;
    for (int s = 0; s < S; s++) {
        host_blocks ge = expert_rows(&gr, idx[s], F), ue = expert_rows(&ur, idx[s], F), de = expert_rows(&dr, idx[s], H);
        blocks_reference(&ge, xr + (size_t)(s / k) * H, NULL, 1, g, sg);
        blocks_reference(&ue, xr + (size_t)(s / k) * H, NULL, 1, u, su);
        for (int i = 0; i < F; i++) {
            double err = swiglu_error(act[(size_t)s * F + i], g[i], u[i], sg[i], su[i], tol);
            if (!(err <= worst)) worst = err;
        }
        blocks_reference(&de, ar + (size_t)s * F, NULL, 1, yw, ys);
        double ed = blocks_error(y + (size_t)s * H, H, yw, ys, 1, H);
        if (!(ed <= worst_down)) worst_down = ed;
    }
    CHECK(worst <= 1.0 && worst_down < tol, "expert GEMM %s/%s/%s T=%d: gate/up %g of the bound, down %g",
          cpu_wtype_name(gate->t), cpu_wtype_name(up->t), cpu_wtype_name(down->t), T, worst, worst_down);
    free(gr.f), free(ur.f), free(dr.f), free(xr), free(act), free(ar), free(y), free(g), free(u), free(sg), free(su),
        free(yw), free(ys);
    cudaFree(dact), cudaFree(dy), cudaFree(dxb), cudaFree(dab);
}

/* Routed experts kept as blocks (cuda_expert_matmul_blocks): gate/up with
 * SwiGLU, then down over each slot's activations, for T tokens routed to k
 * of E experts each (cuda_moe_group's grouping, passes of up to 8 slots of
 * an expert), against the reference on each slot's expert rows: dp4a
 * types at columns of a multiple of 64 (Q4_K gate, IQ4_XS up, Q6_K down),
 * the f32 unpacking at 96 and 160 (Q5_1, Q4_0, Q8_0); from 5 tokens the
 * tensor-core path too (experts_gemm). */
static void kernel_blocks_experts(void) {
    static const struct {
        cpu_wtype g, u, d;
        int H, F;
    } cases[] = {{CPU_W_Q4_K, CPU_W_IQ4_XS, CPU_W_Q6_K, 256, 256}, {CPU_W_Q5_1, CPU_W_Q4_0, CPU_W_Q8_0, 96, 160}};
    static const int tokens[] = {1, 5, 19};
    const int E = 6, k = 2;
    for (int c = 0; c < 2; c++) {
        int H = cases[c].H, F = cases[c].F;
        host_blocks gate = make_blocks(cases[c].g, E * F, H), up = make_blocks(cases[c].u, E * F, H),
                    down = make_blocks(cases[c].d, E * H, F);
        cuda_wmat dg = dev_blocks(&gate), du = dev_blocks(&up), dd = dev_blocks(&down), none = {0};
        for (int ti = 0; ti < (quick ? 2 : 3); ti++) {
            int T = tokens[ti], S = T * k;
            int *idx = malloc((size_t)S * sizeof *idx), *didx = NULL, *dgroups = NULL;
            for (int t = 0; t < T; t++) { /* k distinct experts, ascending */
                int a = (int)(block_next() % E), b = (a + 1 + (int)(block_next() % (E - 1))) % E;
                idx[t * k] = a < b ? a : b, idx[t * k + 1] = a < b ? b : a;
            }
            cudaMalloc((void **)&didx, (size_t)S * sizeof(int));
            cudaMalloc((void **)&dgroups, cuda_moe_group_ints(T, k, E) * sizeof(int));
            cudaMemcpy(didx, idx, (size_t)S * sizeof(int), cudaMemcpyHostToDevice);
            float *x = rand_floats((size_t)T * H, 2.0f), *dx = to_dev(x, (size_t)T * H * 4);
            float *dact = dev_floats((size_t)S * F), *dy = dev_floats((size_t)S * H);
            cuda_moe_group(dgroups, didx, T, k, 0, E, NULL);
            cuda_expert_matmul_blocks(dact, dx, dg, du, dgroups, T, k, E, F, H, 0, NULL);
            cuda_expert_matmul_blocks(dy, dact, dd, none, dgroups, T, k, E, H, F, 1, NULL);
            float *act = from_dev(dact, (size_t)S * F), *y = from_dev(dy, (size_t)S * H);
            float *xq = gemv_q8(gate.t, H) && gemv_q8(up.t, H) ? q8_inputs(x, NULL, 0.0f, T, H) : NULL;
            float *aq = gemv_q8(down.t, F) ? q8_inputs(act, NULL, 0.0f, S, F) : NULL;
            double *g = malloc((size_t)F * 8), *u = malloc((size_t)F * 8), *sg = malloc((size_t)F * 8),
                   *su = malloc((size_t)F * 8), *yw = malloc((size_t)H * 8), *ys = malloc((size_t)H * 8);
            double worst = 0.0, worst_down = 0.0;
            for (int s = 0; s < S; s++) {
                int e = idx[s];
                host_blocks ge = expert_rows(&gate, e, F), ue = expert_rows(&up, e, F), de = expert_rows(&down, e, H);
                const float *xt = (xq ? xq : x) + (size_t)(s / k) * H;
                blocks_reference(&ge, xt, NULL, 1, g, sg);
                blocks_reference(&ue, xt, NULL, 1, u, su);
                for (int i = 0; i < F; i++) {
                    double err = swiglu_error(act[(size_t)s * F + i], g[i], u[i], sg[i], su[i], 1e-5);
                    if (!(err <= worst)) worst = err;
                }
                blocks_reference(&de, (aq ? aq : act) + (size_t)s * F, NULL, 1, yw, ys);
                double ed = blocks_error(y + (size_t)s * H, H, yw, ys, 1, H);
                if (!(ed <= worst_down)) worst_down = ed;
            }
            CHECK(worst <= 1.0 && worst_down < TOL_BLOCKS, "experts %s/%s/%s T=%d: gate/up %g of the bound, down %g",
                  cpu_wtype_name(gate.t), cpu_wtype_name(up.t), cpu_wtype_name(down.t), T, worst, worst_down);
            if (T > 1) experts_gemm(&gate, &up, &down, dg, du, dd, x, idx, dgroups, T, k, E, H, F);
            free(idx), free(x), free(act), free(y), free(xq), free(aq), free(g), free(u), free(sg), free(su), free(yw),
                free(ys);
            cudaFree(didx), cudaFree(dgroups), cudaFree(dx), cudaFree(dact), cudaFree(dy);
        }
        cudaFree((void *)dg.p), cudaFree((void *)du.p), cudaFree((void *)dd.p);
        free_blocks(&gate), free_blocks(&up), free_blocks(&down);
    }
}

/* The prefill GEMM over blocks (cuda_gemm_blocks: blocks unpacked to bf16
 * into the tensor cores' tiles) against the f64 dot of the bf16-rounded
 * weights and inputs, within 1e-5 of sum |w x| (f32 sums): T a whole tile
 * and not, odd rows, a last tile of 32 columns (96, 160), a bias, an output
 * wider than the rows, accumulated once more; and gate/up with SwiGLU. */
static void kernel_blocks_gemm(void) {
    static const struct {
        cpu_wtype t;
        int rows, cols;
    } cases[] = {{CPU_W_Q4_K, 70, 512}, {CPU_W_Q6_K, 37, 256}, {CPU_W_Q8_0, 37, 96}, {CPU_W_IQ4_NL, 45, 160},
                 {CPU_W_IQ4_XS, 130, 256}, {CPU_W_Q5_1, 16, 64}};
    static const int tokens[] = {3, 33, 70};
    const double tol = 1e-5;
    cuda_wmat none = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int rows = cases[c].rows, cols = cases[c].cols, ld = rows + 3;
        host_blocks h = make_blocks(cases[c].t, rows, cols), hr = bf16_rounded(&h);
        cuda_wmat w = dev_blocks(&h);
        bf16 *bias = malloc((size_t)rows * 2);
        for (int r = 0; r < rows; r++) bias[r] = f32_to_bf16(frand());
        bf16 *dbias = to_dev(bias, (size_t)rows * 2);
        for (int ti = quick ? 1 : 0; ti < 3; ti++) {
            int T = tokens[ti];
            float *x = rand_floats((size_t)T * cols, 2.0f), *xr = malloc((size_t)T * cols * 4);
            bf16 *dxb = bf16_inputs(x, T, cols, xr);
            double *want = malloc((size_t)T * rows * 8), *scale = malloc((size_t)T * rows * 8);
            blocks_reference(&hr, xr, bias, T, want, scale);
            float *y0 = malloc((size_t)T * ld * 4);
            for (size_t i = 0; i < (size_t)T * ld; i++) y0[i] = -7.0f;
            float *dy = to_dev(y0, (size_t)T * ld * 4);
            cuda_gemm_blocks(dy, ld, dxb, w, none, dbias, T, rows, cols, 0, NULL);
            float *got = from_dev(dy, (size_t)T * ld);
            double e = blocks_error(got, ld, want, scale, T, rows);
            for (int t = 0; t < T; t++)
                for (int r = rows; r < ld; r++) CHECK(got[(size_t)t * ld + r] == -7.0f, "a column past the rows was written");
            cuda_gemm_blocks(dy, ld, dxb, w, none, dbias, T, rows, cols, 1, NULL); /* += the same: twice the reference */
            free(got);
            got = from_dev(dy, (size_t)T * ld);
            for (size_t i = 0; i < (size_t)T * rows; i++) want[i] *= 2, scale[i] *= 2;
            double e2 = blocks_error(got, ld, want, scale, T, rows);
            CHECK(e < tol && e2 < tol, "%s %dx%d T=%d: error %g, accumulated %g of sum |w x| (bound %g)",
                  cpu_wtype_name(h.t), rows, cols, T, e, e2, tol);
            free(x), free(xr), free(want), free(scale), free(y0), free(got);
            cudaFree(dxb), cudaFree(dy);
        }
        free(bias), free(hr.f), cudaFree(dbias), cudaFree((void *)w.p), free_blocks(&h);
    }
    /* gate/up with SwiGLU, each its own type */
    const int F = 45, cols = 256, T = 33;
    host_blocks g = make_blocks(CPU_W_Q4_K, F, cols), u = make_blocks(CPU_W_IQ4_XS, F, cols);
    host_blocks gr = bf16_rounded(&g), ur = bf16_rounded(&u);
    cuda_wmat dg = dev_blocks(&g), du = dev_blocks(&u);
    float *x = rand_floats((size_t)T * cols, 2.0f), *xr = malloc((size_t)T * cols * 4);
    bf16 *dxb = bf16_inputs(x, T, cols, xr);
    double *gw = malloc((size_t)T * F * 8), *uw = malloc((size_t)T * F * 8), *gs = malloc((size_t)T * F * 8),
           *us = malloc((size_t)T * F * 8);
    blocks_reference(&gr, xr, NULL, T, gw, gs);
    blocks_reference(&ur, xr, NULL, T, uw, us);
    float *dact = dev_floats((size_t)T * F);
    cuda_gemm_blocks(dact, F, dxb, dg, du, NULL, T, F, cols, 0, NULL);
    float *act = from_dev(dact, (size_t)T * F);
    double worst = 0.0;
    for (int i = 0; i < T * F; i++) {
        double err = swiglu_error(act[i], gw[i], uw[i], gs[i], us[i], tol);
        if (!(err <= worst)) worst = err;
    }
    CHECK(worst <= 1.0, "gate/up (q4_k, iq4_xs) swiglu T=%d: %g of the bound", T, worst);
    free(x), free(xr), free(gw), free(uw), free(gs), free(us), free(act), free(gr.f), free(ur.f);
    cudaFree(dxb), cudaFree(dact), cudaFree((void *)dg.p), cudaFree((void *)du.p);
    free_blocks(&g), free_blocks(&u);
}

#endif
