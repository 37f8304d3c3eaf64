/* polar bench --batch (see bench_batch.c). */
#ifndef POLAR_BENCH_BATCH_H
#define POLAR_BENCH_BATCH_H

#include "../cli/tp.h"
#include "polar.h"

typedef struct {
    const char *sizes;         /* "1,2,4,8": the batch sizes */
    const char *programs_file; /* NULL: skip/repeat variants of base */
    const char *program;       /* the one program (NULL: base) */
    int n_prompt, gen, reps, threads;
    int shared_prompt;         /* 1: every sequence the same prompt tokens (its K/V shared); 0: each its own */
    int kv_bf16;               /* the CPU's KV pool in bf16 (the GPU's always is) */
    int cuda, json;
    const cli_tp *tp;          /* tensor parallel (tp 0: one GPU) */
} bench_batch_opts;

/* Decode throughput for each batch size, one program against distinct
 * programs (one per sequence, the lines of programs_file or variants of
 * base), on the CPU or (cuda) the GPU. Returns an exit status. */
int bench_batch(const char *cmd, polar_model *m, const char *name, const bench_batch_opts *o);

#endif
