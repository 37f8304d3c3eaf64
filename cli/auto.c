/* Question -> ranked programs: the encoder (any model the runtime loads, run
 * with any program) gives token states, the predictor scores the layers, the
 * beam decoder ranks programs. Opened once (predictor, encoder model,
 * tokenizer, session, buffers) and used for any number of questions: by
 * `polar eval --program auto` for every question, by `polar predict` and
 * `polar run --program auto` once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"

#define MAX_QUESTION_TOKENS 512 /* the reference truncates questions here */

struct auto_ctx {
    polar_predictor *pred;
    polar_model *enc;
    polar_tokenizer *tok;
    polar_session *s; /* the encoder's, for up to MAX_QUESTION_TOKENS */
    polar_program prog;
    int D, hidden;
    float *h, *seg, *op; /* [MAX_QUESTION_TOKENS, hidden], [D], [D, 3] */
    const char *device;  /* where the predictor runs */
};

int default_encoder_last_layer(int n_layers) { return (n_layers + 3) / 4 - 1; }

void auto_close(auto_ctx *a) {
    if (!a) return;
    free(a->h);
    free(a->seg);
    free(a->op);
    polar_program_free(&a->prog);
    polar_session_free(a->s);
    polar_tokenizer_free(a->tok);
    polar_model_free(a->enc);
    polar_predictor_free(a->pred);
    free(a);
}

int auto_open(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
              const char *encoder_spec, auto_ctx **out) {
    *out = NULL;
    if (!predictor_path) return fail_usage(cmd, "--predictor FILE is required with a predicted program");
    if (!encoder_spec) encoder_spec = getenv("POLAR_ENCODER");
    char default_spec[4096];
    if ((!encoder_spec || !*encoder_spec) && model_path) { /* what polar train uses by default */
        snprintf(default_spec, sizeof default_spec, "%s@0-%d", model_path, default_encoder_last_layer(n_layers));
        encoder_spec = default_spec;
    }
    if (!encoder_spec || !*encoder_spec)
        return fail_usage(cmd, "no encoder: pass --encoder PATH[@PROGRAM] (a Qwen3-Embedding-0.6B folder, or the model "
                               "itself with a short program) or set POLAR_ENCODER");
    /* PATH@PROGRAM: the program after the last '@' */
    char path[4096];
    snprintf(path, sizeof path, "%s", encoder_spec);
    char *at = strrchr(path, '@');
    const char *enc_program = "base";
    if (at) {
        *at = 0;
        enc_program = at + 1;
    }
    polar_error err;
    auto_ctx *a = calloc(1, sizeof *a);
    if (!a) return fail_usage(cmd, "out of memory");
    int rc = 1;
    if (polar_predictor_load(predictor_path, &a->pred, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto fail;
    }
    a->D = polar_predictor_layers(a->pred);
    if (a->D != n_layers) {
        fprintf(stderr, "polar %s: error: %s predicts programs for %d layers but the model has %d\n", cmd,
                predictor_path, a->D, n_layers);
        goto fail;
    }
    if (polar_model_load(path, &a->enc, &err) != POLAR_OK || polar_tokenizer_load(path, &a->tok, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto fail;
    }
    polar_model_info info;
    polar_model_info_get(a->enc, &info);
    a->hidden = info.arch.hidden;
    if (a->hidden != polar_predictor_input_dim(a->pred)) {
        fprintf(stderr, "polar %s: error: encoder %s has hidden size %d but the predictor takes %d\n", cmd, path,
                a->hidden, polar_predictor_input_dim(a->pred));
        goto fail;
    }
    if (polar_program_parse(enc_program, info.arch.n_layers, 0, &a->prog, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto fail;
    }
    polar_session_opts so = {.max_ctx = MAX_QUESTION_TOKENS};
    a->h = malloc((size_t)MAX_QUESTION_TOKENS * a->hidden * sizeof *a->h);
    a->seg = malloc((size_t)a->D * sizeof *a->seg);
    a->op = malloc((size_t)a->D * 3 * sizeof *a->op);
    if (!a->h || !a->seg || !a->op || polar_session_create(a->enc, &a->prog, &so, &a->s, &err) != POLAR_OK) {
        if (!a->h || !a->seg || !a->op) snprintf(err.msg, sizeof err.msg, "out of memory");
        rc = fail_status(cmd, &err);
        goto fail;
    }
    /* The predictor runs where the encoder runs, or on the CPU when that GPU
     * cannot run its fused kernel. */
    a->device = "cpu";
    if (!strcmp(polar_session_device(a->s), "cuda")) {
        if (polar_predictor_use_device(a->pred, POLAR_DEVICE_CUDA, &err) == POLAR_OK) a->device = "cuda";
        else fprintf(stderr, "polar %s: note: the predictor runs on the CPU: %s\n", cmd, err.msg);
    }
    *out = a;
    return 0;
fail:
    auto_close(a);
    return rc;
}

int auto_predict(const char *cmd, auto_ctx *a, const char *question, const polar_decode_opts *opts,
                 polar_candidate *out, int k, int *n_out, auto_timing *tm) {
    *n_out = 0;
    memset(tm, 0, sizeof *tm);
    polar_error err;
    int *ids = NULL, n_ids = 0, rc = 1;
    if (polar_tokenize(a->tok, question, strlen(question), 0, 1, &ids, &n_ids, &err) != POLAR_OK)
        return fail_status(cmd, &err);
    if (n_ids > MAX_QUESTION_TOKENS) n_ids = MAX_QUESTION_TOKENS;
    if (n_ids == 0) {
        rc = fail_usage(cmd, "the question gives no tokens");
        goto done;
    }
    double t0 = polar_time_ms();
    if (polar_encode(a->s, ids, n_ids, a->h, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    double t1 = polar_time_ms();
    if (polar_predict_logits(a->pred, a->h, n_ids, a->seg, a->op, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    double t2 = polar_time_ms();
    if (polar_decode_programs(a->seg, a->op, a->D, opts, out, k, n_out, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    tm->encoder_ms = t1 - t0;
    tm->predictor_ms = t2 - t1;
    tm->beam_ms = polar_time_ms() - t2;
    tm->question_tokens = n_ids;
    tm->predictor_device = a->device;
    if (*n_out == 0) {
        fprintf(stderr, "polar %s: error: the predictor left no program within the layer bounds\n", cmd);
        goto done;
    }
    rc = 0;
done:
    polar_free(ids);
    return rc;
}

int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec, const char *question, const polar_decode_opts *opts,
                     polar_candidate *out, int k, int *n_out, auto_timing *tm) {
    *n_out = 0;
    memset(tm, 0, sizeof *tm);
    auto_ctx *a;
    int rc = auto_open(cmd, model_path, n_layers, predictor_path, encoder_spec, &a);
    if (!rc) rc = auto_predict(cmd, a, question, opts, out, k, n_out, tm);
    auto_close(a);
    return rc;
}
