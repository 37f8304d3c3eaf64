// The PoLar predictor as one fused CUDA kernel: projection, cross-attention,
// both encoder layers and both heads in a single cooperative launch. Each
// stage is a grid-stride loop of warps (a warp per output value, per
// attention row, per LayerNorm row); stages are separated by grid syncs.
// f32 throughout, the math of predictor/forward.c.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

#include "predictor_cuda.h"
#include "common.cuh"

namespace cg = cooperative_groups;

#define LN_EPS 1e-5f

struct warp_id {
    long id, count;
    int lane;
};

static __device__ warp_id my_warp() {
    warp_id w;
    w.id = ((long)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    w.count = (long)gridDim.x * blockDim.x / WARP;
    w.lane = threadIdx.x % WARP;
    return w;
}

// y[n, rows] = x[n, cols] . W[rows, cols]^T + b  (relu: max(0, .)). A warp
// task is one row for up to 8 inputs, so a weight row is read once per 8
// tokens; neighbouring warps take neighbouring rows of the same inputs.
static __device__ void linear(float *y, const float *x, const float *w, const float *b, int n, int rows, int cols,
                              int relu) {
    warp_id me = my_warp();
    long blocks = (n + MAX_TOKENS_PER_PASS - 1) / MAX_TOKENS_PER_PASS;
    for (long o = me.id; o < blocks * rows; o += me.count) {
        int t0 = (int)(o / rows) * MAX_TOKENS_PER_PASS, r = (int)(o % rows);
        int cnt = n - t0 < MAX_TOKENS_PER_PASS ? n - t0 : MAX_TOKENS_PER_PASS;
        const float *wr = w + (size_t)r * cols, *xt = x + (size_t)t0 * cols;
        float acc[MAX_TOKENS_PER_PASS];
#pragma unroll
        for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) acc[t] = 0.0f;
        for (int c = me.lane; c < cols; c += WARP) {
            float wc = wr[c];
#pragma unroll
            for (int t = 0; t < MAX_TOKENS_PER_PASS; t++)
                if (t < cnt) acc[t] += wc * xt[(size_t)t * cols + c];
        }
        float bias = b ? b[r] : 0.0f;
#pragma unroll
        for (int t = 0; t < MAX_TOKENS_PER_PASS; t++) {
            if (t >= cnt) break;
            float v = warp_sum(acc[t]) + bias;
            if (me.lane == 0) y[(size_t)(t0 + t) * rows + r] = relu ? fmaxf(v, 0.0f) : v;
        }
    }
}

// ctx[nq, d]: per (query, head), softmax(q k^T / sqrt(dh)) v over nk keys;
// q, k, v rows are d wide with head h at h * dh; probs holds nq*heads*nk.
static __device__ void attention(float *ctx, const float *q, const float *k, const float *v, float *probs, int nq,
                                 int nk, int d, int heads) {
    warp_id me = my_warp();
    int dh = d / heads;
    float scale = 1.0f / sqrtf((float)dh);
    for (long task = me.id; task < (long)nq * heads; task += me.count) {
        int i = (int)(task / heads), h = (int)(task % heads);
        const float *qh = q + (size_t)i * d + (size_t)h * dh;
        float *p = probs + (size_t)task * nk;
        float mx = -INFINITY;
        for (int j = me.lane; j < nk; j += WARP) {
            const float *kj = k + (size_t)j * d + (size_t)h * dh;
            float s = 0.0f;
            for (int c = 0; c < dh; c++) s += qh[c] * kj[c];
            p[j] = s * scale;
            mx = fmaxf(mx, p[j]);
        }
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = me.lane; j < nk; j += WARP) sum += (p[j] = expf(p[j] - mx));
        sum = warp_sum(sum);
        __syncwarp();
        for (int c = me.lane; c < dh; c += WARP) {
            float o = 0.0f;
            for (int j = 0; j < nk; j++) o += p[j] / sum * v[(size_t)j * d + (size_t)h * dh + c];
            ctx[(size_t)i * d + (size_t)h * dh + c] = o;
        }
    }
}

