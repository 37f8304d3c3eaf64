/* A batch's GPU device (batch_device.h), as cuda_batch.c (the device's
 * calls: a step recorded, the ranks made) and cuda_step.c (a recorded step
 * issued on each rank, its graphs) share it. A batch on one GPU has one
 * rank; a tensor-parallel batch (docs/cuda.md) one per GPU of
 * its group, each with its share of the model in its own cuda_state, and
 * every rank issues the same recorded calls on its own device and thread.
 * Built with POLAR_CUDA. */
#ifndef POLAR_CUDA_STEP_H
#define POLAR_CUDA_STEP_H

#include "cuda_internal.h"

#define STEP_GRAPHS 16 /* captured step shapes kept, both halves (least recently used replaced) */

/* One device call of a step, as recorded. Its ints (if any) are in the
 * half's staging area at `at`. */
typedef enum {
    OP_EMBED,       /* n rows; b: with `from` (n more ints) */
    OP_PASS,        /* n rows; a: layer, b: PASS_RUNS | PASS_IN_PLACE */
    OP_COPY_ROWS,   /* n rows: a dst, b src */
    OP_COPY_KV,     /* n pool rows: a from, b to */
    OP_CACHE_KEEP,  /* n rows: a item, b row */
    OP_CACHE_TAKE,  /* n rows: a item, b start row */
    OP_FROM_START,  /* n rows: rows and their start rows at `at` */
    OP_OUTPUTS,     /* n rows from row `at`: a the host logits, b the hidden states (host or device memory; 0: none) */
    OP_HEAD,        /* n rows at `at` */
} op_kind;
enum {
    PASS_RUNS = 1,     /* with prompt runs: through the tiled prefill attention */
    PASS_IN_PLACE = 2, /* its rows are 0..n-1: run on the step's rows without a gather */
};
typedef struct {
    int kind, n;
    long long a, b;
    size_t at;
} step_op;
_Static_assert(sizeof(step_op) == 32, "no padding: recorded calls are compared with memcmp");

/* A step shape captured as a graph on every rank (exec in each rank_state). */
typedef struct {
    int live;             /* 0: free */
    int half;             /* the half whose buffers it was captured on */
    step_op *ops;         /* [graph_ops] the calls it runs */
    int n_ops;
    unsigned char *want;  /* [head_rows] the head rows it copies to the host */
    unsigned long last_used;
    int kernels, copies;  /* the first rank's graph's kernel nodes and memcpy/memset nodes (-1: not counted) */
} step_graph;

/* The host's side of one step, so that the next may be planned and queued
 * while it runs. */
typedef struct {
    int *staging;         /* pinned host [cap_ints]: the step's ints, uploaded by every rank */
    size_t used;
    int *table_staging;   /* pinned host [n_tables]: block tables on their way to the mirrors */
    size_t tables_used;
    int *host_ids;        /* mapped host [head_rows]: the argmax, written there by the first rank's kernel */
    int *host_ids_dev;    /* the same memory, as the device addresses it */
    float *host_logits;   /* pinned host [head_rows, vocab]: the rows the host asked for */
    int failed;           /* the ints ran out: wait reports it */
} step_half;

/* A rank's side of one step. */
typedef struct {
    int *ints;            /* [cap_ints] the step's uploaded ints */
    int *ids;             /* [head_rows] the head's argmax (the whole vocabulary's) */
    float *logits;        /* [head_rows, vocab_part] its head's logits: the rank's vocabulary */
    cudaEvent_t done;     /* recorded after the step */
    int failed;           /* a copy failed: wait reports it */
    cudaError_t error;    /* the CUDA error of issuing it, if any */
} rank_half;

/* One GPU's part of the batch. */
typedef struct {
    cuda_state *c;        /* its share of the weights, workspaces, stream, cuBLASLt, its heads' KV pool, tables */
    float *x;             /* [rows, hidden] the step's residual streams (whole on every rank) */
    float *cache_rows;    /* [cache_items * CUDA_KV_BLOCK, hidden] the prefix cache's residual rows */
    float *start;         /* [start_rows, hidden] rows cached prompt blocks start from, per sequence */
    float *logits;        /* [max(2 x head_rows, LOGIT_ROWS), vocab_part]: each half's head, or an outputs slice */
    float *gathered;      /* tensor parallel: [world, max(head_rows, LOGIT_ROWS), vocab_part] every rank's logits */
    float *part, *parts;  /* tensor parallel: [2 x head_rows] its argmax part, [world, 2 x head_rows] all of them */
    rank_half half[2];
    cuda_run *runs;       /* [rows / (DECODE_TOKENS + 1) + 1] a pass's prompt runs */
    cudaGraphExec_t exec[STEP_GRAPHS]; /* its graph of each captured shape */
    polar_error err;      /* what its creation failed with */
    int capture_failed;   /* this step's capture failed here; retry: worth trying again (cuda_state_capture_failed) */
    int retry, launch_failed;
    cudaError_t job_error; /* what its part of a copy of logits failed with */
} rank_state;

typedef struct {
    tp_group *tp;          /* the tensor-parallel group; NULL: one GPU, no NCCL */
    int n_ranks, world;    /* ranks here, ranks in all */
    int *v0, *vocab;       /* [world] each rank's vocabulary rows (the head's split) */
    int vocab_part;        /* the largest: each rank's part of a logits all-gather */
    rank_state *rank;      /* [n_ranks] */
    int rows;
    size_t cap_ints, n_tables;
    step_half half[2];
    int h;                 /* the half of the step being recorded */
    int head_rows;
    /* the step's calls, and the graphs of earlier steps */
    step_op *ops;          /* [cap_ops] */
    int n_ops, cap_ops, graph_ops;
    unsigned char *want;   /* [head_rows] this step's head rows wanted on the host */
    int direct;            /* the step outgrew cap_ops: its calls go out as they come */
    int graphs;            /* 0: POLAR_CUDA_GRAPHS=0, or a capture or graph launch failed once */
    step_graph last;       /* the previous step's calls (never a graph) */
    step_graph graph[STEP_GRAPHS];
    unsigned long clock;
    int ran_as;            /* the last step: 0 issued call by call, 1 replayed, 2 captured and run */
    int ran_kernels, ran_copies; /* the last step's graph's nodes (step_graph's kernels, copies); -1: no graph */
} cuda_batch;

/* fn(arg, r) for every rank r, each on its own thread with its device
 * current (tp_run), or on the caller's for one GPU. */
void ranks_run(cuda_batch *d, void (*fn)(void *arg, int r), void *arg);

/* The runs of more than DECODE_TOKENS tokens among T that are consecutive
 * positions of one sequence (the same table) into runs (when not NULL);
 * their count. */
int find_runs(const int *pos, const int *table, int T, cuda_run *runs);

/* One recorded call on rank r's stream, on the buffers of half `half`. */
void step_issue(cuda_batch *d, int r, int half, const step_op *o);

/* The step's recorded calls go out on every rank: a graph of this shape
 * and half replayed, or captured when the previous step had the same calls
 * (on both halves: the next such step runs on the other), or else one by
 * one; then each rank records its half's event. A captured graph's nodes
 * are counted (cudaGraphGetNodes): what ran_kernels reports. */
void step_launch(cuda_batch *d);

/* Row i of a half's head to the host now (the rows not wanted with the
 * step): gathered from every rank's vocabulary under tensor parallel. */
polar_status step_copy_logits(cuda_batch *d, int half, int i, polar_error *err);

#endif
