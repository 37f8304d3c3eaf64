/* The CUDA emulation's own tests (make test runs them): the emulated
 * cuBLASLt against a plain GEMM under every layout polar uses and a few it
 * does not, WMMA against a plain product, the runtime rules of graph
 * capture, and each detection: a child process (this program re-run with
 * --case NAME) runs a faulty kernel and must abort with a message naming the
 * fault. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/cpu/bf16.h"
#include "../../kernels/cuda/ops.h"
#include "../harness.h"

int emu_bad_launch(const char *which, float *out, int n, void *stream);
int emu_wmma_product(float *c, const void *a, const void *b);
int emu_race_checked(void);

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* ------------------------------------------------------------ cuBLASLt */

typedef struct {
    int transa, transb;     /* CUBLAS_OP_N / CUBLAS_OP_T */
    int m, n, k, pad;       /* pad: extra rows in every leading dimension */
    cudaDataType_t in, out; /* A/B type, C/D type */
    float alpha, beta;
    int bias;
    const char *what;
} gemm_case;

static float value_of(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_32F ? ((const float *)p)[i] : bf16_to_f32(((const uint16_t *)p)[i]);
}

/* Fills a rows x cols column-major matrix of leading dimension ld (the
 * padding rows too) with bf16-representable values. */
static void *make_matrix(int rows, int cols, int ld, cudaDataType_t t) {
    size_t n = (size_t)ld * cols, es = t == CUDA_R_32F ? 4 : 2;
    void *h = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        bf16 b = f32_to_bf16(frand());
        if (t == CUDA_R_32F) ((float *)h)[i] = bf16_to_f32(b);
        else ((uint16_t *)h)[i] = b;
    }
    (void)rows;
    return h;
}

static void *upload(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

static void run_gemm_case(const gemm_case *g) {
    int m = g->m, n = g->n, k = g->k;
    int a_rows = g->transa == CUBLAS_OP_N ? m : k, a_cols = g->transa == CUBLAS_OP_N ? k : m;
    int b_rows = g->transb == CUBLAS_OP_N ? k : n, b_cols = g->transb == CUBLAS_OP_N ? n : k;
    int lda = a_rows + g->pad, ldb = b_rows + g->pad, ldc = m + g->pad;
    size_t ies = g->in == CUDA_R_32F ? 4 : 2, oes = g->out == CUDA_R_32F ? 4 : 2;
    void *A = make_matrix(a_rows, a_cols, lda, g->in), *B = make_matrix(b_rows, b_cols, ldb, g->in);
    void *C = make_matrix(m, n, ldc, g->out), *bias = make_matrix(m, 1, m, g->out);
    void *dA = upload(A, (size_t)lda * a_cols * ies), *dB = upload(B, (size_t)ldb * b_cols * ies);
    void *dC = upload(C, (size_t)ldc * n * oes), *dD = upload(C, (size_t)ldc * n * oes);
    void *dbias = upload(bias, (size_t)m * oes);
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    cublasOperation_t ta = g->transa, tb = g->transb;
    cublasLtEpilogue_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    size_t ws = 1 << 20;
    int ok = cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias) ==
                 CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&la, g->in, a_rows, a_cols, lda) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&lb, g->in, b_rows, b_cols, ldb) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutCreate(&lc, g->out, m, n, ldc) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                 CUBLAS_STATUS_SUCCESS &&
             cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &heur, &found) == CUBLAS_STATUS_SUCCESS &&
             found == 1;
    CHECK(ok, "%s: descriptors and heuristic", g->what);
    if (ok)
        CHECK(cublasLtMatmul(h, desc, &g->alpha, dA, la, dB, lb, &g->beta, dC, lc, dD, lc, &heur.algo, NULL, 0, NULL) ==
                  CUBLAS_STATUS_SUCCESS,
              "%s: cublasLtMatmul", g->what);
    void *D = malloc((size_t)ldc * n * oes);
    cudaMemcpy(D, dD, (size_t)ldc * n * oes, cudaMemcpyDeviceToHost);
    double worst = 0;
    int pad_kept = 1;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double s = 0, scale = 0;
            for (int p = 0; p < k; p++) {
                double a = value_of(A, g->in, g->transa == CUBLAS_OP_N ? i + (size_t)p * lda : p + (size_t)i * lda);
                double b = value_of(B, g->in, g->transb == CUBLAS_OP_N ? p + (size_t)j * ldb : j + (size_t)p * ldb);
                s += a * b, scale += fabs(a * b);
            }
            double want = g->alpha * s + g->beta * value_of(C, g->out, i + (size_t)j * ldc) +
                          (g->bias ? value_of(bias, g->out, i) : 0);
            double got = value_of(D, g->out, i + (size_t)j * ldc);
            double tol = g->out == CUDA_R_32F ? 1e-5 * (scale + 1) : 1e-2 * (fabs(want) + 1e-3 * (scale + 1));
            if (fabs(got - want) / tol > worst) worst = fabs(got - want) / tol;
        }
        for (int i = m; i < ldc; i++) /* the padding rows of D are not D's */
            pad_kept &= value_of(D, g->out, i + (size_t)j * ldc) == value_of(C, g->out, i + (size_t)j * ldc);
    }
    CHECK(worst <= 1, "%s: off by %.2f tolerances", g->what, worst);
    CHECK(pad_kept, "%s: wrote the padding rows of D", g->what);
    if (ok) {
        /* op(A) and op(B) that disagree on k are refused */
        cublasLtMatrixLayout_t bad;
        cublasLtMatrixLayoutCreate(&bad, g->in, b_rows + 1, b_cols + 1, ldb + 1);
        CHECK(cublasLtMatmul(h, desc, &g->alpha, dA, la, dB, bad, &g->beta, dC, lc, dD, lc, &heur.algo, NULL, 0,
                             NULL) != CUBLAS_STATUS_SUCCESS,
              "%s: a mismatched layout was accepted", g->what);
        cublasLtMatrixLayoutDestroy(bad);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatmulDescDestroy(desc);
        cublasLtDestroy(h);
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(dbias);
    free(A), free(B), free(C), free(D), free(bias);
}

