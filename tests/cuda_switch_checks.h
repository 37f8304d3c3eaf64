/* test_cuda's checks of the environment switches: those that change only
 * timing (the same bits), overlapped launches off, the GEMV's token limit
 * (POLAR_CUDA_GEMV_TOKENS) and the tensor-core GEMV (POLAR_CUDA_MMA_GEMV).
 * Included by test_cuda.c after its model helpers (golden_model,
 * max_abs_diff, the bounds). */
#ifndef POLAR_TEST_CUDA_SWITCH_CHECKS_H
#define POLAR_TEST_CUDA_SWITCH_CHECKS_H

/* The switches that change timing only, each the same logits (prompt and
 * last decode step) and greedy tokens bit for bit on a dense and an MoE
 * model, the 2-token prompt and the steps on the GEMVs:
 * POLAR_CUDA_PREFETCH=1 (the GEMVs' weight rows asked into L2 before the
 * dependency wait), POLAR_CUDA_FUSED_MERGE=1 (split-K attention merged by
 * its last block: one launch, the merge's operations unchanged),
 * POLAR_CUDA_FUSED_ROPE=1 (RoPE and the K/V store in the q/k/v GEMV's
 * epilogue: one launch, the same operations), POLAR_CUDA_FUSED_ROUTE=1 (the
 * MoE router, top-k and grouping by one block), POLAR_CUDA_GEMV_RING=1 (the
 * bf16 GEMVs' loads as a ring: the same steps in the same order). */
static void timing_switches(void) {
    static const char *vars[] = {"POLAR_CUDA_PREFETCH", "POLAR_CUDA_FUSED_MERGE", "POLAR_CUDA_FUSED_ROPE",
                                 "POLAR_CUDA_FUSED_ROUTE", "POLAR_CUDA_GEMV_RING"};
    enum { N_VARS = sizeof vars / sizeof vars[0] };
    static const char *archs[] = {"llama", "qwen2_moe"};
    for (int a = 0; a < 2; a++) {
        polar_error err;
        polar_model *m = NULL;
        char dir[256];
        snprintf(dir, sizeof dir, GOLDEN_DIR "/%s", archs[a]);
        CHECK_OK(polar_model_load(dir, &m, &err));
        if (!m) continue;
        polar_model_info info;
        polar_model_info_get(m, &info);
        polar_program p;
        CHECK_OK(polar_program_parse("0,1-2x2,3", info.arch.n_layers, 0, &p, &err));
        int prompt[2] = {1, 2}, toks[N_VARS + 1][10];
        size_t V = (size_t)info.arch.vocab;
        float *logits[N_VARS + 1];
        polar_gen_opts go = {.max_new = 10, .ignore_eos = 1};
        polar_session_opts o = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CUDA};
        for (int i = 0; i <= N_VARS; i++) { /* none, then each switch */
            logits[i] = malloc(2 * V * 4); /* the prompt's last, the last step's */
            if (i) setenv(vars[i - 1], "1", 1);
            polar_session *s = NULL;
            CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
            if (i) unsetenv(vars[i - 1]);
            if (s) {
                CHECK_OK(polar_prefill(s, prompt, 2, NULL, &err));
                memcpy(logits[i], polar_logits(s), V * 4);
                CHECK_OK(polar_generate(s, prompt, 2, &go, toks[i], NULL, NULL, NULL, &err));
                memcpy(logits[i] + V, polar_logits(s), V * 4);
            }
            polar_session_free(s);
            if (i)
                CHECK(!memcmp(logits[0], logits[i], 2 * V * 4) && !memcmp(toks[0], toks[i], sizeof toks[0]),
                      "%s: %s=1 changed the logits or tokens", archs[a], vars[i - 1]);
        }
        for (int i = 0; i <= N_VARS; i++) free(logits[i]);
        polar_program_free(&p);
        polar_model_free(m);
    }
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (m) { /* the values the variants of cuda_state_create take: 0 or 1 */
        env_refused(m, "POLAR_CUDA_FUSED_ROPE", "2");
        env_refused(m, "POLAR_CUDA_FUSED_ROUTE", "yes");
        env_refused(m, "POLAR_CUDA_GEMV_RING", "8");
    }
    polar_model_free(m);
}

