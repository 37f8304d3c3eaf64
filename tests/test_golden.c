/* Agreement with Hugging Face transformers (float32, layer list rebuilt per
 * program, no cache) on the committed fixtures of tests/golden, dense and
 * mixture-of-experts, RoPE plain and scaled (llama3, linear, YaRN): logits at
 * every prompt position within 1e-4, and 8 greedy tokens identical. */
#include "../loader/safetensors.h"
#include "harness.h"

#define LOGIT_TOL 1e-4f /* the issue asks 1e-3; f32 vs f32 lands near 3e-6 */
#define N_GREEDY 8

static const char *archs[] = {"llama",        "qwen2",      "qwen3",     "qwen2_moe",
                              "qwen3_moe",    "llama_linear", "qwen3_yarn", "qwen2_yarn"};
static const char *programs[] = {"base", "skip", "repeat", "mixed", "reorder"};

static const st_tensor *need(const st_file *f, const char *name) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL, "fixture tensor %s missing", name);
    return t;
}

/* The fixture of arch: its model and what transformers gave; 0 after a
 * failed check. */
static int open_fixture(const char *arch, polar_model **m, st_file *exp) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, arch);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    polar_error err;
    *m = NULL;
    *exp = (st_file){0};
    CHECK_OK(polar_model_load(dir, m, &err));
    CHECK_OK(st_open(path, exp, &err));
    if (*m && exp->tensors) return 1;
    if (exp->tensors) st_close(exp);
    polar_model_free(*m);
    return 0;
}

static void check_arch(const char *arch) {
    char name[64];
    polar_error err;
    polar_model *m;
    st_file exp;
    if (!open_fixture(arch, &m, &exp)) return;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab;
    const st_tensor *pt = need(&exp, "prompt");
    if (!pt) return;
    int T = (int)pt->shape[0];
    const int *prompt = pt->data;
    float *logits = malloc((size_t)T * V * sizeof *logits);
    for (size_t p = 0; p < sizeof programs / sizeof programs[0]; p++) {
        snprintf(name, sizeof name, "%s.program", programs[p]);
        const st_tensor *prog_t = need(&exp, name);
        snprintf(name, sizeof name, "%s.logits", programs[p]);
        const st_tensor *logit_t = need(&exp, name);
        snprintf(name, sizeof name, "%s.tokens", programs[p]);
        const st_tensor *tok_t = need(&exp, name);
        if (!prog_t || !logit_t || !tok_t) continue;
        CHECK(logit_t->shape[0] == T && logit_t->shape[1] == V, "logits shape");
        polar_program prog = {(int)prog_t->shape[0], (int *)prog_t->data};
        polar_session *s = NULL;
        polar_session_opts so = {.max_ctx = T + N_GREEDY, .n_threads = 2};
        CHECK_OK(polar_session_create(m, &prog, &so, &s, &err));
        if (!s) continue;
        CHECK_OK(polar_prefill(s, prompt, T, logits, &err));
        const float *want = logit_t->data;
        float maxdiff = 0;
        for (size_t i = 0; i < (size_t)T * V; i++) maxdiff = nan_max(maxdiff, fabsf(logits[i] - want[i]));
        CHECK(maxdiff <= LOGIT_TOL, "%s %s: max abs logit diff %g > %g", arch, programs[p], maxdiff, LOGIT_TOL);
        int out[N_GREEDY];
        polar_gen_opts go = {.max_new = N_GREEDY, .ignore_eos = 1};
        polar_gen_stats st;
        CHECK_OK(polar_generate(s, prompt, T, &go, out, &st, NULL, NULL, &err));
        const int *want_tok = tok_t->data;
        CHECK(st.n_generated == N_GREEDY, "generated %d", st.n_generated);
        int equal = 0;
        for (int i = 0; i < N_GREEDY; i++) {
            CHECK(out[i] == want_tok[i], "%s %s: greedy token %d is %d, transformers gives %d", arch, programs[p], i,
                  out[i], want_tok[i]);
            equal += out[i] == want_tok[i];
        }
        printf("  %-12s %-8s %2d layers: max |logit diff| %.2e, %d of %d greedy tokens equal\n", arch, programs[p],
               prog.n, maxdiff, equal, N_GREEDY);
        polar_session_free(s);
    }
    free(logits);
    st_close(&exp);
    polar_model_free(m);
}

