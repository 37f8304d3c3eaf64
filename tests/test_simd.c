/* Every SIMD kernel level this machine can run against the plain C one
 * (ops.c, the oracle), on random data and shapes that hit every vector
 * tail and tile remainder. A level the CPU cannot run prints
 * "SKIP <level>: skipped: <why>" instead of passing.
 *
 * Tolerances: matmul |simd - plain| <= 1e-5 * (sum_j |w_j x_j| + |bias| +
 * |y0|) per output (sums reordered; f32 rounding of a 576-term sum is far
 * below); rmsnorm and swiglu 2e-6 relative (reordered sum of squares, a
 * polynomial e^x of about 2 ulp); attention 1e-5 of max |v| (its outputs
 * are averages of v rows); RoPE bit for bit (the same operations). Within a
 * level the matmul must give the same bits whatever T, the thread count or
 * the row range. */
#include <stdint.h>

#include "../kernels/cpu/kernels.h"
#include "harness.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
}
static void fill_bf16(bf16 *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(scale * frand());
}

static const cpu_kernels *g = &cpu_kernels_generic;
static const cpu_kernels *k; /* the level under test */

/* One matmul shape, with and without bias/accumulate, against the plain C
 * kernel; then the level against itself: T = 1 per token, 3 threads, and
 * two row ranges all give the same bits as the whole call. */
static int matmul_case(int T, int rows, int cols) {
    size_t nx = (size_t)T * cols, ny = (size_t)T * rows;
    float *x = malloc(nx * 4), *y0 = malloc(ny * 4), *ya = malloc(ny * 4), *yb = malloc(ny * 4), *yc = malloc(ny * 4);
    bf16 *w = malloc((size_t)rows * cols * 2), *b = malloc((size_t)rows * 2);
    fill(x, nx, 1);
    fill(y0, ny, 1);
    fill_bf16(w, (size_t)rows * cols, 0.5f);
    fill_bf16(b, (size_t)rows, 0.5f);
    int bad = 0;
    for (int acc = 0; acc < 2; acc++) {
        const bf16 *bias = acc ? NULL : b;
        memcpy(ya, y0, ny * 4);
        memcpy(yb, y0, ny * 4);
        cpu_matmul_with(g, ya, x, w, bias, T, rows, cols, acc, 1);
        cpu_matmul_with(k, yb, x, w, bias, T, rows, cols, acc, 2);
        double worst = 0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                double mag = (acc ? fabs(y0[(size_t)t * rows + r]) : fabs(bf16_to_f32(b[r])));
                for (int c = 0; c < cols; c++)
                    mag += fabs((double)bf16_to_f32(w[(size_t)r * cols + c]) * x[(size_t)t * cols + c]);
                double e = fabs((double)ya[(size_t)t * rows + r] - yb[(size_t)t * rows + r]) / (mag + 1e-30);
                worst = fmax(worst, e);
            }
        if (worst > 1e-5) {
            CHECK(0, "%s matmul T=%d %dx%d acc=%d: relative error %g", k->name, T, rows, cols, acc, worst);
            bad++;
        }
        /* the same bits one token at a time (decode vs prefill) */
        memcpy(yc, y0, ny * 4);
        for (int t = 0; t < T; t++)
            cpu_matmul_with(k, yc + (size_t)t * rows, x + (size_t)t * cols, w, bias, 1, rows, cols, acc, 1);
        if (memcmp(yb, yc, ny * 4)) {
            CHECK(0, "%s matmul T=%d %dx%d acc=%d: T=1 calls differ from one T=%d call", k->name, T, rows, cols, acc, T);
            bad++;
        }
        /* the same bits over 3 threads and over two uneven row ranges */
        memcpy(yc, y0, ny * 4);
        cpu_matmul_with(k, yc, x, w, bias, T, rows, cols, acc, 3);
        int split = rows / 3;
        memcpy(ya, y0, ny * 4);
        k->matmul_bf16(ya, x, w, bias, T, rows, cols, acc, 0, split);
        k->matmul_bf16(ya, x, w, bias, T, rows, cols, acc, split, rows);
        if (memcmp(yb, yc, ny * 4) || memcmp(yb, ya, ny * 4)) {
            CHECK(0, "%s matmul T=%d %dx%d acc=%d: results depend on the row split", k->name, T, rows, cols, acc);
            bad++;
        }
    }
    free(x);
    free(y0);
    free(ya);
    free(yb);
    free(yc);
    free(w);
    free(b);
    return bad;
}

