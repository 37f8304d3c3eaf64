/* test_cuda's kernel tests: every CUDA kernel against its CPU reference on
 * random inputs (kernels/cpu/ops.h), at the presets' real shapes, 1e-4
 * relative to the row's scale (f32 math in another summation order). One
 * file per concern: test_cuda.c holds the whole-model tests and main. */
#ifndef POLAR_TEST_CUDA_KERNEL_CHECKS_H
#define POLAR_TEST_CUDA_KERNEL_CHECKS_H

#include <cuda_runtime_api.h>

#include "../kernels/cpu/ops.h"
#include "../kernels/cuda/ops.h"
#include "../runtime/cuda_gemm.h"
#include "harness.h"

static int quick; /* --quick (set by main): fewer shapes, for compute-sanitizer */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}

static void *to_dev(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

/* max |a - b| over max |b|; infinite when any difference is NaN (fmaxf would drop it). */
static float max_rel(const float *a, const float *b, size_t n) {
    float scale = 1e-6f, d = 0;
    for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(b[i]));
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        if (e != e) return INFINITY;
        d = fmaxf(d, e);
    }
    return d / scale;
}

static bf16 *rand_weights(size_t n, int cols) {
    bf16 *w = malloc(n * 2);
    for (size_t i = 0; i < n; i++) w[i] = f32_to_bf16(frand() / sqrtf((float)cols));
    return w;
}

static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
    return x;
}

static float *from_dev(const float *d, size_t n) {
    float *h = malloc(n * 4);
    cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost);
    return h;
}

static float *dev_floats(size_t n) {
    float *d = NULL;
    cudaMalloc((void **)&d, n * 4);
    return d;
}

/* The read-bandwidth kernel reads every word once: its blocks' sums add
 * up to the host's (a count of words no grid divides); then
 * polar_read_bandwidth on the device gives a positive figure. */
static void kernel_read_sum(void) {
    enum { WORDS = 3 * 512 * 7 + 5, BLOCKS = 3 };
    uint32_t *h = malloc(WORDS * 16), want = 0, got = 0, sums[BLOCKS];
    for (int i = 0; i < WORDS * 4; i++) frand(), h[i] = (uint32_t)(rng >> 17);
    for (int i = 0; i < WORDS; i++) want += h[4 * i] ^ h[4 * i + 1] ^ h[4 * i + 2] ^ h[4 * i + 3];
    void *d = to_dev(h, WORDS * 16);
    unsigned *dsums = NULL;
    cudaMalloc((void **)&dsums, sizeof sums);
    cuda_read_sum(dsums, BLOCKS, d, WORDS * 16, NULL);
    cudaMemcpy(sums, dsums, sizeof sums, cudaMemcpyDeviceToHost);
    for (int b = 0; b < BLOCKS; b++) got += sums[b];
    CHECK(got == want, "read sum %u, the host's %u", got, want);
    cudaFree(d), cudaFree(dsums), free(h);
    double gbps = 0;
    polar_error err;
    CHECK_OK(polar_read_bandwidth(POLAR_DEVICE_CUDA, 1 << 20, 0, &gbps, &err));
    CHECK(gbps > 0, "read bandwidth %g GB/s", gbps);
}

/* Shapes of the presets' projections: q/o (hidden x hidden), kv, MLP, head
 * rows, and rows whose lanes end on different steps (1408, 2568 columns).
 * Each again with the loads as a ring (POLAR_CUDA_GEMV_RING): the same bits. */
static void kernel_matmul(void) {
    static const int shapes[][2] = {{3072, 3072}, {160, 1408}, {33, 100}, {2048, 2048}, {512, 2048}, {8192, 2048},
                                    {2048, 8192}, {11008, 2048}, {4096, 4096}, {12288, 4096}, {100, 72}, {96, 2568}};
    int n_shapes = quick ? 3 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int sidx = 0; sidx < n_shapes; sidx++) {
        int rows = shapes[sidx][0], cols = shapes[sidx][1];
        for (int T = 1; T <= 11; T += quick ? 10 : 3) {
            size_t nw = (size_t)rows * cols;
            bf16 *w = rand_weights(nw, cols), *b = rand_weights(rows, 100); /* bias ~0.1 */
            float *x = rand_floats((size_t)T * cols, 1), *y = rand_floats((size_t)T * rows, 1);
            float *g = malloc((size_t)T * rows * 4);
            memcpy(g, y, (size_t)T * rows * 4);
            cpu_matmul(y, x, w, b, T, rows, cols, 1, 2);
            bf16 *dw = to_dev(w, nw * 2), *db = to_dev(b, (size_t)rows * 2);
            float *dx = to_dev(x, (size_t)T * cols * 4), *dy = to_dev(g, (size_t)T * rows * 4);
            float *dy_ring = to_dev(g, (size_t)T * rows * 4);
            cuda_matmul(dy, dx, dw, db, T, rows, cols, 1, NULL);
            cudaMemcpy(g, dy, (size_t)T * rows * 4, cudaMemcpyDeviceToHost);
            float d = max_rel(g, y, (size_t)T * rows);
            CHECK(d < 1e-4f, "matmul %dx%d T=%d: relative error %g", rows, cols, T, d);
            const cuda_queue ring = {.ring = 1};
            cuda_matmul(dy_ring, dx, dw, db, T, rows, cols, 1, &ring);
            float *got_ring = from_dev(dy_ring, (size_t)T * rows);
            CHECK(!memcmp(got_ring, g, (size_t)T * rows * 4), "matmul %dx%d T=%d: the ring changed the bits", rows,
                  cols, T);
            free(got_ring);
            cudaFree(dw), cudaFree(db), cudaFree(dx), cudaFree(dy), cudaFree(dy_ring);
            free(w), free(b), free(x), free(y), free(g);
        }
    }
}

