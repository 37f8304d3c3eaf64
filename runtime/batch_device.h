/* Where a batch's steps run, behind one set of calls. runtime/batch.c
 * plans each step on the host (which rows, which layer passes, which
 * prefix-cache items) and calls these; runtime/cpu_batch.c runs them on
 * the CPU, runtime/cuda_batch.c on a GPU. Both hold the step's residual
 * rows (0..rows-1), the K/V rows of the pool blocks the host hands out, a
 * mirror of every sequence's block tables (a sequence's tables at offset
 * (slot x cap_program + entry) x max_blocks), the rows a sequence's cached
 * prompt blocks start from (start rows: slot x max_ctx + position) and the
 * prefix cache's residual rows (CPU_KV_BLOCK per item). */
#ifndef POLAR_BATCH_DEVICE_H
#define POLAR_BATCH_DEVICE_H

#include "backend.h"
#include "kv_pool.h"
#include "model.h"

typedef struct {
    /* The start of a step (the GPU clears errors earlier calls left). */
    void (*begin)(void *d);
    /* n ints of block tables to the mirror at offset. */
    void (*put_tables)(void *d, const int *tables, int offset, int n);
    /* Row r embeds tokens[r] at position pos[r], r < R. */
    void (*embed)(void *d, const int *tokens, const int *pos, int R);
    /* Layer `layer` over T rows: rows[t] at position pos[t], its table at
     * offset table[t] of the mirror. */
    void (*pass)(void *d, int layer, const int *rows, const int *pos, const int *table, int T);
    /* Residual rows src.. -> dst.. (n); K/V pool rows from.. -> to.. (n). */
    void (*copy_rows)(void *d, int dst, int src, int n);
    void (*copy_kv)(void *d, size_t from, size_t to, int n);
    /* Residual rows row.. (n) into cache item; the item's rows into start
     * rows start.. (n); then rows[i] from start rows starts[i], after embed. */
    void (*cache_keep)(void *d, int item, int row, int n);
    void (*cache_take)(void *d, int item, int start, int n);
    void (*rows_from_start)(void *d, const int *rows, const int *starts, int n);
    /* Final norm and head over rows[0..n): ids[i] the argmax of row i for
     * the rows without want[i]; the rows with want[i] in host_logits (row i
     * at i x vocab) now, the others when copy_logits asks. The step's
     * error, if any. */
    polar_status (*head)(void *d, const int *rows, int n, const unsigned char *want, int *ids, polar_error *err);
    float *(*host_logits)(void *d);
    polar_status (*copy_logits)(void *d, int i, polar_error *err);
    /* The end of a step without a head: its error, if any. */
    polar_status (*finish)(void *d, polar_error *err);
    /* 0: the last step ran call by call; 1 a captured graph replayed; 2
     * captured from it. */
    int (*step_graph)(const void *d);
    /* The GPU: how its kernels are launched (cuda_state_launches); the
     * CPU: NULL. */
    const char *(*launches)(const void *d);
    void (*free)(void *d);
} batch_device_ops;

/* A batch's device: its calls and its state. */
typedef struct {
    const batch_device_ops *ops;
    void *state;
} batch_device;

/* What a batch's device holds (cuda_batch_shape on a GPU). */
typedef struct {
    int rows, tables, cache_items, start_rows, head_rows;
    int n_threads;       /* OpenMP threads of a pass */
    int max_ctx;         /* positions of a sequence (its attention scratch) */
    int round_like_cuda; /* round to bf16 where the CUDA step does (polar_batch_opts) */
} cpu_batch_shape;

/* The CPU's device: its K/V rows are pool's (f32 or bf16). NULL when
 * out of memory. */
void *cpu_batch_create(const polar_model *m, const cpu_batch_shape *shape, kv_pool *pool);

extern const batch_device_ops cpu_batch_ops, cuda_batch_ops;

#endif
