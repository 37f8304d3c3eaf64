/* make test-cuda (needs a GPU): every CUDA kernel against its CPU reference on
 * random inputs at the presets' real shapes, then whole models: the golden
 * fixtures, dense and MoE (logits and 16 greedy tokens against the CPU, two
 * MoE runs bitwise equal), a preset's logits (cosine >= 0.999),
 * skip/repeat/reorder programs, and cached decode against recompute on the
 * GPU. --quick runs a smaller set (for compute-sanitizer).
 * Tolerances: kernels 1e-4 relative to the row's scale (f32 math, other
 * summation order); models against a CPU that rounds where the GPU rounds
 * (TOL_ROUNDED below), with the difference to the f32 CPU printed. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <unistd.h>

#include "../kernels/cpu/ops.h"
#include "../kernels/cuda/ops.h"
#include "../runtime/cuda_gemm.h"
#include "gguf_util.h"
#include "harness.h"
#include "logit_compare.h"
#include "pred_util.h"

static int quick;
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

/* Shapes of the presets' projections: q/o (hidden x hidden), kv, MLP, head rows. */
static void kernel_matmul(void) {
    static const int shapes[][2] = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {3072, 3072},
                                    {11008, 2048}, {4096, 4096}, {12288, 4096}, {100, 72}, {33, 100}};
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
            cuda_matmul(dy, dx, dw, db, T, rows, cols, 1, NULL);
            cudaMemcpy(g, dy, (size_t)T * rows * 4, cudaMemcpyDeviceToHost);
            float d = max_rel(g, y, (size_t)T * rows);
            CHECK(d < 1e-4f, "matmul %dx%d T=%d: relative error %g", rows, cols, T, d);
            cudaFree(dw), cudaFree(db), cudaFree(dx), cudaFree(dy);
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
    cuda_argmax(di, dl, n, NULL);
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
        int *dids, ids[5];
        cudaMalloc((void **)&dids, T * sizeof(int));
        cuda_argmax_rows(dids, drows, T, width, NULL);
        cudaMemcpy(ids, dids, T * sizeof(int), cudaMemcpyDeviceToHost);
        for (int t = 0; t < T; t++)
            CHECK(ids[t] == polar_argmax(x + (size_t)t * width, width), "argmax rows (width %d) row %d: %d, host %d",
                  width, t, ids[t], polar_argmax(x + (size_t)t * width, width));
        cudaFree(drows), cudaFree(dids);
    }
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(du), cudaFree(dl), cudaFree(di);
    free(x), free(want), free(got), free(w), free(u);
}

/* The fused GEMVs (q/k/v in one launch with biases; gate/up with the SwiGLU
 * epilogue) against cpu_matmul + cpu_swiglu, T across the 8-token passes. */
static void kernel_fused_gemv(void) {
    static const int shapes[][3] = {{3072, 1024, 3072}, {2048, 256, 2048}, {96, 40, 72}}; /* q rows, kv rows, cols */
    for (int sidx = 0; sidx < (quick ? 1 : 3); sidx++) {
        int qr = shapes[sidx][0], kr = shapes[sidx][1], cols = shapes[sidx][2], F = 4 * cols;
        for (int T = 1; T <= 11; T += 5) {
            bf16 *w[3] = {rand_weights((size_t)qr * cols, cols), rand_weights((size_t)kr * cols, cols),
                          rand_weights((size_t)kr * cols, cols)};
            bf16 *b[3] = {rand_weights(qr, 10), rand_weights(kr, 10), rand_weights(kr, 10)};
            float *x = rand_floats((size_t)T * cols, 1), *want[3], *dy[3];
            int rows[3] = {qr, kr, kr};
            bf16 *dw[3], *db[3];
            for (int i = 0; i < 3; i++) {
                want[i] = malloc((size_t)T * rows[i] * 4);
                cpu_matmul(want[i], x, w[i], b[i], T, rows[i], cols, 0, 2);
                dw[i] = to_dev(w[i], (size_t)rows[i] * cols * 2), db[i] = to_dev(b[i], (size_t)rows[i] * 2);
                dy[i] = dev_floats((size_t)T * rows[i]);
            }
            float *dx = to_dev(x, (size_t)T * cols * 4);
            cuda_matmul_qkv(dy[0], dy[1], dy[2], dx, dw[0], dw[1], dw[2], db[0], db[1], db[2], T, qr, kr, cols, NULL);
            for (int i = 0; i < 3; i++) {
                float *got = from_dev(dy[i], (size_t)T * rows[i]), d = max_rel(got, want[i], (size_t)T * rows[i]);
                CHECK(d < 1e-4f, "qkv part %d %dx%d T=%d: relative error %g", i, rows[i], cols, T, d);
                free(got);
            }
            /* gate/up: F rows each */
            bf16 *wg = rand_weights((size_t)F * cols, cols), *wu = rand_weights((size_t)F * cols, cols);
            float *g = malloc((size_t)T * F * 4), *u = malloc((size_t)T * F * 4), *dact = dev_floats((size_t)T * F);
            cpu_matmul(g, x, wg, NULL, T, F, cols, 0, 2);
            cpu_matmul(u, x, wu, NULL, T, F, cols, 0, 2);
            cpu_swiglu(g, u, T * F);
            bf16 *dwg = to_dev(wg, (size_t)F * cols * 2), *dwu = to_dev(wu, (size_t)F * cols * 2);
            cuda_matmul_swiglu(dact, dx, dwg, dwu, T, F, cols, NULL);
            float *got = from_dev(dact, (size_t)T * F), d = max_rel(got, g, (size_t)T * F);
            CHECK(d < 1e-4f, "gate/up swiglu %dx%d T=%d: relative error %g", F, cols, T, d);
            free(got), free(g), free(u), free(wg), free(wu), free(x);
            cudaFree(dact), cudaFree(dwg), cudaFree(dwu), cudaFree(dx);
            for (int i = 0; i < 3; i++) free(w[i]), free(b[i]), free(want[i]), cudaFree(dw[i]), cudaFree(db[i]),
                                        cudaFree(dy[i]);
        }
    }
}

