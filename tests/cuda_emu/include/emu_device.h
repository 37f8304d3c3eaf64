// CUDA emulation, device side: what a kernel sees (threadIdx, __syncthreads,
// warp shuffles, shared memory, atomics, vector types) and how a launch
// reaches the scheduler (scheduler.cpp). Every thread of a block is a fiber;
// barriers and warp collectives are real rendezvous between fibers, so a
// kernel that relies on something a GPU does not promise fails here too.
//
// Launch syntax: the build rewrites (tests/cuda_emu/rewrite.awk)
//   kernel<<<grid, block, smem, stream>>>(args)
// into
//   emu::launcher(kernel, "kernel", emu::launch_config(grid, block, smem, stream))(args)
// (cudaLaunchKernelEx is a template here, as in the real header)
// and each __shared__ declaration into a reference to the block's own copy
// (emu::shared_var), so no source file carries emulation macros.
#ifndef POLAR_CUDA_EMU_DEVICE_H
#define POLAR_CUDA_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

#include "../race.h"
#include "cuda_runtime_api.h"

// ------------------------------------------------------------ qualifiers

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

// ----------------------------------------------------------- vector types

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

// ------------------------------------------------------------ the scheduler

namespace emu {

struct block_info {
    uint3 block_idx;
};
struct thread_info {
    uint3 thread_idx;
    block_info *block;
    bool fenced; // ran __threadfence (the race check's atomics release then)
};
struct launch_info {
    dim3 grid_dim, block_dim;
};
extern thread_info *cur;         // the running GPU thread
extern launch_info *cur_launch;  // its launch

// Where a __shared__ variable is declared: identifies it within a block and
// names it in error messages.
struct shared_site {
    const char *name, *file;
    int line;
};
void *shared_var(const shared_site *site, size_t bytes, size_t align);
void *dynamic_shared(size_t align);

void syncthreads();
void grid_sync();

enum warp_kind { W_SYNC, W_SHFL_IDX, W_SHFL_XOR, W_SHFL_UP, W_SHFL_DOWN, W_BALLOT, W_ANY, W_ALL, W_MATCH_ANY,
                 W_WMMA_LOAD, W_WMMA_STORE, W_WMMA_MMA };
// A warp collective: every lane of mask must arrive with the same kind and
// mask; the result is this lane's (the source lane's value for shuffles).
uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width);
// A collective that hands the last lane to arrive every lane's pointer (on
// their stacks; all other lanes wait), for WMMA.
void warp_exchange(warp_kind kind, unsigned mask, void *mine, void (*complete)(void *const lanes[32]));
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Launch configuration as the <<<...>>> brackets give it.
struct launch_config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    launch_config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
};

// Runs the launch now, or records it when its stream is capturing a graph
// (body holds copies of the arguments, taken here, as a graph node does).
// A bad configuration sets the last error; the return value is that error.
// overlap: launched with programmatic stream serialization (cudaLaunchKernelEx),
// so every thread must call cudaGridDependencySynchronize before it exits.
// A null name is looked up from func's symbol.
cudaError_t submit(const void *func, const char *name, const launch_config &cfg, std::function<void()> body,
                   bool cooperative, bool overlap = false);
// Called by a launch's body as the kernel starts, once its arguments are
// copied: in a launch made to overlap the previous one, ThreadSanitizer
// checks the kernel's own accesses from here on, not the launch's.
void kernel_entry();

template <typename... P>
struct launcher_t {
    void (*kernel)(P...);
    const char *name;
    launch_config cfg;
    // The kernel's own parameter types, so arguments convert as in a call.
    void operator()(P... args) const {
        auto k = kernel;
        submit((const void *)k, name, cfg, [=]() {
            kernel_entry();
            k(args...);
        }, false);
    }
};
template <typename... P>
launcher_t<P...> launcher(void (*kernel)(P...), const char *name, launch_config cfg) {
    return launcher_t<P...>{kernel, name, cfg};
}

