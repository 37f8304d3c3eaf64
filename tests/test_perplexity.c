/* polar_perplexity: llama-perplexity's method (chunks, the second half
 * scored, BOS first) against logits computed directly; a run against its
 * own saved log-probabilities; the top-k file's lower bound; the errors of
 * bad reference files; and the KL divergence of every CPU level this CPU
 * runs from the reference level (POLAR_CPU=reference: the same weights
 * dequantized, f32 activations, double sums), each in a process of its
 * own, on a Q4_0 and a Q4_K model, within bounds derived from measured
 * values: a kernel that doubles its KL divergence fails.
 *
 *   test_perplexity                the cases
 *   test_perplexity --child ...    (internal) one level's run, in a process of its own */
#include <sys/wait.h>
#include <unistd.h>

#include "gguf_util.h"
#include "harness.h"

#define CHUNK_CTX 16

/* Deterministic tokens of a vocabulary. */
static void tokens_of(int *t, int n, int vocab, int seed) {
    for (int i = 0; i < n; i++) t[i] = (int)((i * 131u + (unsigned)seed * 17u + (unsigned)(i * i) * 7u) % (unsigned)vocab);
}

/* The scored tokens' summed negative log-likelihood and its square, from
 * every row's logits of each chunk as a session gives them. */
static void direct_sums(const polar_model *m, const polar_program *p, const int *tokens, int chunks, int ctx, int bos,
                        double *nll, double *nll2, long *count) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab, chunk[64];
    float *logits = malloc((size_t)ctx * V * sizeof *logits);
    polar_session_opts so = {.max_ctx = ctx, .n_threads = 2, .device = POLAR_DEVICE_CPU};
    polar_session *s = NULL;
    CHECK_OK(polar_session_create(m, p, &so, &s, &err));
    *nll = *nll2 = 0, *count = 0;
    for (int c = 0; s && logits && c < chunks; c++) {
        memcpy(chunk, tokens + c * ctx, (size_t)ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        polar_session_reset(s);
        CHECK_OK(polar_prefill(s, chunk, ctx, logits, &err));
        for (int j = ctx / 2; j < ctx - 1; j++) {
            const float *row = logits + (size_t)j * V;
            double mx = row[0], sum = 0;
            for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < V; i++) sum += exp(row[i] - mx);
            double v = mx + log(sum) - row[tokens[c * ctx + j + 1]];
            *nll += v, *nll2 += v * v, ++*count;
        }
    }
    polar_session_free(s);
    free(logits);
}

/* Chunks of 16 on a golden model, the first token of each replaced by a
 * BOS: the perplexity and its error are those of the rows computed
 * directly (the same CPU bits, summed in another order). */
static void ppl_matches_direct(void) {
    static const char *archs[] = {"llama", "qwen2_moe"};
    for (int a = 0; a < 2; a++) {
        polar_error err;
        polar_model_info info;
        polar_model *m = golden_model(archs[a], &info);
        if (!m) continue;
        int tokens[60];
        tokens_of(tokens, 60, info.arch.vocab, a);
        polar_program p;
        CHECK_OK(polar_program_parse("0,1-2x2,3", info.arch.n_layers, 0, &p, &err));
        polar_ppl_opts o = {.ctx = CHUNK_CTX, .bos = 7, .n_threads = 2, .device = POLAR_DEVICE_CPU};
        polar_ppl_result r;
        CHECK_OK(polar_perplexity(m, &p, tokens, 60, &o, &r, &err));
        double nll, nll2;
        long count;
        direct_sums(m, &p, tokens, 3, CHUNK_CTX, 7, &nll, &nll2, &count);
        double mean = nll / count, var = nll2 / count - mean * mean, ppl = exp(mean);
        double ppl_err = ppl * sqrt(var / (count - 1));
        CHECK(r.chunks == 3 && r.tokens == 3 * 7 && r.ctx == CHUNK_CTX && !r.compared, "%s: %d chunks, %ld tokens",
              archs[a], r.chunks, r.tokens);
        CHECK(fabs(r.ppl - ppl) <= 1e-12 * ppl && fabs(r.ppl_err - ppl_err) <= 1e-9 * ppl_err,
              "%s: PPL %.15g +/- %.15g, directly %.15g +/- %.15g", archs[a], r.ppl, r.ppl_err, ppl, ppl_err);
        /* without the BOS the first token of a chunk counts: another perplexity */
        o.bos = -1;
        polar_ppl_result r2;
        CHECK_OK(polar_perplexity(m, &p, tokens, 60, &o, &r2, &err));
        direct_sums(m, &p, tokens, 3, CHUNK_CTX, -1, &nll, &nll2, &count);
        CHECK(fabs(r2.ppl - exp(nll / count)) <= 1e-12 * r2.ppl && r2.ppl != r.ppl, "%s: without BOS %.15g, directly %.15g",
              archs[a], r2.ppl, exp(nll / count));
        printf("  %-9s PPL %.4f +/- %.4f over %ld tokens (directly %.4f)\n", archs[a], r.ppl, r.ppl_err, r.tokens, ppl);
        polar_program_free(&p);
        polar_model_free(m);
    }
}