static void kernel_rmsnorm_swiglu_argmax(void) {
    int T = 5, n = 3072;
    float *x = malloc((size_t)T * n * 4), *want = malloc((size_t)T * n * 4), *got = malloc((size_t)T * n * 4);
    bf16 *w = malloc((size_t)n * 2);
    for (int i = 0; i < T * n; i++) x[i] = 3 * frand();
    for (int i = 0; i < n; i++) w[i] = f32_to_bf16(1 + 0.2f * frand());
    for (int t = 0; t < T; t++) cpu_rmsnorm(want + (size_t)t * n, x + (size_t)t * n, w, n, 1e-5f);
    float *dx = to_dev(x, (size_t)T * n * 4), *dout;
    bf16 *dw = to_dev(w, (size_t)n * 2);
    cudaMalloc((void **)&dout, (size_t)T * n * 4);
    cuda_rmsnorm(dout, dx, dw, T, n, 1e-5f, NULL);
    cudaMemcpy(got, dout, (size_t)T * n * 4, cudaMemcpyDeviceToHost);
    CHECK(max_rel(got, want, (size_t)T * n) < 1e-5f, "rmsnorm");
    float *u = malloc((size_t)T * n * 4);
    for (int i = 0; i < T * n; i++) u[i] = frand(), want[i] = x[i];
    cpu_swiglu(want, u, T * n);
    float *du = to_dev(u, (size_t)T * n * 4);
    cuda_swiglu(dx, du, T * n, NULL);
    cudaMemcpy(got, dx, (size_t)T * n * 4, cudaMemcpyDeviceToHost);
    CHECK(max_rel(got, want, (size_t)T * n) < 1e-5f, "swiglu");
    /* argmax: ties to the lowest index, across the block's strides */
    for (int i = 0; i < n; i++) x[i] = 0;
    x[2500] = x[700] = x[1900] = 5;
    float *dl = to_dev(x, (size_t)n * 4);
    int *di, out = -1;
    cudaMalloc((void **)&di, sizeof(int));
    cuda_argmax_rows(di, NULL, dl, 1, n, NULL);
    cudaMemcpy(&out, di, sizeof out, cudaMemcpyDeviceToHost);
    CHECK(out == 700, "argmax ties to the lowest index: %d", out);
    /* one block per row (a batch's head): each row as polar_argmax, with an
     * even width (vector loads) and an odd one (scalar loads, rows not
     * 16-byte aligned); row 1 ties, row 2 is all -inf (index 0), row 3
     * starts with a NaN and has more (passed over) */
    for (int width = n; width >= n - 1; width--) {
        for (int i = 0; i < T * width; i++) x[i] = 4 * frand();
        x[width + 3000] = x[width + 10] = 9;
        for (int i = 0; i < width; i++) x[2 * width + i] = -INFINITY;
        x[3 * width] = x[3 * width + 77] = x[3 * width + 2000] = NAN;
        float *drows = to_dev(x, (size_t)T * width * 4);
        /* the ids also straight to mapped host memory (a step's head) */
        int *dids, ids[5], *mapped = NULL, *dmapped = NULL;
        cudaMalloc((void **)&dids, T * sizeof(int));
        cudaHostAlloc((void **)&mapped, T * sizeof(int), cudaHostAllocMapped);
        if (mapped) memset(mapped, 0xff, T * sizeof(int)), cudaHostGetDevicePointer((void **)&dmapped, mapped, 0);
        cuda_argmax_rows(dids, dmapped, drows, T, width, NULL);
        cudaMemcpy(ids, dids, T * sizeof(int), cudaMemcpyDeviceToHost);
        for (int t = 0; t < T; t++)
            CHECK(ids[t] == polar_argmax(x + (size_t)t * width, width) && mapped && mapped[t] == ids[t],
                  "argmax rows (width %d) row %d: %d (mapped %d), host %d", width, t, ids[t], mapped ? mapped[t] : -2,
                  polar_argmax(x + (size_t)t * width, width));
        /* the same rows' vocabulary split in 3 (tensor parallel: row 1's
         * ties fall in different parts, row 4 ties across a boundary): each
         * part's maxima, gathered in part order, merged */
        int v1 = 1000, v2 = 2501, cut[4] = {0, v1, v2, width};
        x[4 * width + v1 - 1] = x[4 * width + v1] = 11;
        float *dpart = dev_floats((size_t)3 * 2 * T), *dslice = dev_floats((size_t)T * (v2 - v1)); /* the widest part */
        for (int p = 0; p < 3; p++) {
            float *slice = malloc((size_t)T * (cut[p + 1] - cut[p]) * 4);
            for (int t = 0; t < T; t++)
                memcpy(slice + (size_t)t * (cut[p + 1] - cut[p]), x + (size_t)t * width + cut[p],
                       (size_t)(cut[p + 1] - cut[p]) * 4);
            cudaMemcpy(dslice, slice, (size_t)T * (cut[p + 1] - cut[p]) * 4, cudaMemcpyHostToDevice);
            cuda_argmax_part(dpart + (size_t)p * 2 * T, dslice, T, cut[p + 1] - cut[p], cut[p], NULL);
            free(slice);
        }
        cudaFree(drows);
        drows = to_dev(x, (size_t)T * width * 4);
        cuda_argmax_rows(dids, NULL, drows, T, width, NULL);
        int whole[5], merged[5];
        cudaMemcpy(whole, dids, T * sizeof(int), cudaMemcpyDeviceToHost);
        if (mapped) memset(mapped, 0xff, T * sizeof(int));
        cuda_argmax_merge(dids, dmapped, dpart, T, 3, NULL);
        cudaMemcpy(merged, dids, T * sizeof(int), cudaMemcpyDeviceToHost);
        for (int t = 0; t < T; t++)
            CHECK(merged[t] == whole[t] && mapped && mapped[t] == merged[t] &&
                      whole[t] == polar_argmax(x + (size_t)t * width, width),
                  "split argmax (width %d) row %d: %d merged (mapped %d), %d whole", width, t, merged[t],
                  mapped ? mapped[t] : -2, whole[t]);
        CHECK(merged[4] == v1 - 1, "a tie across the split went to %d, not %d", merged[4], v1 - 1);
        cudaFree(dpart), cudaFree(dslice);
        cudaFree(drows), cudaFree(dids), cudaFreeHost(mapped);
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(du), cudaFree(dl), cudaFree(di);
    free(x), free(want), free(got), free(w), free(u);
}

/* The fused GEMVs (q/k/v in one launch with biases; gate/up with the SwiGLU
 * epilogue) against cpu_matmul + cpu_swiglu, T across the 8-token passes;
 * each also with the RMSNorm applied on the fly, against cpu_rmsnorm first
 * (the residual rows at a scale of 3, as a model's are not normed). Columns
 * 60 take the scalar path (not a multiple of 8). Both again with the loads
 * as a ring (POLAR_CUDA_GEMV_RING): the same bits. */
static void kernel_fused_gemv(void) {
    static const int shapes[][3] = {{3072, 1024, 3072}, {2048, 256, 2048}, {96, 40, 72}, {64, 24, 60}};
    for (int sidx = 0; sidx < (quick ? 1 : 4); sidx++) {
        int qr = shapes[sidx][0], kr = shapes[sidx][1], cols = shapes[sidx][2], F = 4 * cols;
        for (int T = 1; T <= 11; T += 5) {
            for (int normed = 0; normed < 2; normed++) {
                const float eps = 1e-5f;
                bf16 *w[3] = {rand_weights((size_t)qr * cols, cols), rand_weights((size_t)kr * cols, cols),
                              rand_weights((size_t)kr * cols, cols)};
                bf16 *b[3] = {rand_weights(qr, 10), rand_weights(kr, 10), rand_weights(kr, 10)};
                bf16 *nw = malloc((size_t)cols * 2);
                for (int i = 0; i < cols; i++) nw[i] = f32_to_bf16(1 + 0.2f * frand());
                float *x = rand_floats((size_t)T * cols, normed ? 3 : 1), *xn = malloc((size_t)T * cols * 4);
                for (int t = 0; t < T; t++)
                    if (normed) cpu_rmsnorm(xn + (size_t)t * cols, x + (size_t)t * cols, nw, cols, eps);
                    else memcpy(xn + (size_t)t * cols, x + (size_t)t * cols, (size_t)cols * 4);
                float *want[3], *dy[3];
                int rows[3] = {qr, kr, kr};
                bf16 *dw[3], *db[3], *dnw = normed ? to_dev(nw, (size_t)cols * 2) : NULL;
                for (int i = 0; i < 3; i++) {
                    want[i] = malloc((size_t)T * rows[i] * 4);
                    cpu_matmul(want[i], xn, w[i], b[i], T, rows[i], cols, 0, 2);
                    dw[i] = to_dev(w[i], (size_t)rows[i] * cols * 2), db[i] = to_dev(b[i], (size_t)rows[i] * 2);
                    dy[i] = dev_floats((size_t)T * rows[i]);
                }
                float *dx = to_dev(x, (size_t)T * cols * 4);
                cuda_matmul_qkv(dy[0], dy[1], dy[2], dx, dw[0], dw[1], dw[2], db[0], db[1], db[2], dnw, eps, T, qr, kr,
                                cols, NULL);
                float *got_qkv[3];
                for (int i = 0; i < 3; i++) {
                    float *got = got_qkv[i] = from_dev(dy[i], (size_t)T * rows[i]);
                    float d = max_rel(got, want[i], (size_t)T * rows[i]);
                    CHECK(d < 1e-4f, "qkv part %d %dx%d T=%d normed %d: relative error %g", i, rows[i], cols, T,
                          normed, d);
                }
                const cuda_queue ring = {.ring = 1};
                cuda_matmul_qkv(dy[0], dy[1], dy[2], dx, dw[0], dw[1], dw[2], db[0], db[1], db[2], dnw, eps, T, qr, kr,
                                cols, &ring);
                for (int i = 0; i < 3; i++) {
                    float *got = from_dev(dy[i], (size_t)T * rows[i]);
                    CHECK(!memcmp(got, got_qkv[i], (size_t)T * rows[i] * 4),
                          "qkv part %d %dx%d T=%d normed %d: the ring changed the bits", i, rows[i], cols, T, normed);
                    free(got), free(got_qkv[i]);
                }
                /* gate/up: F rows each */
                bf16 *wg = rand_weights((size_t)F * cols, cols), *wu = rand_weights((size_t)F * cols, cols);
                float *g = malloc((size_t)T * F * 4), *u = malloc((size_t)T * F * 4), *dact = dev_floats((size_t)T * F);
                cpu_matmul(g, xn, wg, NULL, T, F, cols, 0, 2);
                cpu_matmul(u, xn, wu, NULL, T, F, cols, 0, 2);
                cpu_swiglu(g, u, T * F);
                bf16 *dwg = to_dev(wg, (size_t)F * cols * 2), *dwu = to_dev(wu, (size_t)F * cols * 2);
                cuda_matmul_swiglu(dact, dx, dnw, eps, dwg, dwu, T, F, cols, NULL);
                float *got = from_dev(dact, (size_t)T * F), d = max_rel(got, g, (size_t)T * F);
                CHECK(d < 1e-4f, "gate/up swiglu %dx%d T=%d normed %d: relative error %g", F, cols, T, normed, d);
                cuda_matmul_swiglu(dact, dx, dnw, eps, dwg, dwu, T, F, cols, &ring);
                float *got_ring = from_dev(dact, (size_t)T * F);
                CHECK(!memcmp(got_ring, got, (size_t)T * F * 4), "gate/up swiglu %dx%d T=%d normed %d: the ring changed the bits",
                      F, cols, T, normed);
                free(got_ring);
                free(got), free(g), free(u), free(wg), free(wu), free(x), free(xn), free(nw);
                cudaFree(dact), cudaFree(dwg), cudaFree(dwu), cudaFree(dx), cudaFree(dnw);
                for (int i = 0; i < 3; i++) free(w[i]), free(b[i]), free(want[i]), cudaFree(dw[i]), cudaFree(db[i]),
                                            cudaFree(dy[i]);
            }
        }
    }
}

/* The ops only whole models reached before: embedding rows (of given
 * tokens, and of ids a greedy step chose, fed back on the device), bf16
 * rounding, the cuBLASLt GEMM (beyond 8 tokens) with its bias/residual
 * epilogue. */
static void kernel_prefill_ops(void) {
    int T = 37, hidden = 320, vocab = 50, rows = 200;
    /* embed */
    bf16 *table = rand_weights((size_t)vocab * hidden, 1);
    int tokens[37];
    for (int t = 0; t < T; t++) tokens[t] = (t * 7 + 3) % vocab;
    float *want = malloc((size_t)T * hidden * 4);
    for (int t = 0; t < T; t++) cpu_embed(want + (size_t)t * hidden, table, tokens[t], hidden);
    bf16 *dtable = to_dev(table, (size_t)vocab * hidden * 2);
    int *dtok = to_dev(tokens, sizeof tokens);
    float *dx = dev_floats((size_t)T * hidden);
    cuda_embed(dx, dtable, dtok, NULL, NULL, T, hidden, NULL);
    float *got = from_dev(dx, (size_t)T * hidden);
    CHECK(!memcmp(got, want, (size_t)T * hidden * 4), "embed: rows differ from the table's");
    free(got);
    /* rows with from[t] >= 0 take ids[from[t]] (the others their token): every third row from the ids */
    int ids[4] = {41, 7, 19, 0}, from[37];
    for (int t = 0; t < T; t++) {
        from[t] = t % 3 ? -1 : t % 4;
        if (from[t] >= 0) cpu_embed(want + (size_t)t * hidden, table, ids[from[t]], hidden);
    }
    int *dids = to_dev(ids, sizeof ids), *dfrom = to_dev(from, sizeof from);
    cuda_embed(dx, dtable, dtok, dids, dfrom, T, hidden, NULL);
    got = from_dev(dx, (size_t)T * hidden);
    CHECK(!memcmp(got, want, (size_t)T * hidden * 4), "embed from fed-back ids: rows differ from the table's");
    free(got);
    cudaFree(dids), cudaFree(dfrom);
    /* to_bf16, then the GEMM + epilogue against cpu_matmul on the rounded input */
    float *x = rand_floats((size_t)T * hidden, 2), *xr = malloc((size_t)T * hidden * 4);
    memcpy(xr, x, (size_t)T * hidden * 4);
    cpu_round_bf16(xr, (size_t)T * hidden);
    float *dxf = to_dev(x, (size_t)T * hidden * 4);
    bf16_bits *dxb = NULL;
    cudaMalloc((void **)&dxb, (size_t)T * hidden * 2);
    cuda_to_bf16(dxb, dxf, (long)T * hidden, NULL);
    bf16 *xb = malloc((size_t)T * hidden * 2);
    cudaMemcpy(xb, dxb, (size_t)T * hidden * 2, cudaMemcpyDeviceToHost);
    int same = 1;
    for (int i = 0; i < T * hidden; i++) same &= bf16_to_f32(xb[i]) == xr[i];
    CHECK(same, "to_bf16 rounds differently from cpu_round_bf16");
    bf16 *w = rand_weights((size_t)rows * hidden, hidden), *b = rand_weights(rows, 100);
    float *y = rand_floats((size_t)T * rows, 1), *ywant = malloc((size_t)T * rows * 4);
    memcpy(ywant, y, (size_t)T * rows * 4);
    cpu_matmul(ywant, xr, w, b, T, rows, hidden, 1, 2);
    bf16 *dw = to_dev(w, (size_t)rows * hidden * 2), *db = to_dev(b, (size_t)rows * 2);
    float *dacc = dev_floats((size_t)T * rows), *dy = to_dev(y, (size_t)T * rows * 4);
    cuda_gemm *g = cuda_gemm_create();
    CHECK(g != NULL, "cuda_gemm_create");
    if (g) {
        CHECK(cuda_gemm_run(g, dacc, rows, dxb, dw, T, rows, hidden, 0, NULL), "cuBLASLt declined %d x %d x %d", T, rows,
              hidden);
        cuda_bias_residual(dy, dacc, db, T, rows, 1, NULL);
        got = from_dev(dy, (size_t)T * rows);
        float d = max_rel(got, ywant, (size_t)T * rows);
        CHECK(d < 1e-4f, "GEMM + bias + residual T %d: relative error %g", T, d);
        free(got);
        /* the residual in cuBLASLt's epilogue, in place: y += x . w^T; then y = x . w^T over NaNs */
        memcpy(ywant, y, (size_t)T * rows * 4);
        cpu_matmul(ywant, xr, w, NULL, T, rows, hidden, 1, 2);
        cudaMemcpy(dy, y, (size_t)T * rows * 4, cudaMemcpyHostToDevice);
        CHECK(cuda_gemm_run(g, dy, rows, dxb, dw, T, rows, hidden, 1, NULL), "cuBLASLt declined accumulating");
        got = from_dev(dy, (size_t)T * rows);
        d = max_rel(got, ywant, (size_t)T * rows);
        CHECK(d < 1e-4f, "GEMM += in place T %d: relative error %g", T, d);
        free(got);
        cpu_matmul(ywant, xr, w, NULL, T, rows, hidden, 0, 2);
        cudaMemset(dy, 0xff, (size_t)T * rows * 4);
        CHECK(cuda_gemm_run(g, dy, rows, dxb, dw, T, rows, hidden, 0, NULL), "cuBLASLt declined writing");
        got = from_dev(dy, (size_t)T * rows);
        d = max_rel(got, ywant, (size_t)T * rows);
        CHECK(d < 1e-4f, "GEMM = over NaNs T %d: relative error %g", T, d);
        free(got);
        cuda_gemm_free(g);
    }
    cudaFree(dtable), cudaFree(dtok), cudaFree(dx), cudaFree(dxf), cudaFree(dxb), cudaFree(dw), cudaFree(db);
    cudaFree(dacc), cudaFree(dy);
    free(table), free(want), free(x), free(xr), free(xb), free(w), free(b), free(y), free(ywant);
}

/* A paged pool shared by two sequences: a at positions 0..len_a-1, b at
 * 0..len_b-1, their blocks shuffled over the pool (block 0 in neither when
 * spare_block). One tables array holds, in order, `pad` entries that map b's
 * first blocks (a kernel that ignores a table's offset reads the wrong rows
 * instead of faulting), a's table at *off_a and b's at *off_b. */
typedef struct {
    int *tables, n_tables, n_blocks, off_a, off_b;
} two_tables;

static two_tables two_tables_make(int len_a, int len_b, int spare_block) {
    enum { pad = 2 };
    int na = (len_a + CUDA_KV_BLOCK - 1) / CUDA_KV_BLOCK, nb = (len_b + CUDA_KV_BLOCK - 1) / CUDA_KV_BLOCK;
    two_tables tt = {.n_tables = pad + na + nb, .n_blocks = spare_block + na + nb, .off_a = pad, .off_b = pad + na};
    tt.tables = malloc((size_t)tt.n_tables * sizeof *tt.tables);
    int *ids = tt.tables + pad;
    for (int i = 0; i < na + nb; i++) ids[i] = spare_block + i;
    for (int i = na + nb - 1; i > 0; i--) { /* Fisher-Yates on frand */
        int j = (int)((frand() + 1) * 0.5f * (float)(i + 1)) % (i + 1), keep = ids[i];
        ids[i] = ids[j], ids[j] = keep;
    }
    for (int i = 0; i < pad; i++) tt.tables[i] = tt.tables[tt.off_b + i % nb];
    return tt;
}

/* A launch's tokens: a's run at positions pos0.., and for per_token
 * launches the even tokens taken by b at scattered positions 3t + 5 (a
 * batch's tokens of two sequences, positions not consecutive). */
static void two_tables_tokens(const two_tables *tt, int per_token, int T, int pos0, int *pos, int *table) {
    for (int t = 0; t < T; t++) {
        int b = per_token && t % 2 == 0;
        pos[t] = b ? 3 * t + 5 : pos0 + t;
        table[t] = b ? tt->off_b : tt->off_a;
    }
}

/* The device copies of a launch's map: the run (pos0 device-held, a's table
 * at its nonzero offset) or per token. */
typedef struct {
    int *pos0, *pos, *table, *tables;
} map_dev;

static cuda_kv_map map_upload(map_dev *d, const two_tables *tt, int per_token, int T, int pos0, const int *pos,
                              const int *table) {
    d->pos0 = to_dev(&pos0, sizeof pos0), d->pos = to_dev(pos, (size_t)T * sizeof *pos);
    d->table = to_dev(table, (size_t)T * sizeof *table);
    d->tables = to_dev(tt->tables, (size_t)tt->n_tables * sizeof *tt->tables);
    if (per_token) return (cuda_kv_map){.pos = d->pos, .table = d->table, .tables = d->tables};
    return (cuda_kv_map){.run = {d->pos0, d->tables + tt->off_a}};
}

static void map_free(map_dev *d) { cudaFree(d->pos0), cudaFree(d->pos), cudaFree(d->table), cudaFree(d->tables); }

/* q/k norm + RoPE + the bf16 K/V write into the paged pool of two_tables,
 * as a session's run (positions from *pos0) and per token (two sequences'
 * tokens interleaved), with q/k norms (Qwen3) and per token without: q and
 * each token's pool row against the CPU's, and every other row (block 0 in
 * no table among them) still 0. */
static void kernel_kv_store(void) {
    int T = 37, nh = 4, nkv = 2, hd = 64, half = hd / 2, pos0 = 11, qd = nh * hd, kvd = nkv * hd;
    two_tables tt = two_tables_make(pos0 + T, 3 * T + 5, 1);
    size_t pool_vals = (size_t)tt.n_blocks * CUDA_KV_BLOCK * kvd;
    float *q = rand_floats((size_t)T * qd, 1), *k = rand_floats((size_t)T * kvd, 1), *v = rand_floats((size_t)T * kvd, 1);
    float inv_freq[32], cs[32], sn[32];
    for (int i = 0; i < half; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / hd);
    bf16 *qn = rand_weights(hd, 1), *kn = rand_weights(hd, 1);
    float *qwant = malloc((size_t)T * qd * 4), *kwant = malloc((size_t)T * kvd * 4), *vwant = malloc((size_t)T * kvd * 4);
    float *dq = dev_floats((size_t)T * qd), *dk = to_dev(k, (size_t)T * kvd * 4), *dv = to_dev(v, (size_t)T * kvd * 4);
    float *dfreq = to_dev(inv_freq, sizeof inv_freq);
    bf16 *dqn = to_dev(qn, (size_t)hd * 2), *dkn = to_dev(kn, (size_t)hd * 2), *kc = malloc(pool_vals * 2),
         *vc = malloc(pool_vals * 2);
    bf16_bits *dkc = NULL, *dvc = NULL;
    cudaMalloc((void **)&dkc, pool_vals * 2);
    cudaMalloc((void **)&dvc, pool_vals * 2);
    int pos[37], table[37];
    static const char *cases[] = {"run", "per token", "per token, no q/k norm (llama, qwen2), cos and sin x 1.25 (yarn)"};
    for (int c = 0; c < 3; c++) {
        int per_token = c > 0, norms = c < 2;
        float scale = c == 2 ? 1.25f : 1.0f;
        two_tables_tokens(&tt, per_token, T, pos0, pos, table);
        memcpy(qwant, q, (size_t)T * qd * 4), memcpy(kwant, k, (size_t)T * kvd * 4), memcpy(vwant, v, (size_t)T * kvd * 4);
        for (int t = 0; t < T; t++) {
            float *qt = qwant + (size_t)t * qd, *kt = kwant + (size_t)t * kvd;
            for (int h = 0; h < nh && norms; h++) cpu_rmsnorm(qt + (size_t)h * hd, qt + (size_t)h * hd, qn, hd, 1e-6f);
            for (int h = 0; h < nkv && norms; h++) cpu_rmsnorm(kt + (size_t)h * hd, kt + (size_t)h * hd, kn, hd, 1e-6f);
            cpu_rope_angles(cs, sn, inv_freq, scale, half, pos[t]);
            cpu_rope(qt, cs, sn, nh, hd);
            cpu_rope(kt, cs, sn, nkv, hd);
        }
        cpu_round_bf16(kwant, (size_t)T * kvd);
        cpu_round_bf16(vwant, (size_t)T * kvd);
        cudaMemcpy(dq, q, (size_t)T * qd * 4, cudaMemcpyHostToDevice);
        cudaMemset(dkc, 0, pool_vals * 2);
        cudaMemset(dvc, 0, pool_vals * 2);
        map_dev md;
        cuda_kv_map map = map_upload(&md, &tt, per_token, T, pos0, pos, table);
        cuda_qk_rope_store(dq, dk, dv, norms ? dqn : NULL, norms ? dkn : NULL, dfreq, scale, dkc, dvc, map, T, nh, nkv,
                           hd, 1e-6f, NULL);
        const char *how = cases[c];
        float *got = from_dev(dq, (size_t)T * qd), dqerr = max_rel(got, qwant, (size_t)T * qd);
        CHECK(dqerr < 1e-4f, "q norm + rope (%s): relative error %g", how, dqerr);
        free(got);
        cudaMemcpy(kc, dkc, pool_vals * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(vc, dvc, pool_vals * 2, cudaMemcpyDeviceToHost);
        int k_off = 0, v_same = 1, rows_set = 0;
        for (int t = 0; t < T; t++) {
            const int *tab = tt.tables + table[t];
            size_t at = cpu_kv_row(tab, pos[t]) * kvd;
            for (int i = 0; i < kvd; i++) {
                float kw = kwant[(size_t)t * kvd + i];
                /* k went through f32 math in another order: at most one bf16 step apart */
                k_off += fabsf(bf16_to_f32(kc[at + i]) - kw) > 1e-2f * fmaxf(fabsf(kw), 1e-3f);
                v_same &= bf16_to_f32(vc[at + i]) == vwant[(size_t)t * kvd + i];
            }
        }
        for (size_t r = 0; r < pool_vals / kvd; r++) {
            int set = 0;
            for (int i = 0; i < kvd; i++) set |= kc[r * kvd + i] != 0 || vc[r * kvd + i] != 0;
            rows_set += set;
        }
        CHECK(k_off == 0, "k pool (%s): %d values off by more than a bf16 step", how, k_off);
        CHECK(v_same, "v pool (%s): not the bf16 of v at the tokens' rows", how);
        CHECK(rows_set == T, "k/v pool (%s): %d rows written for %d tokens", how, rows_set, T);
        map_free(&md);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dfreq), cudaFree(dqn), cudaFree(dkn), cudaFree(dkc), cudaFree(dvc);
    free(q), free(k), free(v), free(qn), free(kn), free(qwant), free(kwant), free(vwant), free(kc), free(vc);
    free(tt.tables);
}

/* cpu_attention_head with the tensor-core prefill kernel's roundings: the
 * scaled query and each probability exp(s - max) rounded to bf16; their sum
 * and everything else in f32 (kf, vf: the pool's bf16 values as floats). */
static void attention_head_tc(float *out, const float *q, const float *kf, const float *vf, const int *blocks, int pos,
                              int h, int nh, int nkv, int hd, float *scores) {
    int kvh = h / (nh / nkv);
    size_t kvd = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd), qb[256], m = -INFINITY, l = 0;
    for (int c = 0; c < hd; c++) qb[c] = bf16_to_f32(f32_to_bf16(q[(size_t)h * hd + c] * scale));
    for (int j = 0; j <= pos; j++) {
        const float *k = kf + cpu_kv_row(blocks, j) * kvd + kvh * hd;
        float s = 0;
        for (int c = 0; c < hd; c++) s += qb[c] * k[c];
        scores[j] = s, m = fmaxf(m, s);
    }
    for (int c = 0; c < hd; c++) out[(size_t)h * hd + c] = 0;
    for (int j = 0; j <= pos; j++) {
        float p = expf(scores[j] - m), pb = bf16_to_f32(f32_to_bf16(p));
        const float *v = vf + cpu_kv_row(blocks, j) * kvd + kvh * hd;
        l += p;
        for (int c = 0; c < hd; c++) out[(size_t)h * hd + c] += pb * v[c];
    }
    for (int c = 0; c < hd; c++) out[(size_t)h * hd + c] /= l;
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const float *b, size_t n) {
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), w += (double)b[i] * b[i];
    return w > 0 ? sqrt(d / w) : sqrt(d);
}

