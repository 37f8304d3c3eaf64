/* Question -> ranked programs: the encoder (any model the runtime loads, run
 * with any program) gives token states, the predictor scores the layers, the
 * beam decoder ranks programs. Shared by `polar predict` and
 * `polar run --program auto`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"

#define MAX_QUESTION_TOKENS 512 /* the reference truncates questions here */

static int fail(const char *cmd, polar_error *err) { return fail_status(cmd, err); }

int default_encoder_last_layer(int n_layers) { return (n_layers + 3) / 4 - 1; }

int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec, const char *question, const polar_decode_opts *opts,
                     polar_candidate *out, int k, int *n_out, auto_timing *tm) {
    *n_out = 0;
    memset(tm, 0, sizeof *tm);
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
    polar_predictor *pred = NULL;
    polar_model *enc = NULL;
    polar_tokenizer *tok = NULL;
    polar_session *s = NULL;
    polar_program prog = {0};
    int *ids = NULL, n_ids = 0, rc = 1;
    float *h = NULL, *seg = NULL, *op = NULL;
    if (polar_predictor_load(predictor_path, &pred, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    int D = polar_predictor_layers(pred);
    if (D != n_layers) {
        fprintf(stderr, "polar %s: error: %s predicts programs for %d layers but the model has %d\n", cmd,
                predictor_path, D, n_layers);
        goto done;
    }
    if (polar_model_load(path, &enc, &err) != POLAR_OK || polar_tokenizer_load(path, &tok, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    polar_model_info info;
    polar_model_info_get(enc, &info);
    if (info.arch.hidden != polar_predictor_input_dim(pred)) {
        fprintf(stderr, "polar %s: error: encoder %s has hidden size %d but the predictor takes %d\n", cmd, path,
                info.arch.hidden, polar_predictor_input_dim(pred));
        goto done;
    }
    if (polar_program_parse(enc_program, info.arch.n_layers, 0, &prog, &err) != POLAR_OK ||
        polar_tokenize(tok, question, strlen(question), 0, 1, &ids, &n_ids, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    if (n_ids > MAX_QUESTION_TOKENS) n_ids = MAX_QUESTION_TOKENS;
    if (n_ids == 0) {
        rc = fail_usage(cmd, "the question gives no tokens");
        goto done;
    }
    polar_session_opts so = {.max_ctx = n_ids};
    h = malloc((size_t)n_ids * info.arch.hidden * sizeof *h);
    seg = malloc((size_t)D * sizeof *seg);
    op = malloc((size_t)D * 3 * sizeof *op);
    if (!h || !seg || !op || polar_session_create(enc, &prog, &so, &s, &err) != POLAR_OK) {
        if (!h || !seg || !op) snprintf(err.msg, sizeof err.msg, "out of memory");
        rc = fail(cmd, &err);
        goto done;
    }
    /* The predictor runs where the encoder runs, or on the CPU when that GPU
     * cannot run its fused kernel. */
    if (!strcmp(polar_session_device(s), "cuda") && polar_predictor_use_device(pred, POLAR_DEVICE_CUDA, &err) != POLAR_OK)
        fprintf(stderr, "polar %s: note: the predictor runs on the CPU: %s\n", cmd, err.msg);
    double t0 = polar_time_ms();
    if (polar_encode(s, ids, n_ids, h, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    double t1 = polar_time_ms();
    if (polar_predict_logits(pred, h, n_ids, seg, op, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    double t2 = polar_time_ms();
    if (polar_decode_programs(seg, op, D, opts, out, k, n_out, &err) != POLAR_OK) {
        rc = fail(cmd, &err);
        goto done;
    }
    tm->encoder_ms = t1 - t0;
    tm->predictor_ms = t2 - t1;
    tm->beam_ms = polar_time_ms() - t2;
    tm->question_tokens = n_ids;
    if (*n_out == 0) {
        fprintf(stderr, "polar %s: error: the predictor left no program within the layer bounds\n", cmd);
        goto done;
    }
    rc = 0;
done:
    free(h);
    free(seg);
    free(op);
    polar_free(ids);
    polar_program_free(&prog);
    polar_session_free(s);
    polar_tokenizer_free(tok);
    polar_model_free(enc);
    polar_predictor_free(pred);
    return rc;
}
