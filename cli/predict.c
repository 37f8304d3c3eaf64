/* polar predict: the ranked programs the PoLar predictor picks for a question. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auto.h"

int cmd_predict(int argc, char **argv) {
    const char *cmd = "predict", *model_arg = NULL, *predictor = NULL, *encoder = NULL, *question = NULL,
               *decode = NULL;
    int k = 5, json = 0, min_layers = 0, max_layers = 0;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_arg, 0},     {"--predictor", OPT_STR, &predictor, 0},
        {"--encoder", OPT_STR, &encoder, 0},     {"--question", OPT_STR, &question, 0},
        {"-k", OPT_INT, &k, 0},                  {"--json", OPT_FLAG, &json, 0},
        {"--min-layers", OPT_INT, &min_layers, 0}, {"--max-layers", OPT_INT, &max_layers, 0},
        {"--decode", OPT_STR, &decode, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (!question) return fail_usage(cmd, "--question TEXT is required");
    if (k < 1 || k > 64) return fail_usage(cmd, "-k must be 1 to 64");
    char *model_file;
    const char *model_path;
    polar_arch arch;
    int st_model = model_arch_of(cmd, model_arg, &model_path, &model_file, &arch);
    if (st_model) return st_model;
    polar_decode_opts o = polar_decode_defaults();
    o.min_layers = min_layers;
    o.max_layers = max_layers;
    if (decode_mode(cmd, decode, &o)) {
        polar_free(model_file);
        return EXIT_USAGE;
    }
    polar_candidate cand[64];
    int n = 0;
    polar_planner_timing tm;
    int rc = predict_programs(cmd, model_path, arch.n_layers, predictor, encoder, question, &o, cand, k, &n, &tm, NULL);
    for (int i = 0; rc == 0 && i < n; i++) {
        char text[1024];
        polar_program_format(&cand[i].program, text, sizeof text);
        if (json) {
            printf("%s{\"program\":[", i ? "," : "{\"programs\":[");
            for (int j = 0; j < cand[i].program.n; j++) printf("%s%d", j ? "," : "", cand[i].program.layers[j]);
            printf("],\"program_text\":\"%s\",\"executed_layers\":%d,\"score\":%.6f}", text, cand[i].program.n,
                   cand[i].score);
        } else {
            if (i == 0) printf("question tokens: %d\n%4s %10s %7s  %s\n", tm.question_tokens, "rank", "score", "layers",
                               "program");
            printf("%4d %10.4f %7d  %s\n", i + 1, cand[i].score, cand[i].program.n, text);
        }
    }
    if (rc == 0 && json)
        printf("],\"n_layers\":%d,\"question_tokens\":%d,\"encoder_ms\":%.4f,\"predictor_ms\":%.4f,\"beam_ms\":%.4f}\n",
               arch.n_layers, tm.question_tokens, tm.encoder_ms, tm.predictor_ms, tm.beam_ms);
    else if (rc == 0)
        printf("encoder %.2f ms, predictor %.2f ms, beam %.3f ms\n", tm.encoder_ms, tm.predictor_ms, tm.beam_ms);
    for (int i = 0; i < n; i++) polar_program_free(&cand[i].program);
    polar_free(model_file);
    return rc;
}
