/* The checks of the quantized kernels that need no model (see
 * test_quant.c's head): random blocks, tests/golden/quant_blocks.bin
 * against gguf-py's dequantizer, and every level this build can run
 * (dot products against the f32 and plain C dots, the matmul against the
 * dot products bit for bit). test_quant runs them natively with the model
 * tests; test_quant_kernels runs them alone, cross-built for aarch64 under
 * qemu-user (make test-neon), where the NEON level exists. */
#ifndef POLAR_TEST_QUANT_CHECKS_H
#define POLAR_TEST_QUANT_CHECKS_H

#include <stdint.h>

#include "../kernels/cpu/kernels.h"
#include "../loader/gguf.h"
#include "block_util.h"
#include "harness.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)(urand() >> 8) * (1.0f / 8388608.0f) - 1.0f; } /* [-1, 1) */

/* A random f16 scale of magnitude about 2^-10 .. 2^-4, either sign. */
static uint16_t rand_scale(int allow_negative) {
    uint16_t h = (uint16_t)((5 + urand() % 7) << 10 | (urand() & 0x3FF));
    return allow_negative && (urand() & 1) ? (uint16_t)(h | 0x8000) : h;
}

/* nb random blocks of t; want[32 * nb] the values by definition. */
static void rand_blocks(cpu_wtype t, int nb, uint8_t *b, float *want) {
    size_t bb = cpu_wtype_block_bytes(t);
    for (int k = 0; k < nb; k++, b += bb, want += 32) {
        uint16_t dh = rand_scale(1), mh = rand_scale(1);
        float d = f16_to_f32(dh), m = f16_to_f32(mh);
        b[0] = (uint8_t)dh, b[1] = (uint8_t)(dh >> 8);
        if (t == CPU_W_Q8_0) {
            for (int i = 0; i < 32; i++) {
                int q = (int)(urand() % 256) - 128; /* -128 included: the edge of maddubs */
                b[2 + i] = (uint8_t)(int8_t)q;
                want[i] = d * (float)q;
            }
            continue;
        }
        int qs = t == CPU_W_Q4_1 ? 4 : 2;
        if (t == CPU_W_Q4_1) b[2] = (uint8_t)mh, b[3] = (uint8_t)(mh >> 8);
        int q[32];
        for (int i = 0; i < 32; i++) q[i] = (int)(urand() % 16);
        for (int i = 0; i < 16; i++) b[qs + i] = (uint8_t)(q[i] | q[i + 16] << 4); /* element i low, i + 16 high */
        for (int i = 0; i < 32; i++) want[i] = t == CPU_W_Q4_1 ? d * (float)q[i] + m : d * (float)(q[i] - 8);
    }
}

/* tests/golden/quant_blocks.bin (make_quant_blocks.py): random blocks of
 * every GGUF block type and their values by gguf-py's dequantizer. */
static struct {
    cpu_wtype t;
    int n; /* weights */
    uint8_t *raw;
    float *values;
} fixture[16];
static int n_fixture;
static uint8_t *fixture_data;

static int load_fixture(void) {
    FILE *f = fopen(GOLDEN_DIR "/quant_blocks.bin", "rb");
    if (!f) return 0;
    fixture_data = malloc(1 << 16);
    size_t len = fixture_data ? fread(fixture_data, 1, 1 << 16, f) : 0, at = 0;
    fclose(f);
    while (at + 16 <= len && n_fixture < 16) {
        uint32_t h[4];
        memcpy(h, fixture_data + at, 16);
        size_t raw = (size_t)h[1] * h[3], n = (size_t)h[1] * h[2];
        if (at + 16 + raw + 4 * n > len) return 0;
        fixture[n_fixture].t = ggml_block_format((ggml_type)h[0]);
        fixture[n_fixture].n = (int)n;
        fixture[n_fixture].raw = fixture_data + at + 16;
        fixture[n_fixture].values = malloc(4 * n);
        memcpy(fixture[n_fixture].values, fixture_data + at + 16 + raw, 4 * n);
        if (fixture[n_fixture].t == CPU_W_BF16 || h[3] != cpu_wtype_block_bytes(fixture[n_fixture].t)) return 0;
        n_fixture++;
        at += 16 + raw + 4 * n;
    }
    return at == len && n_fixture == 12;
}