/* Both attention kernels against cpu_attention_head over the paged bf16
 * pool of two_tables: split-K decode per token (two sequences' tokens
 * interleaved, any T; 130 on the first shape only) and as a's run (a
 * session's decode, T <= 8), the tiled prefill kernel for a's run with 1, 2
 * and 4 query rows per warp; at positions that start mid-cache; GQA groups
 * 1 to 16, head_dim 64 to 256. */
static void kernel_attention(void) {
    /* heads, kv, hd: the last three are head_dim 80 and 96 and groups of 12
     * and 16 heads, more than one pass of the decode kernel's group */
    static const int shapes[][3] = {{24, 8, 128}, {16, 2, 128}, {16, 16, 64}, {8, 4, 256},
                                    {20, 4, 80},  {24, 2, 96},  {16, 1, 256}};
    static const int runs[][2] = {{1, 0}, {1, 700}, {5, 2000}, {8, 31}, {37, 0}, {130, 95}};    /* T, first position */
    static const char *kinds[] = {"decode per token", "decode run", "prefill", "prefill", "prefill"};
    for (int sidx = 0; sidx < (quick ? 1 : (int)(sizeof shapes / sizeof shapes[0])); sidx++) {
        int nh = shapes[sidx][0], nkv = shapes[sidx][1], hd = shapes[sidx][2], kvd = nkv * hd;
        for (int r = 0; r < (quick ? 3 : 6); r++) {
            int T = runs[r][0], pos0 = runs[r][1];
            two_tables tt = two_tables_make(pos0 + T, 3 * T + 5, 0);
            size_t pool_vals = (size_t)tt.n_blocks * CUDA_KV_BLOCK * kvd, out_vals = (size_t)T * nh * hd;
            float *q = rand_floats(out_vals, 1), *kf = malloc(pool_vals * 4), *vf = malloc(pool_vals * 4),
                  *want[2] = {malloc(out_vals * 4), malloc(out_vals * 4)}, *scores = malloc((size_t)(pos0 + 3 * T + 5) * 4);
            int *pos[2], *table[2];
            bf16 *kb = malloc(pool_vals * 2), *vb = malloc(pool_vals * 2);
            for (size_t i = 0; i < pool_vals; i++) {
                kb[i] = f32_to_bf16(2 * frand()), vb[i] = f32_to_bf16(frand());
                kf[i] = bf16_to_f32(kb[i]), vf[i] = bf16_to_f32(vb[i]);
            }
            bf16 *dk = to_dev(kb, pool_vals * 2), *dv = to_dev(vb, pool_vals * 2);
            float *dq = to_dev(q, out_vals * 4), *dout = dev_floats(out_vals);
            map_dev md[2];
            cuda_kv_map map[2]; /* a's run, per token */
            for (int per_token = 0; per_token < 2; per_token++) {
                pos[per_token] = malloc((size_t)T * sizeof(int)), table[per_token] = malloc((size_t)T * sizeof(int));
                two_tables_tokens(&tt, per_token, T, pos0, pos[per_token], table[per_token]);
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < nh; h++)
                        cpu_attention_head(want[per_token] + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kf, vf,
                                           tt.tables + table[per_token][t], pos[per_token][t], h, nh, nkv, hd, scores);
                map[per_token] = map_upload(&md[per_token], &tt, per_token, T, pos0, pos[per_token], table[per_token]);
            }
            /* the tensor-core kernel's rounding, for a run (head_dim a multiple of 16 up to 128) */
            int tc = hd % 16 == 0 && hd <= 128;
            float *want_tc = tc ? malloc(out_vals * 4) : NULL;
            for (int t = 0; tc && t < T; t++)
                for (int h = 0; h < nh; h++)
                    attention_head_tc(want_tc + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kf, vf,
                                      tt.tables + table[0][t], pos[0][t], h, nh, nkv, hd, scores);
            CHECK(cuda_attention_prepare(hd) == 0, "cuda_attention_prepare(%d)", hd);
            float *scratch = dev_floats(cuda_attention_scratch(T, nh, hd));
            for (int kind = 0; kind < 5; kind++) {
                if (kind == 1 && T > 8) continue;
                /* per token, each token's blocks are their own: 37 tokens cover every shape's path, 130 only the
                 * first shape's (three launches of 130 x n_kv blocks a shape: over a minute of make test) */
                if (kind == 0 && T > 64 && sidx > 0) continue;
                int per_token = kind == 0;
                cudaMemset(dout, 0xff, out_vals * 4); /* NaN: unwritten outputs fail */
                if (kind < 2)
                    cuda_attention_decode(dout, dq, dk, dv, scratch, map[per_token], T, nh, nkv, hd,
                                          cuda_attention_splits(T, nkv, 132), NULL, NULL);
                else
                    cuda_attention_prefill(dout, dq, dk, dv, map[0].run, T, nh, nkv, hd, 1 << (kind - 2), NULL);
                float *got = from_dev(dout, out_vals), d = max_rel(got, want[per_token], out_vals);
                CHECK(d < 1e-4f, "attention %s (%d rows per warp) heads %d/%d hd %d T %d at %d: relative error %g",
                      kinds[kind], kind < 2 ? 0 : 1 << (kind - 2), nh, nkv, hd, T, pos0, d);
                if (kind < 2) { /* merged by the last split block, twice (the tickets back at 0): the same bits */
                    int *tickets = NULL;
                    cudaMalloc((void **)&tickets, (size_t)T * nkv * sizeof(int));
                    cudaMemset(tickets, 0, (size_t)T * nkv * sizeof(int));
                    for (int rep = 0; rep < 2; rep++) {
                        cudaMemset(dout, 0xff, out_vals * 4);
                        cuda_attention_decode(dout, dq, dk, dv, scratch, map[per_token], T, nh, nkv, hd,
                                              cuda_attention_splits(T, nkv, 132), tickets, NULL);
                        float *fused = from_dev(dout, out_vals);
                        CHECK(!memcmp(fused, got, out_vals * 4), "attention %s, merged by the last block (run %d): "
                              "other bits than the merge kernel's", kinds[kind], rep + 1);
                        free(fused);
                    }
                    cudaFree(tickets);
                }
                free(got);
            }
            if (tc) { /* a probability may round the other way (2^-8 of it): the largest error bounded, the L2 tight */
                cudaMemset(dout, 0xff, out_vals * 4);
                cuda_attention_prefill(dout, dq, dk, dv, map[0].run, T, nh, nkv, hd, CUDA_ATTENTION_TENSOR_CORES, NULL);
                float *got = from_dev(dout, out_vals), d = max_rel(got, want_tc, out_vals);
                double l2 = rel_l2(got, want_tc, out_vals);
                CHECK(d < 1e-2f && l2 < 1e-4, "attention prefill on tensor cores heads %d/%d hd %d T %d at %d: relative "
                      "error %g, relative L2 %g", nh, nkv, hd, T, pos0, d, l2);
                if (r == 5)
                    printf("  tensor-core prefill heads %d/%d hd %d T %d at %d: against its rounding max %.1e L2 %.1e; "
                           "against f32 max %.1e L2 %.1e\n", nh, nkv, hd, T, pos0, d, l2,
                           max_rel(got, want[0], out_vals), rel_l2(got, want[0], out_vals));
                free(got);
            }
            free(want_tc);
            for (int i = 0; i < 2; i++) map_free(&md[i]), free(want[i]), free(pos[i]), free(table[i]);
            cudaFree(scratch), cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout);
            free(q), free(kf), free(vf), free(scores), free(kb), free(vb), free(tt.tables);
        }
    }
}