static void simd_matmul(void) {
    /* cols around every vector width (8, 16, 32) and the model sizes; rows
     * around the 8-row decode and 4-row prefill blocks. */
    static const int cols[] = {1, 5, 8, 15, 16, 17, 31, 32, 33, 64, 100, 129, 576};
    static const int rows[] = {1, 3, 4, 7, 8, 9, 13, 33, 70};
    int bad = 0;
    for (int T = 1; T <= 11 && bad < 5; T++)
        for (size_t ci = 0; ci < sizeof cols / sizeof *cols; ci++)
            for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++)
                if ((T + ci + ri) % 3 == 0 || T == 1) bad += matmul_case(T, rows[ri], cols[ci]);
    bad += matmul_case(64, 37, 576); /* a prefill chunk */
    bad += matmul_case(2, 1000, 1536);
}

static void simd_rmsnorm(void) {
    static const int ns[] = {1, 7, 8, 15, 16, 17, 64, 77, 576};
    for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
        int n = ns[c];
        float x[576], a[576], b[576];
        bf16 w[576];
        fill(x, n, 3);
        fill_bf16(w, n, 1);
        g->rmsnorm(a, x, w, n, 1e-6f);
        k->rmsnorm(b, x, w, n, 1e-6f);
        double worst = 0;
        for (int i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / (fabs(a[i]) + 1e-30));
        CHECK(worst <= 2e-6, "%s rmsnorm n=%d: relative error %g", k->name, n, worst);
        k->rmsnorm(x, x, w, n, 1e-6f);
        CHECK(!memcmp(x, b, (size_t)n * 4), "%s rmsnorm n=%d in place", k->name, n);
    }
}

static void simd_swiglu(void) {
    static const int ns[] = {1, 7, 8, 15, 16, 17, 33, 1536};
    for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
        int n = ns[c];
        float gate[1536], up[1536], a[1536], b[1536];
        fill(gate, n, 12);
        fill(up, n, 2);
        if (n > 16) { /* the ends of e^x's range, and past them */
            gate[0] = 100.0f, gate[1] = -100.0f, gate[2] = 87.0f, gate[3] = -87.0f, gate[4] = 0.0f;
            gate[5] = -88.5f, gate[6] = 88.5f, gate[7] = 1e-20f;
        }
        memcpy(a, gate, (size_t)n * 4);
        memcpy(b, gate, (size_t)n * 4);
        g->swiglu(a, up, n);
        k->swiglu(b, up, n);
        double worst = 0;
        int at = 0;
        for (int i = 0; i < n; i++) {
            double e = fabs(a[i] - b[i]) <= 1e-30 ? 0 : fabs(a[i] - b[i]) / fabs(a[i]);
            if (e > worst) worst = e, at = i;
        }
        CHECK(worst <= 2e-6, "%s swiglu n=%d: relative error %g at g=%g (%g vs %g)", k->name, n, worst, gate[at], b[at],
              a[at]);
    }
}

static void simd_rope(void) {
    static const int hds[] = {2, 6, 16, 34, 64, 128};
    for (size_t c = 0; c < sizeof hds / sizeof *hds; c++) {
        int hd = hds[c], half = hd / 2, heads = 3;
        float cs[64], sn[64], a[3 * 128], b[3 * 128];
        fill(cs, half, 1);
        fill(sn, half, 1);
        fill(a, (size_t)heads * hd, 2);
        memcpy(b, a, (size_t)heads * hd * 4);
        g->rope(a, cs, sn, heads, hd);
        k->rope(b, cs, sn, heads, hd);
        CHECK(!memcmp(a, b, (size_t)heads * hd * 4), "%s rope hd=%d differs from the plain C bits", k->name, hd);
    }
}

