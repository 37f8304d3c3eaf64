/* The trainer's input: every question's token states through the frozen
 * encoder, computed once per run, and kept across runs in a safetensors
 * cache ("T" [n] i32, "h" [sum T, d_q] f32) whose metadata key says what
 * made it. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "predictor.h"

#define FEATURES_VERSION "polar-train-features 1"
#define PROBE_TOL 1e-4 /* of the largest state: the same encoder gives the same states */

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv1a_str(uint64_t h, const char *s) { return fnv1a(h, s, strlen(s) + 1); }

/* What the features depend on, as 16 hex digits. */
static void features_key(const char *encoder_path, const char *program, const polar_model_info *info,
                         const polar_train_labels *l, char key[17]) {
    uint64_t h = fnv1a_str(0xcbf29ce484222325ull, FEATURES_VERSION);
    h = fnv1a_str(fnv1a_str(h, encoder_path), program);
    int64_t shape[5] = {info->arch.n_layers, info->arch.hidden, info->arch.vocab, (int64_t)info->n_params,
                        PRED_MAX_TOKENS};
    h = fnv1a(h, shape, sizeof shape);
    for (int i = 0; i < l->n; i++) h = fnv1a_str(h, l->q[i].question);
    snprintf(key, 17, "%016" PRIx64, h);
}

typedef struct {
    polar_model *m;
    polar_tokenizer *tok;
    polar_session *s;
    int dq;
} encoder;

static void encoder_free(encoder *e) {
    polar_session_free(e->s);
    polar_tokenizer_free(e->tok);
    polar_model_free(e->m);
}

static polar_status encoder_open(encoder *e, const char *path, const char *program, polar_model_info *info,
                                 polar_error *err) {
    memset(e, 0, sizeof *e);
    polar_program prog = {0};
    polar_status st = polar_model_load(path, &e->m, err);
    if (st == POLAR_OK) st = polar_tokenizer_load(path, &e->tok, err);
    if (st == POLAR_OK) {
        polar_model_info_get(e->m, info);
        e->dq = info->arch.hidden;
        st = polar_program_parse(program, info->arch.n_layers, 0, &prog, err);
    }
    polar_session_opts so = {.max_ctx = PRED_MAX_TOKENS};
    if (st == POLAR_OK) st = polar_session_create(e->m, &prog, &so, &e->s, err);
    polar_program_free(&prog);
    if (st != POLAR_OK) encoder_free(e);
    return st;
}

/* Question q's token count (truncated) and, when h is not NULL, its states. */
static polar_status encode_question(const encoder *e, const char *q, int index, float *h, int *T, polar_error *err) {
    int *ids = NULL, n = 0;
    polar_status st = polar_tokenize(e->tok, q, strlen(q), 0, 1, &ids, &n, err);
    if (st == POLAR_OK && n == 0) st = polar_fail(err, POLAR_ERR_ARG, "question %d gives no tokens", index);
    n = n > PRED_MAX_TOKENS ? PRED_MAX_TOKENS : n;
    if (st == POLAR_OK && h) st = polar_encode(e->s, ids, n, h, err);
    polar_free(ids);
    *T = n;
    return st;
}

static polar_status features_alloc(polar_train_features *f, int n, int dq, size_t tokens, polar_error *err) {
    f->n = n, f->dq = dq;
    f->T = calloc((size_t)n, sizeof *f->T);
    f->h = calloc((size_t)n, sizeof *f->h);
    float *block = f->h ? malloc(tokens * (size_t)dq * sizeof *block) : NULL;
    if (!f->T || !f->h || !block) {
        free(block);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for the features of %d questions", n);
    }
    f->h[0] = block;
    return POLAR_OK;
}

/* Point h[i] at question i's rows once T[] is known. */
static void features_index(polar_train_features *f) {
    for (int i = 1; i < f->n; i++) f->h[i] = f->h[i - 1] + (size_t)f->T[i - 1] * f->dq;
}

/* The cache when it was made from the same key and shape: 1 (read into f), 0 (stale or absent). */
static int cache_read(const char *path, const char *key, int n, int dq, polar_train_features *f, polar_error *err) {
    st_file sf;
    polar_error ignored;
    if (st_open(path, &sf, &ignored) != POLAR_OK) return 0;
    char have[32];
    const st_tensor *T = st_find(&sf, "T"), *h = st_find(&sf, "h");
    int ok = pred_st_meta(&sf, "key", have, sizeof have) && !strcmp(have, key) && T && h && T->dtype == ST_I32 &&
             T->ndim == 1 && T->shape[0] == n && h->dtype == ST_F32 && h->ndim == 2 && h->shape[1] == dq;
    size_t tokens = 0;
    for (int i = 0; ok && i < n; i++) {
        int32_t t;
        memcpy(&t, (const char *)T->data + 4 * (size_t)i, 4);
        ok = t >= 1 && t <= PRED_MAX_TOKENS;
        tokens += ok ? (size_t)t : 0;
    }
    ok = ok && (size_t)h->shape[0] == tokens;
    if (ok && features_alloc(f, n, dq, tokens, err) == POLAR_OK) {
        memcpy(f->T, T->data, (size_t)n * sizeof *f->T);
        memcpy(f->h[0], h->data, tokens * (size_t)dq * sizeof(float));
        features_index(f);
    } else {
        polar_train_features_free(f);
        ok = 0;
    }
    st_close(&sf);
    return ok;
}