/* polar's layout first (runtime/cuda_gemm.c: W^T x with bf16 W [rows,
 * cols] as a cols x rows column-major A, x as cols x T, f32 C with ld =
 * rows), at the shapes of kernel_prefill_ops and a prefill chunk; then the
 * other transposes, padded leading dimensions, f32 inputs, bf16 output,
 * alpha/beta and the bias epilogue. */
static void cublaslt_layouts(void) {
    static const gemm_case cases[] = {
        {CUBLAS_OP_T, CUBLAS_OP_N, 200, 37, 320, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "polar: W^T x, 200x37x320"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 256, 40, 64, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "polar: head slice 256x40x64"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 96, 129, 48, 0, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "polar: odd T 96x129x48"},
        {CUBLAS_OP_N, CUBLAS_OP_N, 33, 17, 65, 3, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "NN padded"},
        {CUBLAS_OP_N, CUBLAS_OP_T, 33, 17, 65, 5, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "NT padded"},
        {CUBLAS_OP_T, CUBLAS_OP_T, 33, 17, 65, 1, CUDA_R_16BF, CUDA_R_32F, 1, 0, 0, "TT padded"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 40, 9, 24, 2, CUDA_R_32F, CUDA_R_32F, 0.5f, 2.0f, 0, "f32 inputs, alpha, beta"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 40, 9, 24, 0, CUDA_R_16BF, CUDA_R_16BF, 1, 1, 1, "bf16 output, beta, bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_gemm_case(&cases[i]);
}

/* ------------------------------------------------------ WMMA and runtime */

static void wmma_product(void) {
    uint16_t a[256], b[256];
    float want[256], got[256];
    for (int i = 0; i < 256; i++) a[i] = f32_to_bf16(frand()), b[i] = f32_to_bf16(frand());
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += (double)bf16_to_f32(a[r * 16 + k]) * bf16_to_f32(b[c * 16 + k]);
            want[r * 16 + c] = (float)s;
        }
    void *da = upload(a, sizeof a), *db = upload(b, sizeof b);
    float *dc = NULL;
    cudaMalloc((void **)&dc, sizeof got);
    CHECK(emu_wmma_product(dc, da, db) == cudaSuccess, "wmma launch");
    cudaMemcpy(got, dc, sizeof got, cudaMemcpyDeviceToHost);
    float d = 0;
    for (int i = 0; i < 256; i++) d = fmaxf(d, fabsf(got[i] - want[i]));
    CHECK(d < 1e-5f, "wmma product off by %g", d);
    cudaFree(da), cudaFree(db), cudaFree(dc);
}

/* Memory nobody wrote reads as NaN; copies must stay inside allocations;
 * bad launch configurations are refused. */
static void runtime_checks(void) {
    float *d = NULL, h[4];
    CHECK(cudaMalloc((void **)&d, 4 * sizeof(float)) == cudaSuccess, "cudaMalloc");
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(isnan(h[0]) && isnan(h[3]), "fresh device memory is not NaN-poisoned");
    CHECK(cudaMemcpy(d, h, 5 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "a copy past the allocation was accepted");
    CHECK(cudaMemcpy(h, h + 1, sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "a host pointer was accepted as device memory");
    CHECK(cudaMemcpy(d, d, sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
          "device memory was accepted as a copy's host side");
    CHECK(cudaMemcpy(d, h, sizeof(float), cudaMemcpyDefault) == cudaSuccess &&
              cudaMemcpy(h, d, sizeof(float), cudaMemcpyDefault) == cudaSuccess,
          "cudaMemcpyDefault refused host or device memory");
    CHECK(emu_bad_launch("too_many_threads", d, 4, NULL) == cudaErrorInvalidConfiguration, "2048 threads");
    CHECK(emu_bad_launch("too_much_shared", d, 4, NULL) == cudaErrorInvalidValue, "64 KiB without the opt-in");
    CHECK(cudaGetLastError() == cudaSuccess, "launch errors are not sticky");
    /* shared memory placed with its declared alignment: no more, no less */
    CHECK(emu_bad_launch("aligned_shared", d, 4, NULL) == cudaSuccess, "aligned_shared launch");
    cudaMemcpy(h, d, 2 * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h[0] == 1.0f && h[1] == 32.0f, "__align__: float4 read %g, dynamic shared memory at 32 + %g mod 64", h[0],
          h[1] - 32.0f);
    /* cudaLaunchKernelEx, launched to overlap the previous kernel: runs with its arguments */
    float before[4] = {1, 2, 5, 7}, after[4];
    cudaMemcpy(d, before, sizeof before, cudaMemcpyHostToDevice);
    CHECK(emu_bad_launch("overlap_add_one", d, 3, NULL) == cudaSuccess, "overlap_add_one launch");
    cudaMemcpy(after, d, sizeof after, cudaMemcpyDeviceToHost);
    CHECK(after[0] == 2 && after[1] == 3 && after[2] == 6 && after[3] == 7, "cudaLaunchKernelEx: %g %g %g %g",
          after[0], after[1], after[2], after[3]);
    cudaFree(d);
}

/* Capture records launches with their arguments, a replay runs them; a
 * graph lists its kernel, memcpy and memset nodes; a
 * forbidden call during capture fails as the real runtime fails it and
 * invalidates the capture; the legacy stream may not wait on a blocking
 * stream that captures. */
static void graph_capture_rules(void) {
    cudaStream_t s, blocking;
    float *d = NULL, h[8];
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking);
    cudaMalloc((void **)&d, sizeof h);
    cudaMemset(d, 0, sizeof h);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
    int n = 8;
    emu_bad_launch("add_one", d, n, s);
    n = 3; /* the graph keeps the 8 it was captured with */
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "end capture");
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 0 && h[7] == 0, "a captured launch ran at capture");
    CHECK(cudaGraphInstantiate(&x, g, 0) == cudaSuccess, "instantiate");
    cudaGraphDestroy(g);
    cudaGraphLaunch(x, s);
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 2 && h[7] == 2 && n == 3, "two replays: %g %g", h[0], h[7]);
    cudaGraphExecDestroy(x);
    /* a graph's nodes (what polar counts a decode step's launches by): a
     * kernel, a memcpy, a memset; an event recorded during capture is none */
    cudaEvent_t ev;
    cudaEventCreate(&ev);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
    emu_bad_launch("add_one", d, 8, s);
    cudaMemcpyAsync(d + 4, d, 4 * sizeof(float), cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(ev, s);
    cudaMemsetAsync(d, 0, 4 * sizeof(float), s);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "end capture");
    static const enum cudaGraphNodeType kinds[3] = {cudaGraphNodeTypeKernel, cudaGraphNodeTypeMemcpy,
                                                    cudaGraphNodeTypeMemset};
    cudaGraphNode_t nodes[5];
    size_t nn = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nn) == cudaSuccess && nn == 3, "%zu nodes counted, not 3", nn);
    nn = 5;
    CHECK(cudaGraphGetNodes(g, nodes, &nn) == cudaSuccess && nn == 3 && !nodes[3] && !nodes[4],
          "5 asked for: %zu nodes, the rest not NULL", nn);
    for (int i = 0; i < 3 && nn == 3; i++) {
        enum cudaGraphNodeType t = cudaGraphNodeTypeEmpty;
        CHECK(cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == kinds[i], "node %d: type %d, not %d", i,
              (int)t, (int)kinds[i]);
    }
    nn = 2;
    CHECK(cudaGraphGetNodes(g, nodes, &nn) == cudaSuccess && nn == 2, "2 asked for: %zu", nn);
    cudaGraphDestroy(g);
    cudaEventDestroy(ev);
    /* forbidden calls on the capturing thread */
    static const char *calls[] = {"cudaMalloc", "cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize"};
    for (int c = 0; c < 4; c++) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
        void *p = NULL;
        cudaError_t e = c == 0 ? cudaMalloc(&p, 16)
                        : c == 1 ? cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost)
                        : c == 2 ? cudaStreamSynchronize(s)
                                 : cudaDeviceSynchronize();
        CHECK(e == cudaErrorStreamCaptureUnsupported, "%s during capture: %s", calls[c], cudaGetErrorName(e));
        g = NULL;
        CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g,
              "%s did not invalidate the capture", calls[c]);
    }
    /* a blocking stream captures: the legacy stream cannot wait for it */
    CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin capture");
    cudaError_t e = cudaMemset(d, 0, sizeof h);
    CHECK(e == cudaErrorStreamCaptureImplicit, "legacy memset while a blocking stream captures: %s",
          cudaGetErrorName(e));
    CHECK(cudaStreamEndCapture(blocking, &g) == cudaErrorStreamCaptureInvalidated, "implicit sync invalidates");
    cudaGetLastError();
    cudaFree(d);
    cudaStreamDestroy(s);
    cudaStreamDestroy(blocking);
}