/* A run against its own log-probabilities: no divergence, the same top
 * token and perplexity; a skip program against the base: the whole
 * vocabulary's KL divergence, the top 256 of 256 the same, the top 8 a
 * lower bound of it. */
static void kld_reference_files(void) {
    polar_error err;
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, tokens[64];
    tokens_of(tokens, 64, V, 3);
    polar_program base, skip;
    CHECK_OK(polar_program_base(info.arch.n_layers, &base, &err));
    CHECK_OK(polar_program_parse("0,2,3", info.arch.n_layers, 0, &skip, &err));
    char full[64], top[2][64];
    snprintf(full, sizeof full, "/tmp/polar-ppl-%d.full", (int)getpid());
    polar_ppl_opts o = {.ctx = CHUNK_CTX, .bos = -1, .n_threads = 2, .device = POLAR_DEVICE_CPU, .save = full};
    polar_ppl_result saved, self, r[3];
    CHECK_OK(polar_perplexity(m, &base, tokens, 64, &o, &saved, &err));
    for (int k = 0; k < 2; k++) {
        snprintf(top[k], sizeof top[k], "/tmp/polar-ppl-%d.top%d", (int)getpid(), k);
        o.save = top[k], o.save_top_k = k ? 8 : V;
        CHECK_OK(polar_perplexity(m, &base, tokens, 64, &o, &saved, &err));
    }
    o.save = NULL, o.save_top_k = 0, o.reference = full;
    CHECK_OK(polar_perplexity(m, &base, NULL, 0, &o, &self, &err)); /* the file's own tokens */
    CHECK(self.compared && self.kld < 1e-6 && self.kld_max < 1e-5 && self.same_top == 1.0 &&
              fabs(self.ln_ratio) < 1e-6 && fabs(self.ppl / self.ref_ppl - 1) < 1e-6 && self.chunks == 4,
          "against itself: KLD %g (max %g), same top %g, ln ratio %g", self.kld, self.kld_max, self.same_top,
          self.ln_ratio);
    const char *files[3] = {full, top[0], top[1]};
    for (int f = 0; f < 3; f++) {
        o.reference = files[f];
        CHECK_OK(polar_perplexity(m, &skip, tokens, 64, &o, &r[f], &err));
    }
    CHECK(r[0].kld > 1e-4 && fabs(r[1].kld / r[0].kld - 1) < 1e-3 && r[2].kld <= r[1].kld && r[2].kld > 0.2 * r[1].kld,
          "skip vs base: KLD %g (all, 16-bit), %g (top 256), %g (top 8)", r[0].kld, r[1].kld, r[2].kld);
    CHECK(r[0].same_top == r[1].same_top && r[1].same_top == r[2].same_top && r[0].ln_ratio == r[1].ln_ratio,
          "same top %g %g %g", r[0].same_top, r[1].same_top, r[2].same_top);
    printf("  skip 0,2,3 against base: KLD %.5f (whole vocabulary), %.5f (top 256), %.5f (top 8); same top %.1f%%\n",
           r[0].kld, r[1].kld, r[2].kld, 100 * r[0].same_top);
    for (int f = 0; f < 3; f++) unlink(files[f]);
    polar_program_free(&base);
    polar_program_free(&skip);
    polar_model_free(m);
}