/* Kernels launched to overlap the previous one (programmatic dependent
 * launch, on by default from sm_90) give the tokens they give without it,
 * bit for bit: with POLAR_CUDA_PDL=0, and (under the emulation) with every
 * graph capture that records an overlapping launch failing, which a session
 * answers by capturing again without overlap. */
static void overlap_off(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    static const char *texts[] = {"base", "0,1-2x2,3"};
    static const char *env[][2] = {{"POLAR_CUDA_PDL", "0"}, {"POLAR_CUDA_EMU_BREAK_CAPTURE", "overlap"}};
    int n_env = 1;
#ifdef POLAR_CUDA_EMU
    n_env = 2;
#endif
    int prompt[4] = {1, 2, 3, 4};
    polar_gen_opts go = {.max_new = 10, .ignore_eos = 1};
    polar_session_opts o = {.max_ctx = 32, .max_program_len = 8, .device = POLAR_DEVICE_CUDA};
    for (int i = 0; i < 2; i++) {
        polar_program p;
        CHECK_OK(polar_program_parse(texts[i], 4, 0, &p, &err));
        int want[10], got[10];
        polar_session *s = NULL;
        CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
        if (s) {
            CHECK_OK(polar_generate(s, prompt, 4, &go, want, NULL, NULL, NULL, &err));
            /* a GPU before sm_90, or a driver refusing the capture: serial */
            const char *how = polar_session_cuda_launches(s);
            printf("  %s: kernel launches %s\n", texts[i], how ? how : "(none)");
#ifdef POLAR_CUDA_EMU
            CHECK(how && !strcmp(how, "overlapped"), "the emulated H100's launches: %s", how ? how : "NULL");
#endif
        }
        polar_session_free(s);
        for (int e = 0; e < n_env; e++) {
            setenv(env[e][0], env[e][1], 1);
            s = NULL;
            CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
            if (s) {
                CHECK_OK(polar_generate(s, prompt, 4, &go, got, NULL, NULL, NULL, &err));
                /* the reason: the variable, or the refused capture (a GPU before sm_90: its age) */
                const char *how = polar_session_cuda_launches(s), *want_why = e ? "driver" : "POLAR_CUDA_PDL=0";
                int older = 0;
#ifndef POLAR_CUDA_EMU
                older = how && strstr(how, "older") != NULL;
#endif
                CHECK(how && !strncmp(how, "serial: ", 8) && (strstr(how, want_why) || older),
                      "%s=%s: launches \"%s\"", env[e][0], env[e][1], how ? how : "NULL");
            }
            polar_session_free(s);
            unsetenv(env[e][0]);
            CHECK(!memcmp(want, got, sizeof want), "%s with %s=%s: tokens differ", texts[i], env[e][0], env[e][1]);
        }
        polar_program_free(&p);
    }
    polar_model_free(m);
}

/* POLAR_CUDA_GEMV_TOKENS=N sends passes of more than N tokens through
 * cuBLASLt (the default, CUDA_GEMV_TOKENS, is 2). On a dense and an MoE
 * model, a 7-token prompt and 8 greedy steps: N 2 gives the default's bits;
 * N 8 keeps the prompt on the GEMVs (f32 activations); N 0 takes the
 * single-token decode steps through cuBLASLt too (inside the captured
 * graph, launches still overlapped on the emulated H100), the prompt's bits
 * those of the default (7 tokens go through cuBLASLt either way): the same
 * greedy tokens, and where the route differs logits within the bounds of
 * the f32 route (only the rounding of GEMM inputs to bf16 changes) and not
 * the same bits. A value out of 0..8 fails the session whatever the device,
 * with the variable named. */
