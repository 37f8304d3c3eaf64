/* make test-cuda (and make test, under the CUDA emulation): the CUDA batch
 * step against a CPU batch that rounds where the GPU rounds
 * (round_like_cuda), step by step on the golden models: sequences with
 * base, skip, repeat and reorder programs, prompts of different lengths
 * chunked over steps beside other sequences' decode tokens (passes of up to
 * 8 rows through the GEMVs, more through the GEMMs), two sequences with
 * the same prompt (the later one follows the first: device row and K/V
 * copies), sequences joining mid-run and a pool that refuses some until
 * others end. Every step's logits within the GEMM tolerances of
 * logit_compare.h (earlier passes of more than 8 rows feed every later
 * one), the same greedy tokens, the same admissions and plans. */
#include "harness.h"
#include "logit_compare.h"

static int quick;

#define N_REQ 7
#define MAX_NEW 10

typedef struct {
    const char *program;
    int n_prompt, prompt_seed;
    int after_step; /* added once this many steps have run (and the pool admits it) */
} request;

/* Both batches' ids of one request (0: not added yet). */
typedef struct {
    int id[2];
    polar_program p;
    int prompt[40];
} pending;

static void batch_against_cpu(const char *arch) {
    static const request reqs[N_REQ] = {
        {"base", 7, 1, 0},      {"0,3", 20, 2, 0},        {"base", 7, 1, 0}, /* the same prompt as the first */
        {"0,1-2x2,3", 12, 3, 0}, {"0,2,1,3", 3, 4, 2},    {"0,2-3x2", 31, 5, 2},
        {"0-1,3", 9, 6, 4}};
    char dir[128];
    snprintf(dir, sizeof dir, GOLDEN_DIR "/%s", arch);
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(dir, &m, &err));
    if (!m) return;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab, D = info.arch.n_layers;
    /* room for two base programs of the longest prompt: the first four
     * requests do not fit at once. The CPU's f32 rows take twice the bytes
     * of the GPU's bf16 for the same number of blocks. */
    size_t cpu_kv = polar_batch_kv_bytes(m, 2, D, 31 + MAX_NEW);
    polar_batch_opts o[2] = {
        {.max_seqs = 5, .max_ctx = 48, .max_program_len = 2 * D, .kv_bytes = cpu_kv / 2, .step_tokens = 16,
         .device = POLAR_DEVICE_CUDA},
        {.max_seqs = 5, .max_ctx = 48, .max_program_len = 2 * D, .kv_bytes = cpu_kv, .step_tokens = 16,
         .n_threads = 2, .device = POLAR_DEVICE_CPU, .round_like_cuda = 1}};
    polar_batch *b[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) CHECK_OK(polar_batch_create(m, &o[i], &b[i], &err));
    pending req[N_REQ];
    memset(req, 0, sizeof req);
    for (int r = 0; r < N_REQ; r++) {
        CHECK_OK(polar_program_parse(reqs[r].program, D, 0, &req[r].p, &err));
        for (int t = 0; t < reqs[r].n_prompt; t++) req[r].prompt[t] = (t * 131 + reqs[r].prompt_seed * 17) % V;
    }
    polar_gen_opts gen = {.max_new = MAX_NEW, .ignore_eos = 1};
    int steps = 0, refused = 0, compared = 0, followed = 0;
    double worst_rel = 0;
    float worst_max = 0;
    while (b[0] && b[1] && steps < 200) {
        for (int r = 0; r < N_REQ; r++) {
            if (req[r].id[0] || reqs[r].after_step > steps) continue;
            polar_status s[2];
            for (int i = 0; i < 2; i++)
                s[i] = polar_batch_add(b[i], &req[r].p, req[r].prompt, reqs[r].n_prompt, &gen, &req[r].id[i], &err);
            CHECK(s[0] == s[1], "request %d: added %s on the GPU, %s on the CPU", r, polar_status_name(s[0]),
                  polar_status_name(s[1]));
            if (s[0] != POLAR_OK || s[1] != POLAR_OK) {
                refused += s[0] == POLAR_ERR_FULL;
                req[r].id[0] = req[r].id[1] = 0;
                break; /* in order: a later request waits behind a refused one */
            }
            CHECK(req[r].id[0] == req[r].id[1], "request %d: ids %d and %d", r, req[r].id[0], req[r].id[1]);
        }
        if (!polar_batch_running(b[0]) && !polar_batch_running(b[1])) {
            int left = 0;
            for (int r = 0; r < N_REQ; r++) left += !req[r].id[0];
            if (!left) break;
        }
        polar_batch_stats st[2];
        for (int i = 0; i < 2; i++) CHECK_OK(polar_batch_step(b[i], &st[i], &err));
        CHECK(st[0].layer_passes == st[1].layer_passes && st[0].decode_tokens == st[1].decode_tokens &&
                  st[0].prompt_tokens == st[1].prompt_tokens,
              "step %d plans differ", steps);
        followed += st[0].shared_prompt_tokens;
        steps++;
        for (int r = 0; r < N_REQ; r++) {
            if (!req[r].id[0]) continue;
            const float *l[2] = {polar_batch_logits(b[0], req[r].id[0]), polar_batch_logits(b[1], req[r].id[1])};
            if (!l[0] || !l[1]) continue;
            double cosine, rel;
            float d = max_abs_diff(l[0], l[1], (size_t)V, &cosine, &rel);
            worst_rel = rel > worst_rel ? rel : worst_rel, worst_max = d > worst_max ? d : worst_max;
            CHECK(rel <= TOL_REL_GEMM && d <= TOL_GEMM_MAX, "%s step %d request %d: relative L2 %g, max diff %g", arch,
                  steps, r, rel, d);
            compared++;
        }
        for (int r = 0; r < N_REQ; r++) /* ended sequences leave, freeing their slots */
            if (req[r].id[0] > 0) {
                polar_seq_info s[2];
                CHECK_OK(polar_batch_seq(b[0], req[r].id[0], &s[0], &err));
                CHECK_OK(polar_batch_seq(b[1], req[r].id[1], &s[1], &err));
                if (s[0].state != POLAR_SEQ_ENDED || s[1].state != POLAR_SEQ_ENDED) continue;
                CHECK(s[0].n_generated == MAX_NEW && s[1].n_generated == MAX_NEW, "request %d: %d and %d tokens", r,
                      s[0].n_generated, s[1].n_generated);
                int same = 0;
                while (same < MAX_NEW && s[0].tokens[same] == s[1].tokens[same]) same++;
                CHECK(same == MAX_NEW, "%s request %d (%s): greedy tokens agree for %d of %d", arch, r,
                      reqs[r].program, same, MAX_NEW);
                for (int i = 0; i < 2; i++) CHECK_OK(polar_batch_remove(b[i], req[r].id[i], &err));
                req[r].id[0] = -1; /* done */
            }
    }
    int done = 0;
    for (int r = 0; r < N_REQ; r++) done += req[r].id[0] == -1;
    CHECK(done == N_REQ, "%s: %d of %d requests done in %d steps", arch, done, N_REQ, steps);
    CHECK(refused > 0, "%s: the pool never refused a request (the full-pool path is not covered)", arch);
    CHECK(followed > 0, "%s: no sequence followed another's prompt (the device copies are not covered)", arch);
    printf("  %-10s %d steps, %d logit rows compared, %d adds refused, %d prompt tokens followed: worst relative L2 "
           "%.1e, max diff %.2e\n", arch, steps, compared, refused, followed, worst_rel, worst_max);
    for (int r = 0; r < N_REQ; r++) polar_program_free(&req[r].p);
    for (int i = 0; i < 2; i++) polar_batch_free(b[i]);
    polar_model_free(m);
}

