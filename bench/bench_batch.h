/* polar bench --batch (see bench_batch.c). */
#ifndef POLAR_BENCH_BATCH_H
#define POLAR_BENCH_BATCH_H

#include "polar.h"

/* Decode throughput for each batch size of sizes_text ("1,2,4,8"), one
 * program (program_text, or base) against distinct programs (the lines of
 * programs_file, or skip/repeat variants of base), on the CPU (its KV pool
 * f32, or bf16 with kv_bf16) or (cuda) the GPU. Returns an exit status. */
int bench_batch(const char *cmd, polar_model *m, const char *name, const char *sizes_text, const char *programs_file,
                const char *program_text, int n_prompt, int gen, int reps, int threads, int kv_bf16, int cuda, int json);

#endif