/* The ops only whole models reached before: embedding rows, bf16 rounding,
 * the cuBLASLt GEMM (beyond 8 tokens) with its bias/residual epilogue, q/k
 * norm + RoPE + the bf16 write into a paged pool at a device-held position,
 * and the
 * argmax fed back for greedy decoding. */
static void kernel_prefill_ops(void) {
    int T = 37, hidden = 320, vocab = 50, rows = 200, nh = 4, nkv = 2, hd = 64, half = hd / 2, pos0 = 11;
    int qd = nh * hd, kvd = nkv * hd;
    /* embed */
    bf16 *table = rand_weights((size_t)vocab * hidden, 1);
    int tokens[37];
    for (int t = 0; t < T; t++) tokens[t] = (t * 7 + 3) % vocab;
    float *want = malloc((size_t)T * hidden * 4);
    for (int t = 0; t < T; t++) cpu_embed(want + (size_t)t * hidden, table, tokens[t], hidden);
    bf16 *dtable = to_dev(table, (size_t)vocab * hidden * 2);
    int *dtok = to_dev(tokens, sizeof tokens);
    float *dx = dev_floats((size_t)T * hidden);
    cuda_embed(dx, dtable, dtok, T, hidden, NULL);
    float *got = from_dev(dx, (size_t)T * hidden);
    CHECK(!memcmp(got, want, (size_t)T * hidden * 4), "embed: rows differ from the table's");
    free(got);
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
        CHECK(cuda_gemm_run(g, dacc, dxb, dw, T, rows, hidden, NULL), "cuBLASLt declined %d x %d x %d", T, rows, hidden);
        cuda_bias_residual(dy, dacc, db, T, rows, 1, NULL);
        got = from_dev(dy, (size_t)T * rows);
        float d = max_rel(got, ywant, (size_t)T * rows);
        CHECK(d < 1e-4f, "GEMM + bias + residual T %d: relative error %g", T, d);
        free(got);
        cuda_gemm_free(g);
    }
    /* q/k norm + RoPE + pool write at *pos0: the positions' blocks in
     * reverse order, block 0 mapped by none (it must stay 0) */
    float *q = rand_floats((size_t)T * qd, 1), *k = rand_floats((size_t)T * kvd, 1), *v = rand_floats((size_t)T * kvd, 1);
    float inv_freq[32], cs[32], sn[32];
    for (int i = 0; i < half; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / hd);
    bf16 *qn = rand_weights(hd, 1), *kn = rand_weights(hd, 1);
    float *qwant = malloc((size_t)T * qd * 4), *kwant = calloc((size_t)(pos0 + T) * kvd, 4),
          *vwant = calloc((size_t)(pos0 + T) * kvd, 4);
    memcpy(qwant, q, (size_t)T * qd * 4);
    for (int t = 0; t < T; t++) {
        float *qt = qwant + (size_t)t * qd, *kt = kwant + (size_t)(pos0 + t) * kvd;
        memcpy(kt, k + (size_t)t * kvd, (size_t)kvd * 4);
        memcpy(vwant + (size_t)(pos0 + t) * kvd, v + (size_t)t * kvd, (size_t)kvd * 4);
        for (int h = 0; h < nh; h++) cpu_rmsnorm(qt + (size_t)h * hd, qt + (size_t)h * hd, qn, hd, 1e-6f);
        for (int h = 0; h < nkv; h++) cpu_rmsnorm(kt + (size_t)h * hd, kt + (size_t)h * hd, kn, hd, 1e-6f);
        cpu_rope_angles(cs, sn, inv_freq, half, pos0 + t);
        cpu_rope(qt, cs, sn, nh, hd);
        cpu_rope(kt, cs, sn, nkv, hd);
    }
    cpu_round_bf16(kwant, (size_t)(pos0 + T) * kvd);
    cpu_round_bf16(vwant, (size_t)(pos0 + T) * kvd);
    float *dq = to_dev(q, (size_t)T * qd * 4), *dk = to_dev(k, (size_t)T * kvd * 4), *dv = to_dev(v, (size_t)T * kvd * 4);
    float *dfreq = to_dev(inv_freq, sizeof inv_freq);
    bf16 *dqn = to_dev(qn, (size_t)hd * 2), *dkn = to_dev(kn, (size_t)hd * 2);
    int n_blocks = (pos0 + T + CUDA_KV_BLOCK - 1) / CUDA_KV_BLOCK + 1, blocks[4];
    size_t pool_vals = (size_t)n_blocks * CUDA_KV_BLOCK * kvd;
    for (int i = 0; i < n_blocks - 1; i++) blocks[i] = n_blocks - 1 - i;
    bf16_bits *dkc = NULL, *dvc = NULL;
    cudaMalloc((void **)&dkc, pool_vals * 2);
    cudaMalloc((void **)&dvc, pool_vals * 2);
    cudaMemset(dkc, 0, pool_vals * 2);
    cudaMemset(dvc, 0, pool_vals * 2);
    int *dpos = to_dev(&pos0, sizeof pos0), *dblocks = to_dev(blocks, sizeof blocks);
    cuda_kv_map map = {.pos0 = dpos, .tables = dblocks};
    cuda_qk_rope_store(dq, dk, dv, dqn, dkn, dfreq, dkc, dvc, map, T, nh, nkv, hd, 1e-6f, NULL);
    got = from_dev(dq, (size_t)T * qd);
    float dqerr = max_rel(got, qwant, (size_t)T * qd);
    CHECK(dqerr < 1e-4f, "q norm + rope: relative error %g", dqerr);
    free(got);
    bf16 *kc = malloc(pool_vals * 2), *vc = malloc(pool_vals * 2);
    cudaMemcpy(kc, dkc, pool_vals * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(vc, dvc, pool_vals * 2, cudaMemcpyDeviceToHost);
    int k_off = 0, v_same = 1, unmapped_zero = 1;
    for (int j = 0; j < pos0 + T; j++)
        for (int i = 0; i < kvd; i++) {
            size_t at = ((size_t)blocks[j / CUDA_KV_BLOCK] * CUDA_KV_BLOCK + j % CUDA_KV_BLOCK) * kvd + i;
            float kw = kwant[(size_t)j * kvd + i];
            /* k went through f32 math in another order: at most one bf16 step apart */
            k_off += fabsf(bf16_to_f32(kc[at]) - kw) > 1e-2f * fmaxf(fabsf(kw), 1e-3f);
            v_same &= bf16_to_f32(vc[at]) == vwant[(size_t)j * kvd + i];
        }
    for (size_t i = 0; i < (size_t)CUDA_KV_BLOCK * kvd; i++) unmapped_zero &= kc[i] == 0 && vc[i] == 0;
    CHECK(k_off == 0, "k pool: %d values off by more than a bf16 step (rows before %d must stay 0)", k_off, pos0);
    CHECK(v_same, "v pool: not the bf16 of v at positions %d..%d", pos0, pos0 + T - 1);
    CHECK(unmapped_zero, "k/v pool: the block no position maps was written");
    /* argmax fed back: token, ring slot, position and step all advance */
    float logits[300];
    for (int i = 0; i < 300; i++) logits[i] = frand();
    logits[123] = 9, logits[250] = 9;
    float *dl = to_dev(logits, sizeof logits);
    int state[3] = {-1, 40, 5}, *dstate = to_dev(state, sizeof state), *ring = NULL, host_state[3];
    cudaHostAlloc((void **)&ring, 2 * sizeof(int), cudaHostAllocMapped);
    int *dring = NULL;
    if (ring) ring[0] = ring[1] = -1, cudaHostGetDevicePointer((void **)&dring, ring, 0);
    cuda_argmax_feed(dstate, dring, dstate + 1, dstate + 2, dl, 300, NULL);
    cudaDeviceSynchronize();
    cudaMemcpy(host_state, dstate, sizeof host_state, cudaMemcpyDeviceToHost);
    CHECK(host_state[0] == 123 && host_state[1] == 41 && host_state[2] == 6 && ring && ring[1] == 123 && ring[0] == -1,
          "argmax_feed: token %d pos %d step %d ring %d/%d", host_state[0], host_state[1], host_state[2],
          ring ? ring[0] : -2, ring ? ring[1] : -2);
    cudaFreeHost(ring);
    cudaFree(dtable), cudaFree(dtok), cudaFree(dx), cudaFree(dxf), cudaFree(dxb), cudaFree(dw), cudaFree(db);
    cudaFree(dacc), cudaFree(dy), cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dfreq), cudaFree(dqn);
    cudaFree(dkn), cudaFree(dkc), cudaFree(dvc), cudaFree(dpos), cudaFree(dblocks), cudaFree(dl), cudaFree(dstate);
    free(table), free(want), free(x), free(xr), free(xb), free(w), free(b), free(y), free(ywant), free(q), free(k);
    free(v), free(qn), free(kn), free(qwant), free(kwant), free(vwant), free(kc), free(vc);
}

