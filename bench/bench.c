/* polar bench: prefill and decode speed of a program next to the base
 * program, and the achieved weight bandwidth next to the memory's read and
 * copy bandwidths measured in the same run (before and after the timed
 * runs, the best of both). Times are the best of --reps runs; programs are
 * interleaved within each rep so drift hits them alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/auto.h"
#include "bench_batch.h"

#define MIN_OF(a, b) ((b) < (a) ? (b) : (a))

typedef struct {
    polar_program prog;
    char text[512];
    double prefill_ms, decode_ms; /* best of reps: whole prefill, per decode step */
    double bytes;                 /* read per decode step at the mean context */
    int kernels, copies;          /* its decode step's CUDA graph: kernel and memcpy/memset nodes (-1: none) */
} bench_run;

/* One prefill of the prompt and gen decode steps, greedy (on a GPU the
 * chosen ids stay on the device between steps), through polar_generate. */
static polar_status time_run(polar_session *s, bench_run *r, const int *prompt, int n_prompt, int gen, int *out,
                             polar_error *err) {
    polar_status st = polar_session_set_program(s, &r->prog, err);
    if (st != POLAR_OK) return st;
    polar_gen_opts o = {.max_new = gen + 1, .ignore_eos = 1};
    polar_gen_stats stats;
    if ((st = polar_generate(s, prompt, n_prompt, &o, out, &stats, NULL, NULL, err)) != POLAR_OK) return st;
    if (stats.prefill_ms < r->prefill_ms) r->prefill_ms = stats.prefill_ms;
    if (gen && stats.decode_ms / gen < r->decode_ms) r->decode_ms = stats.decode_ms / gen;
    r->kernels = polar_session_graph_kernels(s, &r->copies); /* the last decode step's */
    return POLAR_OK;
}

/* Kernels a decode step launches (a GPU's, from its graph): the fixed
 * part (embed, head) from programs "0" and "0x2" (fixed = K(0) - (K(0x2) -
 * K(0))), per layer the mean over the base program's layers ((K(base) -
 * fixed) / D): exact per layer when every layer is of one kind. */
typedef struct {
    double per_layer;
    int fixed, ok;
} launch_count;

/* The kernels of the last decode step of program spec (-1: no graph): a
 * prompt, then 3 decode steps: the host feeds the first, the device the
 * next (run ahead), whose calls the third repeats: captured. */
static int program_kernels(polar_session *s, const char *spec, int D, const int *prompt, int n_prompt,
                           polar_status *st, polar_error *err) {
    polar_program p;
    int out[4], copies;
    polar_gen_opts o = {.max_new = 4, .ignore_eos = 1};
    if ((*st = polar_program_parse(spec, D, 0, &p, err)) != POLAR_OK) return -1;
    *st = polar_session_set_program(s, &p, err);
    polar_program_free(&p);
    if (*st == POLAR_OK) *st = polar_generate(s, prompt, n_prompt < 8 ? n_prompt : 8, &o, out, NULL, NULL, NULL, err);
    return *st == POLAR_OK ? polar_session_graph_kernels(s, &copies) : -1;
}

static polar_status count_launches(polar_session *s, const bench_run *base, int D, const int *prompt, int n_prompt,
                                   launch_count *lc, polar_error *err) {
    polar_status st = POLAR_OK;
    memset(lc, 0, sizeof *lc);
    if (base->kernels < 0) return st; /* the CPU, or no decode step as a graph (--gen 1-2, POLAR_CUDA_GRAPHS=0) */
    int one = program_kernels(s, "0", D, prompt, n_prompt, &st, err);
    int two = one < 0 ? -1 : program_kernels(s, "0x2", D, prompt, n_prompt, &st, err);
    if (two >= 0) {
        lc->fixed = one - (two - one);
        lc->per_layer = (double)(base->kernels - lc->fixed) / D;
        lc->ok = 1;
    }
    return st;
}

/* A JSON number, or null for a count of -1. */
static void json_count(const char *key, int v) {
    if (v >= 0) printf(",\"%s\":%d", key, v);
    else printf(",\"%s\":null", key);
}

/* The device's memory, GB/s: a read (what a decode step does) and a copy
 * (read + written). */
typedef struct {
    double read, copy;
} bandwidth;

