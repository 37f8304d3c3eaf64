/* The batch engine's state, shared by its files: batch.c (the batch and its
 * sequences: create, add, open, append, read, end), batch_step.c (planning
 * and running steps) and session.c (a session: a batch of one held
 * sequence). polar.h says what a batch promises. */
#ifndef POLAR_BATCH_H
#define POLAR_BATCH_H

#include "batch_device.h"
#include "kv_pool.h"
#include "model.h"
#include "prefix_cache.h"

typedef struct {
    int id;                /* 0: a free slot */
    polar_seq_state state;
    int held;              /* opened (polar_batch_open): idle, not ended, once its work is done */
    int *program;          /* [cap_program] */
    int n_program;
    int *tokens;           /* [max_ctx + 1] every token in order: appended, then generated (the last generated
                            * one is never run while it generates) */
    int cap_tokens;        /* tokens its KV promise covers */
    int n_tokens, n_run;   /* tokens known; tokens whose K/V are in the cache */
    int n_prompt;          /* its prompt: the tokens its first append put at position 0 (what prompt sharing
                            * and the prefix cache key on) */
    int gen_start;         /* where the tokens of its last generation start */
    int n_generated;
    int stopped_at_eos;
    int generating;        /* its append goes on to generate gen.max_new tokens */
    float *out_logits, *out_hidden; /* the caller's rows for its last append's tokens, or NULL */
    int out_from;          /* the position of that append's first token */
    int want_last;         /* the last appended token's logits come from the head (not a hidden-only append) */
    int head_row, head_half; /* its row of the head its last logits are from, and that head's half; -1: none */
    int logits_here;       /* that row is on the host (sampled rows come with the step, others when asked for) */
    int step_row[2];       /* its head row in the step of each half, -1: none */
    int from_row;          /* an ahead step: its token is the one the step in flight chooses at this head row */
    polar_gen_opts gen;
    int stop[POLAR_BATCH_MAX_STOP];
    polar_rng rng;
    kv_seq kv;
    int dev_mapped;        /* blocks per entry of its tables mirrored on the device */
    /* prompt sharing: added while an older sequence with the same prompt
     * had not started it, this one follows that leader through its first
     * `shared` program entries (the same in both) for the prompt: it
     * computes nothing there and its K/V are the leader's */
    int leader;            /* the leader's id, 0: none (or no longer aligned with it) */
    int shared;            /* program entries in common with the leader */
    int *share;            /* [cap_program, max_blocks] blocks to map rather than take fresh (-1: fresh) */
    /* the prefix cache (batches that have one): at its first step a prompt
     * looks up each of its full blocks (all but the one holding its last
     * token) at entries 0, 1, ...; a block found at entries 0..s-1 maps
     * those K/V blocks and starts at entry s from the cached residual */
    uint64_t *block_hash;  /* [max_blocks] the prompt's tokens up to each block's end */
    uint64_t *entry_hash;  /* [cap_program] the program's entries 0..k */
    int *block_start;      /* [max_blocks] the first entry each prompt block computes (its rows start from
                            * the device's start rows) */
    int looked_up;
    int resumed;           /* the fewest entries any of its prompt's blocks started at */
    long skipped;          /* (prompt token, entry) pairs it did not compute: followed or cached */
    /* this step */
    int row0, n_rows;      /* its rows of the step */
    int cursor;            /* its next program entry (rows join the walk at their block's start) */
    int following;         /* its rows are the leader's until its cursor reaches `shared` */
    int in_pass;           /* it took part in the walk's current pass */
    int waiting;           /* its prompt waits for another's with the same start to be cached */
} batch_seq;

struct polar_batch {
    const polar_model *m;
    int max_seqs, max_ctx, cap_program, step_tokens, n_threads;
    int next_id;
    batch_seq *seqs;       /* [max_seqs] */
    kv_pool pool;          /* the blocks; their rows on the CPU, or on the device */
    batch_device dev;      /* where the steps run: the CPU or the GPU (batch_device.h) */
    int on_gpu;
    int broken;            /* a device step failed half-way: every later call refuses */
    prefix_cache cache;    /* cap 0: none */
    int cache_last_prompt; /* the cache keeps only what the last prompt found or left (a session's) */
    int *pass_rows;        /* [step_tokens] one layer pass's rows (then the head's rows) */
    int *pass_pos, *pass_table; /* [step_tokens] their positions and table offsets (table_offset) */
    int *row_tokens, *row_pos, *row_from; /* [step_tokens] the rows' tokens, positions and fed head rows */
    int *found;            /* [max_program_len] a prompt block's pool blocks found in the prefix cache */
    int *row_start;        /* [step_tokens] the program entry each row starts at */
    batch_seq **order;     /* [max_seqs] the step's sequences, oldest first */
    batch_seq **headed[2]; /* [max_seqs] the sequences of each half's head, in its row order */
    int n_headed[2];
    unsigned char *want[2]; /* [max_seqs] each half's head rows whose logits the host needs with the step (sampled) */
    int *layer_uses;       /* [n_layers] one program's uses of each layer */
    int *layer_most;       /* [n_layers] the most uses of each layer by one program this step */
    void *sample_work;     /* polar_sample_work_bytes(vocab) */
};

/* polar_batch_create, the prefix cache keeping only the last prompt's
 * blocks when cache_last_prompt (a session's share_prompt). */
polar_status batch_create(const polar_model *m, const polar_batch_opts *opts, int cache_last_prompt,
                          polar_batch **out, polar_error *err);

batch_seq *batch_find(const polar_batch *b, int id);

/* Blocks of q's prompt (the last may be partial) and the rows of block j. */
int prompt_blocks(const batch_seq *q);
int block_rows(const batch_seq *q, int j);

/* A sequence whose generation or append is done: held ones go idle (the
 * last generated token not run), the others end (their blocks back). */
void batch_seq_done(polar_batch *b, batch_seq *q);
/* q ends now: its blocks go back to the pool. */
void batch_seq_end(polar_batch *b, batch_seq *q);

polar_status batch_refuse_broken(polar_error *err);

#endif
