/* polar perplexity: a text's perplexity as llama-perplexity computes it,
 * and the KL divergence from a reference run's log-probabilities
 * (polar_perplexity). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"

static void show_progress(int chunk, int n_chunks, double ppl, void *user) {
    (void)user;
    fprintf(stderr, "\rpolar perplexity: chunk %d/%d, PPL %.4f", chunk, n_chunks, ppl);
    if (chunk == n_chunks) fputc('\n', stderr);
}

static void print_text(const polar_ppl_result *r) {
    if (r->compared) {
        printf("Mean PPL                      : %10.6f +/- %10.6f\n", r->ppl, r->ppl_err);
        printf("Mean PPL(reference)           : %10.6f +/- %10.6f\n", r->ref_ppl, r->ref_ppl_err);
        printf("Cor(ln PPL, ln PPL(reference)): %6.2f%%\n", 100 * r->cor);
        printf("Mean ln(PPL/PPL(reference))   : %10.6f +/- %10.6f\n", r->ln_ratio, r->ln_ratio_err);
        printf("KLD mean   %10.6f +/- %10.6f\n", r->kld, r->kld_err);
        printf("KLD max    %10.6f\n    99.9%%  %10.6f\n    99%%    %10.6f\n    95%%    %10.6f\n    90%%    %10.6f\n",
               r->kld_max, r->kld_p999, r->kld_p99, r->kld_p95, r->kld_p90);
        printf("    median %10.6f\n    10%%    %10.6f\n    5%%     %10.6f\n    1%%     %10.6f\n    min    %10.6f\n",
               r->kld_median, r->kld_p10, r->kld_p5, r->kld_p1, r->kld_min);
        printf("RMS dp     %6.3f +/- %5.3f %%\n", 100 * r->dp_rms, 100 * r->dp_rms_err);
        printf("Same top p %6.3f +/- %5.3f %%\n", 100 * r->same_top, 100 * r->same_top_err);
    }
    printf("PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_err);
}

static void print_json(const polar_ppl_result *r, const char *program, int executed, const char *device) {
    printf("{\"ppl\":%.6f,\"ppl_err\":%.6f,\"tokens\":%ld,\"chunks\":%d,\"ctx\":%d,\"program\":\"%s\","
           "\"executed_layers\":%d,\"device\":\"%s\",\"cpu_kernels\":\"%s\"",
           r->ppl, r->ppl_err, r->tokens, r->chunks, r->ctx, program, executed, device, polar_cpu_kernels());
    if (r->compared)
        printf(",\"reference\":{\"ppl\":%.6f,\"ppl_err\":%.6f,\"cor\":%.6f,\"ln_ratio\":%.6f,\"ln_ratio_err\":%.6f,"
               "\"kld\":%.8f,\"kld_err\":%.8f,\"kld_max\":%.8f,\"kld_p999\":%.8f,\"kld_p99\":%.8f,\"kld_p95\":%.8f,"
               "\"kld_p90\":%.8f,\"kld_median\":%.8f,\"kld_p10\":%.8f,\"kld_p5\":%.8f,\"kld_p1\":%.8f,"
               "\"kld_min\":%.8f,\"same_top\":%.6f,\"same_top_err\":%.6f,\"dp_rms\":%.6f,\"dp_rms_err\":%.6f}",
               r->ref_ppl, r->ref_ppl_err, r->cor, r->ln_ratio, r->ln_ratio_err, r->kld, r->kld_err, r->kld_max,
               r->kld_p999, r->kld_p99, r->kld_p95, r->kld_p90, r->kld_median, r->kld_p10, r->kld_p5, r->kld_p1,
               r->kld_min, r->same_top, r->same_top_err, r->dp_rms, r->dp_rms_err);
    printf("}\n");
}

int cmd_perplexity(int argc, char **argv) {
    const char *cmd = "perplexity", *model_arg = NULL, *file = NULL, *program_text = "base", *device_text = NULL;
    const char *kv_text = NULL, *save = NULL, *reference = NULL, *format = NULL;
    int ctx = 512, chunks = 0, threads = 0, top_k = 0, json = 0, quiet = 0;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_arg, 0},
        {"-f", OPT_STR, &file, 0},
        {"--ctx", OPT_INT, &ctx, 0},
        {"--chunks", OPT_INT, &chunks, 0},
        {"--program", OPT_STR, &program_text, 0},
        {"--threads", OPT_INT, &threads, 0},
        {"--device", OPT_STR, &device_text, 0},
        {"--kv", OPT_STR, &kv_text, 0},
        {"--kl-divergence-base", OPT_STR, &save, 0},
        {"--kl-top-k", OPT_INT, &top_k, 0},
        {"--kl-format", OPT_STR, &format, 0},
        {"--kl-divergence", OPT_STR, &reference, 0},
        {"--json", OPT_FLAG, &json, 0},
        {"--quiet", OPT_FLAG, &quiet, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    polar_ppl_opts o = {.ctx = ctx, .max_chunks = chunks, .n_threads = threads, .save = save, .save_top_k = top_k,
                        .reference = reference, .bos = -1};
    if (!parse_device(cmd, device_text, &o.device) || !parse_kv(cmd, kv_text, &o.kv_bf16)) return EXIT_USAGE;
    if (!file && !reference) return fail_usage(cmd, "-f TEXT is required (or --kl-divergence FILE, whose tokens are scored)");
    if (save && reference) return fail_usage(cmd, "--kl-divergence-base saves a reference, --kl-divergence compares: one of them");
    if (top_k && !save) return fail_usage(cmd, "--kl-top-k goes with --kl-divergence-base");
    if (format && !save) return fail_usage(cmd, "--kl-format goes with --kl-divergence-base (a reference's is read from it)");
    if (format && strcmp(format, "polar") && strcmp(format, "llama"))
        return fail_usage(cmd, "--kl-format must be polar or llama, got '%s'", format);
    o.save_llama = format && !strcmp(format, "llama");
    if (o.save_llama && top_k) return fail_usage(cmd, "--kl-format llama keeps the whole vocabulary: no --kl-top-k");
    if (ctx < 4) return fail_usage(cmd, "--ctx must be 4 at least");
    char *model_file = find_model(cmd, model_arg);
    const char *model_path = model_file;
    if (!model_path) return 1;
    polar_error err;
    polar_model *m = NULL;
    polar_tokenizer *tok = NULL;
    polar_program p = {0};
    char *text = NULL;
    int *ids = NULL, n_ids = 0, rc = 1;
    if (polar_model_load(model_path, &m, &err) != POLAR_OK || polar_tokenizer_load(model_path, &tok, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    polar_model_info info;
    polar_model_info_get(m, &info);
    if (polar_program_parse(program_text, info.arch.n_layers, 0, &p, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    size_t len = 0;
    if (file && !(text = read_text_file(cmd, file, &len))) goto done;
    /* tokenized once, as llama-perplexity does: with the vocabulary's own specials (its BOS) */
    if (text && polar_tokenize(tok, text, len, 0, 1, &ids, &n_ids, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    o.bos = polar_tokenizer_bos(tok);
    if (!quiet && isatty(2)) o.progress = show_progress;
    polar_ppl_result r;
    if (polar_perplexity(m, &p, ids, n_ids, &o, &r, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    char spec[1024];
    polar_program_format(&p, spec, sizeof spec);
    const char *device = o.device == POLAR_DEVICE_CUDA || (o.device == POLAR_DEVICE_AUTO && polar_cuda_available(NULL, 0))
                             ? "cuda"
                             : "cpu";
    if (json) {
        print_json(&r, spec, p.n, device);
    } else {
        printf("perplexity: %d chunks of %d tokens, %ld scored; program %s (%d of %d layers); %s%s%s\n", r.chunks,
               r.ctx, r.tokens, spec, p.n, info.arch.n_layers, device, strcmp(device, "cpu") ? "" : ", ",
               strcmp(device, "cpu") ? "" : polar_cpu_kernels());
        print_text(&r);
    }
    rc = 0;
done:
    polar_free(ids);
    free(text);
    polar_program_free(&p);
    polar_tokenizer_free(tok);
    polar_model_free(m);
    polar_free(model_file);
    return rc;
}