/* Measure both, keeping the better of each against *bw's (buffers past
 * the caches: 256 MiB on the CPU, 1 GiB on a GPU). */
static polar_status measure_bandwidth(polar_device device, int threads, bandwidth *bw, polar_error *err) {
    size_t bytes = (size_t)(device == POLAR_DEVICE_CUDA ? 1024 : 256) << 20;
    bandwidth now;
    polar_status st = polar_read_bandwidth(device, bytes, threads, &now.read, err);
    if (st == POLAR_OK) st = polar_copy_bandwidth(device, bytes, threads, &now.copy, err);
    if (st != POLAR_OK) return st;
    bw->read = now.read > bw->read ? now.read : bw->read;
    bw->copy = now.copy > bw->copy ? now.copy : bw->copy;
    return POLAR_OK;
}

/* What a run was of, beside its timings. */
typedef struct {
    const char *name, *device, *kv;
    const char *launches;   /* polar_session_cuda_launches (NULL on the CPU) */
    int tp;                 /* GPUs in all under tensor parallel (0: none) */
    int threads, D, n_prompt, gen;
    size_t stored_bytes;    /* the model's weights as it holds them (polar_model_info) */
    int has_memory;         /* on a GPU: */
    polar_device_memory memory;
} bench_setup;

/* The device memory the session holds, in MB, and its weights against the
 * model's own: near 1 when a GGUF's blocks stay blocks (under tensor
 * parallel the first GPU's share against the whole model). */
static void report_memory(const bench_setup *u, int json) {
    const polar_device_memory *m = &u->memory;
    if (json && !u->has_memory) {
        printf(",\"device_weight_bytes\":null,\"device_kv_bytes\":null,\"device_workspace_bytes\":null,"
               "\"stored_weight_bytes\":%zu,\"device_weights_vs_stored\":null", u->stored_bytes);
    } else if (json) {
        printf(",\"device_weight_bytes\":%zu,\"device_kv_bytes\":%zu,\"device_workspace_bytes\":%zu,"
               "\"stored_weight_bytes\":%zu,\"device_weights_vs_stored\":%.4f",
               m->weights, m->kv, m->workspaces, u->stored_bytes, (double)m->weights / (double)u->stored_bytes);
    } else if (u->has_memory) {
        printf("held on the GPU%s: weights %.1f MB (%.3f x the model's %.1f MB), KV %.1f MB, workspaces %.1f MB\n",
               u->tp ? " (the first's)" : "", m->weights * 1e-6, (double)m->weights / (double)u->stored_bytes,
               u->stored_bytes * 1e-6, m->kv * 1e-6, m->workspaces * 1e-6);
    }
}

