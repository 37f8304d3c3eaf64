/* Paged KV storage: see kv_pool.h. */
#include "kv_pool.h"

#include <stdlib.h>
#include <string.h>

int kv_pool_init(kv_pool *p, int n_blocks, int kv_dim) {
    *p = (kv_pool){.n_blocks = n_blocks, .kv_dim = kv_dim};
    p->free_blocks = malloc((size_t)n_blocks * sizeof *p->free_blocks);
    p->refs = calloc((size_t)n_blocks, sizeof *p->refs);
    if (!p->free_blocks || !p->refs) {
        kv_pool_free(p);
        return 0;
    }
    for (int i = 0; i < n_blocks; i++) p->free_blocks[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 1;
}

int kv_pool_add_rows(kv_pool *p, int bf16_rows) {
    size_t n = (size_t)p->n_blocks * CPU_KV_BLOCK * p->kv_dim;
    if (bf16_rows) {
        p->k16 = malloc(n * sizeof(bf16));
        p->v16 = malloc(n * sizeof(bf16));
        return p->k16 && p->v16;
    }
    p->k = malloc(n * sizeof(float));
    p->v = malloc(n * sizeof(float));
    return p->k && p->v;
}

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
    free(p->free_blocks);
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
    while (s->n_mapped * CPU_KV_BLOCK < n_tokens) {
        int b = s->n_mapped;
        for (int k = 0; k < s->n_program; k++) {
            size_t at = (size_t)k * s->max_blocks + b;
            int id = share && share[at] >= 0 ? share[at] : p->free_blocks[--p->n_free];
            p->refs[id]++;
            s->blocks[at] = id;
        }
        p->promised -= s->n_program;
        s->reserved -= s->n_program;
        s->n_mapped++;
    }
}

void kv_seq_release(kv_pool *p, kv_seq *s) {
    for (int k = 0; k < s->n_program; k++)
        for (int b = 0; b < s->n_mapped; b++) {
            int id = s->blocks[(size_t)k * s->max_blocks + b];
            if (--p->refs[id] == 0) p->free_blocks[p->n_free++] = id;
        }
    p->promised -= s->reserved;
    s->reserved = 0;
    s->n_mapped = 0;
    s->n_program = 0;
}