/* Every block type dequantizes (kernels and loader) to exactly gguf-py's
 * values: an implementation independent of ours. */
static void gguf_py_blocks(void) {
    CHECK(n_fixture == 12, "tests/golden/quant_blocks.bin: 12 types");
    for (int i = 0; i < n_fixture; i++) {
        float *got = malloc(4 * (size_t)fixture[i].n), *got2 = malloc(4 * (size_t)fixture[i].n);
        cpu_dequantize_row(fixture[i].t, fixture[i].raw, got, fixture[i].n);
        int bad = 0;
        for (int g = 0; g <= GGML_BF16; g++)
            if (ggml_block_format((ggml_type)g) == fixture[i].t) ggml_dequantize((ggml_type)g, fixture[i].raw, got2, (size_t)fixture[i].n);
        for (int j = 0; j < fixture[i].n; j++) bad += got[j] != fixture[i].values[j] || got2[j] != fixture[i].values[j];
        CHECK(!bad, "%s: %d of %d values differ from gguf-py's", cpu_wtype_name(fixture[i].t), bad, fixture[i].n);
        free(got);
        free(got2);
    }
}

/* A level's dot product of nb 32-blocks of weights w (values wf) with
 * random activations, against the f32 dot and the plain C one. */
static void check_dot(const cpu_kernels *k, const char *name, cpu_wtype t, const uint8_t *w, const float *wf, int nb) {
    int n = 32 * nb;
    float *x = calloc((size_t)n, 4);
    cpu_q8_block *xq = malloc((size_t)nb * sizeof *xq);
    for (int i = 0; i < n; i++) x[i] = frand() * (i % 7 == 0 ? 8.0f : 1.0f); /* some outliers */
    if (nb > 1)
        for (int i = 32; i < 64; i++) x[i] = 0; /* an all-zero block: d = 0 */
    cpu_quantize_q8(xq, x, n);
    double ref = 0, mag = 0, bound = 0, mag_q = 0;
    for (int b = 0; b < nb; b++) {
        double wabs = 0;
        for (int i = 32 * b; i < 32 * b + 32; i++) {
            ref += (double)wf[i] * x[i];
            mag += fabs((double)wf[i] * x[i]);
            mag_q += fabs((double)wf[i] * xq[b].d * xq[b].q[i - 32 * b]);
            wabs += fabs(wf[i]);
        }
        bound += xq[b].d * 0.5 * wabs;
    }
    float got = k->dot_q[t](w, xq, nb), plain = cpu_dot_q_plain(t, w, xq, nb);
    double tol = bound * (1 + 1e-5) + 1e-5 * mag + 1e-30;
    CHECK(fabs(got - ref) <= tol, "%s %s nb=%d: |%g - %g| > %g", name, cpu_wtype_name(t), nb, got, ref, tol);
    CHECK(fabs(got - plain) <= 1e-5 * (mag_q + mag) + 1e-30, "%s %s nb=%d: %g vs plain C %g", name, cpu_wtype_name(t),
          nb, got, plain);
    free(x);
    free(xq);
}

/* rows x cols weights of a kept type t (block_util.h). */
static void rand_rows(cpu_wtype t, int rows, int cols, uint8_t *w) { rand_block_rows(t, rows, cols, w, urand); }

/* One level's dot products: Q8_0 / Q4_0 / Q4_1 on random blocks of
 * several counts (int8 -128, zero blocks), every kept type on random
 * bytes (every bit pattern of the packed fields) and on the gguf-py
 * blocks. */