static void simd_attention(void) {
    static const int hds[] = {6, 12, 20, 64, 80, 128};
    static const int poss[] = {0, 2, 3, 7, 8, 15, 16, 40};
    /* positions 0..40 in three pool blocks out of order */
    int heads = 6, kv = 2, ctx = 3 * CPU_KV_BLOCK;
    const int blocks[3] = {2, 0, 1};
    for (size_t c = 0; c < sizeof hds / sizeof *hds; c++) {
        int hd = hds[c], kvd = kv * hd;
        float *q = malloc((size_t)heads * hd * 4), *kc = malloc((size_t)ctx * kvd * 4),
              *vc = malloc((size_t)ctx * kvd * 4), *a = malloc((size_t)heads * hd * 4),
              *b = malloc((size_t)heads * hd * 4), scores[48];
        fill(q, (size_t)heads * hd, 2);
        fill(kc, (size_t)ctx * kvd, 2);
        fill(vc, (size_t)ctx * kvd, 1); /* |v| < 1: the bound is absolute */
        for (size_t p = 0; p < sizeof poss / sizeof *poss; p++)
            for (int h = 0; h < heads; h++) {
                g->attention_head(a, q, kc, vc, blocks, poss[p], h, heads, kv, hd, scores);
                k->attention_head(b, q, kc, vc, blocks, poss[p], h, heads, kv, hd, scores);
                double worst = 0;
                for (int i = 0; i < hd; i++) worst = fmax(worst, fabs(a[h * hd + i] - b[h * hd + i]));
                CHECK(worst <= 1e-5, "%s attention hd=%d pos=%d head %d: error %g", k->name, hd, poss[p], h, worst);
            }
        free(q);
        free(kc);
        free(vc);
        free(a);
        free(b);
    }
}

/* A level's attention over several queries of one sequence (a prompt
 * tile, or a decode token's heads), bit for bit against: (bf16_rows 0) its
 * own one-query kernel, or (bf16_rows 1, attention_rows_bf16 over bf16
 * rows) its attention over f32 rows holding the same values. Head dims
 * with and without whole 8-, 16- and 64-float chunks (24 and 40 end on 8
 * lanes), MHA, GQA (groups of 2, 3, 4) and MQA (a group of 7: a tile of 4
 * then 3), 1..9 queries (more than one tile) starting inside and at the
 * edges of KV blocks (pool blocks out of order), each head alone, all heads
 * and a range starting and ending inside groups; the scratch poisoned with
 * NaN before every call. */
