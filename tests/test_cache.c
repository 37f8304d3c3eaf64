/* The KV cache is keyed by execution position, so decoding with the cache
 * must give what a fresh prefill of the whole sequence gives, step by step,
 * for programs that repeat and skip layers. */
#include "harness.h"
#include "../runtime/kv_pool.h"

#define CACHE_TOL 1e-4f

static float max_diff(const float *a, const float *b, int n) {
    float d = 0;
    for (int i = 0; i < n; i++) d = nan_max(d, fabsf(a[i] - b[i]));
    return d;
}

/* Decode `steps` greedy tokens with the cache; after each, recompute the
 * whole sequence in a fresh session and compare the last logits. */
static void check_consistency(const char *arch, const char *program_text, int n_prompt, int steps) {
    polar_error err;
    polar_model_info info;
    polar_model *m = golden_model(arch, &info);
    if (!m) return;
    int V = info.arch.vocab, total = n_prompt + steps;
    polar_program prog;
    CHECK_OK(polar_program_parse(program_text, info.arch.n_layers, 0, &prog, &err));
    polar_session *cached = NULL, *fresh = NULL;
    polar_session_opts so = {.max_ctx = total, .n_threads = 2};
    CHECK_OK(polar_session_create(m, &prog, &so, &cached, &err));
    CHECK_OK(polar_session_create(m, &prog, &so, &fresh, &err));
    int *seq = malloc((size_t)total * sizeof *seq);
    for (int i = 0; i < n_prompt; i++) seq[i] = (i * 37 + 11) % (V - 1);
    CHECK_OK(polar_prefill(cached, seq, n_prompt, NULL, &err));
    float worst = 0;
    int n = n_prompt;
    for (int step = 0; step < steps && cached && fresh; step++) {
        int tok = polar_argmax(polar_logits(cached), V);
        seq[n++] = tok;
        CHECK_OK(polar_decode_step(cached, tok, &err));
        polar_session_reset(fresh);
        CHECK_OK(polar_prefill(fresh, seq, n, NULL, &err));
        const float *a = polar_logits(cached), *b = polar_logits(fresh);
        if (!a || !b) break;
        float d = max_diff(a, b, V);
        worst = fmaxf(worst, d);
        CHECK(d <= CACHE_TOL, "%s %s step %d: cached vs recomputed logits differ by %g", arch, program_text, step, d);
        CHECK(polar_argmax(a, V) == polar_argmax(b, V), "%s %s step %d: next token differs", arch, program_text, step);
    }
    printf("  %-9s %-14s prompt %2d + %2d steps: max |cached - recomputed| %.2e\n", arch, program_text, n_prompt,
           steps, worst);
    free(seq);
    polar_session_free(cached);
    polar_session_free(fresh);
    polar_program_free(&prog);
    polar_model_free(m);
}

static void cache_repeat(void) {
    check_consistency("llama", "0,1-2x2,3", 5, 12);
    check_consistency("qwen3", "0-1x2,2-3", 5, 12);
}

static void cache_mixed(void) {
    check_consistency("qwen2", "0,2-3x2", 5, 12);
    check_consistency("llama", "3,0x2,2", 5, 12);
}

/* A repeated MoE layer routes again on its new input, in prefill and decode alike. */
static void cache_moe(void) {
    check_consistency("qwen2_moe", "0-1,5,1x2,4-5", 5, 12);
    check_consistency("qwen3_moe", "0-1x2,3", 5, 12);
}

/* A prompt longer than the prefill chunk: logits of every position from one
 * prefill call equal those of feeding the tokens one at a time. */
static void cache_chunked_prefill(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2", &m, &err));
    if (!m) return;
    int T = 75, V = 256;
    polar_program prog;
    CHECK_OK(polar_program_parse("0-1x2,3", 4, 0, &prog, &err));
    polar_session *a = NULL, *b = NULL;
    polar_session_opts so = {.max_ctx = T, .n_threads = 2};
    CHECK_OK(polar_session_create(m, &prog, &so, &a, &err));
    CHECK_OK(polar_session_create(m, &prog, &so, &b, &err));
    int tokens[75];
    for (int i = 0; i < T; i++) tokens[i] = (i * 91 + 5) % V;
    float *all = malloc((size_t)T * V * sizeof *all);
    CHECK_OK(polar_prefill(a, tokens, T, all, &err));
    float worst = 0;
    for (int i = 0; i < T && b; i++) {
        CHECK_OK(polar_decode_step(b, tokens[i], &err));
        worst = fmaxf(worst, max_diff(all + (size_t)i * V, polar_logits(b), V));
    }
    CHECK(worst <= CACHE_TOL, "chunked prefill vs one-by-one: %g", worst);
    CHECK(polar_session_pos(a) == T, "pos %d", polar_session_pos(a));
    /* The context is full now: one more token is a clear range error. */
    polar_status st = polar_decode_step(a, 1, &err);
    CHECK(st == POLAR_ERR_RANGE && strstr(err.msg, "context"), "full context: %s", err.msg);
    free(all);
    polar_session_free(a);
    polar_session_free(b);
    polar_program_free(&prog);
    polar_model_free(m);
}