template <typename... P, size_t... I>
cudaError_t launch_cooperative_args(void (*kernel)(P...), const char *name, const launch_config &cfg, void **args,
                                    std::index_sequence<I...>) {
    std::tuple<P...> params(*static_cast<P *>(args[I])...);
    return submit((const void *)kernel, name, cfg, [kernel, params]() {
        kernel_entry();
        std::apply(kernel, params);
    }, true);
}
// cudaLaunchCooperativeKernel((void *)kernel, ...), rewritten by the build
// so that the argument array can be unpacked with the kernel's types.
template <typename... P>
cudaError_t launch_cooperative(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, void **args,
                               size_t smem, cudaStream_t stream) {
    return launch_cooperative_args(kernel, name, launch_config(grid, block, smem, stream), args,
                                   std::index_sequence_for<P...>{});
}

cudaError_t occupancy(int *blocks, const void *func, int block_size, size_t smem);

// The device side of programmatic dependent launch: the launches already
// run one after the other, so these only check the order the sources
// promise (scheduler.cpp).
void grid_dependency_sync();
void trigger_dependents();
[[noreturn]] void unsupported_launch_attribute(int id);

} // namespace emu

// cudaLaunchKernelEx and what it takes (the real header's names and values;
// only programmatic stream serialization is understood).
enum cudaLaunchAttributeID { cudaLaunchAttributeIgnore = 0, cudaLaunchAttributeProgrammaticStreamSerialization = 6 };
union cudaLaunchAttributeValue {
    char pad[64];
    unsigned int programmaticStreamSerializationAllowed;
};
struct cudaLaunchAttribute {
    cudaLaunchAttributeID id;
    char pad[8 - sizeof(cudaLaunchAttributeID)];
    cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
};
template <typename... P, typename... A>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *config, void (*kernel)(P...), A &&...args) {
    bool overlap = false;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        const cudaLaunchAttribute &a = config->attrs[i];
        if (a.id == cudaLaunchAttributeProgrammaticStreamSerialization)
            overlap = a.val.programmaticStreamSerializationAllowed != 0;
        else if (a.id != cudaLaunchAttributeIgnore)
            emu::unsupported_launch_attribute((int)a.id);
    }
    std::tuple<P...> params(std::forward<A>(args)...); // converted as a call converts them
    return emu::submit((const void *)kernel, nullptr,
                       emu::launch_config(config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream),
                       [kernel, params]() {
                           auto k = kernel; // copied before the kernel starts: see kernel_entry
                           std::tuple<P...> mine = params;
                           emu::kernel_entry();
                           std::apply(k, mine);
                       }, false, overlap);
}

// Typed overloads of the runtime calls that take a kernel.
template <typename F>
cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)func, attr, value);
}
template <typename F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, F *func, int block_size, size_t smem) {
    return emu::occupancy(blocks, (const void *)func, block_size, smem);
}

// --------------------------------------------------------- built-in indices

// The running launch's dimensions (one launch runs at a time). Variables,
// not macros as threadIdx is, so that cudaLaunchConfig_t's fields of these
// names stay readable.
extern dim3 blockDim, gridDim;

#define threadIdx (::emu::cur->thread_idx)
#define blockIdx (::emu::cur->block->block_idx)
#define warpSize 32

// ------------------------------------------------------- barriers and warps

static inline void __syncthreads() { emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_op(emu::W_SYNC, mask, 0, 0, 32); }
static inline void cudaGridDependencySynchronize() { emu::grid_dependency_sync(); }
static inline void cudaTriggerProgrammaticLaunchCompletion() { emu::trigger_dependents(); }
static inline void __threadfence() { emu::cur->fenced = true; }
static inline void __threadfence_block() {}