static void batch_dense(void) { batch_against_cpu("llama"); }
static void batch_qwen3(void) {
    if (!quick) batch_against_cpu("qwen3");
}
static void batch_moe(void) {
    batch_against_cpu("qwen2_moe");
    if (!quick) batch_against_cpu("qwen3_moe");
}

/* What a batch refuses on the GPU, with a clear error. */
static void batch_refusals(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    polar_batch *b = NULL;
    polar_batch_opts o = {.device = POLAR_DEVICE_CUDA, .prefix_cache_bytes = 1 << 20};
    CHECK(polar_batch_create(m, &o, &b, &err) == POLAR_ERR_UNSUPPORTED && !b && strstr(err.msg, "prefix cache"),
          "a prefix cache on CUDA: %s", err.msg);
    polar_batch_free(b);
    polar_model_free(m);
}

int main(int argc, char **argv) {
    quick = argc > 1 && !strcmp(argv[1], "--quick");
    char why[256];
    if (!polar_cuda_available(why, sizeof why)) {
        printf("FAIL test_cuda_batch: %s (make test-cuda needs a GPU)\n", why);
        return 1;
    }
    RUN(batch_dense);
    RUN(batch_qwen3);
    RUN(batch_moe);
    RUN(batch_refusals);
    TEST_EXIT();
}