static void attention_rows_cases(int bf16_rows) {
    static const int hds[] = {6, 12, 20, 24, 40, 64, 80, 96, 128};
    static const int shapes[][2] = {{6, 2}, {4, 4}, {7, 1}, {8, 2}, {6, 3}}; /* query heads, KV heads */
    static const int starts[] = {0, 1, 5, 12, 15, 16, 29, 31, 39};
    enum { MAX_Q = 9, MAX_HEADS = 8, MAX_HD = 128 };
    int ctx = 3 * CPU_KV_BLOCK, qd = MAX_HEADS * MAX_HD;
    const int blocks[3] = {2, 0, 1};
    size_t pool = (size_t)ctx * qd;
    float *q = malloc((size_t)MAX_Q * qd * 4), *kc = malloc(pool * 4), *vc = malloc(pool * 4),
          *a = malloc((size_t)MAX_Q * qd * 4), *b = malloc((size_t)MAX_Q * qd * 4),
          *scores = malloc((size_t)ATTENTION_QUERIES * ctx * 4);
    bf16 *k16 = malloc(pool * 2), *v16 = malloc(pool * 2);
    const char *what = bf16_rows ? "attention_rows_bf16" : "attention_rows";
    int bad = 0, cases = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (size_t c = 0; c < sizeof hds / sizeof *hds; c++) {
            int heads = shapes[sh][0], kv = shapes[sh][1], hd = hds[c];
            size_t n = (size_t)ctx * kv * hd;
            fill(q, (size_t)MAX_Q * qd, 2);
            if (bf16_rows) { /* the same values both ways */
                fill_bf16(k16, n, 2);
                fill_bf16(v16, n, 1);
                for (size_t i = 0; i < n; i++) kc[i] = bf16_to_f32(k16[i]), vc[i] = bf16_to_f32(v16[i]);
            } else {
                fill(kc, n, 2);
                fill(vc, n, 1);
            }
            for (size_t p = 0; p < sizeof starts / sizeof *starts; p++)
                for (int n_q = 1; n_q <= MAX_Q && starts[p] + n_q <= ctx; n_q++)
                    for (int r = 0; r < heads + 2; r++, cases++) { /* heads alone, all, one inside range */
                        int pos = starts[p], h0 = r < heads ? r : r == heads ? 0 : 1;
                        int n_h = r < heads ? 1 : r == heads ? heads : heads - 2;
                        if (bf16_rows) { /* reference: the f32 rows */
                            for (int i = 0; i < ATTENTION_QUERIES * ctx; i++) scores[i] = NAN;
                            k->attention_rows(a, q, (size_t)qd, n_q, kc, vc, blocks, pos, h0, n_h, heads, kv, hd,
                                              scores, (size_t)ctx);
                        } else { /* reference: one query at a time */
                            for (int h = h0; h < h0 + n_h; h++)
                                for (int t = 0; t < n_q; t++) {
                                    for (int i = 0; i < ctx; i++) scores[i] = NAN;
                                    k->attention_head(a + (size_t)t * qd, q + (size_t)t * qd, kc, vc, blocks, pos + t,
                                                      h, heads, kv, hd, scores);
                                }
                        }
                        for (int i = 0; i < ATTENTION_QUERIES * ctx; i++) scores[i] = NAN;
                        memset(b, 0xff, (size_t)MAX_Q * qd * 4); /* heads outside the range stay so */
                        if (bf16_rows)
                            k->attention_rows_bf16(b, q, (size_t)qd, n_q, k16, v16, blocks, pos, h0, n_h, heads, kv,
                                                   hd, scores, (size_t)ctx);
                        else
                            k->attention_rows(b, q, (size_t)qd, n_q, kc, vc, blocks, pos, h0, n_h, heads, kv, hd,
                                              scores, (size_t)ctx);
                        int same = 1;
                        for (int t = 0; t < n_q; t++) {
                            const unsigned char *row = (const unsigned char *)(b + (size_t)t * qd);
                            same &= !memcmp(a + (size_t)t * qd + h0 * hd, b + (size_t)t * qd + h0 * hd,
                                            (size_t)n_h * hd * 4);
                            for (size_t i = 0; i < (size_t)heads * hd * 4; i++)
                                same &= (i >= (size_t)h0 * hd * 4 && i < (size_t)(h0 + n_h) * hd * 4) || row[i] == 0xff;
                        }
                        if (!same && bad++ < 5)
                            CHECK(0, "%s %s %d/%d heads hd=%d from %d, %d queries, heads %d..%d: not the reference's "
                                  "bits", k->name, what, heads, kv, hd, starts[p], n_q, h0, h0 + n_h - 1);
                    }
        }
    CHECK(bad == 0, "%s %s: %d of %d cases differ", k->name, what, bad, cases);
    free(q), free(kc), free(vc), free(a), free(b), free(scores), free(k16), free(v16);
}

static void simd_attention_rows(void) { attention_rows_cases(0); }

/* A bf16 KV cache: every level, the plain C one included. */
static void simd_attention_rows_bf16(void) { attention_rows_cases(1); }

int main(void) {
    static const cpu_level levels[] = {CPU_AVX2, CPU_AVX2VNNI, CPU_AVX512, CPU_AVX512VNNI, CPU_NEON};
    printf("active kernels: %s\n", cpu_kernels_active()->name);
    k = g;
    printf("== generic over bf16 K/V rows\n");
    RUN(simd_attention_rows_bf16);
    for (int l = 0; l < 4; l++) {
        const char *why;
        k = cpu_kernels_for(levels[l], &why);
        if (!k) {
            printf("SKIP %s: skipped: %s\n", cpu_level_name(levels[l]), why);
            continue;
        }
        printf("== %s against generic\n", k->name);
        RUN(simd_matmul);
        RUN(simd_rmsnorm);
        RUN(simd_swiglu);
        RUN(simd_rope);
        RUN(simd_attention);
        RUN(simd_attention_rows);
        RUN(simd_attention_rows_bf16);
    }
    TEST_EXIT();
}