static void report(const bench_run *runs, int n_runs, const bench_setup *u, bandwidth bw, const launch_count *lc,
                   int json) {
    const bench_run *base = &runs[0];
    int D = u->D, n_prompt = u->n_prompt;
    if (json) {
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"tp\":%d,\"kv\":\"%s\",\"cpu_kernels\":\"%s\",\"threads\":%d,"
               "\"cuda_launches\":%s%s%s,\"prompt_len\":%d,\"gen\":%d,\"n_layers\":%d,\"read_gbps\":%.3f,"
               "\"copy_gbps\":%.3f",
               u->name, u->device, u->tp, u->kv, polar_cpu_kernels(), u->threads, u->launches ? "\"" : "",
               u->launches ? u->launches : "null", u->launches ? "\"" : "", n_prompt, u->gen, D, bw.read, bw.copy);
        report_memory(u, 1);
        json_count("launches_per_step", base->kernels);
        json_count("copies_per_step", base->copies);
        if (lc->ok)
            printf(",\"launches_per_layer\":%.4g,\"launches_fixed\":%d,\"launches_counted\":\"kernel nodes of a batch-1 "
                   "decode step's CUDA graph; fixed: 2 K(0) - K(0x2); per layer: (base - fixed) / %d layers\"",
                   lc->per_layer, lc->fixed, D);
        else
            printf(",\"launches_per_layer\":null,\"launches_fixed\":null,\"launches_counted\":null");
        printf(",\"runs\":[");
        for (int i = 0; i < n_runs; i++) {
            const bench_run *r = &runs[i];
            double gbps = r->bytes / (r->decode_ms * 1e6);
            printf("%s{\"program\":\"%s\",\"executed_layers\":%d,\"prefill_ms\":%.4f,\"prefill_tok_s\":%.2f,"
                   "\"decode_ms_per_token\":%.4f,\"decode_tok_s\":%.3f,\"bytes_per_step\":%.0f,\"gbps\":%.3f,"
                   "\"fraction_of_copy\":%.4f,\"fraction_of_read\":%.4f,\"decode_time_vs_base\":%.4f,\"bytes_vs_base\":%.4f",
                   i ? "," : "", r->text, r->prog.n, r->prefill_ms, n_prompt / (r->prefill_ms * 1e-3), r->decode_ms,
                   1e3 / r->decode_ms, r->bytes, gbps, gbps / bw.copy, gbps / bw.read, r->decode_ms / base->decode_ms,
                   r->bytes / base->bytes);
            json_count("launches_per_step", r->kernels);
            printf("}");
        }
        printf("]}\n");
        return;
    }
    printf("model %s, %d layers, %s (%d CPU threads, %s kernels), KV %s, prompt %d tokens, %d decode steps (best of "
           "reps)\n", u->name, D, u->device, u->threads, polar_cpu_kernels(), u->kv, n_prompt, u->gen);
    printf("%s: read %.2f GB/s, copy %.2f GB/s (bytes read + written)\n",
           strcmp(u->device, "cuda") ? "memory" : "device memory", bw.read, bw.copy);
    report_memory(u, 0);
    if (u->launches) printf("kernel launches: %s\n", u->launches);
    if (lc->ok)
        printf("kernels per decode step: %d = %d (embed, head) + %d layers x %.4g, %d memcpy/memset nodes\n",
               base->kernels, lc->fixed, D, lc->per_layer, base->copies);
    if (u->tp) printf("tensor parallel: %d GPUs (bandwidth and bytes above are one GPU's)\n", u->tp);
    printf("\n");
    printf("%-28s %6s %11s %10s %11s %9s %8s %7s %8s\n", "program", "layers", "prefill ms", "prefill/s",
           "decode ms", "decode/s", "GB/s", "read%", "vs base");
    for (int i = 0; i < n_runs; i++) {
        const bench_run *r = &runs[i];
        double gbps = r->bytes / (r->decode_ms * 1e6);
        printf("%-28.28s %6d %11.2f %10.1f %11.3f %9.2f %8.2f %6.1f%% %8.3f\n", r->text, r->prog.n, r->prefill_ms,
               n_prompt / (r->prefill_ms * 1e-3), r->decode_ms, 1e3 / r->decode_ms, gbps, 100 * gbps / bw.read,
               r->decode_ms / base->decode_ms);
    }
    for (int i = 1; i < n_runs; i++)
        printf("\n%s: decode time %.3f x base; bytes read %.3f x base; executed layers %.3f x base\n", runs[i].text,
               runs[i].decode_ms / base->decode_ms, runs[i].bytes / base->bytes, (double)runs[i].prog.n / D);
}

#define WARM_CALLS 50

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Encoder, predictor network and beam decoding as a server holding them
 * loaded runs them (polar eval --program auto does): opened once, a first
 * question, then WARM_CALLS timed ones. min[3] and median[3]: encoder,
 * network, beam, in ms; *device: where the network ran. */
static int time_warm(const char *cmd, const char *model_dir, int D, const char *predictor, const char *encoder,
                     const char *question, double *min, double *median, const char **device) {
    polar_planner *a;
    int rc = auto_open(cmd, model_dir, D, predictor, encoder, &a);
    if (rc) return rc;
    polar_decode_opts o = polar_decode_defaults();
    double ms[3][WARM_CALLS];
    for (int c = -1; !rc && c < WARM_CALLS; c++) {
        polar_candidate cand[8];
        int n;
        polar_planner_timing tm;
        rc = auto_predict(cmd, a, question, &o, cand, 5, &n, &tm);
        for (int i = 0; i < n; i++) polar_program_free(&cand[i].program);
        if (!rc && c >= 0) ms[0][c] = tm.encoder_ms, ms[1][c] = tm.predictor_ms, ms[2][c] = tm.beam_ms;
        if (!rc) *device = polar_planner_device(a);
    }
    for (int k = 0; !rc && k < 3; k++) {
        qsort(ms[k], WARM_CALLS, sizeof ms[k][0], cmp_double);
        min[k] = ms[k][0], median[k] = ms[k][WARM_CALLS / 2];
    }
    polar_planner_free(a);
    return rc;
}