static void dots_on_level(const cpu_kernels *k, const char *name) {
    static const int nbs[] = {1, 2, 3, 18, 48};
    for (int t = CPU_W_Q8_0; t <= CPU_W_Q4_1; t++)
        for (int c = 0; c < 5; c++) {
            uint8_t *w = malloc((size_t)nbs[c] * 34);
            float *wf = malloc((size_t)nbs[c] * 32 * 4);
            rand_blocks((cpu_wtype)t, nbs[c], w, wf);
            check_dot(k, name, (cpu_wtype)t, w, wf, nbs[c]);
            free(w);
            free(wf);
        }
    for (int t = CPU_W_Q8_0; t < CPU_W_N; t++)
        for (int cols = 256; cols <= 1536 && cpu_wtype_kept((cpu_wtype)t); cols += 1280) {
            uint8_t *w = malloc(cpu_wtype_row_bytes((cpu_wtype)t, (size_t)cols));
            float *wf = malloc((size_t)cols * 4);
            rand_rows((cpu_wtype)t, 1, cols, w);
            cpu_dequantize_row((cpu_wtype)t, w, wf, cols);
            check_dot(k, name, (cpu_wtype)t, w, wf, cols / 32);
            free(w);
            free(wf);
        }
    for (int i = 0; i < n_fixture; i++)
        if (cpu_wtype_kept(fixture[i].t)) check_dot(k, name, fixture[i].t, fixture[i].raw, fixture[i].values, fixture[i].n / 32);
}

/* The matmul over rows and tokens: the same bits as each row's dot
 * product (plus bias, or added into y), whatever T (tiles of 1 to 4
 * tokens, 4 and 2 rows, and their tails; more than 4 tokens reuse rows a
 * level may unpack once) and thread count; two outputs of different types
 * from one input, as q/k/v run; rows of 256 weights and, for the 32-weight
 * types, of 96 (an odd number of blocks). */
static void matmul_on_level(const cpu_kernels *k, const char *name) {
    enum { MAXCOLS = 256, MAXNB = MAXCOLS / 32, MAXT = 9 };
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 9}, out_rows[2] = {37, 22}, colss[2] = {256, 96};
    for (int t = CPU_W_Q8_0; t < CPU_W_N; t++)
        for (int ci = 0; ci < 2 && cpu_wtype_kept((cpu_wtype)t); ci++)
            for (int ti = 0; ti < 7 && (ci == 0 || cpu_wtype_block_elems((cpu_wtype)t) == 32); ti++)
                for (int acc = 0; acc < 2; acc++)
                    for (int threads = 1; threads <= 3; threads += 2) {
                        int T = Ts[ti], COLS = colss[ci], NB = COLS / 32;
                        cpu_wtype types[2] = {(cpu_wtype)t,
                                              ci ? (t == CPU_W_Q8_0 ? CPU_W_Q4_1 : CPU_W_Q8_0) : t == CPU_W_Q6_K ? CPU_W_Q4_K : CPU_W_Q6_K};
                        uint8_t *w[2];
                        float *y[2], *y0[2], x[MAXT * MAXCOLS];
                        bf16 bias[37];
                        cpu_q8_block xq[MAXT * MAXNB], xq2[MAXNB];
                        cpu_q_out outs[2];
                        for (int i = 0; i < T * COLS; i++) x[i] = frand();
                        for (int r = 0; r < 37; r++) bias[r] = f32_to_bf16(frand());
                        for (int o = 0; o < 2; o++) {
                            size_t rb = cpu_wtype_row_bytes(types[o], COLS);
                            w[o] = malloc(out_rows[o] * rb);
                            rand_rows(types[o], out_rows[o], COLS, w[o]);
                            y[o] = malloc((size_t)T * out_rows[o] * 4);
                            y0[o] = malloc((size_t)T * out_rows[o] * 4);
                            for (int i = 0; i < T * out_rows[o]; i++) y[o][i] = y0[o][i] = frand();
                            outs[o] = (cpu_q_out){y[o], w[o], types[o], acc || o ? NULL : bias, out_rows[o]};
                        }
                        cpu_matmul_q_multi_with(k, outs, 2, x, T, COLS, acc, threads, xq);
                        int bad = 0;
                        for (int tok = 0; tok < T; tok++) {
                            cpu_quantize_q8(xq2, x + (size_t)tok * COLS, COLS);
                            for (int o = 0; o < 2; o++)
                                for (int r = 0; r < out_rows[o]; r++) {
                                    size_t rb = cpu_wtype_row_bytes(types[o], COLS), i = (size_t)tok * out_rows[o] + r;
                                    float d = k->dot_q[types[o]](w[o] + r * rb, xq2, NB);
                                    float b = outs[o].bias ? bf16_to_f32(bias[r]) : 0.0f;
                                    bad += y[o][i] != (acc ? y0[o][i] + (d + b) : d + b);
                                }
                        }
                        CHECK(!bad, "%s %s+%s cols=%d T=%d acc=%d threads=%d: %d outputs differ from the row dot products",
                              name, cpu_wtype_name(types[0]), cpu_wtype_name(types[1]), COLS, T, acc, threads, bad);
                        for (int o = 0; o < 2; o++) free(w[o]), free(y[o]), free(y0[o]);
                    }
}