/* --------------------------------------------------------------- detections */

static const char *self;

/* Runs this program with --case name under the given thread order; returns
 * its exit status (-signal when killed) and its stderr in err. */
static int run_case(const char *name, const char *order, char *err, size_t err_size) {
    int pipefd[2];
    if (pipe(pipefd)) return 999;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 2);
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        setenv("POLAR_CUDA_EMU_ORDER", order, 1);
        execl(self, self, "--case", name, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(pipefd[0], err + got, err_size - 1 - got)) > 0) got += (size_t)r;
    err[got] = 0;
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

/* The child's side: one faulty launch. */
static int child_case(const char *name) {
    float *d = NULL;
    int n = 64;
    cudaMalloc((void **)&d, 64 * 256 * sizeof(float));
    if (!strcmp(name, "global_overread")) { /* in = the last 64 floats of 128, read at 1..64 */
        float *two = NULL;
        cudaMalloc((void **)&two, 128 * sizeof(float));
        emu_bad_launch(name, two, 64, NULL);
        printf("no fault found\n");
        return 0;
    }
    if (!strcmp(name, "global_overflow")) {
        float *small = NULL;
        cudaMalloc((void **)&small, 40 * sizeof(float));
        emu_bad_launch(name, small, 40, NULL);
        cudaFree(small); /* the redzone check finds the write past the end */
        return 0;
    }
    if (!strncmp(name, "ticket_", 7)) { /* the last block's sum of 1..4, in any order of blocks */
        float sum = 0;
        emu_bad_launch(name, d, n, NULL);
        cudaMemcpy(&sum, d, sizeof sum, cudaMemcpyDeviceToHost);
        printf("sum %g\n", sum);
        return 0;
    }
    if (!strcmp(name, "racy") || !strcmp(name, "fixed")) {
        float h[64];
        emu_bad_launch(name, d, n, NULL);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        int ones = 0;
        for (int i = 0; i < n; i++) ones += h[i] == 1.0f;
        printf("ones %d\n", ones);
        return 0;
    }
    emu_bad_launch(name, d, name[0] == 'd' ? 8 : n, NULL);
    printf("no fault found\n");
    return 0;
}

