// CUDA emulation: nvcuda::wmma for the 16x16x16 shape with bf16 (or float)
// inputs and f32 accumulation. As on a GPU each lane holds a slice of a
// fragment (8 of its 256 elements: element e = i * 32 + lane, row-major in
// the logical matrix); the *_sync operations are warp collectives, so every
// lane of the warp must reach them with the same pointer and stride. The
// product is computed once per warp, in f32 with k ascending (a tensor core
// rounds in its own order: results agree to f32 rounding, not bit for bit).
#ifndef POLAR_CUDA_EMU_MMA_H
#define POLAR_CUDA_EMU_MMA_H

#include <stdint.h>

#include <type_traits>

#include "cuda_bf16.h"
#include "emu_device.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 WMMA shape only");
    enum { num_elements = 8 };
    T x[8];
};

static inline float emu_to_float(float v) { return v; }
static inline float emu_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
static inline void emu_from_float(float &d, float v) { d = v; }

static inline unsigned emu_lane() { return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32; }

// The GPU's requirements: a 256-bit aligned pointer, ldm a multiple of 16 bytes.
template <typename T>
static inline void emu_check_tile(const char *what, const T *p, unsigned ldm) {
    if ((uintptr_t)p % 32) emu::fail("%s: pointer %p is not 32-byte aligned", what, (const void *)p);
    if ((ldm * sizeof(T)) % 16) emu::fail("%s: ldm %u is not a multiple of 16 bytes", what, ldm);
}

template <typename T, typename Layout>
static inline size_t emu_offset(int r, int c, unsigned ldm) {
    return std::is_same<Layout, col_major>::value ? (size_t)c * ldm + r : (size_t)r * ldm + c;
}

// load/store are collectives only to check convergence and agreement: the
// pointer and ldm of every lane must be the same.
static inline void emu_agree(emu::warp_kind kind, const void *p, unsigned ldm) {
    emu::warp_op(kind, 0xffffffffu, (uint64_t)(uintptr_t)p ^ ((uint64_t)ldm << 48), -1, 32);
}

template <typename Use, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p, unsigned ldm) {
    emu_check_tile("wmma::load_matrix_sync", p, ldm);
    emu_agree(emu::W_WMMA_LOAD, p, ldm);
    unsigned lane = emu_lane();
    for (int i = 0; i < 8; i++) {
        int e = i * 32 + (int)lane;
        f.x[i] = p[emu_offset<T, Layout>(e / 16, e % 16, ldm)];
    }
}

template <typename T>
static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T> &f, const T *p, unsigned ldm, layout_t l) {
    emu_check_tile("wmma::load_matrix_sync", p, ldm);
    emu_agree(emu::W_WMMA_LOAD, p, ldm);
    unsigned lane = emu_lane();
    for (int i = 0; i < 8; i++) {
        int e = i * 32 + (int)lane, r = e / 16, c = e % 16;
        f.x[i] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}

template <typename T>
static inline void store_matrix_sync(T *p, const fragment<accumulator, 16, 16, 16, T> &f, unsigned ldm, layout_t l) {
    emu_check_tile("wmma::store_matrix_sync", p, ldm);
    emu_agree(emu::W_WMMA_STORE, p, ldm);
    unsigned lane = emu_lane();
    for (int i = 0; i < 8; i++) {
        int e = i * 32 + (int)lane, r = e / 16, c = e % 16;
        (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[i];
    }
}

template <typename Use, typename T, typename Layout, typename V>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, V v) {
    for (int i = 0; i < 8; i++) f.x[i] = (T)v;
}

template <typename FD, typename FA, typename FB, typename FC>
struct emu_mma_args {
    FD *d;
    const FA *a;
    const FB *b;
    const FC *c;
};

// The last lane to arrive multiplies for the whole warp: gather A, B and C
// from the 32 slices, D = A B + C, scatter D back.
template <typename FD, typename FA, typename FB, typename FC>
static void emu_mma_complete(void *const lanes[32]) {
    float A[256], B[256], C[256];
    for (int l = 0; l < 32; l++) {
        const emu_mma_args<FD, FA, FB, FC> *m = (const emu_mma_args<FD, FA, FB, FC> *)lanes[l];
        for (int i = 0; i < 8; i++) {
            A[i * 32 + l] = emu_to_float(m->a->x[i]);
            B[i * 32 + l] = emu_to_float(m->b->x[i]);
            C[i * 32 + l] = emu_to_float(m->c->x[i]);
        }
    }
    float D[256];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            float s = C[r * 16 + c];
            for (int k = 0; k < 16; k++) s += A[r * 16 + k] * B[k * 16 + c];
            D[r * 16 + c] = s;
        }
    for (int l = 0; l < 32; l++) {
        const emu_mma_args<FD, FA, FB, FC> *m = (const emu_mma_args<FD, FA, FB, FC> *)lanes[l];
        for (int i = 0; i < 8; i++) emu_from_float(m->d->x[i], D[i * 32 + l]);
    }
}

template <typename TA, typename LA, typename TB, typename LB, typename TC>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, TC> &d, const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, TB, LB> &b,
                            const fragment<accumulator, 16, 16, 16, TC> &c) {
    typedef fragment<accumulator, 16, 16, 16, TC> FD;
    typedef fragment<matrix_a, 16, 16, 16, TA, LA> FA;
    typedef fragment<matrix_b, 16, 16, 16, TB, LB> FB;
    emu_mma_args<FD, FA, FB, FD> args = {&d, &a, &b, &c};
    emu::warp_exchange(emu::W_WMMA_MMA, 0xffffffffu, &args, emu_mma_complete<FD, FA, FB, FD>);
}

} // namespace wmma
} // namespace nvcuda

#endif