/* llama-perplexity's --kl-divergence-base layout, written and read: its
 * header and size to the byte, a run against itself, and a program's KLD
 * the same as against polar's own full record (its floor is 16 nats, which
 * this model's probabilities stay above). */
static void kld_llama_files(void) {
    polar_error err;
    polar_model_info info;
    polar_model *m = golden_model("llama", &info);
    if (!m) return;
    int V = info.arch.vocab, tokens[64];
    tokens_of(tokens, 64, V, 3);
    polar_program base, skip;
    CHECK_OK(polar_program_base(info.arch.n_layers, &base, &err));
    CHECK_OK(polar_program_parse("0,2,3", info.arch.n_layers, 0, &skip, &err));
    char llama[64], own[64];
    snprintf(llama, sizeof llama, "/tmp/polar-ppl-%d.kld", (int)getpid());
    snprintf(own, sizeof own, "/tmp/polar-ppl-%d.own", (int)getpid());
    polar_ppl_opts o = {.ctx = CHUNK_CTX, .bos = -1, .n_threads = 2, .device = POLAR_DEVICE_CPU, .save = llama,
                        .save_llama = 1};
    polar_ppl_result saved, self, r[2];
    CHECK_OK(polar_perplexity(m, &base, tokens, 64, &o, &saved, &err));
    o.save = own, o.save_llama = 0;
    CHECK_OK(polar_perplexity(m, &base, tokens, 64, &o, &saved, &err));
    FILE *f = fopen(llama, "rb");
    char magic[8] = {0};
    uint32_t head[3] = {0};
    int t0 = -1;
    long size = 0;
    if (f) {
        CHECK(fread(magic, 1, 8, f) == 8 && fread(head, 4, 3, f) == 3 && fread(&t0, 4, 1, f) == 1, "header read");
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fclose(f);
    }
    long want = 8 + 12 + 64 * 4 + 4L * (CHUNK_CTX - 1 - CHUNK_CTX / 2) * (2 * (4 + ((V + 1) & ~1)));
    CHECK(!memcmp(magic, "_logits_", 8) && head[0] == CHUNK_CTX && (int)head[1] == V && head[2] == 4 &&
              t0 == tokens[0] && size == want,
          "llama layout: magic %.8s, ctx %u, vocab %u, chunks %u, first token %d, %ld bytes (want %ld)", magic, head[0],
          head[1], head[2], t0, size, want);
    o.save = NULL, o.reference = llama;
    CHECK_OK(polar_perplexity(m, &base, NULL, 0, &o, &self, &err));
    CHECK(self.compared && self.kld < 1e-6 && self.same_top == 1.0 && fabs(self.ln_ratio) < 1e-4 && self.chunks == 4,
          "against itself in llama's layout: KLD %g, same top %g, ln ratio %g", self.kld, self.same_top, self.ln_ratio);
    const char *files[2] = {llama, own};
    for (int i = 0; i < 2; i++) {
        o.reference = files[i];
        CHECK_OK(polar_perplexity(m, &skip, tokens, 64, &o, &r[i], &err));
    }
    CHECK(r[1].kld > 1e-4 && fabs(r[0].kld / r[1].kld - 1) < 1e-3 && r[0].same_top == r[1].same_top,
          "skip vs base: KLD %g (llama's layout) vs %g (polar's), same top %g vs %g", r[0].kld, r[1].kld, r[0].same_top,
          r[1].same_top);
    printf("  skip 0,2,3 against base: KLD %.6f (llama-perplexity's layout), %.6f (polar's)\n", r[0].kld, r[1].kld);
    o.reference = NULL, o.save = llama, o.save_llama = 1, o.save_top_k = 8;
    CHECK(polar_perplexity(m, &base, tokens, 64, &o, &saved, &err) == POLAR_ERR_ARG, "llama layout with a top k: %s",
          err.msg);
    unlink(llama), unlink(own);
    polar_program_free(&base);
    polar_program_free(&skip);
    polar_model_free(m);
}

/* Write n bytes of src (0: all) into dst, or dst's bytes from offset on
 * replaced: a damaged copy of a reference file. */