/* Both attention kernels against cpu_attention_head over the same paged
 * bf16 pool, its blocks in reverse order: split-K decode with a table per
 * token (a batch's tokens, any T) and as one sequence's run (a session's
 * decode, T <= 8), the tiled prefill kernel for a run with 1, 2 and 4 query
 * rows per warp; at positions that start mid-cache; GQA groups 1 to 16,
 * head_dim 64 to 256. */
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
            int T = runs[r][0], pos0 = runs[r][1], n_blocks = (pos0 + T + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK;
            size_t pool_vals = (size_t)n_blocks * CPU_KV_BLOCK * kvd;
            float *q = rand_floats((size_t)T * nh * hd, 1), *kf = malloc(pool_vals * 4), *vf = malloc(pool_vals * 4),
                  *want = malloc((size_t)T * nh * hd * 4), *scores = malloc((size_t)(pos0 + T) * 4);
            int *blocks = malloc((size_t)n_blocks * sizeof *blocks), *pos = malloc((size_t)T * sizeof *pos),
                *table = calloc((size_t)T, sizeof *table); /* every token's table at offset 0 */
            for (int b = 0; b < n_blocks; b++) blocks[b] = n_blocks - 1 - b;
            for (int t = 0; t < T; t++) pos[t] = pos0 + t;
            bf16 *kb = malloc(pool_vals * 2), *vb = malloc(pool_vals * 2);
            for (size_t i = 0; i < pool_vals; i++) {
                kb[i] = f32_to_bf16(2 * frand()), vb[i] = f32_to_bf16(frand());
                kf[i] = bf16_to_f32(kb[i]), vf[i] = bf16_to_f32(vb[i]);
            }
            for (int t = 0; t < T; t++)
                for (int h = 0; h < nh; h++)
                    cpu_attention_head(want + (size_t)t * nh * hd, q + (size_t)t * nh * hd, kf, vf, blocks, pos0 + t, h,
                                       nh, nkv, hd, scores);
            bf16 *dk = to_dev(kb, pool_vals * 2), *dv = to_dev(vb, pool_vals * 2);
            float *dq = to_dev(q, (size_t)T * nh * hd * 4), *dout = dev_floats((size_t)T * nh * hd);
            int *dpos0 = to_dev(&pos0, sizeof pos0), *dblocks = to_dev(blocks, (size_t)n_blocks * sizeof *blocks),
                *dpos = to_dev(pos, (size_t)T * sizeof *pos), *dtable = to_dev(table, (size_t)T * sizeof *table);
            cuda_kv_map run = {.pos0 = dpos0, .tables = dblocks}, per_token = {.pos = dpos, .table = dtable, .tables = dblocks};
            CHECK(cuda_attention_prepare(hd) == 0, "cuda_attention_prepare(%d)", hd);
            float *scratch = dev_floats(cuda_attention_scratch(T, nh, hd));
            for (int kind = 0; kind < 5; kind++) {
                if (kind == 1 && T > 8) continue;
                cudaMemset(dout, 0xff, (size_t)T * nh * hd * 4); /* NaN: unwritten outputs fail */
                if (kind < 2)
                    cuda_attention_decode(dout, dq, dk, dv, scratch, kind ? run : per_token, T, nh, nkv, hd,
                                          cuda_attention_splits(T, nkv, 132), NULL);
                else
                    cuda_attention_prefill(dout, dq, dk, dv, run, T, nh, nkv, hd, 1 << (kind - 2), NULL);
                float *got = from_dev(dout, (size_t)T * nh * hd), d = max_rel(got, want, (size_t)T * nh * hd);
                CHECK(d < 1e-4f, "attention %s (%d rows per warp) heads %d/%d hd %d T %d at %d: relative error %g",
                      kinds[kind], kind < 2 ? 0 : 1 << (kind - 2), nh, nkv, hd, T, pos0, d);
                free(got);
            }
            cudaFree(scratch), cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dpos0);
            cudaFree(dblocks), cudaFree(dpos), cudaFree(dtable);
            free(q), free(kf), free(vf), free(want), free(scores), free(blocks), free(pos), free(table), free(kb), free(vb);
        }
    }
}

