/* The CLI's side of predicting programs for a question (polar_planner):
 * which encoder (--encoder, POLAR_ENCODER, or the model's first quarter),
 * and the errors and notes printed. */
#ifndef POLAR_CLI_AUTO_H
#define POLAR_CLI_AUTO_H

#include "args.h"

/* The planner for a model of n_layers layers at model_path: the encoder is
 * encoder_spec, else POLAR_ENCODER, else the default one on model_path (when
 * not NULL). Returns an exit status (0: *out opened). */
int auto_open(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
              const char *encoder_spec, polar_planner **out);
/* Up to k programs for the question, best first; an exit status (0 on
 * success, having printed nothing). */
int auto_predict(const char *cmd, polar_planner *p, const char *question, const polar_decode_opts *opts,
                 polar_candidate *out, int k, int *n_out, polar_planner_timing *tm);

/* --decode TEXT: "beam" (the reference's) or "catalogue" (the predictor's
 * stored programs, polar_catalogue_rank) into o->catalogue; NULL leaves
 * the beam. An exit status (0: parsed). */
int decode_mode(const char *cmd, const char *text, polar_decode_opts *o);

/* auto_open, auto_predict and polar_planner_free for one question. */
int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec, const char *question, const polar_decode_opts *opts,
                     polar_candidate *out, int k, int *n_out, polar_planner_timing *tm, const char **device);

#endif
