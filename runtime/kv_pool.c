/* Paged KV storage: see kv_pool.h. */
#include "kv_pool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int kv_pool_init(kv_pool *p, int n_blocks, int kv_dim) {
    *p = (kv_pool){.n_blocks = n_blocks, .kv_dim = kv_dim};
    size_t words = ((size_t)n_blocks + 63) / 64;
    p->free_bits = calloc(words ? words : 1, sizeof *p->free_bits);
    p->refs = calloc((size_t)n_blocks, sizeof *p->refs);
    if (!p->free_bits || !p->refs) {
        kv_pool_free(p);
        return 0;
    }
    for (int i = 0; i < n_blocks; i++) p->free_bits[i / 64] |= (uint64_t)1 << (i % 64);
    p->n_free = n_blocks;
    return 1;
}

static int is_free(const kv_pool *p, int id) { return (p->free_bits[id / 64] >> (id % 64)) & 1; }

/* A free block: want when it is free, else the first free one from the
 * cursor on (wrapping). One is free: the sequence was promised it. */
static int take_block(kv_pool *p, int want) {
    int id = want;
    if (id < 0 || id >= p->n_blocks || !is_free(p, id)) {
        int words = (p->n_blocks + 63) / 64, w = p->cursor / 64;
        uint64_t bits = p->free_bits[w] & (~(uint64_t)0 << (p->cursor % 64)); /* from the cursor */
        while (!bits) w = (w + 1) % words, bits = p->free_bits[w]; /* wraps to the cursor's word, whole */
        id = w * 64 + __builtin_ctzll(bits);
    }
    p->free_bits[id / 64] &= ~((uint64_t)1 << (id % 64));
    p->n_free--;
    p->refs[id] = 1;
    p->cursor = id + 1 < p->n_blocks ? id + 1 : 0;
    return id;
}

void kv_block_unref(kv_pool *p, int id) {
    if (--p->refs[id] > 0) return;
    p->free_bits[id / 64] |= (uint64_t)1 << (id % 64);
    p->n_free++;
}

/* Rows on 2 MiB pages where the kernel offers transparent huge pages:
 * decode attention reads every sequence's rows once a step, a block of
 * them per jump, and 4 KiB pages cost a TLB miss per jump (8 sequences
 * after 1000-token prompts: 12.9-13.3 -> 11.5-12.1 ms a step). */
static void *rows_alloc(size_t bytes) {
    void *r = NULL;
    if (posix_memalign(&r, (size_t)1 << 21, bytes)) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(r, bytes, MADV_HUGEPAGE); /* advice: without huge pages the rows work as well */
#endif
    return r;
}

size_t kv_pool_block_bytes(int kv_dim, int bf16_rows) {
    return 2 * (size_t)CPU_KV_BLOCK * (size_t)kv_dim * (bf16_rows ? sizeof(bf16) : sizeof(float));
}

int kv_pool_add_rows(kv_pool *p, int bf16_rows) {
    size_t n = (size_t)p->n_blocks * CPU_KV_BLOCK * p->kv_dim;
    if (bf16_rows) {
        p->k16 = rows_alloc(n * sizeof(bf16));
        p->v16 = rows_alloc(n * sizeof(bf16));
        return p->k16 && p->v16;
    }
    p->k = rows_alloc(n * sizeof(float));
    p->v = rows_alloc(n * sizeof(float));
    return p->k && p->v;
}

const char *kv_pool_row_type(const kv_pool *p) { return p->k ? "f32" : "bf16"; }

void kv_pool_copy_rows(kv_pool *p, size_t from, size_t to, int n) {
    size_t kvd = (size_t)p->kv_dim, count = (size_t)n * kvd;
    if (p->k16) {
        memcpy(p->k16 + to * kvd, p->k16 + from * kvd, count * sizeof(bf16));
        memcpy(p->v16 + to * kvd, p->v16 + from * kvd, count * sizeof(bf16));
    } else {
        memcpy(p->k + to * kvd, p->k + from * kvd, count * sizeof(float));
        memcpy(p->v + to * kvd, p->v + from * kvd, count * sizeof(float));
    }
}

void kv_pool_free(kv_pool *p) {
    free(p->k);
    free(p->v);
    free(p->k16);
    free(p->v16);
    free(p->free_bits);
    free(p->refs);
    *p = (kv_pool){0};
}

int kv_blocks_for(int n_program, int n_tokens) {
    return n_program * ((n_tokens + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK);
}

int kv_seq_init(kv_seq *s, int cap_program, int max_tokens) {
    *s = (kv_seq){.cap_program = cap_program, .max_blocks = (max_tokens + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK};
    s->blocks = malloc((size_t)cap_program * s->max_blocks * sizeof *s->blocks);
    return s->blocks != NULL;
}

void kv_seq_free(kv_seq *s) {
    free(s->blocks);
    s->blocks = NULL;
}

int kv_seq_admit(kv_pool *p, kv_seq *s, int n_program, int n_tokens) {
    int need = kv_blocks_for(n_program, n_tokens);
    if (n_program > s->cap_program || n_tokens > s->max_blocks * CPU_KV_BLOCK || need > p->n_free - p->promised)
        return 0;
    p->promised += need;
    s->reserved = need;
    s->n_program = n_program;
    s->n_mapped = 0;
    /* -1 until mapped: a device reading an entry it was not sent the mapped
     * block of faults (kv_row in kernels/cuda/common.cuh reads -1 as a block
     * far past the pool) rather than reading another sequence's rows */
    for (size_t i = 0; i < (size_t)n_program * s->max_blocks; i++) s->blocks[i] = -1;
    return 1;
}

void kv_seq_grow(kv_pool *p, kv_seq *s, int n_tokens, const int *share) {
    int from = s->n_mapped, to = (n_tokens + CPU_KV_BLOCK - 1) / CPU_KV_BLOCK;
    if (to <= from) return;
    /* blocks each position may still grow after these: the gap left after its run */
    int gap = s->reserved / s->n_program - (to - from);
    for (int k = 0; k < s->n_program; k++) {
        int *row = s->blocks + (size_t)k * s->max_blocks, fresh = 0;
        for (int b = from; b < to; b++) {
            size_t at = (size_t)k * s->max_blocks + b;
            if (share && share[at] >= 0) {
                row[b] = share[at];
                p->refs[row[b]]++;
            } else {
                row[b] = take_block(p, b > 0 ? row[b - 1] + 1 : -1);
                fresh = 1;
            }
        }
        if (fresh && gap > 0) p->cursor = (int)(((long)p->cursor + gap) % p->n_blocks);
    }
    p->promised -= s->n_program * (to - from);
    s->reserved -= s->n_program * (to - from);
    s->n_mapped = to;
}

void kv_seq_release(kv_pool *p, kv_seq *s) {
    for (int k = 0; k < s->n_program; k++)
        for (int b = 0; b < s->n_mapped; b++) kv_block_unref(p, s->blocks[(size_t)k * s->max_blocks + b]);
    p->promised -= s->reserved;
    s->reserved = 0;
    s->n_mapped = 0;
    s->n_program = 0;
}
