/* "Allocate at load time, never per token": after polar_session_create and
 * polar_batch_create, no call on a session or batch allocates: prefill
 * (chunked), decode steps, greedy and sampled generation, a program switch,
 * share_prompt's resumption, a reset; a batch's adds (mixed programs,
 * followers of a shared prompt, a full pool), steps with and without the
 * prefix cache (hits asserted), reads, cancels and removes. Dense, MoE and
 * the quantized default model, on the CPU.
 *
 * malloc, calloc and realloc are replaced in this program, so every call in
 * the process counts, the C library's own included (glibc's qsort
 * allocates past 1 KiB: polar_sample once did, per token). Under
 * AddressSanitizer, whose allocator owns those names, the linker's wraps
 * (Makefile, SAN=1) count the library's own calls instead. */
#include <stdatomic.h>

#include "harness.h"

static atomic_int counting;
static atomic_long allocations;

static void count(void) {
    if (atomic_load_explicit(&counting, memory_order_relaxed)) atomic_fetch_add(&allocations, 1);
}

#ifdef __SANITIZE_ADDRESS__
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n) { return count(), __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return count(), __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return count(), __real_realloc(p, n); }
#else
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void *malloc(size_t n) { return count(), __libc_malloc(n); }
void *calloc(size_t n, size_t size) { return count(), __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return count(), __libc_realloc(p, n); }
#endif

/* Run CALL with counting on; a non-zero count fails the case, naming it. */
#define NO_ALLOC(what, call)                                                                 \
    do {                                                                                     \
        atomic_store(&allocations, 0);                                                       \
        atomic_store(&counting, 1);                                                          \
        call;                                                                                \
        atomic_store(&counting, 0);                                                          \
        long n_ = atomic_load(&allocations);                                                 \
        CHECK(n_ == 0, "%s: %s allocated %ld times", model_name, what, n_);                 \
    } while (0)

static const char *model_name;

static polar_model *load(const char *path, polar_model_info *info) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(path, &m, &err));
    if (m) polar_model_info_get(m, info);
    model_name = path;
    return m;
}

static void prompt_of(int *out, int n, int seed, int shared, int vocab) { /* the first `shared` tokens of every seed alike */
    for (int i = 0; i < n; i++) out[i] = (i < shared ? i * 31 + 7 : i * 17 + seed * 101 + 5) % vocab;
}

/* base, a repeat and a skip of the model's D layers */
static void programs_of(int D, char text[3][64]) {
    snprintf(text[0], 64, "0-%d", D - 1);
    snprintf(text[1], 64, "0-%d,%d-%d", D / 2, D / 2 - 1, D - 1);
    snprintf(text[2], 64, "0-%d,%d-%d", D / 2 - 2, D / 2, D - 1);
}

static void session_calls(const polar_model *m, const polar_model_info *info) {
    int V = info->arch.vocab, D = info->arch.n_layers, prompt[40], out[8];
    char text[3][64];
    programs_of(D, text);
    polar_program p[3];
    polar_error err;
    for (int i = 0; i < 3; i++) CHECK_OK(polar_program_parse(text[i], D, 0, &p[i], &err));
    prompt_of(prompt, 40, 1, 0, V);
    polar_session_opts so = {.max_ctx = 64, .max_program_len = 2 * D, .n_threads = 2, .share_prompt = 1,
                             .device = POLAR_DEVICE_CPU};
    polar_session *s = NULL;
    CHECK_OK(polar_session_create(m, &p[0], &so, &s, &err));
    float *all = malloc((size_t)40 * V * sizeof *all);
    if (s && all) {
        polar_gen_opts greedy = {.max_new = 8, .ignore_eos = 1};
        polar_gen_opts sampled = {.max_new = 8, .ignore_eos = 1, .temperature = 0.8f, .top_p = 0.9f, .seed = 7};
        polar_status st = POLAR_OK;
        NO_ALLOC("polar_generate (greedy, 40-token prompt)",
                 st = polar_generate(s, prompt, 40, &greedy, out, NULL, NULL, NULL, &err));
        CHECK(st == POLAR_OK, "generate: %s", err.msg);
        NO_ALLOC("polar_session_set_program", st = polar_session_set_program(s, &p[1], &err));
        NO_ALLOC("polar_generate (sampled, the same prompt resumed under a repeat program)",
                 st = polar_generate(s, prompt, 40, &sampled, out, NULL, NULL, NULL, &err));
        CHECK(st == POLAR_OK, "generate: %s", err.msg);
        CHECK(polar_session_prompt_reused(s) > 0, "%s: the prompt was not resumed", model_name);
        NO_ALLOC("polar_session_reset", polar_session_reset(s));
        NO_ALLOC("polar_prefill (every row's logits)", st = polar_prefill(s, prompt, 40, all, &err));
        for (int i = 0; i < 3 && st == POLAR_OK; i++)
            NO_ALLOC("polar_decode_step", st = polar_decode_step(s, prompt[i], &err));
        CHECK(st == POLAR_OK, "prefill/decode: %s", err.msg);
    }
    free(all);
    polar_session_free(s);
    for (int i = 0; i < 3; i++) polar_program_free(&p[i]);
}

/* Six sequences through a pool for two of the longest: all prompts share
 * their first 32 tokens (two blocks), the first two are the same prompt
 * under the same program (the second follows the first, or with the cache
 * finds it there), every other one sampled, the second cancelled. With
 * the cache the pool's rows are bf16. */