/* The two tensor-core expert GEMMs of kernel_moe, each alone against the
 * CPU on the inputs it was given (bf16-rounded x; the GPU's own gate/up
 * outputs rounded for down): dact [T*k, F] and dy [T*k, H] on the device,
 * slot s = t * k + j of expert idx[s]. Only the f32 sums' order differs. */
static void expert_gemms_exact(const float *dact, const float *dy, const float *x, const bf16 *gu, const bf16 *down,
                               const int *idx, int T, int k, int H, int F) {
    size_t slots = (size_t)T * k;
    float *act = from_dev(dact, slots * F), *y = from_dev(dy, slots * H), *want_act = malloc(slots * F * 4),
          *want_y = malloc(slots * H * 4), *xr = malloc((size_t)H * 4), *gbuf = malloc((size_t)2 * F * 4);
    for (size_t s = 0; s < slots; s++) {
        memcpy(xr, x + s / k * H, (size_t)H * 4);
        cpu_round_bf16(xr, H);
        cpu_matmul(gbuf, xr, gu + (size_t)idx[s] * 2 * F * H, NULL, 1, 2 * F, H, 0, 1);
        cpu_swiglu(gbuf, gbuf + F, F);
        memcpy(want_act + s * F, gbuf, (size_t)F * 4);
        memcpy(gbuf, act + s * F, (size_t)F * 4);
        cpu_round_bf16(gbuf, F);
        cpu_matmul(want_y + s * H, gbuf, down + (size_t)idx[s] * H * F, NULL, 1, H, F, 0, 1);
    }
    float da = max_rel(act, want_act, slots * F), dd = max_rel(y, want_y, slots * H);
    CHECK(da < 1e-5f && dd < 1e-5f, "T %d k %d: expert GEMM gate/up %g, down %g against the CPU on its inputs", T, k,
          da, dd);
    free(act), free(y), free(want_act), free(want_y), free(xr), free(gbuf);
}