/* Router, grouping and grouped expert GEMVs against cpu_route and per-token
 * expert MLPs: Qwen1.5-MoE's 60 experts top 4 and Qwen3-MoE's 128 top 8, at
 * reduced widths, T = 1 (decode) to 40 (a prefill chunk); and 8 experts top
 * 2 over 120 tokens, so an expert gets ~30 slots (the GEMV's later passes of
 * 8 and the GEMM's later passes of 16, as in a real 512-token chunk). */
static void kernel_moe(void) {
    static const int shapes[][6] = {/* experts, top k, hidden, expert width, first T, T step */
                                    {60, 4, 256, 96, 1, 13}, {128, 8, 128, 64, 1, 13}, {8, 2, 128, 96, 120, 1}};
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
            cuda_moe_group(dgroups, didx, T, k, E, NULL);
            cuda_expert_matmul(dact, dx, dgu, dgroups, T, k, E, 2 * F, H, 0, 1, NULL);
            cuda_expert_matmul(dy, dact, ddown, dgroups, T, k, E, H, F, 1, 0, NULL);
            cuda_moe_combine(dout, dy, dw, NULL, dx, NULL, T, k, H, NULL);
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
            cuda_moe_combine(dout, dy, dw, NULL, dx, NULL, T, k, H, NULL);
            float *got_tc = from_dev(dout, (size_t)T * H), dtc = max_rel(got_tc, want, (size_t)T * H);
            CHECK(tc && dtc < 1e-2f, "E %d k %d T %d: tensor-core expert GEMM %g", E, k, T, dtc);
            free(got_tc);
            cudaFree(dxb);
            cudaFree(drouter), cudaFree(dgu), cudaFree(ddown), cudaFree(dx), cudaFree(dw), cudaFree(dact);
            cudaFree(dy), cudaFree(dout), cudaFree(didx), cudaFree(dgroups), cudaFree(dlogits);
            free(router), free(gu), free(down), free(x), free(logits), free(want), free(gbuf), free(ybuf);
            free(want_idx), free(want_w), free(got_idx), free(got_w), free(got);
        }
    }
}

/* Whole models: a CUDA session against two CPU sessions on the same weights
 * and program. The tight reference rounds where the GPU rounds
 * (round_like_cuda: bf16 K/V, bf16 GEMM inputs in chunks of more than 8
 * tokens). Prompts of up to 8 tokens run the GEMV path, which rounds only the
 * K/V it stores: logits within TOL_ROUNDED. Longer prompts round every GEMM
 * input to bf16 after an f32 sum that cuBLASLt orders differently from the
 * CPU. Two orders of a sum of K random-sign products differ by ~1e-4
 * relative at K in the thousands, so a few percent of the values land one
 * bf16 ulp (2^-8 relative) apart and the flips propagate: on an H100
 * (2026-11-23) the golden models' 40-token prompts ranged from 1e-7 (no flip)
 * to 4.5e-3 relative L2 and the 3B preset's 24 tokens reached 8.5e-3, about
 * the f32 reference's distance. For them the bound is on the relative L2
 * error (TOL_REL_GEMM) and on TOL_GEMM_MAX; greedy tokens must agree either
 * way. The f32 reference (the math of transformers in f32) is reported as
 * a measured figure. */
/* (TOL_ROUNDED, TOL_REL_GEMM and TOL_GEMM_MAX are in logit_compare.h.) */

/* The GPU running gm against the CPU running cm (the same weights: gm
 * itself, or a GGUF's blocks loaded as the bf16 the GPU uploads them as).
 * strict: assert the rounded reference's bound and greedy tokens (golden
 * models); otherwise (random-weight presets, whose near-uniform logits make
 * greedy ties) assert cosine >= 0.999 against f32 and the bound. */
