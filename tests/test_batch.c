/* A batch runs each sequence exactly as a session would run it alone: the
 * same tokens and, on the CPU, bit for bit the same logits, whatever the
 * other sequences' programs, prompt lengths and arrival times, and whatever
 * the KV pool's size. Plus the pass counts and the errors. */
#include "harness.h"

#define MAX_GEN 24

/* One request: its program, prompt and options, and what running it alone
 * gave (tokens and the logits each was chosen from). */
typedef struct {
    const char *program;
    int n_prompt, max_new;
    float temperature;
    int prefix, variant; /* prefix > 0: the first prefix tokens are the same for every variant, the rest not */
    int arrive;   /* the step before which it is added */
    int cancel;   /* > 0: cancelled after this many tokens */
    int want[MAX_GEN], n_want;
    float *want_logits; /* [MAX_GEN, vocab] */
    int id, done;
} request;

/* The KV rows of every session and batch of the test running: f32, or
 * bf16 (polar_session_opts.kv_bf16) for the tests run again so. */
static int kv_bf16;

static void prompt_of(const request *r, int vocab, int *out) {
    for (int i = 0; i < r->n_prompt; i++)
        out[i] = r->prefix ? (i < r->prefix ? i * 31 + 3 : i * 17 + r->variant * 101 + 5) % vocab
                           : (i * 31 + r->n_prompt * 7 + 3) % vocab;
}

static polar_gen_opts gen_of(const request *r) {
    return (polar_gen_opts){.max_new = r->max_new, .temperature = r->temperature, .top_p = 0.9f, .seed = 1234};
}

typedef struct {
    polar_session *s;
    request *r;
    int vocab;
} alone_ctx;

static int record_alone(int token, void *user) {
    alone_ctx *c = user;
    request *r = c->r;
    memcpy(r->want_logits + (size_t)r->n_want * c->vocab, polar_logits(c->s), (size_t)c->vocab * sizeof(float));
    r->want[r->n_want++] = token;
    return 0;
}

/* What polar_generate gives for r in a session of its own. */
static void run_alone(polar_model *m, request *r, int vocab, int n_layers) {
    polar_error err;
    polar_program p;
    polar_session *s = NULL;
    int prompt[256], out[MAX_GEN];
    prompt_of(r, vocab, prompt);
    CHECK_OK(polar_program_parse(r->program, n_layers, 0, &p, &err));
    polar_session_opts so = {.max_ctx = r->n_prompt + r->max_new, .n_threads = 2, .kv_bf16 = kv_bf16};
    CHECK_OK(polar_session_create(m, &p, &so, &s, &err));
    r->want_logits = malloc((size_t)MAX_GEN * vocab * sizeof(float));
    r->n_want = 0;
    alone_ctx c = {s, r, vocab};
    polar_gen_opts g = gen_of(r);
    if (s) CHECK_OK(polar_generate(s, prompt, r->n_prompt, &g, out, NULL, record_alone, &c, &err));
    polar_session_free(s);
    polar_program_free(&p);
}

/* Serve the requests in one batch: add each at its arrival step (retrying
 * while the batch is full), step until all have ended, and compare every
 * token and its logits with the alone run. Returns how often an add met a
 * full batch. */
static int serve(polar_model *m, request *rq, int n, const polar_batch_opts *bo, int vocab, int n_layers,
                 polar_batch_stats *total) {
    polar_error err;
    polar_batch *b = NULL;
    polar_batch_opts o = *bo;
    o.kv_bf16 = kv_bf16;
    CHECK_OK(polar_batch_create(m, &o, &b, &err));
    if (!b) return 0;
    int full = 0, left = n, got[64] = {0};
    if (total) memset(total, 0, sizeof *total);
    for (int i = 0; i < n; i++) rq[i].id = 0, rq[i].done = 0;
    for (int step = 0; left > 0 && step < 2000; step++) {
        for (int i = 0; i < n; i++) {
            request *r = &rq[i];
            if (r->id || r->done || r->arrive > step) continue;
            int prompt[256];
            polar_program p;
            prompt_of(r, vocab, prompt);
            CHECK_OK(polar_program_parse(r->program, n_layers, 0, &p, &err));
            polar_gen_opts g = gen_of(r);
            polar_status st = polar_batch_add(b, &p, prompt, r->n_prompt, &g, &r->id, &err);
            polar_program_free(&p);
            if (st == POLAR_ERR_FULL) full++, r->id = 0;
            else CHECK(st == POLAR_OK, "add %s: %s", r->program, err.msg);
            got[i] = 0;
        }
        polar_batch_stats bs;
        CHECK_OK(polar_batch_step(b, &bs, &err));
        if (total) total->shared_entries += bs.shared_entries, total->cached_entries += bs.cached_entries;
        CHECK(bs.layer_passes >= bs.min_layer_passes, "step %d: %d passes under the bound %d", step, bs.layer_passes,
              bs.min_layer_passes);
        for (int i = 0; i < n; i++) {
            request *r = &rq[i];
            if (!r->id) continue;
            polar_seq_info info;
            CHECK_OK(polar_batch_seq(b, r->id, &info, &err));
            if (info.n_generated > got[i]) { /* one new token: compare it and its logits */
                int t = got[i]++;
                CHECK(info.n_generated == got[i], "%s: %d tokens in one step", r->program, info.n_generated - t);
                CHECK(t < r->n_want && info.tokens[t] == r->want[t], "%s token %d: %d in the batch, %d alone",
                      r->program, t, info.tokens[t], t < r->n_want ? r->want[t] : -1);
                const float *lg = polar_batch_logits(b, r->id);
                CHECK(lg && t < r->n_want && !memcmp(lg, r->want_logits + (size_t)t * vocab, (size_t)vocab * 4),
                      "%s token %d: logits differ from the alone run", r->program, t);
                if (r->cancel && got[i] == r->cancel) CHECK_OK(polar_batch_cancel(b, r->id, &err));
            }
            if (info.state == POLAR_SEQ_ENDED) {
                int expect = r->cancel && r->cancel < r->n_want ? r->cancel : r->n_want;
                CHECK(info.n_generated == expect, "%s ended with %d tokens, alone %d", r->program, info.n_generated,
                      expect);
                CHECK_OK(polar_batch_remove(b, r->id, &err));
                r->id = 0, r->done = 1, left--;
            }
        }
    }
    CHECK(left == 0 && polar_batch_running(b) == 0, "%d requests never finished", left);
    polar_batch_free(b);
    return full;
}