/* Router, grouping and grouped expert GEMVs against cpu_route and per-token
 * expert MLPs: Qwen1.5-MoE's 60 experts top 4 and Qwen3-MoE's 128 top 8, at
 * reduced widths, T = 1 (decode) to 40 (a prefill chunk); and 8 experts top
 * 2 over 160 tokens, so an expert gets ~40 slots (the GEMV's later passes of
 * 8 and the GEMM's later passes of 32, as in a real 512-token chunk), at
 * hidden 176 (the GEMM's last 128-row block of down part empty, its last
 * 64-column tile of gate/up 48 wide). The tensor-core GEMMs are also
 * checked each alone against the CPU on the same bf16 inputs. */
/* Expert parallel (tensor parallel's MoE): the experts split in two at
 * E / 2, each part grouped, run on its own experts' weights and combined
 * without the residual; the two parts sum to the whole combine (got, with
 * a zero residual), within f32 rounding. The residual flag then adds x. */
static void expert_parallel(const float *dx, const float *dw, const int *didx, const bf16 *dgu, const bf16 *ddown,
                            int T, int k, int E, int H, int F, const float *whole) {
    float *sum = calloc((size_t)T * H, 4), *dact = dev_floats((size_t)T * k * F), *dy = dev_floats((size_t)T * k * H);
    float *dpart = dev_floats((size_t)T * H);
    int *dgroups = NULL;
    cudaMalloc((void **)&dgroups, cuda_moe_group_ints(T, k, E) * sizeof(int));
    for (int p = 0; p < 2; p++) {
        int e0 = p ? E / 2 : 0, n = p ? E - E / 2 : E / 2;
        cudaMemset(dpart, 0xff, (size_t)T * H * 4); /* NaN: the combine must write every element, reading none */
        cuda_moe_group(dgroups, didx, T, k, e0, n, NULL);
        cuda_expert_matmul(dact, dx, dgu + (size_t)e0 * 2 * F * H, dgroups, T, k, n, 2 * F, H, 0, 1, NULL, NULL);
        cuda_expert_matmul(dy, dact, ddown + (size_t)e0 * H * F, dgroups, T, k, n, H, F, 1, 0, NULL, NULL);
        cuda_moe_combine(dpart, dy, dw, didx, e0, n, NULL, dx, NULL, T, k, H, 0, NULL);
        float *part = from_dev(dpart, (size_t)T * H);
        for (size_t i = 0; i < (size_t)T * H; i++) sum[i] += part[i];
        free(part);
    }
    float d = max_rel(sum, whole, (size_t)T * H);
    CHECK(d < 1e-5f, "E %d k %d T %d: two halves of the experts sum to the whole within %g", E, k, T, d);
    cudaFree(dact), cudaFree(dy), cudaFree(dpart), cudaFree(dgroups);
    free(sum);
}