static int damaged_copy(const char *src, const char *dst, long n, long offset, const void *bytes, size_t len) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int ok = in && out;
    long at = 0;
    for (int c; ok && (c = fgetc(in)) != EOF && (!n || at < n); at++) {
        unsigned char b = (unsigned char)c;
        if (bytes && at >= offset && (size_t)(at - offset) < len) b = ((const unsigned char *)bytes)[at - offset];
        fputc(b, out);
    }
    if (in) fclose(in);
    if (out) fclose(out);
    return ok;
}

static void errors(void) {
    polar_error err;
    polar_model_info info;
    polar_model *m = golden_model("llama", &info), *other = golden_model("qwen3", NULL);
    if (!m || !other) return;
    int V = info.arch.vocab, tokens[48];
    tokens_of(tokens, 48, V, 5);
    polar_program p;
    CHECK_OK(polar_program_base(info.arch.n_layers, &p, &err));
    char ref[64], bad[64];
    snprintf(ref, sizeof ref, "/tmp/polar-ppl-%d.ref", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/polar-ppl-%d.bad", (int)getpid());
    polar_ppl_opts o = {.ctx = CHUNK_CTX, .bos = -1, .n_threads = 1, .device = POLAR_DEVICE_CPU, .save = ref};
    polar_ppl_result r;
    CHECK_OK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err));
    o.save = NULL;
    polar_ppl_opts c = o;
    c.reference = ref;
    tokens[40] = (tokens[40] + 1) % V;
    CHECK(polar_perplexity(m, &p, tokens, 48, &c, &r, &err) == POLAR_ERR_ARG && strstr(err.msg, "other tokens"),
          "other tokens: %s", err.msg);
    CHECK(damaged_copy(ref, bad, 0, 0, "POLARXX1", 8) &&
              polar_perplexity(m, &p, NULL, 0, &(polar_ppl_opts){.reference = bad, .bos = -1}, &r, &err) == POLAR_ERR_FORMAT,
          "bad magic: %s", err.msg);
    CHECK(damaged_copy(ref, bad, 5000, 0, NULL, 0) &&
              polar_perplexity(m, &p, NULL, 0, &(polar_ppl_opts){.reference = bad, .bos = -1}, &r, &err) == POLAR_ERR_FORMAT,
          "truncated: %s", err.msg);
    uint32_t huge = 1u << 30;
    CHECK(damaged_copy(ref, bad, 0, 8, &huge, 4) &&
              polar_perplexity(m, &p, NULL, 0, &(polar_ppl_opts){.reference = bad, .bos = -1}, &r, &err) == POLAR_ERR_FORMAT,
          "a ctx of 2^30: %s", err.msg);
    int bad_token = V + 3;
    CHECK(damaged_copy(ref, bad, 0, 24 + 4 * 5, &bad_token, 4) &&
              polar_perplexity(m, &p, NULL, 0, &(polar_ppl_opts){.reference = bad, .bos = -1}, &r, &err) == POLAR_ERR_FORMAT,
          "a token outside the vocabulary in the file: %s", err.msg);
    polar_model_info oi;
    polar_model_info_get(other, &oi);
    polar_program op;
    CHECK_OK(polar_program_base(oi.arch.n_layers, &op, &err));
    if (oi.arch.vocab != V)
        CHECK(polar_perplexity(other, &op, NULL, 0, &(polar_ppl_opts){.reference = ref, .bos = -1}, &r, &err) ==
                  POLAR_ERR_ARG, "another vocabulary: %s", err.msg);
    polar_program_free(&op);
    o.ctx = 3;
    CHECK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err) == POLAR_ERR_ARG, "ctx 3: %s", err.msg);
    o.ctx = 64;
    CHECK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err) == POLAR_ERR_RANGE, "48 tokens, ctx 64: %s", err.msg);
    o.ctx = CHUNK_CTX, tokens[3] = -1;
    CHECK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err) == POLAR_ERR_RANGE, "token -1: %s", err.msg);
    tokens[3] = 1, o.save = bad, o.reference = ref;
    CHECK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err) == POLAR_ERR_ARG, "save and compare: %s", err.msg);
    o.reference = NULL, o.save = "/nonexistent-dir/x.lp";
    CHECK(polar_perplexity(m, &p, tokens, 48, &o, &r, &err) == POLAR_ERR_IO, "unwritable: %s", err.msg);
    unlink(ref), unlink(bad);
    polar_program_free(&p);
    polar_model_free(m);
    polar_model_free(other);
}