template <typename T>
static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp collectives move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <typename T>
static inline T emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    return emu_from_bits<T>(emu::warp_op(emu::W_SHFL_IDX, mask, emu_bits(v), src_lane, width));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return emu_from_bits<T>(emu::warp_op(emu::W_SHFL_XOR, mask, emu_bits(v), lane_mask, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu_from_bits<T>(emu::warp_op(emu::W_SHFL_UP, mask, emu_bits(v), (int)delta, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu_from_bits<T>(emu::warp_op(emu::W_SHFL_DOWN, mask, emu_bits(v), (int)delta, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)emu::warp_op(emu::W_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) { return (int)emu::warp_op(emu::W_ANY, mask, pred != 0, 0, 32); }
static inline int __all_sync(unsigned mask, int pred) { return (int)emu::warp_op(emu::W_ALL, mask, pred != 0, 0, 32); }
template <typename T>
static inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)emu::warp_op(emu::W_MATCH_ANY, mask, emu_bits(v), 0, 32);
}

// ------------------------------------------------------ intrinsics and loads

static inline float __uint_as_float(unsigned u) { return emu_from_bits<float>(u); }
static inline unsigned __float_as_uint(float f) { return (unsigned)emu_bits(f); }
static inline float __int_as_float(int i) { return emu_from_bits<float>((unsigned)i); }
static inline int __float_as_int(float f) { return (int)emu_bits(f); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline float __fdividef(float a, float b) { return a / b; }
// c + the four products of a's and b's signed bytes, in int32 as the hardware adds them (wrapping)
static inline int __dp4a(int a, int b, int c) {
    uint32_t s = (uint32_t)c;
    for (int i = 0; i < 4; i++) s += (uint32_t)((int)(int8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i));
    return (int)s;
}
// byte n of the result: byte (s >> 4n) & 7 of y:x (x bytes 0..3); the
// selectors' high bits (prmt's sign-replicate mode) are refused, not emulated
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    if (s & 0x8888u) emu::fail("__byte_perm: selector 0x%x uses a high bit (sign replicate): not emulated", s);
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)(v >> 8 * ((s >> 4 * n) & 7) & 0xFF) << 8 * n;
    return r;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <typename T>
static inline T __ldg(const T *p) { return *p; }
template <typename T>
static inline T __ldcs(const T *p) { return *p; }
template <typename T>
static inline T __ldcg(const T *p) { return *p; }
template <typename T>
static inline void __stcs(T *p, T v) { *p = v; }

// Atomics: fibers switch only at barriers and collectives, and one launch
// runs at a time, so a read-modify-write cannot be interrupted. Under the
// race check each is an atomic access (two threads' atomics on one word are
// no race; an atomic and a plain access are) and carries the GPU's ticket
// idiom: it acquires what earlier atomics on its word released, and releases
// what its thread has seen if the thread ran __threadfence before it. A
// block that takes its ticket without the fence leaves what it wrote racing
// with the last block's reads. (Writes between the fence and the atomic are
// released too, and a missing fence after the ticket is not seen.)
template <typename T, typename Op>
static inline T emu_atomic(T *p, Op op) {
#ifdef POLAR_CUDA_EMU_RACE
    emu::race_acquire(p);
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do want = op(old);
    while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    if (emu::cur->fenced) emu::race_release(p);
    return old;
#else
    T old = *p;
    *p = op(old);
    return old;
#endif
}
template <typename T>
static inline T atomicAdd(T *p, T v) { return emu_atomic(p, [v](T old) { return old + v; }); }
template <typename T>
static inline T atomicSub(T *p, T v) { return emu_atomic(p, [v](T old) { return old - v; }); }
template <typename T>
static inline T atomicMax(T *p, T v) { return emu_atomic(p, [v](T old) { return old > v ? old : v; }); }
template <typename T>
static inline T atomicMin(T *p, T v) { return emu_atomic(p, [v](T old) { return old < v ? old : v; }); }
template <typename T>
static inline T atomicExch(T *p, T v) { return emu_atomic(p, [v](T) { return v; }); }
template <typename T>
static inline T atomicCAS(T *p, T compare, T v) { return emu_atomic(p, [compare, v](T old) { return old == compare ? v : old; }); }

#endif
