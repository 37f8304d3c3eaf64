// Kernels with the mistakes the emulation must catch (test_emu.c runs each
// in a child process and expects an abort naming it), and a racy kernel
// whose result depends on thread order. Plain CUDA: rewrite.awk builds them
// like kernels/cuda.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <mma.h>

#define WARP 32

// Thread 0 returns; the others wait for it at __syncthreads forever.
__global__ void exit_before_barrier_kernel(float *out) {
    if (threadIdx.x == 0) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// Lane 0 waits at __syncthreads, lanes 1..31 at __syncwarp for lane 0.
__global__ void divergent_barrier_kernel(float *out) {
    if (threadIdx.x % WARP == 0) __syncthreads();
    else __syncwarp();
    out[threadIdx.x] = 1.0f;
}

// The full mask names lanes 16..31, which have returned.
__global__ void shuffle_exited_lane_kernel(float *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

// Lanes 0..15 shuffle among themselves but read lane 20.
__global__ void shuffle_outside_mask_kernel(float *out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (float)threadIdx.x, 20);
}

// 64 threads write a 32-float shared array.
__global__ void shared_overflow_kernel(float *out) {
    __shared__ float s[WARP];
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x % WARP];
}

// Writes one float past the dynamic shared memory the launch gave.
__global__ void dynamic_shared_overflow_kernel(float *out, int n) {
    extern __shared__ float dyn[];
    if (threadIdx.x == 0) dyn[n] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = 0.0f;
}

// One float past the end of out.
__global__ void global_overflow_kernel(float *out, int n) {
    out[threadIdx.x + 1 == blockDim.x ? n : threadIdx.x] = 1.0f;
}

// Reads a float array as float4: the array is only float-aligned.
__global__ void shared_vector_kernel(float *out) {
    __shared__ float s[4 * WARP];
    for (int i = threadIdx.x; i < 4 * WARP; i += blockDim.x) s[i] = (float)i;
    __syncthreads();
    float4 v = reinterpret_cast<const float4 *>(s)[threadIdx.x];
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}

// Reads float4s from one float past a 256-byte aligned allocation.
__global__ void global_vector_kernel(float *out) {
    float4 v = reinterpret_cast<const float4 *>(out + 1)[threadIdx.x];
    out[threadIdx.x] = v.x;
}

// Reads one float past the end of in (a 256-byte multiple): out[i] = in[i + 1].
__global__ void global_overread_kernel(float *out, const float *in) {
    out[threadIdx.x] = in[threadIdx.x + 1];
}

// Reads 16 KB before the start of in (a negative index gone wrong).
__global__ void global_underread_kernel(float *out, const float *in) {
    out[threadIdx.x] = in[(int)threadIdx.x - 4096];
}

// Correct: __align__(8) does not lower a float4's alignment, and the dynamic
// shared memory starts as its declaration asks. out[0] = 1 when both hold
// (and the float4 read did not fault), out[1] = the dynamic start mod 64.
__global__ void aligned_shared_kernel(float *out) {
    __shared__ __align__(8) float4 v[2];
    extern __shared__ __align__(32) float dyn32[];
    if (threadIdx.x == 0) v[1] = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
    __syncthreads();
    if (threadIdx.x == 0) {
        out[0] = v[1].x == 1.0f && (uintptr_t)dyn32 % 32 == 0 ? 1.0f : 0.0f;
        out[1] = (float)((uintptr_t)dyn32 % 64);
    }
}

// Each lane passes its own tile pointer to a warp-wide WMMA load.
__global__ void wmma_pointer_kernel(const __nv_bfloat16 *tiles) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::load_matrix_sync(a, tiles + (threadIdx.x % WARP) * 256, 16);
}

// Grid sync outside a cooperative launch.
__global__ void grid_sync_kernel(float *out) {
    cooperative_groups::this_grid().sync();
    out[threadIdx.x] = 1.0f;
}

// Thread 0 sets a shared flag that every thread reads without a barrier:
// the result depends on which threads run first (the emulation's order).
__global__ void racy_kernel(float *out) {
    __shared__ float flag;
    if (threadIdx.x == 0) flag = 1.0f;
    out[threadIdx.x] = flag;
}

// The same with the barrier: every order gives 1.
__global__ void fixed_kernel(float *out) {
    __shared__ float flag;
    if (threadIdx.x == 0) flag = 1.0f;
    __syncthreads();
    out[threadIdx.x] = flag;
}

// Races only ThreadSanitizer sees (make test-cuda-race, tests/cuda_emu/race.h):
// lane i reads what lane i + 1 wrote to shared memory without __syncwarp
// (with independent thread scheduling the lanes need not run in step).
__global__ void warp_racy_kernel(float *out) {
    __shared__ float v[WARP];
    v[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = v[(threadIdx.x + 1) % WARP];
}

// The same with __syncwarp between: no race.
__global__ void warp_fixed_kernel(float *out) {
    __shared__ float v[WARP];
    v[threadIdx.x] = (float)threadIdx.x;
    __syncwarp();
    out[threadIdx.x] = v[(threadIdx.x + 1) % WARP];
}

// Every block writes the same elements of out.
__global__ void blocks_racy_kernel(float *out) { out[threadIdx.x] = (float)blockIdx.x; }

// Each block writes its own elements: no race.
__global__ void blocks_fixed_kernel(float *out) { out[blockIdx.x * blockDim.x + threadIdx.x] = (float)blockIdx.x; }

// Each block writes its element of out[1..], takes a ticket, and the last
// block to take one sums them into out[0] (the split-K attention's merge).
// Without the __threadfence before the ticket the last block's reads race
// with the other blocks' writes.
template <bool fence>
__global__ void ticket_kernel(float *out, int *ticket) {
    __shared__ int last;
    if (threadIdx.x == 0) out[1 + blockIdx.x] = (float)(blockIdx.x + 1);
    if (fence) __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) {
        float sum = 0;
        for (unsigned b = 0; b < gridDim.x; b++) sum += out[1 + b];
        out[0] = sum, *ticket = 0;
    }
}