static void golden_llama(void) { check_arch(archs[0]); }
static void golden_qwen2(void) { check_arch(archs[1]); }
static void golden_qwen3(void) { check_arch(archs[2]); }
static void golden_qwen2_moe(void) { check_arch(archs[3]); }
static void golden_qwen3_moe(void) { check_arch(archs[4]); }
static void golden_llama_linear(void) { check_arch(archs[5]); }
static void golden_qwen3_yarn(void) { check_arch(archs[6]); }
static void golden_qwen2_yarn(void) { check_arch(archs[7]); }

/* round_like_cuda (the CPU reference for a GPU session): rounding the KV
 * cache and, in passes of more than 2 tokens (CUDA_GEMV_TOKENS), the GEMM inputs to bf16 moves
 * the logits (these tiny random models amplify it: ~2e-2, and 0.2 where an
 * expert choice flips) but is no no-op; a 40-token prefill rounds the GEMM
 * inputs, the same tokens fed 2 at a time do not (as on the GPU, whose
 * passes of at most 2 run the f32 GEMVs). */
static void round_like_cuda(void) {
    static const char *which[] = {"llama", "qwen2_moe"};
    for (int a = 0; a < 2; a++) {
        polar_error err;
        polar_model_info info;
        polar_model *m = golden_model(which[a], &info);
        if (!m) continue;
        polar_program prog;
        CHECK_OK(polar_program_base(info.arch.n_layers, &prog, &err));
        int prompt[40], V = info.arch.vocab;
        for (int i = 0; i < 40; i++) prompt[i] = (i * 31 + 7) % V;
        float *l[3];
        for (int r = 0; r < 3; r++) { /* f32; rounded, one prefill; rounded, 2 at a time */
            polar_session *s = NULL;
            polar_session_opts so = {.max_ctx = 48, .n_threads = 2, .round_like_cuda = r > 0};
            l[r] = calloc((size_t)V, sizeof(float));
            CHECK_OK(polar_session_create(m, &prog, &so, &s, &err));
            for (int i = 0; s && i < 40; i += r == 2 ? 2 : 40) CHECK_OK(polar_prefill(s, prompt + i, r == 2 ? 2 : 40, NULL, &err));
            if (s) memcpy(l[r], polar_logits(s), (size_t)V * sizeof(float));
            polar_session_free(s);
        }
        float d[2] = {0, 0};
        for (int i = 0; i < V; i++) d[0] = fmaxf(d[0], fabsf(l[1][i] - l[0][i])), d[1] = fmaxf(d[1], fabsf(l[2][i] - l[0][i]));
        CHECK(d[0] > 1e-5f && d[0] < 0.5f && d[1] > 1e-5f && d[1] < 0.5f, "%s: rounded vs f32 %g, %g", which[a], d[0],
              d[1]);
        CHECK(memcmp(l[1], l[2], (size_t)V * sizeof(float)), "%s: GEMM inputs were not rounded", which[a]);
        printf("  %-9s rounded like CUDA vs f32: %.2e (one prefill), %.2e (2 tokens at a time)\n", which[a], d[0], d[1]);
        for (int r = 0; r < 3; r++) free(l[r]);
        polar_program_free(&prog);
        polar_model_free(m);
    }
}

/* kv_bf16: a session keeping its K/V rows in bf16 gives at every step the
 * bits of round_like_cuda's f32 rows rounded to bf16, where those round
 * nothing else (the prompt fed 2 tokens at a time, the GPU's GEMV passes), and the same bits
 * again with the prompt in one prefill (the tiled path); the distance to
 * transformers' f32 logits is printed, a measured figure. */