static void batch_calls(const polar_model *m, const polar_model_info *info, int with_cache) {
    int V = info->arch.vocab, D = info->arch.n_layers, prompt[6][44], n_prompt[6];
    static const int program_of[6] = {0, 0, 1, 2, 0, 1};
    char text[3][64];
    programs_of(D, text);
    polar_program p[3];
    polar_error err;
    for (int i = 0; i < 3; i++) CHECK_OK(polar_program_parse(text[i], D, 0, &p[i], &err));
    size_t item = 16 * (2 * (size_t)info->arch.n_kv_heads * info->arch.head_dim + info->arch.hidden) * sizeof(float);
    polar_batch_opts bo = {.max_seqs = 6, .max_ctx = 56, .max_program_len = 2 * D, .step_tokens = 24, .n_threads = 2,
                           .device = POLAR_DEVICE_CPU, .kv_bf16 = with_cache,
                           .prefix_cache_bytes = with_cache ? (size_t)4 * (D + 2) * item : 0}; /* a prompt's blocks, every entry */
    bo.kv_bytes = polar_batch_kv_bytes(m, &bo, 2, D + 2, 56);
    polar_batch *b = NULL;
    CHECK_OK(polar_batch_create(m, &bo, &b, &err));
    for (int i = 0; i < 6; i++) {
        n_prompt[i] = i == 1 ? 34 : 34 + 2 * i;
        prompt_of(prompt[i], n_prompt[i], i == 1 ? 0 : i, 32, V);
    }
    if (b) {
        int ids[6], added = 0, full = 0, steps = 0, cancelled = 0;
        long followed = 0, cached = 0;
        polar_status st = POLAR_OK;
        polar_batch_stats stats;
        polar_seq_info si;
        while (steps < 200 && (added < 6 || polar_batch_running(b) > 0)) {
            while (added < 6) {
                polar_gen_opts g = {.max_new = 8, .ignore_eos = 1, .temperature = added % 2 ? 0.7f : 0.0f,
                                    .top_p = 0.9f, .seed = (uint64_t)added};
                NO_ALLOC("polar_batch_add", st = polar_batch_add(b, &p[program_of[added]], prompt[added],
                                                                 n_prompt[added], &g, &ids[added], &err));
                if (st == POLAR_ERR_FULL) {
                    full++;
                    break;
                }
                CHECK(st == POLAR_OK, "add: %s", err.msg);
                added++;
            }
            NO_ALLOC("polar_batch_step", st = polar_batch_step(b, &stats, &err));
            CHECK(st == POLAR_OK, "step: %s", err.msg);
            if (st != POLAR_OK) break;
            steps++;
            followed += stats.shared_prompt_tokens, cached += stats.cached_entries;
            for (int i = 0; i < added; i++) {
                if (ids[i] < 0) continue;
                NO_ALLOC("polar_batch_seq and polar_batch_logits",
                         (st = polar_batch_seq(b, ids[i], &si, &err), (void)polar_batch_logits(b, ids[i])));
                CHECK(st == POLAR_OK, "seq %d: %s", ids[i], err.msg);
                if (st != POLAR_OK) continue;
                if (i == 1 && si.state == POLAR_SEQ_DECODE && si.n_generated >= 3) {
                    NO_ALLOC("polar_batch_cancel", st = polar_batch_cancel(b, ids[i], &err));
                    cancelled++;
                    continue;
                }
                if (si.state == POLAR_SEQ_ENDED) {
                    NO_ALLOC("polar_batch_remove", st = polar_batch_remove(b, ids[i], &err));
                    ids[i] = -1;
                }
            }
        }
        CHECK(added == 6 && polar_batch_running(b) == 0, "%s: %d of 6 sequences added, %d still running after %d steps",
              model_name, added, polar_batch_running(b), steps);
        CHECK(full > 0 && cancelled == 1, "%s: the pool full %d times, %d cancels", model_name, full, cancelled);
        if (with_cache) CHECK(cached > 0, "%s: nothing found in the prefix cache", model_name);
        else CHECK(followed > 0, "%s: no prompt token followed a leader", model_name);
    }
    polar_batch_free(b);
    for (int i = 0; i < 3; i++) polar_program_free(&p[i]);
}

static void run_model(const char *path) {
    polar_model_info info;
    polar_model *m = load(path, &info);
    if (!m) return;
    session_calls(m, &info);
    batch_calls(m, &info, 0);
    batch_calls(m, &info, 1);
    polar_model_free(m);
}

static void alloc_dense(void) {
    run_model(GOLDEN_DIR "/llama");
    run_model(GOLDEN_DIR "/qwen3");
}

static void alloc_moe(void) { run_model(GOLDEN_DIR "/qwen2_moe"); }

/* The Q4_1 GGUF: quantized matmuls and their activation blocks. */
static void alloc_default_model(void) {
    const char *path = getenv("POLAR_DEFAULT_MODEL");
    CHECK(path && *path, "POLAR_DEFAULT_MODEL is not set (make test sets it)");
    if (path && *path) run_model(path);
}

/* The counter counts: a call that does allocate is seen. */
static void alloc_counter_works(void) {
    model_name = "the counter";
    atomic_store(&allocations, 0);
    atomic_store(&counting, 1);
    polar_program p;
    polar_error err;
    polar_status st = polar_program_parse("0-3,2", 4, 0, &p, &err); /* allocates its layers */
    atomic_store(&counting, 0);
    CHECK(st == POLAR_OK && atomic_load(&allocations) > 0, "polar_program_parse's allocation was not counted");
    if (st == POLAR_OK) polar_program_free(&p);
}

int main(void) {
    /* libgomp allocates its thread team at the first parallel region: not ours to count */
#pragma omp parallel num_threads(2)
    atomic_fetch_add(&allocations, 0);
    RUN(alloc_counter_works);
    RUN(alloc_dense);
    RUN(alloc_moe);
    RUN(alloc_default_model);
    TEST_EXIT();
}
