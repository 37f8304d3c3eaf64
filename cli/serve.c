/* polar serve: the options, the model, tokenizer and predictor opened, then
 * the server (serve/serve.h) until SIGTERM or SIGINT. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../serve/serve.h"
#include "auto.h"

/* The id /v1/models lists: the model file's or folder's name, without a
 * .gguf ending; *owned is what to free. */
static const char *model_id(const char *path, char **owned) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/') start--;
    size_t len = n - start;
    if (len > 5 && !strncmp(path + start + len - 5, ".gguf", 5)) len -= 5;
    *owned = strndup(path + start, len);
    return *owned;
}

int cmd_serve(int argc, char **argv) {
    const char *cmd = "serve", *model_arg = NULL, *device_text = NULL, *kv_text = NULL, *predictor = NULL;
    const char *encoder = NULL, *name = NULL;
    serve_opts o = {.host = "127.0.0.1", .port = 8080, .timeout_s = 30, .deadline_s = 600, .queue = 256,
                    .max_connections = 512, .default_max_tokens = 16};
    int max_batch = 16, ctx = 0, threads = 0, kv_mb = 0, cache_mb = 64, max_body_kb = 1024, kv_bf16 = 0;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_arg, 0},      {"--host", OPT_STR, &o.host, 0},
        {"--port", OPT_INT, &o.port, 0},          {"--device", OPT_STR, &device_text, 0},
        {"--max-batch", OPT_INT, &max_batch, 0},  {"--ctx", OPT_INT, &ctx, 0},
        {"--predictor", OPT_STR, &predictor, 0},  {"--encoder", OPT_STR, &encoder, 0},
        {"--api-key", OPT_STR, &o.api_key, 0},    {"--threads", OPT_INT, &threads, 0},
        {"--kv", OPT_STR, &kv_text, 0},           {"--kv-mb", OPT_INT, &kv_mb, 0},
        {"--cache-mb", OPT_INT, &cache_mb, 0},    {"--queue", OPT_INT, &o.queue, 0},
        {"--timeout", OPT_INT, &o.timeout_s, 0},  {"--deadline", OPT_INT, &o.deadline_s, 0},
        {"--max-body-kb", OPT_INT, &max_body_kb, 0}, {"--name", OPT_STR, &name, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (o.port > 65535) return fail_usage(cmd, "--port must be 0 to 65535 (0: any free port)");
    if (max_batch < 1 || max_batch > 1024) return fail_usage(cmd, "--max-batch must be 1 to 1024");
    if (o.queue < 1 || o.timeout_s < 1 || o.deadline_s < 1 || max_body_kb < 1 || max_body_kb > 1 << 20)
        return fail_usage(cmd, "--queue, --timeout, --deadline and --max-body-kb (at most 1048576) must be at least 1");
    if (o.api_key && !*o.api_key) return fail_usage(cmd, "--api-key must not be empty");
    if (encoder && !predictor) return fail_usage(cmd, "--encoder goes with --predictor");
    polar_device device;
    if (!parse_device(cmd, device_text, &device) || !parse_kv(cmd, kv_text, &kv_bf16)) return EXIT_USAGE;
    o.max_body = (size_t)max_body_kb << 10;
    /* before any thread exists (OpenMP's while loading), so that every thread
     * leaves SIGTERM and SIGINT to serve_run */
    serve_block_signals();

    char *model_file = find_model(cmd, model_arg), *id = NULL;
    const char *path = model_file;
    if (!path) return 1;
    o.model_name = name ? name : model_id(path, &id);
    serve_server s = {.o = o};
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    polar_error err;
    int rc = 1;
    if (!o.model_name) {
        fprintf(stderr, "polar serve: error: out of memory\n");
        goto done;
    }
    if (polar_model_load(path, &m, &err) != POLAR_OK || polar_tokenizer_load(path, &tok, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    polar_model_info info;
    polar_model_info_get(m, &info);
    s.model = m, s.tok = tok, s.arch = info.arch;
    if (predictor && (rc = auto_open(cmd, path, info.arch.n_layers, predictor, encoder, &s.planner))) goto done;
    rc = 1;
    s.batch = (polar_batch_opts){.max_seqs = max_batch, .max_ctx = ctx, .max_program_len = 2 * info.arch.n_layers,
                                 .n_threads = threads, .device = device, .kv_bf16 = kv_bf16,
                                 .prefix_cache_bytes = (size_t)cache_mb << 20};
    if (!s.batch.max_ctx) s.batch.max_ctx = info.arch.max_pos > 0 && info.arch.max_pos < 2048 ? info.arch.max_pos : 2048;
    /* by default, room for every sequence of the batch under the base program at the full context */
    s.batch.kv_bytes = kv_mb ? (size_t)kv_mb << 20
                             : polar_batch_kv_bytes(m, &s.batch, max_batch, info.arch.n_layers, s.batch.max_ctx);
    pthread_mutex_init(&s.planner_mu, NULL);
    s.started = (long)time(NULL);
    rc = serve_run(&s);
    pthread_mutex_destroy(&s.planner_mu);
done:
    polar_planner_free(s.planner);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_free(model_file);
    free(id);
    return rc;
}
