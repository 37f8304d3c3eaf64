/* The KV cache of a session or a batch: one pool of blocks of CPU_KV_BLOCK
 * token rows, and per sequence a block table for each execution position of
 * its program (kernels/cpu/ops.h says how attention reads it). A sequence is
 * promised the blocks it can ever need when it is admitted (a reservation),
 * takes them as its tokens grow and gives them back when it ends, so a
 * running sequence never waits for memory.
 *
 * Attention reads an execution position's blocks in order, once a step, so
 * they are laid out as runs of consecutive ids where the pool allows: free
 * blocks are taken next-fit (a cursor moving forward), a block grown by
 * decoding takes the id after its predecessor when that one is free, and a
 * prompt's run leaves a gap for the blocks its sequence may still grow. A
 * fragmented pool gives shorter runs, never a failure. */
#ifndef POLAR_KV_POOL_H
#define POLAR_KV_POOL_H

#include <stdint.h>

#include "../kernels/cpu/ops.h"

typedef struct {
    float *k, *v;      /* [n_blocks * CPU_KV_BLOCK, kv_dim] f32 rows, or NULL: bf16 rows or on the device */
    bf16 *k16, *v16;   /* [n_blocks * CPU_KV_BLOCK, kv_dim] bf16 rows (polar_session_opts.kv_bf16), or NULL */
    int n_blocks, kv_dim;
    uint64_t *free_bits; /* [(n_blocks + 63) / 64] bit i set: block i is free */
    int *refs;         /* [n_blocks] tables holding each block (several when a prompt's blocks are shared) */
    int n_free;
    int cursor;        /* where the next-fit search for a free block starts */
    int promised;      /* free blocks reserved for admitted sequences */
} kv_pool;

/* One sequence's tables: blocks[k * max_blocks + b] is the pool block of
 * positions b*CPU_KV_BLOCK.. at execution position k. Every position of the
 * program holds the same tokens, so one count says how many are mapped. */
typedef struct {
    int *blocks;       /* [cap_program, max_blocks] */
    int cap_program, max_blocks;
    int n_program;     /* execution positions in use */
    int n_mapped;      /* blocks mapped at each of them */
    int reserved;      /* blocks still promised to this sequence */
} kv_seq;

/* The block bookkeeping, k and v NULL (a device keeps the rows); 0 when
 * out of memory. */
int kv_pool_init(kv_pool *p, int n_blocks, int kv_dim);
/* The rows on the host (a CPU pool), f32 or (bf16_rows) bf16; 0 when out
 * of memory. */
int kv_pool_add_rows(kv_pool *p, int bf16_rows);
/* Bytes of one block's K and V rows, f32 or (bf16_rows) bf16. */
size_t kv_pool_block_bytes(int kv_dim, int bf16_rows);
/* Host rows from.. -> to.. (n), K and V, whichever their type. */
void kv_pool_copy_rows(kv_pool *p, size_t from, size_t to, int n);
void kv_pool_free(kv_pool *p);
/* "f32" or "bf16": the rows' type (a device pool's rows always are bf16). */
const char *kv_pool_row_type(const kv_pool *p);
/* Drop one reference to block id; it is free again when none is left. */
void kv_block_unref(kv_pool *p, int id);

/* Blocks a sequence needs for n_program positions x n_tokens tokens. */
int kv_blocks_for(int n_program, int n_tokens);

/* Tables for up to cap_program positions x max_tokens tokens; 0 when out of
 * memory. */
int kv_seq_init(kv_seq *s, int cap_program, int max_tokens);
void kv_seq_free(kv_seq *s);

/* Admit s for n_program positions x n_tokens tokens: promise it the blocks.
 * 0 (nothing changed) when the pool cannot promise that many. */
int kv_seq_admit(kv_pool *p, kv_seq *s, int n_program, int n_tokens);

/* Map blocks until positions 0..n_tokens-1 have rows: from the promise, or
 * where share (NULL: nowhere) names a block (>= 0, laid out as s->blocks),
 * that block, one more reference taken: K/V rows another sequence (or the
 * prefix cache) holds for the same tokens run the same way. */
void kv_seq_grow(kv_pool *p, kv_seq *s, int n_tokens, const int *share);

/* Give every block and what is left of the promise back to the pool. */
void kv_seq_release(kv_pool *p, kv_seq *s);

/* The table of execution position k. */
static inline const int *kv_seq_table(const kv_seq *s, int k) { return s->blocks + (size_t)k * s->max_blocks; }

#endif