static void gemv_tokens_env(void) {
    static const char *archs[] = {"llama", "qwen2_moe"}, *values[] = {NULL, "2", "8", "0"};
    static const char *bad[] = {"9", "-1", "2x", ""};
    const char *saved = getenv("POLAR_CUDA_GEMV_TOKENS");
    char *restore = saved ? strdup(saved) : NULL;
    for (int i = 0; i < 2; i++) {
        polar_error err;
        polar_model_info info;
        polar_model *m = golden_model(archs[i], &info);
        if (!m) continue;
        int V = info.arch.vocab, prompt[7] = {5, 17, 2, 99, 41, 8, 63}, ran[4] = {0};
        polar_program p;
        CHECK_OK(polar_program_parse("0,1-2x2,3", info.arch.n_layers, 0, &p, &err));
        polar_session_opts o = {.max_ctx = 32, .device = POLAR_DEVICE_CUDA};
        polar_gen_opts go = {.max_new = 8, .ignore_eos = 1};
        float *pre[4], *last[4]; /* the prompt's logits, the last step's */
        int tok[4][8];
        for (int v = 0; v < 4; v++) {
            pre[v] = malloc((size_t)7 * V * 4), last[v] = malloc((size_t)V * 4);
            if (values[v]) setenv("POLAR_CUDA_GEMV_TOKENS", values[v], 1);
            else unsetenv("POLAR_CUDA_GEMV_TOKENS");
            polar_session *s = NULL;
            CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
            if (s && pre[v] && last[v] && polar_prefill(s, prompt, 7, pre[v], &err) == POLAR_OK &&
                polar_generate(s, prompt, 7, &go, tok[v], NULL, NULL, NULL, &err) == POLAR_OK) {
                memcpy(last[v], polar_logits(s), (size_t)V * 4);
                ran[v] = 1;
                const char *how = polar_session_cuda_launches(s);
                if (v == 3) printf("  %-9s POLAR_CUDA_GEMV_TOKENS=0: launches %s\n", archs[i], how ? how : "(none)");
#ifdef POLAR_CUDA_EMU
                CHECK(how && !strcmp(how, "overlapped"), "POLAR_CUDA_GEMV_TOKENS=%s: launches %s",
                      values[v] ? values[v] : "unset", how ? how : "NULL");
#endif
            }
            CHECK(ran[v], "%s, POLAR_CUDA_GEMV_TOKENS=%s: %s", archs[i], values[v] ? values[v] : "unset", err.msg);
            polar_session_free(s);
        }
        /* against the default: N 2 the same bits (prompt and last step), N 8
         * the prompt on the GEMVs, N 0 the prompt's bits but the last decode
         * step through cuBLASLt */
        static const struct {
            int b, last, same_bits;
        } pairs[4] = {{1, 0, 1}, {2, 0, 0}, {3, 0, 1}, {3, 1, 0}};
        for (int c = 0; c < 4 && ran[0] && ran[1] && ran[2] && ran[3]; c++) {
            int b = pairs[c].b;
            const float *la = pairs[c].last ? last[0] : pre[0], *lb = pairs[c].last ? last[b] : pre[b];
            size_t n = pairs[c].last ? (size_t)V : (size_t)7 * V;
            double cosine, rel;
            float d = max_abs_diff(lb, la, n, &cosine, &rel);
            const char *what = pairs[c].last ? "the last decode step" : "the prompt";
            if (pairs[c].same_bits)
                CHECK(!memcmp(la, lb, n * 4) && (b != 1 || !memcmp(last[0], last[b], (size_t)V * 4)),
                      "%s, N %s, %s: not the default's bits", archs[i], values[b], what);
            else
                CHECK(rel > 0 && rel <= TOL_REL_GEMM && d <= TOL_F32_GEMM_MAX,
                      "%s, N %s, %s: relative L2 %g (bound %g, and not 0), max %g (bound %g)", archs[i], values[b],
                      what, rel, TOL_REL_GEMM, d, TOL_F32_GEMM_MAX);
            CHECK(!memcmp(tok[0], tok[b], sizeof tok[0]), "%s, N %s: greedy tokens differ", archs[i], values[b]);
            printf("  %-9s N %s against the default, %s: max %.2e rel %.1e\n", archs[i], values[b],
                   pairs[c].last ? "last step" : "prompt", d, rel);
        }
        for (int v = 0; v < 4; v++) free(pre[v]), free(last[v]);
        for (int b = 0; b < 4 && i == 0; b++) {
            setenv("POLAR_CUDA_GEMV_TOKENS", bad[b], 1);
            polar_session *s = NULL;
            o.device = POLAR_DEVICE_AUTO; /* not a reason to fall back to the CPU */
            polar_status st = polar_session_create(m, &p, &o, &s, &err);
            o.device = POLAR_DEVICE_CUDA;
            CHECK(st == POLAR_ERR_ARG && strstr(err.msg, "POLAR_CUDA_GEMV_TOKENS"), "POLAR_CUDA_GEMV_TOKENS=\"%s\": %s",
                  bad[b], st == POLAR_OK ? "accepted" : err.msg);
            polar_session_free(s);
        }
        polar_program_free(&p);
        polar_model_free(m);
    }
    if (restore) setenv("POLAR_CUDA_GEMV_TOKENS", restore, 1);
    else unsetenv("POLAR_CUDA_GEMV_TOKENS");
    free(restore);
}