static void compare_models(const polar_model *gm, const polar_model *cm, const char *program, int n_prompt, int steps,
                           int strict) {
    const polar_model *m = cm;
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab;
    polar_program p;
    CHECK_OK(polar_program_parse(program, info.arch.n_layers, 0, &p, &err));
    polar_session *s[3] = {NULL, NULL, NULL}; /* GPU, CPU rounding like it, CPU f32 */
    polar_session_opts o[3] = {{.max_ctx = n_prompt + steps, .device = POLAR_DEVICE_CUDA},
                               {.max_ctx = n_prompt + steps, .device = POLAR_DEVICE_CPU, .round_like_cuda = 1},
                               {.max_ctx = n_prompt + steps, .device = POLAR_DEVICE_CPU}};
    for (int i = 0; i < 3; i++) CHECK_OK(polar_session_create(i ? cm : gm, &p, &o[i], &s[i], &err));
    int *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 7919 + 13) % V;
    float *l[3];
    int out[3][64], same[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) l[i] = malloc((size_t)n_prompt * V * 4);
    if (s[0] && s[1] && s[2]) {
        polar_gen_opts go = {.max_new = steps, .ignore_eos = 1};
        for (int i = 0; i < 3; i++) {
            CHECK_OK(polar_prefill(s[i], prompt, n_prompt, l[i], &err));
            CHECK_OK(polar_generate(s[i], prompt, n_prompt, &go, out[i], NULL, NULL, NULL, &err));
        }
        for (int i = 1; i < 3; i++)
            while (same[i] < steps && out[0][same[i]] == out[i][same[i]]) same[i]++;
        double cos_r, cos_f, rel_r, rel_f;
        float dr = max_abs_diff(l[0], l[1], (size_t)n_prompt * V, &cos_r, &rel_r);
        float df = max_abs_diff(l[0], l[2], (size_t)n_prompt * V, &cos_f, &rel_f);
        if (n_prompt <= GEMV_PROMPT_TOKENS)
            CHECK(dr <= TOL_ROUNDED, "%s, %d tokens: max |logit diff| to the rounded CPU %g > %g", program, n_prompt,
                  dr, TOL_ROUNDED);
        else
            CHECK(rel_r <= TOL_REL_GEMM && dr <= TOL_GEMM_MAX,
                  "%s, %d tokens: logits to the rounded CPU: relative L2 %g (bound %g), max diff %g (bound %g)",
                  program, n_prompt, rel_r, TOL_REL_GEMM, dr, TOL_GEMM_MAX);
        if (strict) CHECK(same[1] == steps, "%s: greedy tokens agree with the rounded CPU for %d of %d", program,
                          same[1], steps);
        else CHECK(cos_f >= 0.999, "%s: cosine to the f32 CPU %f", program, cos_f);
        printf("  %-18s %4d tok: rounded CPU max %.2e rel %.1e (%2d/%d tok) | f32 CPU max %.2e rel %.1e (%2d/%d tok)\n",
               program, n_prompt, dr, rel_r, same[1], steps, df, rel_f, same[2], steps);
    }
    for (int i = 0; i < 3; i++) free(l[i]), polar_session_free(s[i]);
    free(prompt);
    polar_program_free(&p);
}

static void compare_model(const polar_model *m, const char *program, int n_prompt, int steps, int strict) {
    compare_models(m, m, program, n_prompt, steps, strict);
}

/* Every golden architecture and program, with a 7-token prompt (decode
 * GEMVs and split-K attention) and a 40-token one (cuBLASLt, the tiled
 * prefill attention, the expert GEMM, the head in slices of 32 and 8). */
static void model_golden(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe"};
    static const char *programs[] = {"base", "0,3", "0,1-2x2,3", "0,2-3x2", "0,2,1,3"};
    for (int i = 0; i < 5; i++) {
        char dir[128];
        snprintf(dir, sizeof dir, GOLDEN_DIR "/%s", archs[i]);
        polar_error err;
        polar_model *m = NULL;
        CHECK_OK(polar_model_load(dir, &m, &err));
        for (int p = 0; m && p < (quick ? 1 : 5); p++)
            for (int n = 7; n <= 40; n += 33) compare_model(m, programs[p], n, 16, 1);
        polar_model_free(m);
    }
}

/* A prompt longer than a CUDA chunk: 512 tokens through the GEMMs, then 4
 * through the GEMVs at a nonzero start, against the rounded CPU. */
static void model_long_prompt(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen3", &m, &err));
    if (!m) return;
    compare_model(m, "0-1x2,2-3", 516, 8, 1);
    polar_model_free(m);
}

static void model_preset(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_preset(quick ? "llama-3.2-1b" : "llama-3.2-3b", &a, &err));
    CHECK_OK(polar_model_random(&a, 1, &m, &err));
    if (!m) return;
    compare_model(m, "base", 24, 4, 0);
    if (!quick) compare_model(m, "0-9,12-27", 24, 4, 0), compare_model(m, "0-13,10-13,14-27", 24, 4, 0);
    polar_model_free(m);
}

/* Qwen2-MoE (6 layers: shared expert, dense layers between MoE ones): two
 * identical GPU runs give bitwise identical logits, for a 7-token prompt
 * (expert GEMVs) and a 40-token one (expert GEMM, cuBLASLt shared expert). */
static void model_moe_deterministic(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2_moe", &m, &err));
    if (!m) return;
    polar_program p;
    CHECK_OK(polar_program_parse("0-1,5,1x2,4-5", 6, 0, &p, &err));
    for (int n = 7; n <= 40; n += 33) {
        float *runs[2];
        int prompt[40];
        for (int i = 0; i < n; i++) prompt[i] = (i * 37 + 17) % 256;
        for (int r = 0; r < 2; r++) {
            polar_session *s = NULL;
            polar_session_opts o = {.max_ctx = 64, .device = POLAR_DEVICE_CUDA};
            runs[r] = malloc((size_t)n * 256 * sizeof(float));
            CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
            if (s) CHECK_OK(polar_prefill(s, prompt, n, runs[r], &err));
            polar_session_free(s);
        }
        CHECK(memcmp(runs[0], runs[1], (size_t)n * 256 * sizeof(float)) == 0,
              "%d tokens: two GPU runs differ", n);
        free(runs[0]), free(runs[1]);
    }
    polar_program_free(&p);
    polar_model_free(m);
}

/* One GPU session switching among 11 programs, more than the 8 decode graphs
 * a session keeps, so graphs are evicted and re-captured: every generation
 * equals the CPU's, and device memory stays flat once the cache is full. */
