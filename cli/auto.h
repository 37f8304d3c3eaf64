/* Predicting programs for a question (see auto.c). */
#ifndef POLAR_CLI_AUTO_H
#define POLAR_CLI_AUTO_H

#include "args.h"

typedef struct {
    double encoder_ms, predictor_ms, beam_ms;
    int question_tokens;
    const char *predictor_device; /* "cpu" or "cuda" */
} auto_timing;

/* The default encoder of polar train and of --program auto: the model
 * itself running layers 0..this of its n_layers (the first quarter). */
int default_encoder_last_layer(int n_layers);

/* The predictor, encoder model, tokenizer and encoder session for a model of
 * n_layers layers at model_path: the encoder is encoder_spec, else
 * POLAR_ENCODER, else the default one on model_path (when not NULL). The
 * predictor runs where the encoder runs (a note when that GPU refuses it).
 * Returns an exit status (0: *out opened). One thread at a time. */
typedef struct auto_ctx auto_ctx;
int auto_open(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
              const char *encoder_spec, auto_ctx **out);
/* Up to k programs for the question, best first; an exit status (0 on
 * success, having printed nothing). */
int auto_predict(const char *cmd, auto_ctx *a, const char *question, const polar_decode_opts *opts,
                 polar_candidate *out, int k, int *n_out, auto_timing *tm);
void auto_close(auto_ctx *a);

/* auto_open, auto_predict and auto_close for one question. */
int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec,
                     const char *question, const polar_decode_opts *opts, polar_candidate *out, int k, int *n_out,
                     auto_timing *tm);

#endif