/* A 7-token prompt's logits and 8 greedy tokens of m, program text, with
 * POLAR_CUDA_MMA_GEMV set to value; 0 when the session failed. */
static int mma_run(polar_model *m, const char *text, const char *value, float *logits, int *tok) {
    polar_error err;
    polar_program p;
    CHECK_OK(polar_program_parse(text, m->arch.n_layers, 0, &p, &err));
    polar_session_opts o = {.max_ctx = 32, .device = POLAR_DEVICE_CUDA};
    polar_gen_opts go = {.max_new = 8, .ignore_eos = 1};
    int prompt[7] = {5, 17, 2, 99, 41, 8, 63};
    setenv("POLAR_CUDA_MMA_GEMV", value, 1);
    polar_session *s = NULL;
    CHECK_OK(polar_session_create(m, &p, &o, &s, &err));
    int ran = s && polar_prefill(s, prompt, 7, logits, &err) == POLAR_OK &&
              polar_generate(s, prompt, 7, &go, tok, NULL, NULL, NULL, &err) == POLAR_OK;
    CHECK(ran, "POLAR_CUDA_MMA_GEMV=%s: %s", value, err.msg);
    polar_session_free(s);
    polar_program_free(&p);
    unsetenv("POLAR_CUDA_MMA_GEMV");
    return ran;
}

/* POLAR_CUDA_MMA_GEMV=1: passes of 3-8 tokens over bf16 weights on the
 * tensor-core GEMV instead of cuBLASLt, the same bf16 inputs, the sums in
 * another order. The golden models (whose bf16 products sum exactly in f32,
 * so in any order) give the default's prompt logits within the GEMM bounds
 * and its greedy tokens; a random model of hidden 256, whose sums round,
 * gives other bits within the bounds (the path ran); a value other than 0
 * or 1 fails the session, named. */
static void mma_gemv_env(void) {
    static const char *archs[] = {"llama", "qwen2_moe"};
    for (int i = 0; i < 3; i++) {
        polar_error err;
        polar_model_info info;
        polar_model *m = NULL;
        if (i < 2) {
            m = golden_model(archs[i], &info);
        } else {
            polar_arch a;
            CHECK_OK(polar_arch_default("llama", &a, &err));
            a.hidden = 256, a.ffn = 512, a.vocab = 300;
            CHECK_OK(polar_model_random(&a, 5, &m, &err));
        }
        if (!m) continue;
        const char *name = i < 2 ? archs[i] : "random llama";
        size_t n = (size_t)7 * m->arch.vocab;
        float *pre[2] = {malloc(n * 4), malloc(n * 4)};
        int tok[2][8];
        if (mma_run(m, "0,1-2x2,3", "0", pre[0], tok[0]) && mma_run(m, "0,1-2x2,3", "1", pre[1], tok[1])) {
            double cosine, rel;
            float d = max_abs_diff(pre[1], pre[0], n, &cosine, &rel);
            CHECK(rel <= TOL_REL_GEMM && d <= TOL_F32_GEMM_MAX && (i < 2 || rel > 0),
                  "%s: the tensor-core GEMV's prompt against cuBLASLt's: relative L2 %g (bound %g%s), max %g", name,
                  rel, TOL_REL_GEMM, i < 2 ? "" : ", and not 0", d);
            if (i < 2) CHECK(!memcmp(tok[0], tok[1], sizeof tok[0]), "%s: greedy tokens differ", name);
            printf("  %-12s POLAR_CUDA_MMA_GEMV=1 against cuBLASLt, prompt: max %.2e rel %.1e\n", name, d, rel);
        }
        if (i == 0) env_refused(m, "POLAR_CUDA_MMA_GEMV", "on");
        free(pre[0]), free(pre[1]);
        polar_model_free(m);
    }
}

#endif
