/* polar run: generate greedily from token ids with a program of layers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

static int print_token(int token, void *user) {
    (void)user;
    printf(" %d", token);
    fflush(stdout);
    return 0;
}

static void print_json(const polar_program *p, const polar_arch *a, int n_prompt, const int *out,
                       const polar_gen_stats *st) {
    char text[4096];
    polar_program_format(p, text, sizeof text);
    printf("{\"program\":[");
    for (int i = 0; i < p->n; i++) printf("%s%d", i ? "," : "", p->layers[i]);
    printf("],\"program_text\":\"%s\",\"executed_layers\":%d,\"n_layers\":%d,\"prompt_tokens\":%d,\"tokens\":[",
           text, p->n, a->n_layers, n_prompt);
    for (int i = 0; i < st->n_generated; i++) printf("%s%d", i ? "," : "", out[i]);
    int steps = st->n_generated > 1 ? st->n_generated - 1 : 0;
    printf("],\"stopped_at_eos\":%s,\"prefill_ms\":%.4f,\"decode_ms_per_token\":%.4f}\n",
           st->stopped_at_eos ? "true" : "false", st->prefill_ms, steps ? st->decode_ms / steps : 0.0);
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "run", *model_dir = NULL, *tokens = NULL, *prompt = NULL, *program_text = "base";
    int max_new = 16, ctx = 0, threads = 0, json = 0, ignore_eos = 0;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_dir, 0},   {"--tokens", OPT_STR, &tokens, 0},
        {"--prompt", OPT_STR, &prompt, 0},     {"--program", OPT_STR, &program_text, 0},
        {"--max-new", OPT_INT, &max_new, 0},   {"--ctx", OPT_INT, &ctx, 0},
        {"--threads", OPT_INT, &threads, 0},   {"--json", OPT_FLAG, &json, 0},
        {"--ignore-eos", OPT_FLAG, &ignore_eos, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (!model_dir) return fail_usage(cmd, "--model PATH is required");
    if (!!tokens + !!prompt != 1) return fail_usage(cmd, "give exactly one of --tokens or --prompt");
    if (prompt) {
        fprintf(stderr, "polar run: error: --prompt needs a tokenizer, which this build does not have yet; "
                        "pass token ids with --tokens 1,2,3\n");
        return 1;
    }
    int *ids = NULL, n_ids = 0;
    if (!parse_token_list(cmd, tokens, &ids, &n_ids)) return EXIT_USAGE;

    polar_error err;
    polar_model *m = NULL;
    polar_session *s = NULL;
    polar_program prog = {0};
    int *out = NULL, rc = 1;
    if (polar_model_load(model_dir, &m, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    polar_model_info info;
    polar_model_info_get(m, &info);
    if (polar_program_parse(program_text, info.arch.n_layers, 0, &prog, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    if (ctx == 0) ctx = n_ids + (max_new > 0 ? max_new : 1);
    polar_session_opts so = {.max_ctx = ctx, .n_threads = threads};
    out = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *out);
    if (!out || polar_session_create(m, &prog, &so, &s, &err) != POLAR_OK) {
        if (!out) snprintf(err.msg, sizeof err.msg, "out of memory");
        rc = fail_status(cmd, &err);
        goto done;
    }
    char text[4096];
    polar_program_format(&prog, text, sizeof text);
    if (!json) {
        printf("program: %s\nexecuted layers: %d of %d\nprompt tokens: %d\ngenerated:", text, prog.n,
               info.arch.n_layers, n_ids);
        fflush(stdout);
    }
    polar_gen_opts go = {.max_new = max_new, .ignore_eos = ignore_eos};
    polar_gen_stats st;
    if (polar_generate(s, ids, n_ids, &go, out, &st, json ? NULL : print_token, NULL, &err) != POLAR_OK) {
        if (!json) printf("\n");
        rc = fail_status(cmd, &err);
        goto done;
    }
    if (json) {
        print_json(&prog, &info.arch, n_ids, out, &st);
    } else {
        int steps = st.n_generated > 1 ? st.n_generated - 1 : 0;
        printf("%s\nprefill: %.2f ms (%d tokens)\ndecode: %.2f ms/token (%d steps)\n",
               st.stopped_at_eos ? " [eos]" : "", st.prefill_ms, n_ids, steps ? st.decode_ms / steps : 0.0, steps);
    }
    rc = 0;
done:
    polar_session_free(s);
    polar_program_free(&prog);
    polar_model_free(m);
    free(ids);
    free(out);
    return rc;
}