static void graph_recapture(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    static const char *texts[] = {"base", "0,1-2x2,3", "3,0x2,2", "0-3x2", "1-3",    "0,2",
                                  "0-2,3x2", "3,2,1,0", "0x3,1-3", "2-3",   "0-1,3"};
    enum { N_PROGS = sizeof texts / sizeof texts[0], ROUNDS = 3 * N_PROGS };
    polar_program progs[N_PROGS];
    for (int i = 0; i < N_PROGS; i++) CHECK_OK(polar_program_parse(texts[i], 4, 0, &progs[i], &err));
    polar_session *g = NULL, *c = NULL;
    polar_session_opts og = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CUDA};
    polar_session_opts oc = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CPU, .round_like_cuda = 1};
    CHECK_OK(polar_session_create(m, &progs[0], &og, &g, &err));
    CHECK_OK(polar_session_create(m, &progs[0], &oc, &c, &err));
    int prompt[4] = {1, 2, 3, 4}, a[12], b[12];
    polar_gen_opts go = {.max_new = 12, .ignore_eos = 1};
    size_t free_before = 0, free_after = 0, total;
    for (int round = 0; g && c && round < ROUNDS; round++) {
        int i = round % N_PROGS;
        CHECK_OK(polar_session_set_program(g, &progs[i], &err));
        CHECK_OK(polar_session_set_program(c, &progs[i], &err));
        CHECK_OK(polar_generate(g, prompt, 4, &go, a, NULL, NULL, NULL, &err));
        CHECK_OK(polar_generate(c, prompt, 4, &go, b, NULL, NULL, NULL, &err));
        CHECK(!memcmp(a, b, sizeof a), "round %d (%s): GPU tokens differ from the CPU's", round, texts[i]);
        if (round == N_PROGS) cudaMemGetInfo(&free_before, &total);
    }
    cudaMemGetInfo(&free_after, &total);
    CHECK(free_after + (1 << 20) >= free_before, "device memory fell by %zu bytes over %d evicting re-captures",
          free_before - free_after, ROUNDS - N_PROGS - 1);
    polar_session_free(g);
    polar_session_free(c);
    for (int i = 0; i < N_PROGS; i++) polar_program_free(&progs[i]);
    polar_model_free(m);
}

/* Greedy decoding fed on the device stops where the CPU stops (a stop id
 * met mid-way, so the step queued after it is wasted and the last counted
 * step re-run) and leaves the session as the CPU's: position and logits. */
static void greedy_stop(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2", &m, &err));
    if (!m) return;
    polar_program p;
    CHECK_OK(polar_program_parse("0-1x2,2-3", 4, 0, &p, &err));
    polar_session *s[2] = {NULL, NULL};
    polar_session_opts o[2] = {{.max_ctx = 32, .device = POLAR_DEVICE_CPU, .round_like_cuda = 1},
                               {.max_ctx = 32, .device = POLAR_DEVICE_CUDA}};
    for (int i = 0; i < 2; i++) CHECK_OK(polar_session_create(m, &p, &o[i], &s[i], &err));
    int prompt[5] = {9, 41, 7, 200, 13}, free_run[12], out[2][12];
    polar_gen_opts go = {.max_new = 12, .ignore_eos = 1};
    if (s[0] && s[1]) CHECK_OK(polar_generate(s[0], prompt, 5, &go, free_run, NULL, NULL, NULL, &err));
    for (int stop_at = 0; s[0] && s[1] && stop_at < 12; stop_at += 5) {
        int stop = free_run[stop_at], first = 0;
        while (free_run[first] != stop) first++; /* the id may come earlier too */
        polar_gen_opts so = {.max_new = 12, .stop = &stop, .n_stop = 1};
        polar_gen_stats st[2];
        for (int i = 0; i < 2; i++) CHECK_OK(polar_generate(s[i], prompt, 5, &so, out[i], &st[i], NULL, NULL, &err));
        CHECK(st[0].n_generated == first + 1 && st[1].n_generated == first + 1 && st[1].stopped_at_eos,
              "stop at %d: generated %d (cpu) and %d (gpu)", first, st[0].n_generated, st[1].n_generated);
        CHECK(!memcmp(out[0], out[1], (size_t)st[0].n_generated * sizeof(int)), "stop at %d: tokens differ", first);
        CHECK(polar_session_pos(s[0]) == polar_session_pos(s[1]), "stop at %d: position %d (cpu) vs %d (gpu)", first,
              polar_session_pos(s[0]), polar_session_pos(s[1]));
        float d = 0;
        for (int i = 0; i < 256; i++) d = fmaxf(d, fabsf(polar_logits(s[0])[i] - polar_logits(s[1])[i]));
        CHECK(d < TOL_ROUNDED, "stop at %d: logits after generate differ by %g", first, d);
    }
    for (int i = 0; i < 2; i++) polar_session_free(s[i]);
    polar_program_free(&p);
    polar_model_free(m);
}

/* Two CUDA sessions of one model share its device weights: the second
 * costs its KV cache and workspaces only, and both compute the same. */
static void shared_weights(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_preset("llama-3.2-1b", &a, &err));
    CHECK_OK(polar_model_random(&a, 3, &m, &err));
    if (!m) return;
    polar_model_info info;
    polar_model_info_get(m, &info);
    polar_program p;
    CHECK_OK(polar_program_base(a.n_layers, &p, &err));
    polar_session_opts o = {.max_ctx = 64, .device = POLAR_DEVICE_CUDA};
    polar_session *s[2] = {NULL, NULL};
    size_t free0, free1, free2, total;
    cudaMemGetInfo(&free0, &total);
    CHECK_OK(polar_session_create(m, &p, &o, &s[0], &err));
    cudaMemGetInfo(&free1, &total);
    CHECK_OK(polar_session_create(m, &p, &o, &s[1], &err));
    cudaMemGetInfo(&free2, &total);
    CHECK(free0 - free1 >= info.weight_bytes && free1 - free2 < info.weight_bytes / 4,
          "first session took %zu MiB, second %zu MiB (weights %zu MiB)", (free0 - free1) >> 20, (free1 - free2) >> 20,
          (size_t)info.weight_bytes >> 20);
    int prompt[6] = {1, 7, 99, 1000, 5, 42};
    float *l[2] = {malloc((size_t)a.vocab * 4), malloc((size_t)a.vocab * 4)};
    for (int i = 0; s[0] && s[1] && i < 2; i++) {
        CHECK_OK(polar_prefill(s[i], prompt, 6, NULL, &err));
        memcpy(l[i], polar_logits(s[i]), (size_t)a.vocab * 4);
    }
    CHECK(!memcmp(l[0], l[1], (size_t)a.vocab * 4), "two sessions on shared weights differ");
    free(l[0]), free(l[1]);
    for (int i = 0; i < 2; i++) polar_session_free(s[i]);
    polar_program_free(&p);
    polar_model_free(m);
}

