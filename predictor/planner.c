/* Question -> ranked programs (polar.h's polar_planner): the encoder's
 * session gives the question's token states, the predictor scores the
 * layers, the beam decoder (or the catalogue's) ranks programs. Used by `polar eval --program
 * auto` for every question, by `polar predict` and `polar run --program
 * auto` once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "polar.h"
#include "predictor.h"

/* the encoder's states fit the predictor's device input */
_Static_assert(POLAR_PLANNER_MAX_TOKENS <= PRED_MAX_TOKENS, "planner questions longer than the predictor takes");

struct polar_planner {
    polar_predictor *pred;
    polar_model *enc;
    polar_tokenizer *tok;
    polar_session *s;    /* the encoder's, for up to POLAR_PLANNER_MAX_TOKENS */
    polar_program prog;
    int D, hidden;
    float *h, *seg, *op; /* [POLAR_PLANNER_MAX_TOKENS, hidden], [D], [D, 3] */
    float *states;       /* where the encoder writes: h, or the predictor's device input when both are on the GPU */
    const char *device;  /* where the predictor runs */
    char note[sizeof ((polar_error *)0)->msg]; /* why it runs on the CPU beside an encoder on the GPU */
};

int polar_default_encoder_last_layer(int n_layers) { return (n_layers + 3) / 4 - 1; }

void polar_planner_free(polar_planner *p) {
    if (!p) return;
    free(p->h);
    free(p->seg);
    free(p->op);
    polar_program_free(&p->prog);
    polar_session_free(p->s);
    polar_tokenizer_free(p->tok);
    polar_model_free(p->enc);
    polar_predictor_free(p->pred);
    free(p);
}

/* The encoder model, tokenizer, program and session of spec PATH[@PROGRAM]. */
static polar_status open_encoder(polar_planner *p, const char *spec, polar_error *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", spec) >= (int)sizeof path)
        return polar_fail(err, POLAR_ERR_ARG, "encoder: a path of %zu bytes is too long", strlen(spec));
    char *at = strrchr(path, '@');
    const char *program = "base";
    if (at) *at = 0, program = at + 1;
    polar_status st = polar_model_load(path, &p->enc, err);
    if (st == POLAR_OK) st = polar_tokenizer_load(path, &p->tok, err);
    if (st != POLAR_OK) return st;
    polar_model_info info;
    polar_model_info_get(p->enc, &info);
    p->hidden = info.arch.hidden;
    if (p->hidden != polar_predictor_input_dim(p->pred))
        return polar_fail(err, POLAR_ERR_CONFIG, "encoder %s has hidden size %d but the predictor takes %d", path,
                          p->hidden, polar_predictor_input_dim(p->pred));
    if ((st = polar_program_parse(program, info.arch.n_layers, 0, &p->prog, err)) != POLAR_OK) return st;
    polar_session_opts so = {.max_ctx = POLAR_PLANNER_MAX_TOKENS};
    return polar_session_create(p->enc, &p->prog, &so, &p->s, err);
}

polar_status polar_planner_open(const char *predictor_path, const char *encoder_spec, int n_layers,
                                polar_planner **out, polar_error *err) {
    *out = NULL;
    if (!predictor_path || !encoder_spec || !*encoder_spec)
        return polar_fail(err, POLAR_ERR_ARG, "planner: a predictor and an encoder are needed");
    polar_planner *p = calloc(1, sizeof *p);
    if (!p) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory opening the planner");
    polar_status st = polar_predictor_load(predictor_path, &p->pred, err);
    if (st == POLAR_OK && (p->D = polar_predictor_layers(p->pred)) != n_layers)
        st = polar_fail(err, POLAR_ERR_CONFIG, "%s predicts programs for %d layers but the model has %d", predictor_path,
                        p->D, n_layers);
    if (st == POLAR_OK) st = open_encoder(p, encoder_spec, err);
    if (st == POLAR_OK) {
        p->h = malloc((size_t)POLAR_PLANNER_MAX_TOKENS * p->hidden * sizeof *p->h);
        p->seg = malloc((size_t)p->D * sizeof *p->seg);
        p->op = malloc((size_t)p->D * 3 * sizeof *p->op);
        if (!p->h || !p->seg || !p->op) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory opening the planner");
    }
    if (st != POLAR_OK) {
        polar_planner_free(p);
        return st;
    }
    /* The predictor runs where the encoder runs, or on the CPU when that GPU
     * cannot run its fused kernel. */
    p->device = "cpu";
    p->states = p->h;
    if (!strcmp(polar_session_device(p->s), "cuda")) {
        polar_error why;
        if (polar_predictor_use_device(p->pred, POLAR_DEVICE_CUDA, &why) == POLAR_OK)
            p->device = "cuda", p->states = pred_cuda_input(p->pred);
        else snprintf(p->note, sizeof p->note, "%s", why.msg);
    }
    *out = p;
    return POLAR_OK;
}

const char *polar_planner_device(const polar_planner *p) { return p->device; }

const char *polar_planner_note(const polar_planner *p) { return p->note[0] ? p->note : NULL; }

polar_status polar_planner_predict(polar_planner *p, const char *question, const polar_decode_opts *opts,
                                   polar_candidate *out, int k, int *n_out, polar_planner_timing *tm, polar_error *err) {
    polar_planner_timing local;
    if (!tm) tm = &local;
    *n_out = 0;
    memset(tm, 0, sizeof *tm);
    int *ids = NULL, n_ids = 0;
    polar_status st = polar_tokenize(p->tok, question, strlen(question), 0, 1, &ids, &n_ids, err);
    if (st != POLAR_OK) return st;
    if (n_ids > POLAR_PLANNER_MAX_TOKENS) n_ids = POLAR_PLANNER_MAX_TOKENS;
    double t0 = polar_time_ms(), t1 = t0, t2 = t0;
    if (n_ids == 0) st = polar_fail(err, POLAR_ERR_ARG, "the question gives no tokens");
    if (st == POLAR_OK) st = polar_encode(p->s, ids, n_ids, p->states, err), t1 = polar_time_ms();
    if (st == POLAR_OK) st = polar_predict_logits(p->pred, p->states, n_ids, p->seg, p->op, err), t2 = polar_time_ms();
    if (st == POLAR_OK) st = pred_decode(p->pred, p->seg, p->op, opts, out, k, n_out, err);
    polar_free(ids);
    if (st != POLAR_OK) return st;
    *tm = (polar_planner_timing){t1 - t0, t2 - t1, polar_time_ms() - t2, n_ids};
    if (*n_out == 0) return polar_fail(err, POLAR_ERR_PROGRAM, "the predictor left no program within the layer bounds");
    return POLAR_OK;
}