/* ------------------------------------------------------------ CPU levels */

/* The models of the level check, written once per process into /tmp:
 * 0, the default model as Q4_0 (its weights loaded as bf16 first); 1, a
 * random Llama of hidden 256 as Q4_K_M's mix (Q4_K, and Q6_K for attn_v,
 * ffn_down and the embedding). */
enum { N_KINDS = 2 };
static const char *kind_names[N_KINDS] = {"Q4_0 (default model)", "Q4_K_M (random, hidden 256)"};

static void kind_path(int kind, char *path, size_t size) { snprintf(path, size, "/tmp/polar-ppl-%d-kind%d.gguf", (int)getpid(), kind); }

static int write_kind(int kind, const char *path) {
    polar_error err;
    polar_model *m = NULL;
    int ok = 0;
    if (kind == 0) {
        const char *dm = getenv("POLAR_DEFAULT_MODEL");
        if (!dm || !*dm) return 0;
        setenv("POLAR_GGUF_BF16", "1", 1);
        ok = polar_model_load(dm, &m, &err) == POLAR_OK && gguf_write_model(m, path, GGUF_Q4_0_FILE);
        unsetenv("POLAR_GGUF_BF16");
    } else {
        polar_arch a;
        ok = polar_arch_default("llama", &a, &err) == POLAR_OK;
        a.n_layers = 2, a.hidden = 256, a.ffn = 512, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 64, a.vocab = 512;
        ok = ok && polar_model_random(&a, 11, &m, &err) == POLAR_OK && gguf_write_model(m, path, GGUF_K_FILE);
    }
    polar_model_free(m);
    return ok;
}

/* The kind's tokens: the committed GSM8K text through the default model's
 * tokenizer (2 chunks of 64), or fixed ids. *n tokens into t[128]. */
static int kind_tokens(int kind, const polar_model *m, int *t) {
    polar_model_info info;
    polar_model_info_get(m, &info);
    if (kind == 1) {
        tokens_of(t, 128, info.arch.vocab, 9);
        return 128;
    }
    polar_error err;
    polar_tokenizer *tok = NULL;
    FILE *f = fopen("tests/data/gsm8k_train_40.txt", "rb");
    char text[8192];
    size_t len = f ? fread(text, 1, sizeof text, f) : 0;
    if (f) fclose(f);
    int *ids = NULL, n = 0;
    if (polar_tokenizer_load(getenv("POLAR_DEFAULT_MODEL"), &tok, &err) == POLAR_OK &&
        polar_tokenize(tok, text, len, 0, 1, &ids, &n, &err) == POLAR_OK && n >= 128)
        memcpy(t, ids, 128 * sizeof *t);
    polar_free(ids);
    polar_tokenizer_free(tok);
    return n >= 128 ? 128 : 0;
}

/* A run of the kind's model: saving its log-probabilities (save) or
 * comparing with them (compare). */
static polar_status kind_run(int kind, const char *path, const char *save, const char *compare, polar_ppl_result *r,
                             polar_error *err) {
    polar_model *m = NULL;
    polar_status st = polar_model_load(path, &m, err);
    int tokens[128], n = st == POLAR_OK ? kind_tokens(kind, m, tokens) : 0;
    polar_program p = {0};
    if (st == POLAR_OK && !n) {
        snprintf(err->msg, sizeof err->msg, "no tokens for %s (the default model's tokenizer, tests/data)", kind_names[kind]);
        st = err->code = POLAR_ERR_IO;
    }
    if (st == POLAR_OK) {
        polar_model_info info;
        polar_model_info_get(m, &info);
        st = polar_program_base(info.arch.n_layers, &p, err);
    }
    polar_ppl_opts o = {.ctx = 64, .bos = -1, .n_threads = 2, .device = POLAR_DEVICE_CPU, .save = save, .reference = compare};
    if (st == POLAR_OK) st = polar_perplexity(m, &p, tokens, n, &o, r, err);
    polar_program_free(&p);
    polar_model_free(m);
    return st;
}

static const char *self_path;

