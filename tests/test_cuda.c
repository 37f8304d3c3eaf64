/* make test-cuda (needs a GPU): every CUDA kernel against its CPU reference on
 * random inputs at the presets' real shapes, then whole models: the golden
 * fixtures, dense and MoE (logits and 16 greedy tokens against the CPU, two
 * MoE runs bitwise equal), a preset's logits (cosine >= 0.999),
 * skip/repeat/reorder programs, and cached decode against recompute on the
 * GPU. --quick runs a smaller set (for compute-sanitizer).
 * Tolerances: kernels 1e-4 relative to the row's scale (f32 math, other
 * summation order); models 2e-2 absolute (the KV cache is bf16 on the GPU). */
#include <cuda_runtime_api.h>

#include "../kernels/cpu/ops.h"
#include "../kernels/cuda/ops.h"
#include "harness.h"
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

static float max_rel(const float *a, const float *b, size_t n) {
    float scale = 1e-6f, d = 0;
    for (size_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(b[i]));
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d / scale;
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
            bf16 *w = malloc(nw * 2), *b = malloc((size_t)rows * 2);
            float *x = malloc((size_t)T * cols * 4), *y = malloc((size_t)T * rows * 4), *g = malloc((size_t)T * rows * 4);
            for (size_t i = 0; i < nw; i++) w[i] = f32_to_bf16(frand() / sqrtf((float)cols));
            for (int i = 0; i < rows; i++) b[i] = f32_to_bf16(frand() * 0.1f);
            for (size_t i = 0; i < (size_t)T * cols; i++) x[i] = frand();
            for (size_t i = 0; i < (size_t)T * rows; i++) y[i] = g[i] = frand();
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
    cudaFree(dx), cudaFree(dw), cudaFree(dout), cudaFree(du), cudaFree(dl), cudaFree(di);
    free(x), free(want), free(got), free(w), free(u);
}

/* Whole models: CPU and CUDA sessions on the same weights and programs. */
static void compare_model(const polar_model *m, const char *program, int n_prompt, int steps, float tol, int cosine) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab;
    polar_program p;
    CHECK_OK(polar_program_parse(program, info.arch.n_layers, 0, &p, &err));
    polar_session *cpu = NULL, *gpu = NULL;
    polar_session_opts oc = {.max_ctx = n_prompt + steps, .device = POLAR_DEVICE_CPU};
    polar_session_opts og = {.max_ctx = n_prompt + steps, .device = POLAR_DEVICE_CUDA};
    CHECK_OK(polar_session_create(m, &p, &oc, &cpu, &err));
    CHECK_OK(polar_session_create(m, &p, &og, &gpu, &err));
    int *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 7919 + 13) % V;
    float *a = malloc((size_t)n_prompt * V * 4), *b = malloc((size_t)n_prompt * V * 4);
    if (cpu && gpu) {
        CHECK_OK(polar_prefill(cpu, prompt, n_prompt, a, &err));
        CHECK_OK(polar_prefill(gpu, prompt, n_prompt, b, &err));
        double dot = 0, na = 0, nb = 0;
        float d = 0;
        for (size_t i = 0; i < (size_t)n_prompt * V; i++) {
            d = fmaxf(d, fabsf(a[i] - b[i]));
            dot += (double)a[i] * b[i], na += (double)a[i] * a[i], nb += (double)b[i] * b[i];
        }
        double cos = dot / sqrt(na * nb);
        if (cosine) CHECK(cos >= 0.999, "%s: cosine %f", program, cos);
        else CHECK(d <= tol, "%s: max |logit diff| %g > %g", program, d, tol);
        int oa[64], ob[64];
        polar_gen_opts go = {.max_new = steps, .ignore_eos = 1};
        CHECK_OK(polar_generate(cpu, prompt, n_prompt, &go, oa, NULL, NULL, NULL, &err));
        CHECK_OK(polar_generate(gpu, prompt, n_prompt, &go, ob, NULL, NULL, NULL, &err));
        int same = 0;
        while (same < steps && oa[same] == ob[same]) same++;
        if (!cosine) CHECK(same == steps, "%s: greedy tokens agree for %d of %d", program, same, steps);
        printf("  %-24s max |logit diff| %.3e, cosine %.6f, %d/%d greedy tokens equal\n", program, d, cos, same, steps);
    }
    free(a), free(b), free(prompt);
    polar_session_free(cpu);
    polar_session_free(gpu);
    polar_program_free(&p);
}

static void model_golden(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen3_moe"};
    static const char *programs[] = {"base", "0,3", "0,1-2x2,3", "0,2-3x2", "0,2,1,3"};
    for (int i = 0; i < 4; i++) {
        char dir[128];
        snprintf(dir, sizeof dir, GOLDEN_DIR "/%s", archs[i]);
        polar_error err;
        polar_model *m = NULL;
        CHECK_OK(polar_model_load(dir, &m, &err));
        for (int p = 0; m && p < (quick ? 1 : 5); p++) compare_model(m, programs[p], 7, 16, 2e-2f, 0);
        polar_model_free(m);
    }
}