static void kv_bf16(void) {
    enum { N_PROMPT = 40, STEPS = 6 };
    static const char *progs[] = {"base", "repeat", "reorder"};
    for (size_t a = 0; a < sizeof archs / sizeof *archs; a++) {
        char name[64];
        polar_error err;
        polar_model *m;
        st_file exp;
        if (!open_fixture(archs[a], &m, &exp)) continue;
        polar_model_info info;
        polar_model_info_get(m, &info);
        int V = info.arch.vocab, prompt[N_PROMPT];
        for (int i = 0; i < N_PROMPT; i++) prompt[i] = (i * 31 + 7) % V;
        float worst = 0;
        for (size_t p = 0; p < sizeof progs / sizeof *progs; p++) {
            snprintf(name, sizeof name, "%s.program", progs[p]);
            const st_tensor *prog_t = need(&exp, name);
            if (!prog_t) continue;
            polar_program prog = {(int)prog_t->shape[0], (int *)prog_t->data};
            /* rounded f32 rows, 2 at a time; bf16 rows, 2 at a time; bf16 rows, one prefill */
            polar_session_opts so[3] = {{.max_ctx = N_PROMPT + STEPS, .n_threads = 2, .round_like_cuda = 1},
                                        {.max_ctx = N_PROMPT + STEPS, .n_threads = 2, .kv_bf16 = 1},
                                        {.max_ctx = N_PROMPT + STEPS, .n_threads = 2, .kv_bf16 = 1}};
            polar_session *s[3] = {NULL, NULL, NULL};
            for (int r = 0; r < 3; r++) {
                CHECK_OK(polar_session_create(m, &prog, &so[r], &s[r], &err));
                int chunk = r == 2 ? N_PROMPT : 2;
                for (int i = 0; s[r] && i < N_PROMPT; i += chunk) CHECK_OK(polar_prefill(s[r], prompt + i, chunk, NULL, &err));
            }
            for (int step = 0; s[0] && s[1] && s[2] && step <= STEPS; step++) {
                for (int r = 1; r < 3; r++)
                    CHECK(!memcmp(polar_logits(s[0]), polar_logits(s[r]), (size_t)V * sizeof(float)),
                          "%s %s step %d: bf16 rows (%s) are not the rounded f32 rows' bits", archs[a], progs[p], step,
                          r == 1 ? "2 at a time" : "one prefill");
                int next = polar_argmax(polar_logits(s[0]), V);
                for (int r = 0; r < 3 && step < STEPS; r++) CHECK_OK(polar_decode_step(s[r], next, &err));
            }
            /* the golden prompt: bf16 rows against transformers' f32 logits */
            const st_tensor *pt = need(&exp, "prompt");
            snprintf(name, sizeof name, "%s.logits", progs[p]);
            const st_tensor *logit_t = need(&exp, name);
            polar_session *g = NULL;
            CHECK_OK(polar_session_create(m, &prog, &so[2], &g, &err));
            if (g && pt && logit_t) {
                int T = (int)pt->shape[0];
                float *logits = malloc((size_t)T * V * sizeof(float));
                CHECK_OK(polar_prefill(g, pt->data, T, logits, &err));
                const float *want = logit_t->data;
                for (size_t i = 0; i < (size_t)T * V; i++) worst = nan_max(worst, fabsf(logits[i] - want[i]));
                free(logits);
            }
            polar_session_free(g);
            for (int r = 0; r < 3; r++) polar_session_free(s[r]);
        }
        CHECK(worst > 0 && worst < 0.5f, "%s: bf16 K/V vs transformers %g", archs[a], worst);
        printf("  %-9s bf16 K/V: the rounded rows' bits at %d steps; vs transformers' f32: %.2e\n", archs[a],
               STEPS + 1, worst);
        st_close(&exp);
        polar_model_free(m);
    }
}

int main(void) {
    RUN(round_like_cuda);
    RUN(kv_bf16);
    RUN(golden_llama);
    RUN(golden_qwen2);
    RUN(golden_qwen3);
    RUN(golden_qwen2_moe);
    RUN(golden_qwen3_moe);
    RUN(golden_llama_linear);
    RUN(golden_qwen3_yarn);
    RUN(golden_qwen2_yarn);
    TEST_EXIT();
}