/* The predictor's overhead next to the model's own cost, as the paper's
 * table has it: encoder, predictor network and beam decoding, in ms and in
 * equivalent decoder layers (a layer's share of a prompt-length forward,
 * from the base program against a one-layer program). */
static int bench_predictor(const char *cmd, polar_model *m, const char *model_dir, polar_session *s,
                           const char *predictor, const char *encoder, const int *prompt, int n_prompt, int question_len, int reps, int json) {
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers;
    polar_error err;
    polar_program base, one;
    double base_ms = 1e300, one_ms = 1e300;
    if (polar_program_base(D, &base, &err) != POLAR_OK || polar_program_parse("0", D, 0, &one, &err) != POLAR_OK)
        return fail_status(cmd, &err);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            if (polar_session_set_program(s, k ? &one : &base, &err) != POLAR_OK) return fail_status(cmd, &err);
            double t0 = polar_time_ms();
            if (polar_prefill(s, prompt, n_prompt, NULL, &err) != POLAR_OK) return fail_status(cmd, &err);
            double ms = polar_time_ms() - t0;
            if (k) one_ms = MIN_OF(one_ms, ms);
            else base_ms = MIN_OF(base_ms, ms);
        }
    polar_program_free(&base);
    polar_program_free(&one);
    double layer_ms = D > 1 ? (base_ms - one_ms) / (D - 1) : base_ms;
    /* A question of about question_len tokens (" the" is one token in these
     * vocabularies). */
    char *question = malloc((size_t)question_len * 4 + 1);
    if (!question) return fail_usage(cmd, "out of memory");
    for (int i = 0; i < question_len; i++) memcpy(question + 4 * i, " the", 4);
    question[(size_t)question_len * 4] = 0;
    polar_decode_opts o = polar_decode_defaults();
    double enc_ms = 1e300, pred_ms = 1e300, beam_ms = 1e300;
    for (int r = 0; r < reps; r++) {
        polar_candidate cand[8];
        int n;
        polar_planner_timing tm;
        int rc = predict_programs(cmd, model_dir, D, predictor, encoder, question, &o, cand, 5, &n, &tm, NULL);
        if (rc) {
            free(question);
            return rc;
        }
        for (int i = 0; i < n; i++) polar_program_free(&cand[i].program);
        enc_ms = MIN_OF(enc_ms, tm.encoder_ms);
        pred_ms = MIN_OF(pred_ms, tm.predictor_ms);
        beam_ms = MIN_OF(beam_ms, tm.beam_ms);
        question_len = tm.question_tokens;
    }
    double wmin[3] = {0, 0, 0}, wmed[3] = {0, 0, 0};
    const char *wdev = "cpu";
    int rc = time_warm(cmd, model_dir, D, predictor, encoder, question, wmin, wmed, &wdev);
    free(question);
    if (rc) return rc;
    double total = enc_ms + pred_ms + beam_ms, wtotal = wmin[0] + wmin[1] + wmin[2];
    if (json) {
        printf("{\"predictor\":{\"layer_ms\":%.4f,\"base_forward_ms\":%.4f,\"prompt_len\":%d,\"question_tokens\":%d,"
               "\"encoder_ms\":%.4f,\"predictor_ms\":%.4f,\"beam_ms\":%.4f,\"total_ms\":%.4f,\"total_layers\":%.3f,"
               "\"warm\":{\"calls\":%d,\"predictor_device\":\"%s\",\"encoder_ms\":%.4f,\"encoder_median_ms\":%.4f,"
               "\"predictor_ms\":%.4f,\"predictor_median_ms\":%.4f,\"beam_ms\":%.4f,\"total_ms\":%.4f,"
               "\"total_layers\":%.3f}}}\n",
               layer_ms, base_ms, n_prompt, question_len, enc_ms, pred_ms, beam_ms, total, total / layer_ms,
               WARM_CALLS, wdev, wmin[0], wmed[0], wmin[1], wmed[1], wmin[2], wtotal, wtotal / layer_ms);
        return 0;
    }
    printf("\npredictor overhead (a %d-token question encoded by %s; %d-token forward for the layer cost)\n",
           question_len, encoder, n_prompt);
    printf("  %-24s %10.1f us\n", "one decoder layer", layer_ms * 1e3);
    printf("  %-24s %10.1f us  (%d layers)\n", "base forward", base_ms * 1e3, D);
    char once[64];
    snprintf(once, sizeof once, "loaded once, %d questions", WARM_CALLS);
    printf("  %-24s %29s %29s   (the network on the %s)\n", "", "loaded for each run", once, wdev);
    const char *names[] = {"encoder", "predictor network", "beam decoding", "total"};
    double vals[] = {enc_ms, pred_ms, beam_ms, total}, warm[] = {wmin[0], wmin[1], wmin[2], wtotal};
    for (int i = 0; i < 4; i++)
        printf("  %-24s %10.1f us = %6.2f layers %10.1f us = %6.2f layers\n", names[i], vals[i] * 1e3,
               vals[i] / layer_ms, warm[i] * 1e3, warm[i] / layer_ms);
    return 0;
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench", *model_dir = NULL, *preset = NULL, *arch = NULL, *program_text = NULL;
    const char *predictor = NULL, *encoder = NULL, *device_text = NULL, *batch = NULL, *programs_file = NULL;
    const char *kv_text = NULL, *prompts_text = NULL;
    cli_tp_args tpa = CLI_TP_ARGS_INIT;
    int kv_bf16 = 0, n_prompt = 128, gen = 32, reps = 3, threads = 0, json = 0, question_len = 128;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_dir, 0},   {"--preset", OPT_STR, &preset, 0},
        {"--arch", OPT_STR, &arch, 0},         {"--program", OPT_STR, &program_text, 0},
        {"--prompt-len", OPT_INT, &n_prompt, 0}, {"--gen", OPT_INT, &gen, 0},
        {"--reps", OPT_INT, &reps, 0},         {"--threads", OPT_INT, &threads, 0},
        {"--json", OPT_FLAG, &json, 0},        {"--predictor", OPT_STR, &predictor, 0},
        {"--encoder", OPT_STR, &encoder, 0},   {"--device", OPT_STR, &device_text, 0},
        {"--question-len", OPT_INT, &question_len, 0},
        {"--batch", OPT_STR, &batch, 0},       {"--programs", OPT_STR, &programs_file, 0},
        {"--kv", OPT_STR, &kv_text, 0},        {"--prompts", OPT_STR, &prompts_text, 0},
        CLI_TP_OPTS(tpa),
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (n_prompt < 1 || gen < 1 || reps < 1) return fail_usage(cmd, "--prompt-len, --gen and --reps must be >= 1");
    polar_device device;
    if (!parse_device(cmd, device_text, &device) || !parse_kv(cmd, kv_text, &kv_bf16)) return EXIT_USAGE;
    if (programs_file && !batch) return fail_usage(cmd, "--programs goes with --batch");
    if (batch && predictor) return fail_usage(cmd, "--batch runs without --predictor");
    if (prompts_text && !batch) return fail_usage(cmd, "--prompts goes with --batch");
    if (prompts_text && strcmp(prompts_text, "distinct") && strcmp(prompts_text, "shared"))
        return fail_usage(cmd, "--prompts wants distinct or shared (got \"%s\")", prompts_text);
    cli_tp par;
    int rc = cli_tp_setup(cmd, &tpa, &par);
    if (rc) return rc;
    char *model_file = NULL; /* --model as a path (a name installed by make models resolved) */
    if (model_dir && !(model_dir = model_file = find_model(cmd, model_dir))) return 1;
    polar_model *m;
    rc = open_model(cmd, model_dir, preset, arch, 1, &m);
    if (rc) {
        polar_free(model_file);
        return rc;
    }
    if (batch) {
        bench_batch_opts bo = {
            .sizes = batch, .programs_file = programs_file, .program = program_text, .n_prompt = n_prompt,
            .gen = gen, .reps = reps, .threads = threads, .kv_bf16 = kv_bf16, .json = json,
            .shared_prompt = prompts_text && !strcmp(prompts_text, "shared"),
            .cuda = device == POLAR_DEVICE_CUDA || (device == POLAR_DEVICE_AUTO && (par.tp || polar_cuda_available(NULL, 0))),
            .tp = &par};
        rc = bench_batch(cmd, m, model_dir ? model_dir : preset ? preset : arch, &bo);
        polar_model_free(m);
        polar_free(model_file);
        return rc;
    }
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers;
    polar_error err;
    bench_run runs[2];
    launch_count lc;
    memset(runs, 0, sizeof runs);
    memset(&lc, 0, sizeof lc);
    int n_runs = 1;
    polar_session *s = NULL;
    int *prompt = NULL, *generated = NULL;
    rc = 1;
    if (polar_program_base(D, &runs[0].prog, &err) != POLAR_OK ||
        (program_text && polar_program_parse(program_text, D, 0, &runs[1].prog, &err) != POLAR_OK)) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    if (program_text) n_runs = 2;
    int cap = 0;
    for (int i = 0; i < n_runs; i++) {
        bench_run *r = &runs[i];
        polar_program_format(&r->prog, r->text, sizeof r->text);
        r->prefill_ms = r->decode_ms = 1e300;
        r->kernels = r->copies = -1;
        if (r->prog.n > cap) cap = r->prog.n;
    }
    if (cap < 2) cap = 2; /* program_kernels' 0x2 */
    prompt = malloc((size_t)n_prompt * sizeof *prompt);
    generated = malloc((size_t)(gen + 1) * sizeof *generated);
    if (!prompt || !generated) {
        fprintf(stderr, "polar bench: error: out of memory\n");
        goto done;
    }
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)info.arch.vocab);
    polar_session_opts so = {.max_ctx = n_prompt + gen + 1, .max_program_len = cap, .n_threads = threads,
                             .device = device, .kv_bf16 = kv_bf16, .tp = par.tp, .tp_devices = par.devices,
                             .tp_world = par.world, .tp_rank = par.rank, .tp_nccl_id = par.nccl_id};
    if (polar_session_create(m, &runs[0].prog, &so, &s, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    bandwidth bw = {0, 0};
    polar_device used = strcmp(polar_session_device(s), "cuda") ? POLAR_DEVICE_CPU : POLAR_DEVICE_CUDA;
    if (measure_bandwidth(used, threads, &bw, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    for (int i = 0; i < n_runs; i++) runs[i].bytes = polar_decode_bytes(m, &runs[i].prog, n_prompt + gen / 2, used, kv_bf16);
    for (int rep = 0; rep < reps; rep++)
        for (int i = 0; i < n_runs; i++)
            if (time_run(s, &runs[i], prompt, n_prompt, gen, generated, &err) != POLAR_OK) {
                rc = fail_status(cmd, &err);
                goto done;
            }
    if (measure_bandwidth(used, threads, &bw, &err) != POLAR_OK ||
        count_launches(s, &runs[0], D, prompt, n_prompt, &lc, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    bench_setup u = {.name = model_dir ? model_dir : preset ? preset : arch, .device = polar_session_device(s),
                     .kv = polar_session_kv_type(s), .launches = polar_session_cuda_launches(s),
                     .tp = par.world ? par.world : par.tp, .threads = polar_session_threads(s), .D = D,
                     .n_prompt = n_prompt, .gen = gen, .stored_bytes = info.stored_bytes};
    u.has_memory = used == POLAR_DEVICE_CUDA && polar_session_device_memory(s, &u.memory, &err) == POLAR_OK;
    report(runs, n_runs, &u, bw, &lc, json);
    if (question_len < 1 || question_len > 512) {
        rc = fail_usage(cmd, "--question-len must be 1 to 512");
        goto done;
    }
    rc = predictor ? bench_predictor(cmd, m, model_dir, s, predictor, encoder, prompt, n_prompt, question_len, reps, json) : 0;
done:
    free(prompt);
    free(generated);
    polar_session_free(s);
    for (int i = 0; i < 2; i++) polar_program_free(&runs[i].prog);
    polar_model_free(m);
    polar_free(model_file);
    return rc;
}