static const char *orders[] = {"forward", "reverse", "random"}; /* POLAR_CUDA_EMU_ORDER */

static void detections(void) {
    static const char *cases[][2] = {
        {"exit_before_barrier", "exited"},
        {"divergent_barrier", "deadlock"},
        {"shuffle_exited_lane", "wait for it at __shfl_xor_sync"},
        {"shuffle_outside_mask", "reads lane 20, which is not in the mask"},
        {"shared_overflow", "past the end of the __shared__ variable s"},
        {"dynamic_shared_overflow", "past the end of the dynamic shared memory"},
        {"global_overflow", "written past its end"},
        {"global_overread", "at byte 512 of the 512-byte device allocation"},
        {"global_underread", "16384 bytes before the start of the 65536-byte device allocation"},
        {"wmma_pointer", "different pointers"},
        {"shared_vector", "misaligned address"},
        {"global_vector", "misaligned address"},
        {"grid_sync", "not launched with cudaLaunchCooperativeKernel"},
        {"overlap_no_wait", "kernel add_one_kernel(float*, int), block (0,0,0), thread (0,0,0): the thread of a "
                            "kernel launched to overlap the previous one"},
    };
    char out[8192];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = run_case(cases[i][0], "forward", out, sizeof out);
        /* misaligned vector accesses: -fsanitize=alignment reports them, not the emulation */
        int by_emu = strstr(cases[i][1], "misaligned") == NULL;
        CHECK(st != 0 && strstr(out, cases[i][1]) && (!by_emu || strstr(out, "cuda-emu")),
              "%s: status %d, expected a message with \"%s\", got: %s", cases[i][0], st, cases[i][1], out);
    }
    if (emu_race_checked()) return; /* ThreadSanitizer aborts the racy kernel: see races */
    /* a missing barrier shows as a difference between thread orders */
    char fwd[256], rev[256], fixed_rev[256];
    run_case("racy", "forward", fwd, sizeof fwd);
    run_case("racy", "reverse", rev, sizeof rev);
    run_case("fixed", "random", fixed_rev, sizeof fixed_rev);
    CHECK(strstr(fwd, "ones 64") && !strstr(rev, "ones 64"), "the racy kernel gave %s forward and %s reversed", fwd, rev);
    CHECK(strstr(fixed_rev, "ones 64") != NULL, "the fixed kernel gave %s in random order", fixed_rev);
    /* the ticket's last block sums every block's element, in any order of blocks */
    for (int o = 0; o < 3; o++) {
        char sum[256];
        run_case("ticket_fixed", orders[o], sum, sizeof sum);
        CHECK(strstr(sum, "sum 10\n") != NULL, "the ticket kernel gave %s in %s order", sum, orders[o]);
    }
}

