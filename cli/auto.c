/* Which encoder a predicted program uses, and what the CLI prints of the
 * planner (auto.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"

int auto_open(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
              const char *encoder_spec, polar_planner **out) {
    *out = NULL;
    if (!predictor_path) return fail_usage(cmd, "--predictor FILE is required with a predicted program");
    if (!encoder_spec) encoder_spec = getenv("POLAR_ENCODER");
    char default_spec[4096];
    if ((!encoder_spec || !*encoder_spec) && model_path) { /* what polar train uses by default */
        snprintf(default_spec, sizeof default_spec, "%s@0-%d", model_path, polar_default_encoder_last_layer(n_layers));
        encoder_spec = default_spec;
    }
    if (!encoder_spec || !*encoder_spec)
        return fail_usage(cmd, "no encoder: pass --encoder PATH[@PROGRAM] (a Qwen3-Embedding-0.6B folder, or the model "
                               "itself with a short program) or set POLAR_ENCODER");
    polar_error err;
    if (polar_planner_open(predictor_path, encoder_spec, n_layers, out, &err) != POLAR_OK) return fail_status(cmd, &err);
    if (polar_planner_note(*out)) fprintf(stderr, "polar %s: note: the predictor runs on the CPU: %s\n", cmd, polar_planner_note(*out));
    return 0;
}

int auto_predict(const char *cmd, polar_planner *p, const char *question, const polar_decode_opts *opts,
                 polar_candidate *out, int k, int *n_out, polar_planner_timing *tm) {
    polar_error err;
    return polar_planner_predict(p, question, opts, out, k, n_out, tm, &err) == POLAR_OK ? 0 : fail_status(cmd, &err);
}

int predict_programs(const char *cmd, const char *model_path, int n_layers, const char *predictor_path,
                     const char *encoder_spec, const char *question, const polar_decode_opts *opts,
                     polar_candidate *out, int k, int *n_out, polar_planner_timing *tm, const char **device) {
    *n_out = 0;
    polar_planner *p;
    int rc = auto_open(cmd, model_path, n_layers, predictor_path, encoder_spec, &p);
    if (!rc) rc = auto_predict(cmd, p, question, opts, out, k, n_out, tm);
    if (!rc && device) *device = polar_planner_device(p);
    polar_planner_free(p);
    return rc;
}

int decode_mode(const char *cmd, const char *text, polar_decode_opts *o) {
    if (!text || !strcmp(text, "beam")) o->catalogue = 0;
    else if (!strcmp(text, "catalogue")) o->catalogue = 1;
    else return fail_usage(cmd, "--decode must be beam or catalogue, got '%s'", text);
    return 0;
}
