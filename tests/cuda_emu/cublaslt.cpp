// CUDA emulation: cublasLtMatmul as a CPU GEMM. Column-major as cuBLAS
// defines it: element (i, j) of a layout (rows, cols, ld) is at i + j * ld;
// D = alpha op(A) op(B) + beta C (+ bias per row with CUBLASLT_EPILOGUE_BIAS),
// A and B bf16, f16 or f32, C and D f32 or bf16, f32 accumulation in k
// order. Shapes that do not fit together, a leading dimension below the
// rows, or an operand that runs past its device allocation are refused as
// cuBLASLt would (CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED). The real
// library picks tiles and split-K by its heuristics and so sums in another
// order: results agree to f32 rounding, not bit for bit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "emu_internal.h"

struct emu_lt_handle {
    int unused;
};
struct emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t transa, transb;
    cublasLtEpilogue_t epilogue;
    const void *bias;
};
struct emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct emu_lt_pref {
    size_t max_workspace;
};

namespace {

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

bool known_type(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, u;
    if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else { // subnormal: normalise
        int e = -1;
        do man <<= 1, e++;
        while (!(man & 1024));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 1023) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float load(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t b = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16F) return half_to_float(b);
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void store(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = emu_float_to_bf16_bits(v);
}

size_t span_bytes(const emu_lt_layout *l) {
    return l->cols ? ((l->cols - 1) * (uint64_t)l->ld + l->rows) * type_bytes(l->type) : 0;
}

cublasStatus_t invalid(const char *why) {
    EMU_NOTE("cuda-emu: cublasLtMatmul: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

// Why the problem cannot run (NULL: it can); m, n, k as op(A) is m x k.
const char *check_problem(const emu_lt_desc *desc, const emu_lt_layout *a, const emu_lt_layout *b,
                          const emu_lt_layout *c, const emu_lt_layout *d, uint64_t *m, uint64_t *n, uint64_t *k) {
    if (desc->compute != CUBLAS_COMPUTE_32F || desc->scale != CUDA_R_32F) return "only f32 compute and scale";
    if (desc->transa == CUBLAS_OP_C || desc->transb == CUBLAS_OP_C) return "conjugate transposes of real types";
    if (a->type != b->type || !known_type(a->type)) return "A and B must share a type (f32, f16 or bf16)";
    if (c->type != d->type || (c->type != CUDA_R_32F && c->type != CUDA_R_16BF)) return "C and D must be f32 or bf16";
    *m = desc->transa == CUBLAS_OP_N ? a->rows : a->cols;
    *k = desc->transa == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t kb = desc->transb == CUBLAS_OP_N ? b->rows : b->cols;
    *n = desc->transb == CUBLAS_OP_N ? b->cols : b->rows;
    if (kb != *k) return "op(A) and op(B) disagree on k";
    if (c->rows != *m || c->cols != *n || d->rows != *m || d->cols != *n) return "C or D is not m x n";
    for (const emu_lt_layout *l : {a, b, c, d})
        if (l->ld < (int64_t)l->rows || l->ld < 1) return "a leading dimension below its layout's rows";
    if (desc->epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return "an epilogue other than DEFAULT or BIAS";
    if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && !desc->bias) return "BIAS epilogue without a bias pointer";
    return nullptr;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    *handle = new emu_lt_handle();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute, cudaDataType_t scale) {
    *desc = new emu_lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->transa : desc->transb) = *(const cublasOperation_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        desc->epilogue = *(const cublasLtEpilogue_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        desc->bias = *(const void *const *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        desc->compute = *(const cublasComputeType_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        desc->scale = *(const cudaDataType_t *)buf;
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!known_type(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
    *layout = new emu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    *pref = new emu_lt_pref{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    if (!pref || !buf || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || size != sizeof(uint64_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    pref->max_workspace = *(const uint64_t *)buf;
    return CUBLAS_STATUS_SUCCESS;
}

// One "algorithm" for every problem the matmul accepts, none for the others.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *returned) {
    if (!handle || !desc || !a || !b || !c || !d || !pref || requested < 1 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t m, n, k;
    *returned = 0;
    if (check_problem(desc, a, b, c, d, &m, &n, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 0x454d55; // "EMU"
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b, const void *beta,
                              const void *C, cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    (void)workspace, (void)workspace_bytes, (void)algo;
    if (!handle || !desc || !alpha || !beta || !A || !B || !D || !a || !b || !c || !d)
        return invalid("a NULL handle, descriptor, scalar or operand");
    uint64_t m, n, k;
    if (const char *why = check_problem(desc, a, b, c, d, &m, &n, &k)) return invalid(why);
    float al = *(const float *)alpha, be = *(const float *)beta;
    if (be != 0.0f && !C) return invalid("beta != 0 without C");
    if (emu::check_device_range(A, span_bytes(a), "cublasLtMatmul", "A") != cudaSuccess ||
        emu::check_device_range(B, span_bytes(b), "cublasLtMatmul", "B") != cudaSuccess ||
        (be != 0.0f && emu::check_device_range(C, span_bytes(c), "cublasLtMatmul", "C") != cudaSuccess) ||
        emu::check_device_range(D, span_bytes(d), "cublasLtMatmul", "D") != cudaSuccess)
        return CUBLAS_STATUS_INVALID_VALUE;
    emu_lt_desc dc = *desc;
    emu_lt_layout la = *a, lb = *b, lc = *c, ld = *d;
    cudaError_t e = emu::run_on_stream(stream, "cublasLtMatmul", [=]() {
        // op(A) as rows of k, op(B) as columns of k: both read contiguously
        std::vector<float> ar(m * k), bc(n * k);
        for (uint64_t i = 0; i < m; i++)
            for (uint64_t p = 0; p < k; p++)
                ar[i * k + p] = load(A, la.type, dc.transa == CUBLAS_OP_N ? i + p * la.ld : p + i * la.ld);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t p = 0; p < k; p++)
                bc[j * k + p] = load(B, lb.type, dc.transb == CUBLAS_OP_N ? p + j * lb.ld : j + p * lb.ld);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                const float *x = &ar[i * k], *y = &bc[j * k];
                float s = 0.0f;
                for (uint64_t p = 0; p < k; p++) s += x[p] * y[p];
                float v = al * s;
                if (be != 0.0f) v += be * load(C, lc.type, i + j * lc.ld);
                if (dc.epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(dc.bias, ld.type, i);
                store(D, ld.type, i + j * ld.ld, v);
            }
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // extern "C"