static void kernel_moe(void) {
    static const int shapes[][6] = {/* experts, top k, hidden, expert width, first T, T step */
                                    {60, 4, 256, 96, 1, 13}, {128, 8, 128, 64, 1, 13}, {8, 2, 176, 96, 160, 1}};
    for (int sidx = 0; sidx < 3; sidx++) {
        int E = shapes[sidx][0], k = shapes[sidx][1], H = shapes[sidx][2], F = shapes[sidx][3];
        int T_first = shapes[sidx][4], T_last = T_first == 1 ? 40 : T_first, T_step = quick ? 39 : shapes[sidx][5];
        for (int T = T_first; T <= T_last; T += T_step) {
            bf16 *router = rand_weights((size_t)E * H, H), *gu = rand_weights((size_t)E * 2 * F * H, H),
                 *down = rand_weights((size_t)E * H * F, F);
            float *x = rand_floats((size_t)T * H, 1), *logits = malloc((size_t)E * 4), *want = calloc((size_t)T * H, 4);
            float *gbuf = malloc((size_t)2 * F * 4), *ybuf = malloc((size_t)H * 4);
            int *want_idx = malloc((size_t)T * k * sizeof(int));
            float *want_w = malloc((size_t)T * k * 4);
            for (int t = 0; t < T; t++) {
                cpu_matmul(logits, x + (size_t)t * H, router, NULL, 1, E, H, 0, 1);
                cpu_route(logits, E, k, sidx & 1, want_idx + t * k, want_w + t * k);
                for (int j = 0; j < k; j++) {
                    int e = want_idx[t * k + j];
                    cpu_matmul(gbuf, x + (size_t)t * H, gu + (size_t)e * 2 * F * H, NULL, 1, 2 * F, H, 0, 1);
                    cpu_swiglu(gbuf, gbuf + F, F);
                    cpu_matmul(ybuf, gbuf, down + (size_t)e * H * F, NULL, 1, H, F, 0, 1);
                    for (int i = 0; i < H; i++) want[(size_t)t * H + i] += want_w[t * k + j] * ybuf[i];
                }
            }
            bf16 *drouter = to_dev(router, (size_t)E * H * 2), *dgu = to_dev(gu, (size_t)E * 2 * F * H * 2),
                 *ddown = to_dev(down, (size_t)E * H * F * 2);
            float *dx = to_dev(x, (size_t)T * H * 4), *dw = dev_floats((size_t)T * k), *dlogits = dev_floats((size_t)T * E),
                  *dact = dev_floats((size_t)T * k * F), *dy = dev_floats((size_t)T * k * H), *dout = dev_floats((size_t)T * H);
            int *didx = NULL, *dgroups = NULL;
            cudaMalloc((void **)&didx, (size_t)T * k * sizeof(int));
            cudaMalloc((void **)&dgroups, cuda_moe_group_ints(T, k, E) * sizeof(int));
            cudaMemset(dout, 0, (size_t)T * H * 4);
            cuda_route(didx, dw, dlogits, dx, drouter, T, E, H, k, sidx & 1, NULL);
            cuda_moe_group(dgroups, didx, T, k, 0, E, NULL);
            cuda_expert_matmul(dact, dx, dgu, dgroups, T, k, E, 2 * F, H, 0, 1, NULL, NULL);
            cuda_expert_matmul(dy, dact, ddown, dgroups, T, k, E, H, F, 1, 0, NULL, NULL);
            cuda_moe_combine(dout, dy, dw, didx, 0, E, NULL, dx, NULL, T, k, H, 1, NULL);
            int *got_idx = malloc((size_t)T * k * sizeof(int));
            cudaMemcpy(got_idx, didx, (size_t)T * k * sizeof(int), cudaMemcpyDeviceToHost);
            float *got_w = from_dev(dw, (size_t)T * k), *got = from_dev(dout, (size_t)T * H);
            CHECK(!memcmp(got_idx, want_idx, (size_t)T * k * sizeof(int)), "E %d k %d T %d: routing differs", E, k, T);
            float dwt = max_rel(got_w, want_w, (size_t)T * k), d = max_rel(got, want, (size_t)T * H);
            CHECK(dwt < 1e-5f && d < 1e-4f, "E %d k %d T %d: weights %g, output %g", E, k, T, dwt, d);
            /* the tensor-core path of a prefill chunk: bf16 inputs, so 1e-2 */
            bf16_bits *dxb = NULL;
            cudaMalloc((void **)&dxb, (size_t)T * k * (H > F ? H : F) * 2);
            cudaMemset(dout, 0, (size_t)T * H * 4);
            cuda_to_bf16(dxb, dx, (long)T * H, NULL);
            int tc = cuda_expert_gemm(dact, dxb, dgu, dgroups, T, k, E, 2 * F, H, 0, 1, NULL);
            cuda_to_bf16(dxb, dact, (long)T * k * F, NULL);
            tc = tc && cuda_expert_gemm(dy, dxb, ddown, dgroups, T, k, E, H, F, 1, 0, NULL);
            cuda_moe_combine(dout, dy, dw, didx, 0, E, NULL, dx, NULL, T, k, H, 1, NULL);
            float *got_tc = from_dev(dout, (size_t)T * H), dtc = max_rel(got_tc, want, (size_t)T * H);
            CHECK(tc && dtc < 1e-2f, "E %d k %d T %d: tensor-core expert GEMM %g", E, k, T, dtc);
            free(got_tc);
            /* few tokens: the split's grouping is what it checks. Not under --quick (the race check's run, which
             * paid ~40 s for it): the split runs the same kernels, whose races the whole run checks */
            if (T < 16 && !quick) expert_parallel(dx, dw, didx, dgu, ddown, T, k, E, H, F, got);
            expert_gemms_exact(dact, dy, x, gu, down, want_idx, T, k, H, F);
            cudaFree(dxb);
            cudaFree(drouter), cudaFree(dgu), cudaFree(ddown), cudaFree(dx), cudaFree(dw), cudaFree(dact);
            cudaFree(dy), cudaFree(dout), cudaFree(didx), cudaFree(dgroups), cudaFree(dlogits);
            free(router), free(gu), free(down), free(x), free(logits), free(want), free(gbuf), free(ybuf);
            free(want_idx), free(want_w), free(got_idx), free(got_w), free(got);
        }
    }
}

#endif
