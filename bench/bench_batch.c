/* polar bench --batch: decode throughput of a batch against its size, for
 * one program run by every sequence and for distinct programs (one per
 * sequence), with the layer-weight passes each step made against the
 * bound. Every configuration runs in each rep, interleaved, best of reps.
 * Each sequence has its own prompt (as requests of a server have), unless
 * shared_prompt: then every sequence has the same one, and sequences whose
 * programs agree so far share its K/V (computed once, read once a step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/loop.h"
#include "bench_batch.h"

#define MAX_SIZES 16
#define MAX_BATCH 256

typedef struct {
    int size, mixed;
    double decode_ms;      /* best of reps: the decode steps together */
    double prefill_ms;     /* the steps until every prompt was run */
    int shared_entries;    /* (prompt token, program entry) pairs the prompt step did not compute (shared K/V) */
    double passes, bound;  /* per decode step */
    double graph_steps;    /* CUDA: share of the decode steps that replayed a captured graph */
} batch_run;

/* Distinct variants of the base program for a batch: the base, then skip
 * or repeat (alternately) one layer, the layers spread over the depth. */
static void variant(int D, int j, int n, polar_program *p) {
    int layer = (int)((long)j * D / (n + 1)), len = 0;
    for (int l = 0; l < D; l++) {
        if (j && l == layer && j % 2) continue;        /* odd j: skip */
        p->layers[len++] = l;
        if (j && l == layer && !(j % 2)) p->layers[len++] = l; /* even j: repeat */
    }
    p->n = len;
}

/* One timed run: add the sequences (sequence i gets prompts[i] of
 * n_prompt tokens; prompts all alike when shared), run every prompt in one
 * step (the batch's step budget holds them all), then time gen decode steps
 * of all the sequences. */
static polar_status run_batch(polar_batch *b, const polar_program *progs, int n, const int *const *prompts,
                              int n_prompt, int gen, batch_run *r, polar_error *err) {
    polar_gen_opts g = {.max_new = gen + 1, .ignore_eos = 1};
    int ids[MAX_BATCH];
    polar_status st = POLAR_OK;
    for (int i = 0; i < r->size && st == POLAR_OK; i++)
        st = polar_batch_add(b, &progs[r->mixed ? i % n : 0], prompts[i], n_prompt, &g, &ids[i], err);
    polar_batch_stats bs;
    double t0 = polar_time_ms(), passes = 0, bound = 0, graphs = 0;
    if (st == POLAR_OK) st = polar_batch_step(b, &bs, err);
    double t1 = polar_time_ms();
    r->shared_entries = bs.shared_entries;
    for (int s = 0; s < gen && st == POLAR_OK; s++) {
        st = polar_batch_step(b, &bs, err);
        passes += bs.layer_passes, bound += bs.min_layer_passes, graphs += bs.graph == 1;
    }
    double t2 = polar_time_ms();
    for (int i = 0; i < r->size; i++) polar_batch_remove(b, ids[i], NULL);
    if (st != POLAR_OK) return st;
    if (t1 - t0 < r->prefill_ms) r->prefill_ms = t1 - t0;
    if (t2 - t1 < r->decode_ms) r->decode_ms = t2 - t1;
    r->passes = passes / gen, r->bound = bound / gen, r->graph_steps = graphs / gen;
    return POLAR_OK;
}

