/* Predicting programs for a question (see auto.c). */
#ifndef POLAR_CLI_AUTO_H
#define POLAR_CLI_AUTO_H

#include "args.h"

typedef struct {
    double encoder_ms, predictor_ms, beam_ms;
    int question_tokens;
} auto_timing;

/* Up to k programs for a model of n_layers layers, best first; returns an
 * exit status (0 on success, having printed nothing). */
int predict_programs(const char *cmd, int n_layers, const char *predictor_path, const char *encoder_spec,
                     const char *question, const polar_decode_opts *opts, polar_candidate *out, int k, int *n_out,
                     auto_timing *tm);

#endif