// Launched to overlap the previous kernel, it reads out before waiting for
// that kernel, which writes it.
__global__ void early_read_kernel(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? out[i] : 0.0f;
    cudaGridDependencySynchronize();
    if (i < n) out[i] = v + 1.0f;
}

// A product of 16 x 16 bf16 tiles on WMMA: c = a b (row-major a, col-major b).
__global__ void wmma_product_kernel(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

// out[i] += 1 for i < n: for graph capture (arguments copied at capture).
__global__ void add_one_kernel(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}

// The same after waiting for the previous kernel, as a kernel launched to
// overlap it must (add_one_kernel launched so is a fault).
__global__ void awaiting_add_one_kernel(float *out, int n) {
    cudaGridDependencySynchronize();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += 1.0f;
}

// kernel<<<...>>>(out, n) through cudaLaunchKernelEx with programmatic
// stream serialization (launched to overlap the previous kernel).
static void launch_overlapping(void (*kernel)(float *, int), float *out, int n, cudaStream_t s) {
    cudaLaunchAttribute overlap[1];
    overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((n + 127) / 128), cfg.blockDim = dim3(128), cfg.stream = s;
    cfg.attrs = overlap, cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, out, n);
}

extern "C" {

// Each launches one kernel above on the legacy stream and returns
// cudaGetLastError() (a kernel fault aborts the process before that).
int emu_bad_launch(const char *which, float *out, int n, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    if (!__builtin_strcmp(which, "exit_before_barrier")) exit_before_barrier_kernel<<<1, 64, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "divergent_barrier")) divergent_barrier_kernel<<<1, 64, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "shuffle_exited_lane")) shuffle_exited_lane_kernel<<<1, 32, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "shuffle_outside_mask")) shuffle_outside_mask_kernel<<<1, 32, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "shared_overflow")) shared_overflow_kernel<<<2, 64, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "dynamic_shared_overflow"))
        dynamic_shared_overflow_kernel<<<1, 32, n * sizeof(float), s>>>(out, n);
    else if (!__builtin_strcmp(which, "global_overflow")) global_overflow_kernel<<<1, n, 0, s>>>(out, n);
    else if (!__builtin_strcmp(which, "shared_vector")) shared_vector_kernel<<<1, WARP, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "global_vector")) global_vector_kernel<<<1, WARP, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "global_overread")) global_overread_kernel<<<1, n, 0, s>>>(out, out + n);
    else if (!__builtin_strcmp(which, "global_underread")) global_underread_kernel<<<1, n, 0, s>>>(out, out);
    else if (!__builtin_strcmp(which, "aligned_shared")) aligned_shared_kernel<<<1, WARP, 64, s>>>(out);
    else if (!__builtin_strcmp(which, "wmma_pointer")) wmma_pointer_kernel<<<1, 32, 0, s>>>((const __nv_bfloat16 *)out);
    else if (!__builtin_strcmp(which, "grid_sync")) grid_sync_kernel<<<2, 32, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "racy")) racy_kernel<<<1, n, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "fixed")) fixed_kernel<<<1, n, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "warp_racy")) warp_racy_kernel<<<1, WARP, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "warp_fixed")) warp_fixed_kernel<<<1, WARP, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "blocks_racy")) blocks_racy_kernel<<<2, n, 0, s>>>(out);
    else if (!__builtin_strcmp(which, "blocks_fixed")) blocks_fixed_kernel<<<2, n, 0, s>>>(out);
    else if (!__builtin_strncmp(which, "ticket_", 7)) { /* the ticket after out's n floats */
        int *ticket = (int *)(out + n);
        cudaMemsetAsync(ticket, 0, sizeof(int), s);
        if (which[7] == 'r') ticket_kernel<false><<<4, WARP, 0, s>>>(out, ticket);
        else ticket_kernel<true><<<4, WARP, 0, s>>>(out, ticket);
    }
    else if (!__builtin_strcmp(which, "early_read") || !__builtin_strcmp(which, "overlap_wait")) {
        add_one_kernel<<<(n + 127) / 128, 128, 0, s>>>(out, n);
        launch_overlapping(which[0] == 'e' ? early_read_kernel : awaiting_add_one_kernel, out, n, s);
    }
    else if (!__builtin_strcmp(which, "add_one")) add_one_kernel<<<(n + 127) / 128, 128, 0, s>>>(out, n);
    else if (!__builtin_strcmp(which, "overlap_add_one")) launch_overlapping(awaiting_add_one_kernel, out, n, s);
    else if (!__builtin_strcmp(which, "overlap_no_wait")) launch_overlapping(add_one_kernel, out, n, s);
    else if (!__builtin_strcmp(which, "too_many_threads")) add_one_kernel<<<1, 2048, 0, s>>>(out, n);
    else if (!__builtin_strcmp(which, "too_much_shared")) add_one_kernel<<<1, 32, 64 << 10, s>>>(out, n);
    else return -1;
    return (int)cudaGetLastError();
}

// Whether ThreadSanitizer watches the kernels (a RACE=1 build).
int emu_race_checked(void) {
#ifdef POLAR_CUDA_EMU_RACE
    return 1;
#else
    return 0;
#endif
}

int emu_wmma_product(float *c, const void *a, const void *b) {
    wmma_product_kernel<<<1, 32>>>(c, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b);
    return (int)cudaGetLastError();
}

}