/* Rows too long for a level to unpack once for all tokens (more than 8192
 * weights: the AVX-512 VNNI tiles then unpack per tile): the same bits as
 * the row dot products. */
static void long_rows_on_level(const cpu_kernels *k, const char *name) {
    enum { COLS = 8448, NB = COLS / 32, T = 5, ROWS = 21 };
    size_t rb = cpu_wtype_row_bytes(CPU_W_Q5_0, COLS);
    uint8_t *w = malloc(ROWS * rb);
    float *x = malloc((size_t)T * COLS * 4), y[T * ROWS];
    cpu_q8_block *xq = malloc((size_t)T * NB * sizeof *xq);
    rand_rows(CPU_W_Q5_0, ROWS, COLS, w);
    for (int i = 0; i < T * COLS; i++) x[i] = frand();
    cpu_q_out out = {y, w, CPU_W_Q5_0, NULL, ROWS};
    cpu_matmul_q_multi_with(k, &out, 1, x, T, COLS, 0, 1, xq);
    int bad = 0;
    for (int tok = 0; tok < T; tok++)
        for (int r = 0; r < ROWS; r++) bad += y[tok * ROWS + r] != k->dot_q[CPU_W_Q5_0](w + r * rb, xq + tok * NB, NB);
    CHECK(!bad, "%s q5_0 cols=%d T=%d: %d outputs differ from the row dot products", name, COLS, T, bad);
    free(w), free(x), free(xq);
}

/* The level's activation quantizer gives cpu_quantize_q8's blocks bit for
 * bit: random magnitudes, exact halves (ties to even), zeros, a block of
 * zeros, a block too small to scale, and blocks holding inf or NaN. */