/* Under ThreadSanitizer (make test-cuda-race): each race is reported, in
 * every thread order, and its fixed twin is not. */
static void races(void) {
    static const char *racy[][2] = {
        {"racy", "racy_kernel"},               /* shared memory, no __syncthreads */
        {"warp_racy", "warp_racy_kernel"},     /* shared memory, no __syncwarp */
        {"blocks_racy", "blocks_racy_kernel"}, /* two blocks write one element */
        {"early_read", "early_read_kernel"},   /* read before cudaGridDependencySynchronize */
        {"ticket_racy", "ticket_kernel"},      /* a ticket taken without __threadfence */
    };
    static const char *fixed[] = {"fixed", "warp_fixed", "blocks_fixed", "overlap_wait", "ticket_fixed"};
    char out[16384];
    for (size_t o = 0; o < 3; o++) {
        for (size_t i = 0; i < sizeof racy / sizeof racy[0]; i++) {
            int st = run_case(racy[i][0], orders[o], out, sizeof out);
            CHECK(st == 66 && strstr(out, "ThreadSanitizer: data race") && strstr(out, racy[i][1]),
                  "%s (%s order): status %d, expected a data race in %s, got: %.2000s", racy[i][0], orders[o], st,
                  racy[i][1], out);
        }
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
            int st = run_case(fixed[i], orders[o], out, sizeof out);
            CHECK(st == 0 && !strstr(out, "ThreadSanitizer"), "%s (%s order): status %d, got: %.2000s", fixed[i],
                  orders[o], st, out);
        }
    }
}

int main(int argc, char **argv) {
    self = argv[0];
    setenv("POLAR_CUDA_EMU_QUIET", "1", 1); /* the refusals below are expected */
    if (argc == 3 && !strcmp(argv[1], "--case")) return child_case(argv[2]);
    RUN(cublaslt_layouts);
    RUN(wmma_product);
    RUN(runtime_checks);
    RUN(graph_capture_rules);
    RUN(detections);
    if (emu_race_checked()) {
        setenv("TSAN_OPTIONS", "halt_on_error=1:exitcode=66", 1); /* for the children */
        RUN(races);
    }
    TEST_EXIT();
}