static void free_requests(request *rq, int n) {
    for (int i = 0; i < n; i++) free(rq[i].want_logits);
}

/* The model at path (a fixture directory or a GGUF file) and its info;
 * NULL after a failed check. */
static polar_model *load(const char *path, polar_model_info *info) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(path, &m, &err));
    if (m) polar_model_info_get(m, info);
    return m;
}

/* Bytes of a prefix cache of n items (16 rows of K, V and residual each). */
static size_t cache_bytes(const polar_model_info *info, int n) {
    return (size_t)n * 16 * (2 * (size_t)info->arch.n_kv_heads * info->arch.head_dim + info->arch.hidden) * sizeof(float);
}

/* Base, skip, repeat and reorder programs of different lengths, prompts of
 * 1 to 40 tokens (longer than a step's budget), greedy and sampled, joining
 * at different steps, one cancelled mid-run. */
static void mixed_batch(const char *arch, const char *base, const char *skip, const char *repeat, const char *reorder) {
    polar_model_info info;
    polar_model *m = golden_model(arch, &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    request rq[] = {
        {.program = base, .n_prompt = 7, .max_new = 12},
        {.program = skip, .n_prompt = 40, .max_new = 10},
        {.program = repeat, .n_prompt = 1, .max_new = 16},
        {.program = reorder, .n_prompt = 19, .max_new = 8, .arrive = 3},
        {.program = base, .n_prompt = 23, .max_new = 14, .temperature = 0.8f, .arrive = 5},
        {.program = repeat, .n_prompt = 5, .max_new = 20, .cancel = 6},
        {.program = skip, .n_prompt = 12, .max_new = 9, .temperature = 1.2f, .arrive = 9},
    };
    int n = (int)(sizeof rq / sizeof *rq);
    for (int i = 0; i < n; i++) run_alone(m, &rq[i], V, D);
    polar_batch_opts bo = {.max_seqs = 8, .max_ctx = 64, .max_program_len = 2 * D, .step_tokens = 16, .n_threads = 2};
    int full = serve(m, rq, n, &bo, V, D, NULL);
    CHECK(full == 0, "a roomy batch was full %d times", full);
    free_requests(rq, n);
    polar_model_free(m);
}

static void batch_llama(void) { mixed_batch("llama", "0-3", "0,2,3", "0,1,1,2,3", "0,2,1,3"); }
static void batch_qwen3(void) { mixed_batch("qwen3", "0-3", "0,1,3", "0-2,2,3", "1,0,2,3"); }
static void batch_moe(void) { mixed_batch("qwen2_moe", "0-5", "0,1,3-5", "0-3,3,4,5", "0,2,1,3-5"); }

/* A pool that holds two or three of these sequences at a time and three
 * slots: adds meet POLAR_ERR_FULL and succeed later, slots and blocks are
 * reused, and nothing changes what each sequence gets. */
static void batch_full_pool(void) {
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    request rq[8];
    const char *programs[] = {"0-3", "0,2,3", "0,1,1,2,3", "0,2,1,3"};
    for (int i = 0; i < 8; i++)
        rq[i] = (request){.program = programs[i % 4], .n_prompt = 10 + 3 * i, .max_new = 12 - i, .arrive = i / 3};
    for (int i = 0; i < 8; i++) run_alone(m, &rq[i], V, D);
    /* 2 x 16 x 32 floats per block: 4 KiB; a sequence of 5 entries x <= 42 tokens needs 15 */
    size_t block = 2 * 16 * (size_t)info.arch.n_kv_heads * info.arch.head_dim * sizeof(float);
    polar_batch_opts bo = {.max_seqs = 3, .max_ctx = 64, .kv_bytes = 36 * block, .step_tokens = 8, .n_threads = 2};
    int full = serve(m, rq, 8, &bo, V, D, NULL);
    CHECK(full > 0, "the small pool was never full");
    printf("  8 requests through 3 slots and a 36-block pool: %d adds found it full\n", full);
    free_requests(rq, 8);
    polar_model_free(m);
}

/* polar_batch_kv: a sequence's promise, its blocks as it runs, all of them
 * back when it is cancelled (what a server's metrics report). */
static void batch_kv_info(void) {
    polar_error err;
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    size_t block = 2 * 16 * (size_t)info.arch.n_kv_heads * info.arch.head_dim * sizeof(float);
    polar_batch_opts bo = {.max_seqs = 2, .max_ctx = 64, .kv_bytes = 36 * block, .n_threads = 2};
    polar_batch *b = NULL;
    polar_program p;
    CHECK_OK(polar_program_parse("0-3", info.arch.n_layers, 0, &p, &err));
    CHECK_OK(polar_batch_create(m, &bo, &b, &err));
    int prompt[20] = {1, 2, 3}, id = 0;
    polar_gen_opts g = {.max_new = 8, .ignore_eos = 1};
    polar_batch_kv_info kv;
    if (b) {
        polar_batch_kv(b, &kv);
        CHECK(kv.blocks == 36 && kv.used == 0 && kv.promised == 0, "empty: %d %d %d", kv.blocks, kv.used, kv.promised);
        CHECK_OK(polar_batch_add(b, &p, prompt, 20, &g, &id, &err)); /* 27 tokens x 4 entries: 2 x 4 blocks */
        polar_batch_kv(b, &kv);
        CHECK(kv.used == 0 && kv.promised == 8, "admitted: used %d, promised %d", kv.used, kv.promised);
        CHECK_OK(polar_batch_step(b, NULL, &err));
        polar_batch_kv(b, &kv);
        CHECK(kv.used + kv.promised == 8 && kv.used >= 4, "running: used %d, promised %d", kv.used, kv.promised);
        CHECK_OK(polar_batch_cancel(b, id, &err));
        polar_batch_kv(b, &kv);
        CHECK(kv.used == 0 && kv.promised == 0 && kv.cached == 0, "cancelled: %d %d %d", kv.used, kv.promised, kv.cached);
    }
    polar_batch_free(b);
    polar_program_free(&p);
    polar_model_free(m);
}

/* The quantized default model (GGUF Q4_1): the block-format matmuls too are
 * the same for a row whatever rows run beside it. */
static void batch_default_model(void) {
    const char *path = getenv("POLAR_DEFAULT_MODEL");
    CHECK(path && *path, "POLAR_DEFAULT_MODEL is not set (make test sets it)");
    if (!path || !*path) return;
    polar_model_info info;
    polar_model *m = load(path, &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    request rq[] = {
        {.program = "0-29", .n_prompt = 9, .max_new = 6},
        {.program = "0-13,15-29", .n_prompt = 21, .max_new = 5},
        {.program = "0-20,20-29", .n_prompt = 4, .max_new = 7, .arrive = 2},
    };
    for (int i = 0; i < 3; i++) run_alone(m, &rq[i], V, D);
    polar_batch_opts bo = {.max_seqs = 4, .max_ctx = 64, .step_tokens = 16, .n_threads = 2};
    serve(m, rq, 3, &bo, V, D, NULL);
    free_requests(rq, 3);
    polar_model_free(m);
}

/* Sequences added together with the same prompt share it through the
 * program entries they have in common (the same program sampled: all of
 * them), over a prompt of several blocks ending mid-block and chunked over
 * steps; a late arrival with the same prompt does not share; and when a
 * step has no room for a leader's followers beside it, they go their own
 * way. Every sequence still gets what it gets alone. */
static void batch_shared_prompt(void) {
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    polar_batch_stats total;
    request rq[] = {
        {.program = "0-3", .n_prompt = 37, .max_new = 9},
        {.program = "0-3", .n_prompt = 37, .max_new = 11, .temperature = 0.8f},
        {.program = "0-3", .n_prompt = 37, .max_new = 7, .temperature = 1.2f},
        {.program = "0,1,3", .n_prompt = 37, .max_new = 10},
        {.program = "0-2,2,3", .n_prompt = 37, .max_new = 8},
        {.program = "1-3", .n_prompt = 37, .max_new = 6},
        {.program = "0-3", .n_prompt = 37, .max_new = 5, .arrive = 2},
    };
    int n = (int)(sizeof rq / sizeof *rq);
    for (int i = 0; i < n; i++) run_alone(m, &rq[i], V, D);
    polar_batch_opts bo = {.max_seqs = 8, .max_ctx = 64, .step_tokens = 16, .n_threads = 2};
    serve(m, rq, n, &bo, V, D, &total);
    /* four followers x 37 tokens x 4, 4, 2 and 3 shared entries */
    CHECK(total.shared_entries == 37 * (4 + 4 + 2 + 3), "%d (token, entry) pairs shared, want %d",
          total.shared_entries, 37 * 13);
    free_requests(rq, n);
    request tight[] = { /* the first pair takes 3 rows each of 7, leaving 1 for the three after it */
        {.program = "0-3", .n_prompt = 30, .max_new = 6},
        {.program = "0,1,3", .n_prompt = 30, .max_new = 6},
        {.program = "0-3", .n_prompt = 21, .max_new = 6, .temperature = 0.8f},
        {.program = "0-2,2,3", .n_prompt = 21, .max_new = 6},
        {.program = "0-3", .n_prompt = 21, .max_new = 6},
    };
    for (int i = 0; i < 5; i++) run_alone(m, &tight[i], V, D);
    bo = (polar_batch_opts){.max_seqs = 5, .max_ctx = 64, .step_tokens = 7, .n_threads = 2};
    serve(m, tight, 5, &bo, V, D, &total);
    CHECK(total.shared_entries > 0 && total.shared_entries < 30 * 2 + 21 * (4 + 3),
          "%d pairs shared: the tight batch shares only part", total.shared_entries);
    free_requests(tight, 5);
    polar_model_free(m);
}

/* The prefix cache: prompts with a common 40-token prefix (two full blocks)
 * and programs with common first entries, arriving one after another, find
 * exactly the (block, entry) pairs that earlier prompts left (a partial
 * last block too); of two added together with the same prompt, the second
 * waits for the first and finds what it left; a cache too small for
 * everything evicts. Every sequence gets what it gets alone. */
static void batch_prefix_cache(void) {
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    polar_batch_stats total;
    request rq[] = {
        /* 50 tokens: full blocks 0-2 and the 2-token block 3; blocks 0 and 1 are the common prefix */
        {.program = "0-3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1},
        /* blocks 0, 1 at entries 0, 1 (then 3 differs from 2): 2 x 16 x 2 */
        {.program = "0,1,3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 2, .arrive = 1},
        /* the first prompt again: blocks 0-2 at every entry, skipped: 3 x 16 x 4; block 3 (the last
         * token's, copied) at every entry too, its logits from the cached residual: 2 x 4 */
        {.program = "0-3", .n_prompt = 50, .max_new = 5, .prefix = 40, .variant = 1, .arrive = 2, .temperature = 0.7f},
        /* entries 0, 1 of the first: 3 x 16 x 2 + 2 x 2 */
        {.program = "0,1,1,2,3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1, .arrive = 3},
        /* added together: the first finds blocks 0, 1 (the common prefix) at every entry of the first
         * request's program, skipped: 2 x 16 x 4; the second waits for it, then finds them at entries
         * 0, 1 and the second request's entry 2 (3 after 0, 1): 2 x 16 x 3, and the first's 13-token
         * block 2 at entries 0, 1: 13 x 2 */
        {.program = "0-3", .n_prompt = 45, .max_new = 6, .prefix = 40, .variant = 3, .arrive = 4},
        {.program = "0,1,3", .n_prompt = 45, .max_new = 6, .prefix = 40, .variant = 3, .arrive = 4},
        /* another order of layers from the start: nothing to find */
        {.program = "1,0,2,3", .n_prompt = 50, .max_new = 4, .prefix = 40, .variant = 1, .arrive = 5},
    };
    int n = (int)(sizeof rq / sizeof *rq);
    for (int i = 0; i < n; i++) run_alone(m, &rq[i], V, D);
    polar_batch_opts bo = {.max_seqs = 8, .max_ctx = 64, .step_tokens = 64, .n_threads = 2, .prefix_cache_bytes = 8 << 20};
    serve(m, rq, n, &bo, V, D, &total);
    int want = 16 * (2 * 2 + 3 * 4 + 3 * 2 + 2 * 4 + 2 * 3) + 2 * 4 + 2 * 2 + 13 * 2;
    CHECK(total.cached_entries == want, "%d (token, entry) pairs found in the cache, want %d", total.cached_entries, want);
    CHECK(total.shared_entries == 0, "%d pairs followed: with a cache none", total.shared_entries);
    /* chunks of at most 20 tokens less the decoding sequences' (some blocks split over steps, not cached)
     * and a cache of 12 items, one prompt's: later ones evict earlier ones */
    bo.step_tokens = 20;
    bo.prefix_cache_bytes = cache_bytes(&info, 12);
    serve(m, rq, n, &bo, V, D, &total);
    CHECK(total.cached_entries > 0 && total.cached_entries < want, "%d pairs found in a 12-item cache",
          total.cached_entries);
    free_requests(rq, n);
    polar_model_free(m);
}

/* A pool with room for one sequence beside a cache of 16 items (one
 * prompt's). The first runs alone and leaves its prompt in the cache; three
 * more with the same prompt arrive together: the second is admitted, the
 * third only by taking the cache's blocks (no sequence maps them yet), so
 * the second finds nothing and runs the prompt, and the third waits for it
 * and finds all of it. The fourth is refused while they run, and a refused
 * add gives back nothing (it could not be admitted anyway): once they end,
 * it takes only the partial block's items, which no sequence maps, and
 * finds the full blocks. Everything exact. */
static void batch_cache_pool(void) {
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    polar_batch_stats total;
    request rq[] = {
        {.program = "0-3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1},
        {.program = "0-3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1, .arrive = 8},
        {.program = "0-3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1, .arrive = 8, .temperature = 0.9f},
        {.program = "0-3", .n_prompt = 50, .max_new = 6, .prefix = 40, .variant = 1, .arrive = 8},
    };
    int n = (int)(sizeof rq / sizeof *rq);
    for (int i = 0; i < n; i++) run_alone(m, &rq[i], V, D);
    polar_batch_opts bo = {.max_seqs = 4, .max_ctx = 64, .step_tokens = 64, .n_threads = 2,
                           .kv_bytes = polar_batch_kv_bytes(m, &(polar_batch_opts){.device = POLAR_DEVICE_CPU}, 1, 4, 55),
                           .prefix_cache_bytes = cache_bytes(&info, 16)};
    int full = serve(m, rq, n, &bo, V, D, &total);
    int want = (3 * 16 * 4 + 2 * 4) + 3 * 16 * 4;
    CHECK(full > 0, "the fourth request was never refused");
    CHECK(total.cached_entries == want, "%d (token, entry) pairs found in the cache, want %d", total.cached_entries, want);
    free_requests(rq, n);
    polar_model_free(m);
}

/* Skip and repeat variants of the base program share the base's passes:
 * a step makes exactly as many layer passes as the bound. */
static void batch_passes(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/qwen2_moe", &m, &err));
    if (!m) return;
    const char *programs[] = {"0-5", "1-5", "0,2-5", "0-4", "0-2,2-5", "0-5,5", "0,0-5", "0-3,5"};
    polar_batch *b = NULL;
    polar_batch_opts bo = {.max_seqs = 8, .max_ctx = 16, .n_threads = 2};
    CHECK_OK(polar_batch_create(m, &bo, &b, &err));
    if (!b) return;
    int prompt[3] = {5, 6, 7}, id;
    polar_gen_opts g = {.max_new = 4, .ignore_eos = 1};
    for (int i = 0; i < 8; i++) {
        polar_program p;
        CHECK_OK(polar_program_parse(programs[i], 6, 0, &p, &err));
        CHECK_OK(polar_batch_add(b, &p, prompt, 3, &g, &id, &err));
        polar_program_free(&p);
    }
    polar_batch_stats st;
    for (int step = 0; step < 4; step++) {
        CHECK_OK(polar_batch_step(b, &st, &err));
        /* layers 0, 2 and 5 run twice by one program each: 6 + 3 */
        CHECK(st.sequences == 8 && st.layer_passes == 9 && st.min_layer_passes == 9,
              "step %d: %d sequences, %d passes (bound %d); want 8, 9, 9", step, st.sequences, st.layer_passes,
              st.min_layer_passes);
        CHECK(st.decode_tokens + st.prompt_tokens == (step ? 8 : 24), "step %d: %d + %d tokens", step,
              st.decode_tokens, st.prompt_tokens);
    }
    CHECK(st.finished == 8 && polar_batch_running(b) == 0, "all end after 4 tokens (%d finished)", st.finished);
    CHECK_OK(polar_batch_step(b, &st, &err));
    CHECK(st.sequences == 0 && st.layer_passes == 0, "an idle step does nothing");
    polar_batch_free(b);
    polar_model_free(m);
}

static void batch_errors(void) {
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(GOLDEN_DIR "/llama", &m, &err));
    if (!m) return;
    polar_batch *b = NULL;
    polar_batch_opts bo = {.device = POLAR_DEVICE_CUDA};
    CHECK(polar_batch_create(m, &bo, &b, &err) == POLAR_ERR_UNSUPPORTED && !b, "CUDA batches in a build without CUDA");
    bo = (polar_batch_opts){.max_seqs = -1};
    CHECK(polar_batch_create(m, &bo, &b, &err) == POLAR_ERR_ARG, "negative options");
    bo = (polar_batch_opts){.max_seqs = 2, .max_ctx = 32, .kv_bytes = 1};
    CHECK(polar_batch_create(m, &bo, &b, &err) == POLAR_ERR_ARG, "a pool smaller than one block");
    bo = (polar_batch_opts){.max_seqs = 2, .max_ctx = 32, .max_program_len = 6, .n_threads = 1};
    CHECK_OK(polar_batch_create(m, &bo, &b, &err));
    if (!b) return;
    int layers[8] = {0, 1, 2, 3, 0, 1, 2, 3}, bad[2] = {0, 4}, prompt[40] = {1, 2, 3}, id = 0;
    polar_program p = {4, layers}, too_long = {8, layers}, out_of_range = {2, bad};
    polar_gen_opts g = {.max_new = 4};
    CHECK(polar_batch_add(b, &too_long, prompt, 3, &g, &id, &err) == POLAR_ERR_PROGRAM, "program longer than the batch's");
    CHECK(polar_batch_add(b, &out_of_range, prompt, 3, &g, &id, &err) == POLAR_ERR_PROGRAM, "layer 4 of 4");
    CHECK(polar_batch_add(b, &p, prompt, 0, &g, &id, &err) == POLAR_ERR_ARG, "no prompt");
    prompt[1] = 256;
    CHECK(polar_batch_add(b, &p, prompt, 3, &g, &id, &err) == POLAR_ERR_RANGE, "token outside the vocabulary");
    prompt[1] = 2;
    g.max_new = 31;
    CHECK(polar_batch_add(b, &p, prompt, 3, &g, &id, &err) == POLAR_ERR_RANGE, "past the context: %s", err.msg);
    g.max_new = 4;
    g.n_stop = POLAR_BATCH_MAX_STOP + 1;
    g.stop = layers;
    CHECK(polar_batch_add(b, &p, prompt, 3, &g, &id, &err) == POLAR_ERR_ARG, "too many stop ids");
    g.n_stop = 0;
    int a1, a2, a3;
    CHECK_OK(polar_batch_add(b, &p, prompt, 3, &g, &a1, &err));
    CHECK_OK(polar_batch_add(b, &p, prompt, 3, &g, &a2, &err));
    CHECK(polar_batch_add(b, &p, prompt, 3, &g, &a3, &err) == POLAR_ERR_FULL, "two slots: %s", err.msg);
    polar_seq_info info;
    CHECK(polar_batch_seq(b, 999, &info, &err) == POLAR_ERR_ARG, "unknown id");
    CHECK(polar_batch_logits(b, a1) == NULL, "no logits before a step");
    CHECK_OK(polar_batch_remove(b, a1, &err));
    CHECK(polar_batch_seq(b, a1, &info, &err) == POLAR_ERR_ARG, "a removed id is unknown");
    CHECK_OK(polar_batch_add(b, &p, prompt, 3, &g, &a3, &err));
    CHECK(a3 != a1, "ids are not reused");
    g.max_new = 0;
    CHECK_OK(polar_batch_remove(b, a2, &err));
    CHECK_OK(polar_batch_add(b, &p, prompt, 3, &g, &a2, &err));
    CHECK_OK(polar_batch_seq(b, a2, &info, &err));
    CHECK(info.state == POLAR_SEQ_ENDED && info.n_generated == 0, "max_new 0 ends at once");
    polar_batch_free(b);
    polar_model_free(m);
}

/* Random scenarios: 10-17 requests on programs that skip, repeat and
 * reorder layers, prompts of 1-56 tokens (shared prefixes of whole blocks
 * or none; a third the same as the request before, added with it),
 * arrivals over steps, sampled and greedy, some cancelled; 2-5
 * slots (reused as requests end), 5-44 tokens a step, a prefix cache of
 * 2-31 items or none. Every token and its logits as the request alone. */
static void batch_random(void) {
    static const char *programs[] = {"0-3", "0,1,3", "0,1,1,2,3", "0,2,1,3", "0-2,2,3", "1-3", "0,1,2"};
    static const int lengths[] = {3, 16, 20, 37, 50, 33};
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, D = info.arch.n_layers;
    uint64_t r = 0x243F6A8885A308D3ull;
    long requests = 0, tokens = 0, cached = 0, shared = 0;
    int refused = 0;
#define PICK(n) ((int)((r = r * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (n))
    for (int seed = 0; seed < 16; seed++) {
        request rq[20];
        int n = 10 + PICK(8);
        for (int i = 0; i < n; i++) {
            int np = PICK(4) ? lengths[PICK(6)] : 1 + PICK(56), prefix = PICK(3) ? 16 * (1 + PICK(3)) : 0;
            rq[i] = (request){.program = programs[PICK(7)], .n_prompt = np, .max_new = 1 + PICK(64 - np < 12 ? 64 - np : 12),
                              .prefix = prefix < np ? prefix : np, .variant = PICK(2), .arrive = 3 * PICK(4),
                              .temperature = PICK(3) ? 0.0f : 0.8f, .cancel = PICK(5) ? 0 : 1 + PICK(3)};
            if (i && PICK(3) == 0) { /* the previous request's prompt, added with it: it may follow that one */
                rq[i].n_prompt = rq[i - 1].n_prompt, rq[i].prefix = rq[i - 1].prefix, rq[i].variant = rq[i - 1].variant;
                rq[i].arrive = rq[i - 1].arrive, rq[i].max_new = rq[i - 1].max_new;
            }
        }
        for (int i = 0; i < n; i++) run_alone(m, &rq[i], V, D);
        polar_batch_opts bo = {.max_seqs = 2 + PICK(4), .max_ctx = 64, .max_program_len = 2 * D,
                               .step_tokens = 5 + PICK(40), .n_threads = 2};
        if (seed % 2) bo.prefix_cache_bytes = cache_bytes(&info, 2 + PICK(30));
        polar_batch_stats total;
        refused += serve(m, rq, n, &bo, V, D, &total);
        cached += total.cached_entries, shared += total.shared_entries, requests += n;
        for (int i = 0; i < n; i++) tokens += rq[i].n_want;
        free_requests(rq, n);
    }
#undef PICK
    printf("  %ld requests, %ld tokens compared, %d adds refused, %ld (token, entry) pairs cached, %ld shared\n",
           requests, tokens, refused, cached, shared);
    CHECK(refused > 0 && cached > 0 && shared > 0, "the scenarios miss a full batch, the cache or prompt sharing");
    polar_model_free(m);
}

/* Opened sequences, appended to: a 23-token prompt appended in three
 * pieces gives, row for row, the bits of one append (logits and hidden
 * states as outputs), beside other sequences running; an append with a
 * generation gives the tokens of polar_batch_add with the same prompt; a
 * generation stopped by on_token leaves its last token out of the cache,
 * and appending it goes on exactly as a longer generation; an append of
 * hidden states only is done without a head; and the errors. */
static int stop_at_4(int id, int token, void *user) {
    (void)token;
    int *n = user;
    return ++n[id] == 4;
}

static void batch_append(void) {
    polar_model_info info;
    polar_model *m = golden_model("qwen3", &info);
    if (!m) return;
    polar_error err;
    int V = info.arch.vocab, H = info.arch.hidden, D = info.arch.n_layers, prompt[23], other[30];
    for (int i = 0; i < 23; i++) prompt[i] = (i * 41 + 9) % V;
    for (int i = 0; i < 30; i++) other[i] = (i * 13 + 2) % V;
    polar_program p, q;
    CHECK_OK(polar_program_parse("0,1-2x2,3", D, 0, &p, &err));
    CHECK_OK(polar_program_parse("1-3", D, 0, &q, &err));
    polar_batch_opts bo = {.max_seqs = 4, .max_ctx = 48, .max_program_len = 2 * D, .step_tokens = 16, .n_threads = 2};
    polar_batch *b = NULL;
    CHECK_OK(polar_batch_create(m, &bo, &b, &err));
    float *whole = malloc((size_t)23 * V * 4), *parts = malloc((size_t)23 * V * 4);
    float *hw = malloc((size_t)23 * H * 4), *hp = malloc((size_t)23 * H * 4);
    if (!b || !whole || !parts || !hw || !hp) goto done;
    int one, three, busy, stops[8] = {0};
    polar_gen_opts busy_gen = {.max_new = 12, .ignore_eos = 1};
    CHECK_OK(polar_batch_add(b, &q, other, 30, &busy_gen, &busy, &err)); /* runs beside them */
    CHECK_OK(polar_batch_open(b, &p, 40, &one, &err));
    CHECK_OK(polar_batch_open(b, &p, 40, &three, &err));
    polar_batch_outputs ow = {whole, hw};
    CHECK_OK(polar_batch_append(b, one, prompt, 23, NULL, &ow, &err));
    static const int cuts[4] = {0, 5, 6, 23};
    for (int c = 0; c < 3; c++) {
        polar_batch_outputs op = {parts + (size_t)cuts[c] * V, hp + (size_t)cuts[c] * H};
        CHECK_OK(polar_batch_append(b, three, prompt + cuts[c], cuts[c + 1] - cuts[c], NULL, &op, &err));
        polar_seq_info si;
        CHECK_OK(polar_batch_seq(b, three, &si, &err));
        CHECK(si.state == POLAR_SEQ_PREFILL, "an append runs at the next steps (state %d)", si.state);
        CHECK(polar_batch_append(b, three, prompt, 1, NULL, NULL, &err) == POLAR_ERR_ARG && strstr(err.msg, "running"),
              "an append to a running sequence: %s", err.msg);
        CHECK_OK(polar_batch_run(b, 1000, NULL, NULL, NULL, &err));
        CHECK_OK(polar_batch_seq(b, three, &si, &err));
        CHECK(si.state == POLAR_SEQ_IDLE && si.n_past == cuts[c + 1], "piece %d: state %d, %d tokens in the cache", c,
              si.state, si.n_past);
    }
    CHECK(!memcmp(whole, parts, (size_t)23 * V * 4) && !memcmp(hw, hp, (size_t)23 * H * 4),
          "three appends differ from one");
    CHECK(polar_batch_logits(b, three) && !memcmp(polar_batch_logits(b, three), whole + (size_t)22 * V, (size_t)V * 4),
          "the last appended token's logits are not its outputs' row");
    /* generation: as polar_batch_add's; stopped at 4 tokens, then the 4th appended, 5 more */
    polar_gen_opts g = {.max_new = 9, .ignore_eos = 1};
    int added;
    CHECK_OK(polar_batch_add(b, &p, prompt, 23, &g, &added, &err));
    CHECK_OK(polar_batch_run(b, 1000, NULL, NULL, NULL, &err));
    polar_seq_info want, got;
    CHECK_OK(polar_batch_seq(b, added, &want, &err));
    CHECK_OK(polar_batch_remove(b, one, &err));
    CHECK_OK(polar_batch_open(b, &p, 40, &one, &err));
    CHECK_OK(polar_batch_append(b, one, prompt, 23, &g, NULL, &err));
    polar_batch_run_stats rs;
    CHECK_OK(polar_batch_run(b, 1000, stop_at_4, stops, &rs, &err));
    CHECK_OK(polar_batch_seq(b, one, &got, &err));
    CHECK(got.state == POLAR_SEQ_IDLE && got.n_generated == 4 && got.n_past == 23 + 3 && rs.tokens >= 4 &&
              !memcmp(got.tokens, want.tokens, 4 * sizeof(int)),
          "stopped at 4: state %d, %d tokens, %d in the cache", got.state, got.n_generated, got.n_past);
    int fourth = got.tokens[3];
    g.max_new = 5;
    CHECK_OK(polar_batch_append(b, one, &fourth, 1, &g, NULL, &err));
    CHECK_OK(polar_batch_run(b, 1000, NULL, NULL, NULL, &err));
    CHECK_OK(polar_batch_seq(b, one, &got, &err));
    CHECK(got.n_generated == 5 && !memcmp(got.tokens, want.tokens + 4, 5 * sizeof(int)),
          "continued: %d tokens, not the longer generation's", got.n_generated);
    /* hidden states only: no head, idle at once */
    CHECK_OK(polar_batch_remove(b, three, &err));
    CHECK_OK(polar_batch_open(b, &p, 40, &three, &err));
    polar_batch_outputs oh = {NULL, hp};
    CHECK_OK(polar_batch_append(b, three, prompt, 23, NULL, &oh, &err));
    CHECK_OK(polar_batch_run(b, 1000, NULL, NULL, NULL, &err));
    CHECK(!memcmp(hw, hp, (size_t)23 * H * 4) && !polar_batch_logits(b, three), "hidden states only");
    /* errors */
    CHECK(polar_batch_append(b, added, prompt, 3, NULL, NULL, &err) == POLAR_ERR_ARG, "an added sequence: %s", err.msg);
    CHECK(polar_batch_append(b, three, prompt, 18, NULL, NULL, &err) == POLAR_ERR_RANGE, "past its room: %s", err.msg);
    g.max_new = 11; /* 8 + 10 cache rows in a room of 40 - 23 */
    CHECK(polar_batch_append(b, three, prompt, 8, &g, NULL, &err) == POLAR_ERR_RANGE, "generated past its room: %s",
          err.msg);
    prompt[0] = V;
    CHECK(polar_batch_append(b, three, prompt, 3, NULL, NULL, &err) == POLAR_ERR_RANGE, "a token outside the vocabulary");
    CHECK(polar_batch_open(b, &p, 49, &busy, &err) == POLAR_ERR_RANGE, "opened past the context: %s", err.msg);
    CHECK(polar_batch_append(b, 999, prompt, 3, NULL, NULL, &err) == POLAR_ERR_ARG, "an unknown id");
done:
    free(whole), free(parts), free(hw), free(hp);
    polar_batch_free(b);
    polar_program_free(&p);
    polar_program_free(&q);
    polar_model_free(m);
}

/* The same with bf16 K/V rows, sessions and batches alike: a mixed batch
 * on a dense and an MoE model, and the prefix cache (whose partial blocks
 * are copied row by row). */
static void batch_kv_bf16(void) {
    kv_bf16 = 1;
    batch_llama();
    batch_moe();
    batch_prefix_cache();
    kv_bf16 = 0;
}

int main(void) {
    RUN(batch_llama);
    RUN(batch_qwen3);
    RUN(batch_moe);
    RUN(batch_full_pool);
    RUN(batch_kv_info);
    RUN(batch_shared_prompt);
    RUN(batch_prefix_cache);
    RUN(batch_cache_pool);
    RUN(batch_default_model);
    RUN(batch_passes);
    RUN(batch_errors);
    RUN(batch_random);
    RUN(batch_append);
    RUN(batch_kv_bf16);
    TEST_EXIT();
}