static void quantize_on_level(const cpu_kernels *k, const char *name) {
    enum { N = 32 * 40 };
    static float x[N];
    static cpu_q8_block want[N / 32], got[N / 32];
    uint64_t st = 7;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((st >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
        x[i] = u * (float)(1 << (i % 20)) * 1e-3f;
    }
    for (int i = 0; i < 32; i++) x[32 + i] = (float)(i - 16) + 0.5f; /* 127 / 16.5 is not a tie, so: */
    x[64] = 127.0f;
    for (int i = 1; i < 32; i++) x[64 + i] = (float)(i - 16) + 0.5f; /* id 1: ties at every other entry */
    for (int i = 0; i < 32; i++) x[96 + i] = i % 3 ? 0.0f : -0.0f;
    x[130] = INFINITY, x[170] = -INFINITY, x[200] = NAN, x[250] = -0.0f;
    for (int i = 0; i < 32; i++) x[288 + i] = (float)(i - 16) * 1e-39f; /* 127 / amax overflows */
    cpu_quantize_q8(want, x, N);
    k->quantize_q8(got, x, N);
    int same = 1;
    for (int b = 0; b < N / 32; b++) {
        int nan_w = isnan(want[b].d), nan_g = isnan(got[b].d);
        if (nan_w != nan_g || memcmp(want[b].q, got[b].q, 32) || memcmp(want[b].half_sum, got[b].half_sum, sizeof want[b].half_sum) ||
            (!nan_w && (memcmp(&want[b].d, &got[b].d, sizeof(float)) || memcmp(&want[b].s, &got[b].s, sizeof(float)))))
            same = 0;
    }
    CHECK(same, "%s: quantize_q8 differs from cpu_quantize_q8", name);
}

/* The interleaved layouts (quant.h), on a level that multiplies them:
 * repacked rows dequantize to the row-major rows' values bit for bit;
 * the matmul (rows not a multiple of 16, two k-quant 256-blocks or an odd
 * number of 32-blocks a row, T up to 17 and 70 (past a prefill's 64-token chunk), 1 and 3 threads, bias or
 * accumulate, two outputs from one input) is within 1e-5 of the plain C dot
 * of each original row,
 * and every token's outputs are those of the token alone (T = 1) bit for
 * bit: decode and batches agree. */
static void x16_on_level(const cpu_kernels *k, const char *name) {
    enum { MAXCOLS = 512, MAXT = 70, ROWS0 = 37, ROWS1 = 21, NTYPES = 10 };
    /* each type with the next: IQ4_NL after IQ4_XS, then 32-block types, so that every 32-block type meets a
     * 32-block partner and runs at 96 columns too */
    static const cpu_wtype types[NTYPES] = {CPU_W_Q8_0, CPU_W_Q4_0, CPU_W_Q4_1, CPU_W_Q4_K,   CPU_W_Q5_K,
                                            CPU_W_Q6_K, CPU_W_IQ4_XS, CPU_W_IQ4_NL, CPU_W_Q5_0, CPU_W_Q5_1};
    /* 70: past the 64 tokens a prefill unpacks a 256-block unit for (x16_prefill_k) */
    static const int Ts[] = {1, 2, 3, 5, 8, 9, 17, 70}, colss[2] = {512, 96}, out_rows[2] = {ROWS0, ROWS1};
    static float x[MAXT * MAXCOLS], wf[MAXCOLS], row_f[MAXCOLS], y[2][MAXT * ROWS0], y0[2][MAXT * ROWS0],
        one[2][ROWS0];
    static cpu_q8_block xq[MAXT * MAXCOLS / 32], xq1[MAXCOLS / 32];
    int ran = 0, missing = 0;
    /* the x86 SIMD levels multiply every x16 type (a silently missing kernel
     * would leave models row-major and these checks vacuous) */
    int expected = !strncmp(name, "avx", 3); /* every x86 SIMD level */
    for (int ti = 0; ti < NTYPES; ti++)
        for (int ci = 0; ci < 2; ci++) {
            cpu_wtype rt[2] = {types[ti], types[(ti + 1) % NTYPES]}, xt[2];
            int cols = colss[ci], nb = cols / 32;
            if (cols % cpu_wtype_block_elems(rt[0]) || cols % cpu_wtype_block_elems(rt[1])) continue;
            uint8_t *w[2], *wx[2];
            for (int o = 0; o < 2; o++) {
                xt[o] = cpu_x16_of(rt[o]);
                size_t rb = cpu_wtype_row_bytes(rt[o], (size_t)cols);
                w[o] = malloc((size_t)out_rows[o] * rb);
                wx[o] = malloc(cpu_x16_bytes(xt[o], out_rows[o], (size_t)cols));
                rand_rows(rt[o], out_rows[o], cols, w[o]);
                cpu_repack_x16(rt[o], w[o], out_rows[o], (size_t)cols, wx[o]);
                int bad = 0;
                for (int r = 0; r < out_rows[o]; r++) {
                    cpu_dequantize_row(rt[o], w[o] + (size_t)r * rb, wf, cols);
                    cpu_dequantize_matrix_row(xt[o], wx[o], (size_t)cols, r, row_f);
                    bad += memcmp(wf, row_f, (size_t)cols * 4) != 0;
                }
                CHECK(!bad, "%s: %d rows of %s x %d differ from %s's", cpu_wtype_name(xt[o]), bad, cpu_wtype_name(rt[o]),
                      cols, cpu_wtype_name(rt[o]));
            }
            if (!k->rows_q[xt[0]] || !k->rows_q[xt[1]]) {
                missing += expected;
                for (int o = 0; o < 2; o++) free(w[o]), free(wx[o]);
                continue;
            }
            ran = 1;
            bf16 bias[ROWS0];
            for (int r = 0; r < ROWS0; r++) bias[r] = f32_to_bf16(frand());
            for (int tj = 0; tj < (int)(sizeof Ts / sizeof *Ts); tj++)
                for (int acc = 0; acc < 2; acc++)
                    for (int threads = 1; threads <= 3; threads += 2) {
                        int T = Ts[tj], far = 0, split = 0;
                        for (int i = 0; i < T * cols; i++) x[i] = frand() * (i % 5 ? 1.0f : 6.0f);
                        for (int o = 0; o < 2; o++)
                            for (int i = 0; i < T * out_rows[o]; i++) y[o][i] = y0[o][i] = frand();
                        cpu_q_out outs[2] = {{y[0], wx[0], xt[0], acc ? NULL : bias, ROWS0}, {y[1], wx[1], xt[1], NULL, ROWS1}};
                        cpu_matmul_q_multi_with(k, outs, 2, x, T, cols, acc, threads, xq);
                        for (int tok = 0; tok < T; tok++) {
                            for (int o = 0; o < 2; o++)
                                for (int r = 0; r < out_rows[o]; r++) one[o][r] = y0[o][(size_t)tok * out_rows[o] + r];
                            cpu_q_out alone[2] = {{one[0], wx[0], xt[0], acc ? NULL : bias, ROWS0}, {one[1], wx[1], xt[1], NULL, ROWS1}};
                            cpu_matmul_q_multi_with(k, alone, 2, x + (size_t)tok * cols, 1, cols, acc, 1, xq1);
                            for (int o = 0; o < 2; o++)
                                for (int r = 0; r < out_rows[o]; r++) {
                                    size_t i = (size_t)tok * out_rows[o] + r;
                                    split += memcmp(&y[o][i], &one[o][r], sizeof(float)) != 0;
                                    double mag = 0;
                                    const uint8_t *row = w[o] + (size_t)r * cpu_wtype_row_bytes(rt[o], (size_t)cols);
                                    cpu_dequantize_row(rt[o], row, wf, cols);
                                    for (int c = 0; c < cols; c++) mag += fabs((double)wf[c] * x[(size_t)tok * cols + c]);
                                    float plain = cpu_dot_q_plain(rt[o], row, xq1, nb);
                                    float b = outs[o].bias ? bf16_to_f32(bias[r]) : 0.0f;
                                    float want = acc ? y0[o][i] + (plain + b) : plain + b;
                                    far += !(fabs(y[o][i] - want) <= 1e-5 * (mag + fabs(y0[o][i]) + fabs(b)) + 1e-30);
                                }
                        }
                        CHECK(!far && !split,
                              "%s %s+%s cols=%d T=%d acc=%d threads=%d: %d outputs off the plain dot, %d differ from T = 1",
                              name, cpu_wtype_name(xt[0]), cpu_wtype_name(xt[1]), cols, T, acc, threads, far, split);
                    }
            for (int o = 0; o < 2; o++) free(w[o]), free(wx[o]);
        }
    CHECK(ran == expected && !missing, "%s: x16 kernels %s", name,
          ran && !expected ? "present where none were expected" : "missing");
    if (!ran) printf("  %s: no x16 kernels (repacking checked only)\n", name);
}

/* The x16 matmul gives the same bits on every level that runs it (AVX2's
 * maddubs + madd and AVX-512's vpdpbusd compute the same integers, and the
 * same float operations follow): each type, T 1 to 9, bias, 2 threads. */
static void x16_same_on_levels(void) {
    enum { COLS = 512, ROWS = 53, T = 9 };
    static const cpu_wtype types[] = {CPU_W_Q8_0, CPU_W_Q4_0, CPU_W_Q4_1, CPU_W_Q5_0,   CPU_W_Q5_1,
                                      CPU_W_Q4_K, CPU_W_Q5_K, CPU_W_Q6_K, CPU_W_IQ4_NL, CPU_W_IQ4_XS};
    static float x[T * COLS], y[2][T * ROWS];
    static cpu_q8_block xq[T * COLS / 32];
    const cpu_kernels *ks[CPU_N_LEVELS];
    int n = 0;
    for (int l = 0; l < CPU_N_LEVELS; l++) {
        const cpu_kernels *k = cpu_kernels_for((cpu_level)l, NULL);
        if (k && k->rows_q[CPU_W_Q8_0_X16]) ks[n++] = k;
    }
    if (n < 2) {
        printf("  x16 on one level or none here: nothing to compare\n");
        return;
    }
    bf16 bias[ROWS];
    for (int r = 0; r < ROWS; r++) bias[r] = f32_to_bf16(frand());
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        cpu_wtype x16 = cpu_x16_of(types[ti]);
        uint8_t *w = malloc((size_t)ROWS * cpu_wtype_row_bytes(types[ti], COLS)), *wx = malloc(cpu_x16_bytes(x16, ROWS, COLS));
        rand_rows(types[ti], ROWS, COLS, w);
        cpu_repack_x16(types[ti], w, ROWS, COLS, wx);
        for (int t = 1; t <= T; t++) {
            for (int i = 0; i < t * COLS; i++) x[i] = frand() * (i % 9 ? 1.0f : 5.0f);
            int bad = 0;
            for (int l = 0; l < n; l++) {
                cpu_q_out o = {y[l ? 1 : 0], wx, x16, bias, ROWS};
                cpu_matmul_q_multi_with(ks[l], &o, 1, x, t, COLS, 0, 2, xq);
                if (l) bad += memcmp(y[0], y[1], (size_t)t * ROWS * sizeof(float)) != 0;
            }
            CHECK(!bad, "%s T=%d: the levels' x16 outputs differ", cpu_wtype_name(x16), t);
        }
        free(w);
        free(wx);
    }
}