/* The fused predictor kernel against the CPU reference (f32 both). */
static void predictor_fused(void) {
    static const int cases[][2] = {{28, 7}, {36, 300}};
    for (int c = 0; c < 2; c++) {
        int D = cases[c][0], T = cases[c][1], dq = 1024;
        char path[] = "/tmp/polar-cuda-pred.safetensors";
        polar_error err;
        polar_predictor *p = NULL;
        CHECK(write_predictor(path, D, dq, NULL, NULL) == POLAR_OK, "write predictor");
        CHECK_OK(polar_predictor_load(path, &p, &err));
        if (!p) continue;
        float *h = malloc((size_t)T * dq * sizeof *h), seg[2][64], op[2][192];
        weight_value("H", (size_t)T * dq, 1.0, 0.0, h);
        CHECK_OK(polar_predict_logits(p, h, T, seg[0], op[0], &err));
        CHECK_OK(polar_predictor_use_device(p, POLAR_DEVICE_CUDA, &err));
        CHECK_OK(polar_predict_logits(p, h, T, seg[1], op[1], &err));
        float d = 0;
        for (int i = 0; i < D; i++) d = fmaxf(d, fabsf(seg[0][i] - seg[1][i]));
        for (int i = 0; i < 3 * D; i++) d = fmaxf(d, fabsf(op[0][i] - op[1][i]));
        CHECK(d < 1e-4f, "D %d T %d: fused kernel vs CPU: %g", D, T, d);
        printf("  predictor D %d T %d: max |logit diff| %.2e\n", D, T, d);
        free(h);
        polar_predictor_free(p);
    }
}

/* Several threads on one GPU at once: one switches programs (each switch
 * captures or replays a decode graph) while one creates, uses and frees
 * sessions of another model and one uploads and runs predictors. With
 * blocking streams, a capture on one thread broke the others' synchronous
 * copies. Each job hashes what it computed; run together, every job must
 * compute exactly what it computed alone. */
typedef struct {
    int kind; /* 0 switcher, 1 session churn, 2 predictor */
    const polar_model *m;
    const char *pred_path;
    uint64_t hash;
    polar_status st;
    polar_error err;
} gpu_job;

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001B3ull;
    return h;
}

static void *run_gpu_job(void *arg) {
    gpu_job *j = arg;
    static const char *texts[] = {"base", "0,1-2x2,3", "3,0x2,2", "0-3x2", "1-3", "0,2", "0-2,3x2", "3,2,1,0",
                                  "0x3,1-3", "2-3", "0-1,3"};
    int prompt[5] = {3, 14, 15, 92, 65}, out[8];
    polar_gen_opts go = {.max_new = 8, .ignore_eos = 1};
    polar_session_opts so = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CUDA};
    j->hash = 0xcbf29ce484222325ull;
    j->st = POLAR_OK;
    for (int r = 0; j->st == POLAR_OK && r < 22; r++) {
        polar_program p = {0};
        polar_session *s = NULL;
        polar_predictor *pred = NULL;
        if (j->kind == 0 || j->kind == 1) {
            const char *text = j->kind == 0 ? texts[r % 11] : "base";
            if ((j->st = polar_program_parse(text, 4, 0, &p, &j->err)) == POLAR_OK &&
                (j->st = polar_session_create(j->m, &p, &so, &s, &j->err)) == POLAR_OK &&
                (j->st = polar_generate(s, prompt, 5, &go, out, NULL, NULL, NULL, &j->err)) == POLAR_OK)
                j->hash = hash_bytes(j->hash, out, sizeof out);
        } else if (r < 8) {
            float h[7 * 1024], seg[28], op[84];
            weight_value("H", 7 * 1024, 1.0, 0.0, h);
            if ((j->st = polar_predictor_load(j->pred_path, &pred, &j->err)) == POLAR_OK &&
                (j->st = polar_predictor_use_device(pred, POLAR_DEVICE_CUDA, &j->err)) == POLAR_OK &&
                (j->st = polar_predict_logits(pred, h, 7, seg, op, &j->err)) == POLAR_OK)
                j->hash = hash_bytes(hash_bytes(j->hash, seg, sizeof seg), op, sizeof op);
        }
        polar_predictor_free(pred);
        polar_session_free(s);
        polar_program_free(&p);
    }
    return NULL;
}

static void threads_share_gpu(void) {
    polar_error err;
    polar_model *m[2] = {NULL, NULL};
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m[0], &err));
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2", &m[1], &err));
    char path[] = "/tmp/polar-cuda-threads-pred.safetensors";
    CHECK(write_predictor(path, 28, 1024, NULL, NULL) == POLAR_OK, "write predictor");
    if (!m[0] || !m[1]) return;
    gpu_job jobs[3] = {{.kind = 0, .m = m[0]}, {.kind = 1, .m = m[1]}, {.kind = 2, .pred_path = path}};
    uint64_t alone[3];
    for (int i = 0; i < 3; i++) {
        run_gpu_job(&jobs[i]);
        CHECK(jobs[i].st == POLAR_OK, "job %d alone: %s", i, jobs[i].err.msg);
        alone[i] = jobs[i].hash;
    }
    pthread_t th[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&th[i], NULL, run_gpu_job, &jobs[i]) == 0, "pthread_create");
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    static const char *names[] = {"program switcher", "session churn", "predictor upload"};
    for (int i = 0; i < 3; i++) {
        CHECK(jobs[i].st == POLAR_OK, "%s beside the others: %s", names[i], jobs[i].err.msg);
        CHECK(jobs[i].hash == alone[i], "%s beside the others computed something else than alone", names[i]);
    }
    polar_model_free(m[0]);
    polar_model_free(m[1]);
}