static polar_status cache_write(const char *path, const char *key, const char *encoder_path, const char *program,
                                const polar_train_features *f, polar_error *err) {
    size_t tokens = 0;
    for (int i = 0; i < f->n; i++) tokens += (size_t)f->T[i];
    st_write_tensor t[2] = {{"T", ST_I32, 1, {f->n}, f->T}, {"h", ST_F32, 2, {(int64_t)tokens, f->dq}, f->h[0]}};
    /* the encoder is written for people reading the header; a quote or a
     * backslash in its path would need escaping, so those are left out */
    char meta[1024], shown[600];
    size_t k = 0;
    for (const char *c = encoder_path; *c && k + 1 < sizeof shown; c++)
        if (*c != '"' && *c != '\\' && (unsigned char)*c >= 0x20) shown[k++] = *c;
    shown[k] = 0;
    snprintf(meta, sizeof meta, "{\"key\":\"%s\",\"encoder\":\"%s@%s\",\"questions\":\"%d\",\"version\":\"%s\"}", key,
             shown, program, f->n, FEATURES_VERSION);
    return st_write_meta(path, t, 2, meta, err);
}

void polar_train_features_free(polar_train_features *f) {
    if (!f) return;
    if (f->h) free(f->h[0]);
    free(f->h);
    free(f->T);
    memset(f, 0, sizeof *f);
}

/* The cached first question against the encoder now. */
static polar_status probe_matches(const encoder *e, const polar_train_labels *l, const polar_train_features *f,
                                  int *same, polar_error *err) {
    int T;
    float *h = malloc((size_t)f->T[0] * f->dq * sizeof *h);
    if (!h) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    polar_status st = encode_question(e, l->q[0].question, 0, h, &T, err);
    double diff = 0, scale = 0;
    for (size_t i = 0; st == POLAR_OK && T == f->T[0] && i < (size_t)T * f->dq; i++) {
        diff = fmax(diff, fabs((double)h[i] - f->h[0][i]));
        scale = fmax(scale, fabs((double)f->h[0][i]));
    }
    *same = st == POLAR_OK && T == f->T[0] && diff <= PROBE_TOL * (scale > 1 ? scale : 1);
    free(h);
    return st;
}

polar_status polar_train_features_make(const char *encoder_path, const char *program, const polar_train_labels *l,
                                       const char *cache_path, void (*progress)(int done, int total, void *ctx),
                                       void *ctx, polar_train_features *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    if (!encoder_path || !program || !l || l->n < 1)
        return polar_fail(err, POLAR_ERR_ARG, "train features: missing encoder, program or questions");
    encoder e;
    polar_model_info info;
    polar_status st = encoder_open(&e, encoder_path, program, &info, err);
    if (st != POLAR_OK) return st;
    char key[17];
    features_key(encoder_path, program, &info, l, key);
    int stale = 0;
    if (cache_path) {
        FILE *exists = fopen(cache_path, "rb");
        stale = exists != NULL;
        if (exists) fclose(exists);
    }
    if (cache_path && cache_read(cache_path, key, l->n, e.dq, out, err)) {
        int same = 0;
        st = probe_matches(&e, l, out, &same, err);
        if (st == POLAR_OK && same) {
            out->cache = POLAR_FEATURES_REUSED;
            encoder_free(&e);
            return POLAR_OK;
        }
        polar_train_features_free(out);
    }
    /* count the tokens, then encode into one block */
    size_t tokens = 0;
    int *T = malloc((size_t)l->n * sizeof *T);
    if (!T) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    for (int i = 0; st == POLAR_OK && i < l->n; i++) {
        st = encode_question(&e, l->q[i].question, i, NULL, &T[i], err);
        tokens += (size_t)T[i];
    }
    if (st == POLAR_OK) st = features_alloc(out, l->n, e.dq, tokens, err);
    if (st == POLAR_OK) {
        memcpy(out->T, T, (size_t)l->n * sizeof *T);
        features_index(out);
    }
    free(T);
    for (int i = 0; st == POLAR_OK && i < l->n; i++) {
        int n;
        st = encode_question(&e, l->q[i].question, i, out->h[i], &n, err);
        if (progress) progress(i + 1, l->n, ctx);
    }
    encoder_free(&e);
    if (st == POLAR_OK && cache_path) st = cache_write(cache_path, key, encoder_path, program, out, err);
    out->cache = !cache_path ? POLAR_FEATURES_COMPUTED : stale ? POLAR_FEATURES_REPLACED : POLAR_FEATURES_WRITTEN;
    if (st != POLAR_OK) polar_train_features_free(out);
    return st;
}
