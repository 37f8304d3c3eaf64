/* Prompt prefix cache: see prefix_cache.h. */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>

int prefix_cache_init(prefix_cache *c, int cap) {
    *c = (prefix_cache){.cap = cap, .free_head = -1, .oldest = -1, .newest = -1};
    if (cap == 0) return 1;
    c->n_buckets = 1;
    while (c->n_buckets < 2 * cap) c->n_buckets *= 2;
    c->items = malloc((size_t)cap * sizeof *c->items);
    c->buckets = malloc((size_t)c->n_buckets * sizeof *c->buckets);
    if (!c->items || !c->buckets) {
        prefix_cache_free(c, NULL);
        return 0;
    }
    memset(c->buckets, 0xff, (size_t)c->n_buckets * sizeof *c->buckets);
    for (int i = cap - 1; i >= 0; i--) c->items[i].next = c->free_head, c->free_head = i;
    return 1;
}

void prefix_cache_free(prefix_cache *c, kv_pool *p) {
    while (p && prefix_cache_evict(c, p)) {
    }
    free(c->items);
    free(c->buckets);
    *c = (prefix_cache){0};
}

size_t prefix_cache_item_bytes(size_t kv_block_bytes, int hidden) {
    return kv_block_bytes + (size_t)CPU_KV_BLOCK * (size_t)hidden * sizeof(float);
}

uint64_t prefix_hash_tokens(uint64_t previous, const int *tokens, int n) {
    uint64_t h = (previous ^ 0x9E3779B97F4A7C15ull) + (uint64_t)n * 0xD1B54A32D192ED03ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

uint64_t prefix_hash_entry(uint64_t previous, int layer) {
    uint64_t h = (previous ^ (uint64_t)(uint32_t)layer) * 0x94D049BB133111EBull;
    return h ^ (h >> 29) ^ 0xD6E8FEB86659FD93ull;
}

static int bucket_of(const prefix_cache *c, uint64_t th, uint64_t eh) {
    return (int)((th ^ (eh * 0xFF51AFD7ED558CCDull)) >> 17 & (uint64_t)(c->n_buckets - 1));
}

static void unlink_lru(prefix_cache *c, int i) {
    prefix_item *it = &c->items[i];
    if (it->older >= 0) c->items[it->older].newer = it->newer;
    else c->oldest = it->newer;
    if (it->newer >= 0) c->items[it->newer].older = it->older;
    else c->newest = it->older;
}

static void push_newest(prefix_cache *c, int i) {
    c->items[i].older = c->newest, c->items[i].newer = -1;
    if (c->newest >= 0) c->items[c->newest].newer = i;
    else c->oldest = i;
    c->newest = i;
}

int prefix_cache_find(prefix_cache *c, uint64_t th, uint64_t eh) {
    if (!c->cap) return -1;
    for (int i = c->buckets[bucket_of(c, th, eh)]; i >= 0; i = c->items[i].next)
        if (c->items[i].tokens_hash == th && c->items[i].entries_hash == eh) {
            unlink_lru(c, i);
            push_newest(c, i);
            return i;
        }
    return -1;
}

static void drop(prefix_cache *c, kv_pool *p, int i) {
    unlink_lru(c, i);
    int *link = &c->buckets[bucket_of(c, c->items[i].tokens_hash, c->items[i].entries_hash)];
    while (*link != i) link = &c->items[*link].next;
    *link = c->items[i].next;
    int b = c->items[i].block;
    kv_block_unref(p, b);
    c->items[i].next = c->free_head, c->free_head = i;
    c->n_items--;
}

int prefix_cache_evict(prefix_cache *c, kv_pool *p) {
    if (c->oldest < 0) return 0;
    drop(c, p, c->oldest);
    return 1;
}

void prefix_cache_keep_newest(prefix_cache *c, kv_pool *p, int n) {
    while (c->n_items > n) prefix_cache_evict(c, p);
}

int prefix_cache_unmapped(const prefix_cache *c, const kv_pool *p) {
    int n = 0;
    for (int i = c->oldest; i >= 0; i = c->items[i].newer) n += p->refs[c->items[i].block] == 1;
    return n;
}

int prefix_cache_evict_unmapped(prefix_cache *c, kv_pool *p) {
    for (int i = c->oldest; i >= 0; i = c->items[i].newer)
        if (p->refs[c->items[i].block] == 1) {
            drop(c, p, i);
            return 1;
        }
    return 0;
}

int prefix_cache_insert(prefix_cache *c, kv_pool *p, uint64_t th, uint64_t eh, int block) {
    if (!c->cap || prefix_cache_find(c, th, eh) >= 0) return -1;
    if (c->free_head < 0) prefix_cache_evict(c, p);
    int i = c->free_head, bucket = bucket_of(c, th, eh);
    c->free_head = c->items[i].next;
    c->items[i] = (prefix_item){.tokens_hash = th, .entries_hash = eh, .block = block, .next = c->buckets[bucket]};
    c->buckets[bucket] = i;
    push_newest(c, i);
    p->refs[block]++;
    c->n_items++;
    return i;
}
