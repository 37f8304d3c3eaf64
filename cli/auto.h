/* Predicting programs for a question (see auto.c). */
#ifndef POLAR_CLI_AUTO_H
#define POLAR_CLI_AUTO_H

#include "args.h"

typedef struct {
    double encoder_ms, predictor_ms, beam_ms;
    int question_tokens;
} auto_timing;

/* The default encoder of polar train and of --program auto: the model
 * itself running layers 0..this of its n_layers (the first quarter). */
int default_encoder_last_layer(int n_layers);

/* Up to k programs for a model of n_layers layers at model_path, best
 * first; the encoder is encoder_spec, else POLAR_ENCODER, else the default
 * one on model_path (when not NULL). Returns an exit status (0 on success,
 * having printed nothing). */
int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec,
                     const char *question, const polar_decode_opts *opts, polar_candidate *out, int k, int *n_out,
                     auto_timing *tm);

#endif
