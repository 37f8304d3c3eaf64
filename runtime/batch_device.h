/* Where a batch's steps run, behind one set of calls. runtime/batch_step.c
 * plans each step on the host (which rows, which layer passes, which
 * prefix-cache items, which outputs) and calls these; runtime/cpu_batch.c
 * runs them on the CPU, runtime/cuda_batch.c on a GPU. Both hold the step's
 * residual rows (0..rows-1), the K/V rows of the pool blocks the host hands
 * out, a mirror of every sequence's block tables (a sequence's tables at
 * offset (slot x cap_program + entry) x max_blocks), the rows a sequence's
 * cached prompt blocks start from (start rows: slot x max_ctx + position)
 * and the prefix cache's residual rows (CPU_KV_BLOCK per item).
 *
 * Steps alternate between two halves of the device's per-step state (the
 * ints a step uploads, its head's ids and logits): step s uses half s % 2.
 * On an asynchronous device (a GPU) the host may plan and launch step s + 1
 * while step s runs, feeding s's argmax to s + 1 on the device (embed's
 * `from`); it waits for s before it plans s + 2. */
#ifndef POLAR_BATCH_DEVICE_H
#define POLAR_BATCH_DEVICE_H

#include "backend.h"
#include "kv_pool.h"
#include "model.h"

typedef struct {
    /* launch returns before the step has run: the next may be planned meanwhile */
    int async;
    /* A step begins: its half. */
    int (*begin)(void *d);
    /* n ints of block tables to the mirror at offset. */
    void (*put_tables)(void *d, const int *tables, int offset, int n);
    /* Row r embeds tokens[r] at position pos[r], r < R; with from (async
     * devices only), rows whose from[r] >= 0 embed the id the previous
     * step's head chose for its row from[r] instead. */
    void (*embed)(void *d, const int *tokens, const int *from, const int *pos, int R);
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
    /* Rows row0..row0+n-1 after the final norm into the caller's memory:
     * their normed states to hidden (n x hidden; the GPU's may be device
     * memory) and their logits to logits (n x vocab, host), each when not
     * NULL; in place when the step has run. */
    void (*outputs)(void *d, int row0, int n, float *logits, float *hidden);
    /* Final norm and head over rows[0..n) (n <= head rows): each row's
     * argmax, and the logits of the rows with want[i] copied to the host
     * with the step (the others stay on the device until asked for). */
    void (*head)(void *d, const int *rows, int n, const unsigned char *want);
    /* The step's calls go to the device; an error of issuing them. */
    polar_status (*launch)(void *d, polar_error *err);
    /* Wait for the last step of this half; *ids (may be NULL): its head
     * rows' argmax (host memory of the half). The step's error, if any. */
    polar_status (*wait)(void *d, int half, const int **ids, polar_error *err);
    /* The half's head logits on the host, row i at i x vocab: the want
     * rows at once, row i after copy_logits(half, i). */
    float *(*host_logits)(void *d, int half);
    polar_status (*copy_logits)(void *d, int half, int i, polar_error *err);
    /* 0: the last step ran call by call; 1 a captured graph replayed; 2
     * captured from it. */
    int (*step_graph)(const void *d);
    /* The last step's graph (step_graph 1 or 2): its kernel nodes, and its
     * memcpy and memset nodes into *copies (may be NULL); -1 for both
     * without a graph (and on the CPU). */
    int (*graph_kernels)(const void *d, int *copies);
    /* The GPU: how its kernels are launched (cuda_state_launches); the
     * CPU: NULL. */
    const char *(*launches)(const void *d);
    /* The GPU: the device memory it holds (polar_device_memory), 1; the
     * CPU: 0. */
    int (*memory)(const void *d, polar_device_memory *out);
    void (*free)(void *d);
} batch_device_ops;

/* A batch's device: its calls and its state. */
typedef struct {
    const batch_device_ops *ops;
    void *state;
} batch_device;

/* What a batch's device holds. */
typedef struct {
    int rows;            /* tokens per step */
    int n_blocks;        /* pool blocks */
    int tables;          /* ints of the host's block tables, all sequences (max_seqs x cap_program x max_blocks) */
    int cap_program;     /* entries of the longest program (a row takes part in at most that many passes) */
    int cache_items;     /* prefix cache items (CPU_KV_BLOCK residual rows each); 0: no cache */
    int start_rows;      /* rows the sequences' cached prompt blocks start from (max_seqs x max_ctx), with a cache */
    int head_rows;       /* rows of a step's head at most (max_seqs) */
    int n_threads;       /* CPU: OpenMP threads of a pass */
    int max_ctx;         /* CPU: positions of a sequence (its attention scratch) */
    int round_like_cuda; /* CPU: round to bf16 where the CUDA step does (polar_batch_opts) */
    /* GPU: tensor parallel over NCCL (polar_batch_opts): tp ranks here on
     * devices (NULL: 0..tp-1), the first tp_rank of tp_world, joined under
     * nccl_id when tp_world > tp; tp 0: one GPU, no NCCL */
    int tp, tp_world, tp_rank;
    const int *devices;
    const void *nccl_id;
} batch_device_shape;

/* The CPU's device: its K/V rows are pool's (f32 or bf16). */
polar_status cpu_batch_device(const polar_model *m, const batch_device_shape *shape, kv_pool *pool, batch_device *out,
                              polar_error *err);
/* The GPU's (a build with CUDA; else POLAR_ERR_UNSUPPORTED). */
polar_status cuda_batch_device(const polar_model *m, const batch_device_shape *shape, batch_device *out,
                               polar_error *err);

#endif