/* Changing the program resets the cache and fits the session's capacity. */
static void cache_set_program(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    polar_program base, longer, shorter;
    CHECK_OK(polar_program_base(4, &base, &err));
    CHECK_OK(polar_program_parse("0-3x3", 4, 0, &longer, &err));
    CHECK_OK(polar_program_parse("1,3", 4, 0, &shorter, &err));
    polar_session *s = NULL;
    polar_session_opts so = {.max_ctx = 16, .max_program_len = 8, .n_threads = 1};
    CHECK_OK(polar_session_create(m, &base, &so, &s, &err));
    int toks[3] = {1, 2, 3};
    CHECK_OK(polar_prefill(s, toks, 3, NULL, &err));
    CHECK_OK(polar_session_set_program(s, &shorter, &err));
    CHECK(polar_session_pos(s) == 0 && polar_logits(s) == NULL, "set_program must clear the cache");
    polar_status st = polar_session_set_program(s, &longer, &err);
    CHECK(st == POLAR_ERR_PROGRAM && strstr(err.msg, "12 entries"), "too long a program: %s", err.msg);
    polar_session_free(s);
    polar_program_free(&base);
    polar_program_free(&longer);
    polar_program_free(&shorter);
    polar_model_free(m);
}

/* share_prompt: a chain of programs, each a one-layer skip or repeat of the
 * one before (a program search's walk), prefilled with the same 40-token
 * prompt (two CPU chunks) resumes at the first differing entry and gives
 * bit for bit the logits and greedy tokens of a fresh session; the third
 * run keeps both sessions' K/V rows in bf16. */
static void shared_prompt_prefix(void) {
    static const char *archs[] = {"qwen3", "qwen2_moe", "qwen3"};
    for (int ai = 0; ai < 3; ai++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL;
        CHECK_OK(polar_arch_default(archs[ai], &a, &err));
        CHECK_OK(polar_model_random(&a, 21, &m, &err));
        if (!m) return;
        int D = a.n_layers, layers[64], n = D, prompt[40], out[2][6];
        for (int i = 0; i < D; i++) layers[i] = i;
        for (int i = 0; i < 40; i++) prompt[i] = (i * 53 + 7) % a.vocab;
        polar_program p = {n, layers};
        polar_session *shared = NULL, *fresh = NULL;
        polar_session_opts so = {.max_ctx = 48, .max_program_len = 2 * D, .n_threads = 2, .share_prompt = 1,
                                 .kv_bf16 = ai == 2};
        polar_session_opts fo = {.max_ctx = 48, .max_program_len = 2 * D, .n_threads = 2, .kv_bf16 = ai == 2};
        CHECK_OK(polar_session_create(m, &p, &so, &shared, &err));
        CHECK_OK(polar_session_create(m, &p, &fo, &fresh, &err));
        polar_gen_opts go = {.max_new = 6, .ignore_eos = 1};
        uint64_t rng = 99;
        int prev[64], n_prev = 0, resumed = 0;
        for (int step = 0; shared && fresh && step < 12; step++) {
            CHECK_OK(polar_session_set_program(shared, &p, &err));
            CHECK_OK(polar_session_set_program(fresh, &p, &err));
            CHECK_OK(polar_generate(shared, prompt, 40, &go, out[0], NULL, NULL, NULL, &err));
            CHECK_OK(polar_generate(fresh, prompt, 40, &go, out[1], NULL, NULL, NULL, &err));
            int common = 0;
            while (common < n && common < n_prev && prev[common] == layers[common]) common++;
            CHECK(polar_session_prompt_reused(shared) == common, "%s step %d: resumed at %d, programs share %d",
                  archs[ai], step, polar_session_prompt_reused(shared), common);
            resumed += common > 0;
            CHECK(!memcmp(out[0], out[1], sizeof out[0]), "%s step %d: tokens differ", archs[ai], step);
            CHECK(!memcmp(polar_logits(shared), polar_logits(fresh), (size_t)a.vocab * sizeof(float)),
                  "%s step %d: logits differ", archs[ai], step);
            memcpy(prev, layers, (size_t)n * sizeof *layers), n_prev = n;
            /* next: skip or repeat one entry (keep 2..2D entries) */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int i = (int)((rng >> 33) % (uint64_t)n), repeat = (rng >> 20) & 1;
            if (n <= 2) repeat = 1;
            if (n >= 2 * D) repeat = 0;
            if (repeat) memmove(layers + i + 1, layers + i, (size_t)(n - i) * sizeof *layers), n++;
            else memmove(layers + i, layers + i + 1, (size_t)(n - i - 1) * sizeof *layers), n--;
            p.n = n;
        }
        CHECK(resumed >= 8, "%s: only %d of 12 prompts resumed", archs[ai], resumed);
        polar_session_free(shared);
        polar_session_free(fresh);
        polar_model_free(m);
    }
}