/* Cached decode on the GPU equals a fresh prefill on the GPU. */
static void gpu_cache_consistency(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen3", &m, &err));
    if (!m) return;
    polar_program p;
    CHECK_OK(polar_program_parse("0-1x2,2-3", 4, 0, &p, &err));
    polar_session *a = NULL, *b = NULL;
    polar_session_opts o = {.max_ctx = 32, .device = POLAR_DEVICE_CUDA};
    CHECK_OK(polar_session_create(m, &p, &o, &a, &err));
    CHECK_OK(polar_session_create(m, &p, &o, &b, &err));
    int seq[32] = {5, 17, 99, 3, 250};
    int n = 5;
    /* The recompute goes in pieces of at most 8 tokens, so both sides run
     * the decode kernels on f32 activations (only the summation order of
     * the attention splits differs): 1e-4. */
    float worst = 0;
    if (a && b) CHECK_OK(polar_prefill(a, seq, n, NULL, &err));
    for (int step = 0; a && b && step < 10; step++) {
        seq[n] = polar_argmax(polar_logits(a), 256);
        CHECK_OK(polar_decode_step(a, seq[n++], &err));
        polar_session_reset(b);
        for (int i = 0; i < n; i += 8) CHECK_OK(polar_prefill(b, seq + i, n - i < 8 ? n - i : 8, NULL, &err));
        for (int i = 0; i < 256; i++) worst = fmaxf(worst, fabsf(polar_logits(a)[i] - polar_logits(b)[i]));
    }
    CHECK(worst < 1e-4f, "GPU cached vs recomputed: %g", worst);
    polar_session_free(a);
    polar_session_free(b);
    polar_program_free(&p);
    polar_model_free(m);
}

/* GGUF blocks on the GPU: a random Llama and Qwen2-MoE written as Q8_0
 * (projections, embedding, expert stacks and shared expert), loaded kept in
 * their blocks (interleaved where the CPU level runs that) for the GPU,
 * which dequantizes them at upload, and as bf16 for the CPU reference: the
 * same weights, so the bounds of the golden models hold. */
static void model_gguf_blocks(void) {
    static const char *archs[] = {"llama", "qwen2_moe"};
    for (int i = 0; i < 2; i++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL, *q = NULL, *b = NULL;
        CHECK_OK(polar_arch_default(archs[i], &a, &err));
        if (a.n_experts) a.moe_ffn = 64, a.shared_ffn = 96; /* whole 32-blocks in every stack */
        CHECK_OK(polar_model_random(&a, 3, &m, &err));
        char path[64];
        snprintf(path, sizeof path, "/tmp/polar-cuda-gguf-%d.gguf", (int)getpid());
        CHECK(m && gguf_write_model(m, path, GGUF_Q8_0_FILE), "write %s", path);
        CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
        unlink(path);
        if (q && b) {
            CHECK(q->quantized && !b->quantized, "%s: kept in blocks for the GPU, bf16 for the CPU", archs[i]);
            /* the upload dequantizes to the bf16 load's weights: the GPU gives the same bits from either */
            polar_program p;
            polar_session *s[2] = {NULL, NULL};
            polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
            CHECK_OK(polar_program_base(a.n_layers, &p, &err));
            CHECK_OK(polar_session_create(q, &p, &o, &s[0], &err));
            CHECK_OK(polar_session_create(b, &p, &o, &s[1], &err));
            int toks[5] = {3, 1, 4, 1, 5};
            for (int j = 0; j < 2; j++)
                if (s[j]) CHECK_OK(polar_prefill(s[j], toks, 5, NULL, &err));
            if (s[0] && s[1])
                CHECK(!memcmp(polar_logits(s[0]), polar_logits(s[1]), (size_t)a.vocab * sizeof(float)),
                      "%s: GPU logits from the blocks differ from those of the bf16 load", archs[i]);
            for (int j = 0; j < 2; j++) polar_session_free(s[j]);
            polar_program_free(&p);
            compare_models(q, b, "base", 7, 8, 1);
            if (!quick) compare_models(q, b, "0,1-2x2,3", 40, 8, 1);
        }
        polar_model_free(m);
        polar_model_free(q);
        polar_model_free(b);
    }
}

static char **only;
static int n_only;

static int wanted(const char *name) {
    for (int i = 0; i < n_only; i++)
        if (!strcmp(only[i], name)) return 1;
    return n_only == 0;
}

#define RUN_IF(fn)                                                         \
    do {                                                                   \
        if (wanted(#fn)) RUN(fn);                                          \
    } while (0)

int main(int argc, char **argv) {
    /* [--quick] [names...]: a smaller set; only the named tests (e.g. the
     * kernel tests under racecheck, which runs models too slowly) */
    int first = 1;
    if (argc > 1 && !strcmp(argv[1], "--quick")) quick = 1, first = 2;
    only = argv + first, n_only = argc - first;
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) {
        printf("FAIL test_cuda: %s (make test-cuda needs a GPU)\n", why);
        return 1;
    }
    RUN_IF(kernel_matmul);
    RUN_IF(kernel_rmsnorm_swiglu_argmax);
    RUN_IF(kernel_fused_gemv);
    RUN_IF(kernel_prefill_ops);
    RUN_IF(kernel_attention);
    RUN_IF(kernel_moe);
    RUN_IF(model_golden);
    RUN_IF(model_long_prompt);
    RUN_IF(model_preset);
    RUN_IF(model_moe_deterministic);
    RUN_IF(model_gguf_blocks);
    RUN_IF(predictor_fused);
    RUN_IF(graph_recapture);
    RUN_IF(greedy_stop);
    RUN_IF(shared_weights);
    RUN_IF(threads_share_gpu);
    RUN_IF(gpu_cache_consistency);
    TEST_EXIT();
}