/* launches: polar_batch_cuda_launches (NULL on the CPU). */
static void report(const batch_run *runs, int n_runs, const char *name, int D, const bench_batch_opts *o,
                   const char *kv, const char *launches, int threads) {
    const char *device = o->cuda ? "cuda" : "cpu", *prompts = o->shared_prompt ? "shared" : "distinct";
    int gen = o->gen, n_prompt = o->n_prompt, json = o->json, tp = o->tp->world ? o->tp->world : o->tp->tp;
    double base_tok_s = 0;
    for (int i = 0; i < n_runs; i++)
        if (runs[i].size == 1) base_tok_s = gen / (runs[i].decode_ms * 1e-3);
    if (!json) {
        printf("model %s, %d layers, %s (host: %d threads, %s kernels), KV %s, prompt %d tokens (%s), %d decode "
               "steps (best of reps)\n\n", name, D, device, threads, polar_cpu_kernels(), kv, n_prompt,
               o->shared_prompt ? "one prompt shared by all sequences" : "each sequence its own", gen);
        if (launches) printf("kernel launches: %s\n\n", launches);
        if (tp) printf("tensor parallel: %d GPUs\n\n", tp);
        printf("%5s %-9s %11s %10s %9s %11s %8s %8s %9s\n", "batch", "programs", "prefill ms", "ms/step", "tok/s",
               "vs batch 1", "passes", "bound", "vs one");
    }
    for (int i = 0; i < n_runs; i++) {
        const batch_run *r = &runs[i], *one = NULL;
        for (int j = 0; j < n_runs; j++)
            if (runs[j].size == r->size && !runs[j].mixed) one = &runs[j];
        double tok_s = r->size * gen / (r->decode_ms * 1e-3), vs_one = one ? r->decode_ms / one->decode_ms : 1;
        char vs_batch1[32]; /* no batch 1 in the run: no ratio, rather than a made-up 0 */
        if (base_tok_s) snprintf(vs_batch1, sizeof vs_batch1, "%.*f", json ? 4 : 2, tok_s / base_tok_s);
        else snprintf(vs_batch1, sizeof vs_batch1, "%s", json ? "null" : "-");
        if (json)
            printf("{\"model\":\"%s\",\"device\":\"%s\",\"tp\":%d,\"kv\":\"%s\",\"cpu_kernels\":\"%s\",\"threads\":%d,"
                   "\"cuda_launches\":%s%s%s,\"prompt_len\":%d,\"prompts\":\"%s\",\"gen\":%d,\"batch\":%d,"
                   "\"programs\":\"%s\","
                   "\"prefill_ms\":%.3f,\"decode_ms_per_step\":%.4f,"
                   "\"decode_tok_s\":%.3f,\"vs_batch1\":%s,\"passes_per_step\":%.3f,\"bound_per_step\":%.3f,"
                   "\"time_vs_one_program\":%.4f,\"graph_steps\":%.3f,\"prefill_shared_entries\":%d}\n",
                   name, device, tp, kv, polar_cpu_kernels(), threads, launches ? "\"" : "", launches ? launches : "null",
                   launches ? "\"" : "", n_prompt, prompts, gen, r->size,
                   r->mixed ? "mixed" : "one", r->prefill_ms, r->decode_ms / gen, tok_s, vs_batch1, r->passes,
                   r->bound, vs_one, r->graph_steps, r->shared_entries);
        else
            printf("%5d %-9s %11.1f %10.3f %9.1f %10s%s %8.1f %8.1f %8.3fx\n", r->size, r->mixed ? "mixed" : "one",
                   r->prefill_ms, r->decode_ms / gen, tok_s, vs_batch1, base_tok_s ? "x" : " ", r->passes, r->bound,
                   vs_one);
    }
}