/* Bounds on the mean KL divergence from the reference level, per kind:
 * 1.5 x the largest measured on a level (2026-11-27, a 2-core AMD EPYC
 * with AVX2 only: Q4_0 0.00342 generic, 0.00333 avx2; Q4_K_M 0.000203
 * generic, 0.000201 avx2; the AVX-512 levels quantize activations as avx2
 * does). A kernel that doubles its divergence fails. */
static const double kld_bound[N_KINDS] = {0.0052, 0.00031};

/* Run this program as a child under POLAR_CPU=level: the kind's model
 * saving (save) or comparing with (compare) the reference file; the
 * child's result line into out. 0 when it ran. */
static int child_run(const char *level, int kind, const char *model, const char *save, const char *compare,
                     const char *out) {
    pid_t pid = fork();
    if (pid == 0) {
        char k[8];
        snprintf(k, sizeof k, "%d", kind);
        setenv("POLAR_CPU", level, 1);
        execl(self_path, self_path, "--child", k, model, save ? "save" : "compare", save ? save : compare, out,
              (char *)NULL);
        _exit(127);
    }
    int status = 0;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The child: "LEVEL KLD KLD_ERR SAME_TOP PPL REF_PPL" into out (the level
 * it ran: another than asked when this CPU cannot run it). */
static int child_main(char **argv) {
    int kind = atoi(argv[0]), save = !strcmp(argv[2], "save");
    polar_error err;
    polar_ppl_result r;
    if (kind_run(kind, argv[1], save ? argv[3] : NULL, save ? NULL : argv[3], &r, &err) != POLAR_OK) {
        fprintf(stderr, "test_perplexity --child: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[4], "w");
    if (!f) return 1;
    fprintf(f, "%s %.9g %.9g %.9g %.9g %.9g\n", polar_cpu_kernels(), r.kld, r.kld_err, r.same_top, r.ppl, r.ref_ppl);
    return fclose(f) != 0;
}

/* Each kind's model once, its reference log-probabilities once (a level is
 * chosen once per process: each run is a child), then every CPU level
 * against them; a level this CPU cannot run is skipped. */
static void level_kld(void) {
    static const char *levels[] = {"generic", "avx2", "avx2vnni", "avx512", "avx512vnni", "neon"};
    for (int kind = 0; kind < N_KINDS; kind++) {
        char path[128], ref[160], out[160];
        kind_path(kind, path, sizeof path);
        snprintf(ref, sizeof ref, "%s.lp", path);
        snprintf(out, sizeof out, "%s.txt", path);
        if (!write_kind(kind, path)) {
            CHECK(0, "could not write the %s model (POLAR_DEFAULT_MODEL: make test sets it)", kind_names[kind]);
            continue;
        }
        if (!child_run("reference", kind, path, ref, NULL, out)) {
            CHECK(0, "%s: the reference run failed", kind_names[kind]);
            unlink(path);
            continue;
        }
        for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
            char ran[32] = "";
            double kld = 0, kld_err = 0, top = 0, ppl = 0, ref_ppl = 0;
            FILE *f = child_run(levels[l], kind, path, NULL, ref, out) ? fopen(out, "r") : NULL;
            int got = f && fscanf(f, "%31s %lf %lf %lf %lf %lf", ran, &kld, &kld_err, &top, &ppl, &ref_ppl) == 6;
            if (f) fclose(f);
            CHECK(got, "%s on %s: the run failed", kind_names[kind], levels[l]);
            if (!got || strcmp(ran, levels[l])) continue; /* this CPU cannot run the level */
            CHECK(kld > 0 && kld < kld_bound[kind], "%s on %s: mean KLD %g (bound %g)", kind_names[kind], levels[l], kld,
                  kld_bound[kind]);
            printf("  %-28s %-10s KLD %.7f +/- %.7f (bound %.5f), same top %.1f%%, PPL %.4f vs the reference's %.4f\n",
                   kind_names[kind], levels[l], kld, kld_err, kld_bound[kind], 100 * top, ppl, ref_ppl);
        }
        unlink(ref), unlink(path), unlink(out);
    }
}

int main(int argc, char **argv) {
    self_path = argv[0];
    if (argc == 7 && !strcmp(argv[1], "--child")) return child_main(argv + 2);
    RUN(ppl_matches_direct);
    RUN(kld_reference_files);
    RUN(kld_llama_files);
    RUN(errors);
    RUN(level_kld);
    TEST_EXIT();
}
