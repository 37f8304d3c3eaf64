/* Agreement with Hugging Face transformers (float32, layer list rebuilt per
 * program, no cache) on the committed fixtures of tests/golden, dense and
 * mixture-of-experts: logits at
 * every prompt position within 1e-4, and 8 greedy tokens identical. */
#include "../loader/safetensors.h"
#include "harness.h"

#define LOGIT_TOL 1e-4f /* the issue asks 1e-3; f32 vs f32 lands near 3e-6 */
#define N_GREEDY 8

static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"};
static const char *programs[] = {"base", "skip", "repeat", "mixed", "reorder"};

static const st_tensor *need(const st_file *f, const char *name) {
    const st_tensor *t = st_find(f, name);
    CHECK(t != NULL, "fixture tensor %s missing", name);
    return t;
}

static void check_arch(const char *arch) {
    char dir[256], path[300], name[64];
    snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, arch);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    polar_error err;
    polar_model *m = NULL;
    st_file exp;
    CHECK_OK(polar_model_load(dir, &m, &err));
    CHECK_OK(st_open(path, &exp, &err));
    if (!m || !exp.tensors) return;
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
        for (size_t i = 0; i < (size_t)T * V; i++) maxdiff = fmaxf(maxdiff, fabsf(logits[i] - want[i]));
        CHECK(maxdiff <= LOGIT_TOL, "%s %s: max abs logit diff %g > %g", arch, programs[p], maxdiff, LOGIT_TOL);
        int out[N_GREEDY];
        polar_gen_opts go = {.max_new = N_GREEDY, .ignore_eos = 1};
        polar_gen_stats st;
        CHECK_OK(polar_generate(s, prompt, T, &go, out, &st, NULL, NULL, &err));
        const int *want_tok = tok_t->data;
        CHECK(st.n_generated == N_GREEDY, "generated %d", st.n_generated);
        for (int i = 0; i < N_GREEDY; i++)
            CHECK(out[i] == want_tok[i], "%s %s: greedy token %d is %d, transformers gives %d", arch, programs[p], i,
                  out[i], want_tok[i]);
        printf("  %-9s %-8s %2d layers: max |logit diff| %.2e, %d greedy tokens equal\n", arch, programs[p], prog.n,
               maxdiff, N_GREEDY);
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

int main(void) {
    RUN(golden_llama);
    RUN(golden_qwen2);
    RUN(golden_qwen3);
    RUN(golden_qwen2_moe);
    RUN(golden_qwen3_moe);
    TEST_EXIT();
}