int bench_batch(const char *cmd, polar_model *m, const char *name, const bench_batch_opts *o) {
    polar_model_info info;
    polar_model_info_get(m, &info);
    int D = info.arch.n_layers, sizes[MAX_SIZES], n_sizes = 0, max_size = 0, n_progs = 0, rc = 1;
    for (const char *p = o->sizes; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_BATCH || n_sizes == MAX_SIZES || (*end && *end != ','))
            return fail_usage(cmd, "--batch wants up to %d sizes 1..%d, comma-separated (got \"%s\")", MAX_SIZES,
                              MAX_BATCH, o->sizes);
        sizes[n_sizes++] = (int)v;
        max_size = v > max_size ? (int)v : max_size;
        p = *end ? end + 1 : end;
    }
    if (!n_sizes) return fail_usage(cmd, "--batch wants at least one size");
    polar_program progs[MAX_BATCH] = {{0}}, one = {0};
    polar_error err;
    polar_batch *b = NULL;
    batch_run runs[2 * MAX_SIZES];
    int n_prompts = o->shared_prompt ? 1 : max_size, n_prompt = o->n_prompt, cap = 2 * D + 2, n_runs = 0;
    int *tokens = malloc((size_t)n_prompts * n_prompt * sizeof *tokens); /* [n_prompts, n_prompt] */
    const int *prompts[MAX_BATCH];
    if (!tokens) return fail_usage(cmd, "out of memory");
    if (o->programs_file) {
        if ((rc = read_programs(cmd, o->programs_file, D, progs, MAX_BATCH, &n_progs))) goto done;
    } else {
        n_progs = max_size;
        for (int j = 0; j < n_progs; j++) {
            if (!(progs[j].layers = malloc((size_t)(D + 1) * sizeof(int)))) goto done;
            variant(D, j, n_progs, &progs[j]);
        }
    }
    rc = 1;
    if ((o->program ? polar_program_parse(o->program, D, 0, &one, &err) : polar_program_base(D, &one, &err)) !=
        POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    for (int i = 0; i < n_progs; i++) cap = progs[i].n > cap ? progs[i].n : cap;
    cap = one.n > cap ? one.n : cap;
    /* One stream of pseudo-random tokens cut into prompts: distinct prompts
     * differ from their first token on, so no K/V block is shared. */
    for (long i = 0; i < (long)n_prompts * n_prompt; i++)
        tokens[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)info.arch.vocab);
    for (int i = 0; i < max_size; i++) prompts[i] = tokens + (size_t)(i % n_prompts) * n_prompt;
    polar_batch_opts bo = {.max_seqs = max_size, .max_ctx = n_prompt + o->gen + 1, .max_program_len = cap,
                           .step_tokens = max_size * (n_prompt + 1), .n_threads = o->threads,
                           .device = o->cuda ? POLAR_DEVICE_CUDA : POLAR_DEVICE_CPU, .kv_bf16 = o->kv_bf16,
                           .tp = o->tp->tp, .tp_devices = o->tp->devices, .tp_world = o->tp->world,
                           .tp_rank = o->tp->rank, .tp_nccl_id = o->tp->nccl_id};
    bo.kv_bytes = polar_batch_kv_bytes(m, &bo, max_size, cap, bo.max_ctx);
    if (polar_batch_create(m, &bo, &b, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    for (int i = 0; i < n_sizes; i++)
        for (int mixed = 0; mixed < 2; mixed++)
            if (!mixed || sizes[i] > 1)
                runs[n_runs++] = (batch_run){.size = sizes[i], .mixed = mixed, .decode_ms = 1e300, .prefill_ms = 1e300};
    for (int rep = 0; rep < o->reps; rep++)
        for (int j = 0; j < n_runs; j++) {
            int i = rep % 2 ? n_runs - 1 - j : j; /* every other rep backwards: no run always follows the same one */
            const polar_program *list = runs[i].mixed ? progs : &one;
            if (run_batch(b, list, runs[i].mixed ? n_progs : 1, prompts, n_prompt, o->gen, &runs[i], &err) !=
                POLAR_OK) {
                rc = fail_status(cmd, &err);
                goto done;
            }
        }
    report(runs, n_runs, name, D, o, polar_batch_kv_type(b), polar_batch_cuda_launches(b), polar_batch_threads(b));
    if (!o->json && !o->programs_file)
        printf("\nmixed: the base program, then each sequence skipping or repeating one layer (alternately),\n"
               "the layers spread over the depth; one: every sequence runs %s.\n", o->program ? o->program : "base");
    rc = 0;
done:
    polar_batch_free(b);
    for (int i = 0; i < MAX_BATCH; i++) polar_program_free(&progs[i]);
    polar_program_free(&one);
    free(tokens);
    return rc;
}