/* The reference level (POLAR_CPU=reference): every kept type's rows times
 * f32 activations, as cpu_dequantize_row's weights (checked against
 * gguf-py above) summed in double, to float rounding; T past its 64-token
 * tile, a bias, and accumulation. */
static void reference_level(void) {
    enum { ROWS = 19, COLS = 512, T = 67 };
    static float x[T * COLS], y[T * ROWS], wf[COLS];
    bf16 bias[ROWS];
    for (int i = 0; i < T * COLS; i++) x[i] = frand();
    for (int r = 0; r < ROWS; r++) bias[r] = f32_to_bf16(frand());
    for (int t = CPU_W_Q8_0; t < CPU_W_N; t++) {
        if (!cpu_wtype_kept((cpu_wtype)t)) continue;
        size_t rb = cpu_wtype_row_bytes((cpu_wtype)t, COLS);
        uint8_t *w = malloc(ROWS * rb);
        rand_rows((cpu_wtype)t, ROWS, COLS, w);
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < T * ROWS; i++) y[i] = acc ? 0.25f : 0.0f;
            cpu_q_out out = {y, w, (cpu_wtype)t, acc ? NULL : bias, ROWS};
            cpu_matmul_q_multi_with(&cpu_kernels_reference, &out, 1, x, T, COLS, acc, 2, NULL);
            int bad = 0;
            double worst = 0;
            for (int r = 0; r < ROWS; r++) {
                cpu_dequantize_row((cpu_wtype)t, w + r * rb, wf, COLS);
                for (int tok = 0; tok < T; tok++) {
                    double sum = 0, mag = 0;
                    for (int i = 0; i < COLS; i++)
                        sum += (double)wf[i] * x[tok * COLS + i], mag += fabs((double)wf[i] * x[tok * COLS + i]);
                    double want = sum + (acc ? 0.25 : bf16_to_f32(bias[r]));
                    double e = fabs(y[tok * ROWS + r] - want) / (mag + 1.0);
                    worst = e > worst ? e : worst;
                    bad += e > 2e-7;
                }
            }
            CHECK(!bad, "reference %s acc=%d: %d of %d outputs off the double sum (worst %.2g of the magnitude)",
                  cpu_wtype_name((cpu_wtype)t), acc, bad, T * ROWS, worst);
        }
        free(w);
    }
}

static void levels(void) {
    for (int l = 0; l < CPU_N_LEVELS; l++) {
        const char *why;
        const cpu_kernels *k = cpu_kernels_for((cpu_level)l, &why);
        if (!k) {
            printf("SKIP quant %s: skipped: %s\n", cpu_level_name((cpu_level)l), why);
            continue;
        }
        dots_on_level(k, cpu_level_name((cpu_level)l));
        matmul_on_level(k, cpu_level_name((cpu_level)l));
        quantize_on_level(k, cpu_level_name((cpu_level)l));
        x16_on_level(k, cpu_level_name((cpu_level)l));
        long_rows_on_level(k, cpu_level_name((cpu_level)l));
    }
    x16_same_on_levels();
    reference_level();
}

#endif