static void model_preset(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_preset(quick ? "llama-3.2-1b" : "llama-3.2-3b", &a, &err));
    CHECK_OK(polar_model_random(&a, 1, &m, &err));
    if (!m) return;
    compare_model(m, "base", 24, 4, 0, 1);
    if (!quick) compare_model(m, "0-9,12-27", 24, 4, 0, 1), compare_model(m, "0-13,10-13,14-27", 24, 4, 0, 1);
    polar_model_free(m);
}

/* Qwen2-MoE (6 layers: shared expert, dense layers between MoE ones) on the
 * GPU against the CPU, and two identical GPU runs bitwise equal. */
static void model_moe(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2_moe", &m, &err));
    if (!m) return;
    compare_model(m, "base", 7, 16, 2e-2f, 0);
    compare_model(m, "0,1-2x2,3-5", 7, 16, 2e-2f, 0);
    polar_program p;
    CHECK_OK(polar_program_parse("0-1,5,1x2,4-5", 6, 0, &p, &err));
    float *runs[2];
    for (int r = 0; r < 2; r++) {
        polar_session *s = NULL;
        polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
        int prompt[7] = {17, 3, 200, 45, 91, 128, 7};
        runs[r] = malloc(7 * 256 * sizeof(float));
        CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
        if (s) CHECK_OK(polar_prefill(s, prompt, 7, runs[r], &err));
        polar_session_free(s);
    }
    CHECK(memcmp(runs[0], runs[1], 7 * 256 * sizeof(float)) == 0, "two GPU runs give bitwise identical logits");
    free(runs[0]), free(runs[1]);
    polar_program_free(&p);
    polar_model_free(m);
}

/* One GPU session switching programs (each switch re-captures the decode
 * graph): every generation equals the CPU's, and device memory stays flat. */
static void graph_recapture(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    static const char *texts[] = {"base", "0,1-2x2,3", "3,0x2,2"};
    polar_program progs[3];
    for (int i = 0; i < 3; i++) CHECK_OK(polar_program_parse(texts[i], 4, 0, &progs[i], &err));
    polar_session *g = NULL, *c = NULL;
    polar_session_opts og = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CUDA};
    polar_session_opts oc = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CPU};
    CHECK_OK(polar_session_create(m, &progs[0], &og, &g, &err));
    CHECK_OK(polar_session_create(m, &progs[0], &oc, &c, &err));
    int prompt[4] = {1, 2, 3, 4}, a[12], b[12];
    polar_gen_opts go = {.max_new = 12, .ignore_eos = 1};
    size_t free_before = 0, free_after = 0, total;
    for (int round = 0; g && c && round < 30; round++) {
        int i = round % 3;
        CHECK_OK(polar_session_set_program(g, &progs[i], &err));
        CHECK_OK(polar_session_set_program(c, &progs[i], &err));
        CHECK_OK(polar_generate(g, prompt, 4, &go, a, NULL, NULL, NULL, &err));
        CHECK_OK(polar_generate(c, prompt, 4, &go, b, NULL, NULL, NULL, &err));
        CHECK(!memcmp(a, b, sizeof a), "round %d (%s): GPU tokens differ from the CPU's", round, texts[i]);
        if (round == 2) cudaMemGetInfo(&free_before, &total);
    }
    cudaMemGetInfo(&free_after, &total);
    CHECK(free_after + (1 << 20) >= free_before, "device memory fell by %zu bytes over 27 re-captures",
          free_before - free_after);
    polar_session_free(g);
    polar_session_free(c);
    for (int i = 0; i < 3; i++) polar_program_free(&progs[i]);
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
    float worst = 0;
    if (a && b) CHECK_OK(polar_prefill(a, seq, n, NULL, &err));
    for (int step = 0; a && b && step < 10; step++) {
        seq[n] = polar_argmax(polar_logits(a), 256);
        CHECK_OK(polar_decode_step(a, seq[n++], &err));
        polar_session_reset(b);
        CHECK_OK(polar_prefill(b, seq, n, NULL, &err));
        for (int i = 0; i < 256; i++) worst = fmaxf(worst, fabsf(polar_logits(a)[i] - polar_logits(b)[i]));
    }
    CHECK(worst < 1e-4f, "GPU cached vs recomputed: %g", worst);
    polar_session_free(a);
    polar_session_free(b);
    polar_program_free(&p);
    polar_model_free(m);
}

int main(int argc, char **argv) {
    quick = argc > 1 && !strcmp(argv[1], "--quick");
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) {
        printf("FAIL test_cuda: %s (make test-cuda needs a GPU)\n", why);
        return 1;
    }
    RUN(kernel_matmul);
    RUN(kernel_rmsnorm_swiglu_argmax);
    RUN(model_golden);
    RUN(model_preset);
    RUN(model_moe);
    RUN(predictor_fused);
    RUN(graph_recapture);
    RUN(gpu_cache_consistency);
    TEST_EXIT();
}