// x[rows, d] = LayerNorm(x + y), a warp per row.
static __device__ void add_layer_norm(float *x, const float *y, const float *w, const float *b, int rows, int d) {
    warp_id me = my_warp();
    for (long r = me.id; r < rows; r += me.count) {
        float *xr = x + (size_t)r * d;
        const float *yr = y + (size_t)r * d;
        float mean = 0.0f;
        for (int c = me.lane; c < d; c += WARP) mean += xr[c] + yr[c];
        mean = warp_sum(mean) / (float)d;
        float var = 0.0f;
        for (int c = me.lane; c < d; c += WARP) var += (xr[c] + yr[c] - mean) * (xr[c] + yr[c] - mean);
        float inv = 1.0f / sqrtf(warp_sum(var) / (float)d + LN_EPS);
        __syncwarp();
        for (int c = me.lane; c < d; c += WARP) xr[c] = (xr[c] + yr[c] - mean) * inv * w[c] + b[c];
    }
}

__global__ void predictor_kernel(pred_cuda_args a) {
    cg::grid_group grid = cg::this_grid();
    int D = a.D, d = a.d, T = a.T;
    // token projection; the layer queries' and the tokens' q/k/v projections
    linear(a.tok, a.h, a.q_proj_w, a.q_proj_b, T, d, a.dq, 0);
    linear(a.q, a.layer_emb, a.cross.in_w, a.cross.in_b, D, d, d, 0);
    grid.sync();
    linear(a.k, a.tok, a.cross.in_w + (size_t)d * d, a.cross.in_b + d, T, d, d, 0);
    linear(a.v, a.tok, a.cross.in_w + (size_t)2 * d * d, a.cross.in_b + 2 * d, T, d, d, 0);
    grid.sync();
    attention(a.att, a.q, a.k, a.v, a.probs, D, T, d, a.heads);
    grid.sync();
    linear(a.x, a.att, a.cross.out_w, a.cross.out_b, D, d, d, 0);
    grid.sync();
    for (int blk = 0; blk < PRED_CUDA_BLOCKS; blk++) {
        const pred_cuda_block *b = &a.blocks[blk];
        linear(a.q, a.x, b->attn.in_w, b->attn.in_b, D, d, d, 0);
        linear(a.k, a.x, b->attn.in_w + (size_t)d * d, b->attn.in_b + d, D, d, d, 0);
        linear(a.v, a.x, b->attn.in_w + (size_t)2 * d * d, b->attn.in_b + 2 * d, D, d, d, 0);
        grid.sync();
        attention(a.att, a.q, a.k, a.v, a.probs, D, D, d, a.heads);
        grid.sync();
        linear(a.y, a.att, b->attn.out_w, b->attn.out_b, D, d, d, 0);
        grid.sync();
        add_layer_norm(a.x, a.y, b->norm1_w, b->norm1_b, D, d);
        grid.sync();
        linear(a.hid, a.x, b->lin1_w, b->lin1_b, D, a.ff, d, 1);
        grid.sync();
        linear(a.y, a.hid, b->lin2_w, b->lin2_b, D, d, a.ff, 0);
        grid.sync();
        add_layer_norm(a.x, a.y, b->norm2_w, b->norm2_b, D, d);
        grid.sync();
    }
    linear(a.seg, a.x, a.seg_w, a.seg_b, D, 1, d, 0);
    linear(a.op, a.x, a.op_w, a.op_b, D, 3, d, 0);
}

extern "C" int cuda_predictor_grid(int *blocks, char *why, size_t why_size) {
    int device, sms, coop = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, predictor_kernel, PRED_CUDA_THREADS, 0);
    if (e != cudaSuccess) {
        snprintf(why, why_size, "%s", cudaGetErrorString(e));
        return 0;
    }
    if (!coop || per_sm < 1) {
        snprintf(why, why_size, "%s", !coop ? "the GPU does not support cooperative launches"
                                            : "the fused kernel does not fit on a multiprocessor");
        return 0;
    }
    *blocks = sms * per_sm; // every block resident at once, as the grid syncs need
    return 1;
}

extern "C" int cuda_predictor_launch(const pred_cuda_args *args, int blocks, void *stream) {
    pred_cuda_args copy = *args;
    void *params[] = {&copy};
    return (int)cudaLaunchCooperativeKernel((void *)predictor_kernel, dim3(blocks), dim3(PRED_CUDA_THREADS), params,
                                            0, (cudaStream_t)stream);
}