/* Each execution position's blocks are one run of consecutive ids (attention
 * streams them): prompts of three sequences mapped first, then their decode
 * blocks one at a time (growing into the gap left after each run), rounds
 * after the others ended in another order; with a pool too small for gaps the
 * runs break but every block is mapped once; every block returns. */
static void pool_runs_per_entry(void) {
    for (int tight = 0; tight < 2; tight++) {
        int n_blocks = tight ? 120 : 400;
        kv_pool p;
        kv_seq s[3];
        CHECK(kv_pool_init(&p, n_blocks, 8), "pool");
        for (int i = 0; i < 3; i++) CHECK(kv_seq_init(&s[i], 6, 8 * CPU_KV_BLOCK), "tables");
        for (int round = 0; round < 4; round++) {
            for (int i = 0; i < 3; i++) {
                CHECK(kv_seq_admit(&p, &s[i], 4 + i, 8 * CPU_KV_BLOCK), "round %d seq %d: admitted", round, i);
                kv_seq_grow(&p, &s[i], (5 + i) * CPU_KV_BLOCK - 3, NULL);
            }
            for (int t = 5 * CPU_KV_BLOCK; t <= 8 * CPU_KV_BLOCK; t++)
                for (int i = 0; i < 3; i++) kv_seq_grow(&p, &s[i], t > (5 + i) * CPU_KV_BLOCK - 3 ? t : 1, NULL);
            unsigned char seen[400] = {0};
            for (int i = 0; i < 3; i++) {
                CHECK(s[i].reserved == 0 && s[i].n_mapped == 8, "round %d seq %d: %d reserved, %d mapped", round, i,
                      s[i].reserved, s[i].n_mapped);
                for (int k = 0; k < 4 + i; k++)
                    for (int b = 0; b < 8; b++) {
                        int id = s[i].blocks[k * s[i].max_blocks + b];
                        CHECK(id >= 0 && id < n_blocks && !seen[id]++, "round %d seq %d: block %d twice", round, i, id);
                        CHECK(tight || b == 0 || id == s[i].blocks[k * s[i].max_blocks + b - 1] + 1,
                              "round %d seq %d entry %d: block %d is %d after %d", round, i, k, b, id,
                              s[i].blocks[k * s[i].max_blocks + b - 1]);
                    }
            }
            int order[3] = {round % 3, (round + 2) % 3, (round + 1) % 3}; /* they end in another order each round */
            for (int i = 0; i < 3; i++) kv_seq_release(&p, &s[order[i]]);
            CHECK(p.n_free == n_blocks && p.promised == 0, "round %d: %d free, %d promised", round, p.n_free,
                  p.promised);
        }
        for (int i = 0; i < 3; i++) kv_seq_free(&s[i]);
        kv_pool_free(&p);
    }
}

int main(void) {
    RUN(pool_runs_per_entry);
    RUN(cache_repeat);
    RUN(cache_mixed);
    RUN(cache_moe);
    RUN(cache_chunked_prefill);
    RUN(cache_set_program);
    RUN(shared_prompt_prefix);
    TEST_EXIT();
}
