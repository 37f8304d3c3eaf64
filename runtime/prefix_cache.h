/* The prompt prefix cache of a batch. The K/V that a block of 16 prompt
 * tokens gets at execution position k, and its residual stream after that
 * position, depend only on the tokens up to the block's end and on the
 * program's entries 0..k. So one item, keyed by (hash of those tokens, hash
 * of those entries), serves every later sequence whose prompt starts with
 * the same tokens and whose program starts with the same entries: a
 * few-shot prefix shared by every question, or a program search's
 * neighbours that differ after their first L entries. The K/V rows stay in
 * the KV pool (the item holds a reference on their block, which sequences
 * then map read-only); the residual rows are kept by the batch's device
 * (batch_device.h), at the item's index. Least recently used items go
 * first when it is full. */
#ifndef POLAR_PREFIX_CACHE_H
#define POLAR_PREFIX_CACHE_H

#include <stdint.h>

#include "kv_pool.h"

typedef struct {
    uint64_t tokens_hash, entries_hash; /* the key: two 64-bit hashes (polar.h: what a collision does) */
    int block;         /* the pool block holding the K/V rows */
    int next;          /* the next item of its bucket, or of the free list; -1: none */
    int older, newer;  /* the LRU list; -1: none */
} prefix_item;

typedef struct {
    prefix_item *items;  /* [cap] */
    int *buckets;        /* [n_buckets] first item of each, -1: empty */
    int cap, n_buckets;
    int free_head;       /* unused items */
    int oldest, newest;  /* the LRU list's ends */
    int n_items;
} prefix_cache;

/* Room for cap items; 0 when out of memory. A cap of 0 is a cache that
 * holds nothing. */
int prefix_cache_init(prefix_cache *c, int cap);
/* Gives every item's block reference back to p first. */
void prefix_cache_free(prefix_cache *c, kv_pool *p);

/* Bytes one item costs: its K/V block in the pool (kv_block_bytes) and its
 * f32 residual rows. */
size_t prefix_cache_item_bytes(size_t kv_block_bytes, int hidden);

/* The item of a key (now the most recently used), or -1. */
int prefix_cache_find(prefix_cache *c, uint64_t tokens_hash, uint64_t entries_hash);

/* Keep block (one reference taken) under a key not yet held, evicting the
 * least recently used item when full. Returns the item (whose residual
 * rows the caller keeps), or -1: nothing happens with a cap of 0 or a key
 * already held. */
int prefix_cache_insert(prefix_cache *c, kv_pool *p, uint64_t tokens_hash, uint64_t entries_hash, int block);

/* Drop the least recently used item (its block goes back to the pool when
 * no sequence maps it); 0 when empty. */
int prefix_cache_evict(prefix_cache *c, kv_pool *p);

/* Drop every item but the n most recently used. */
void prefix_cache_keep_newest(prefix_cache *c, kv_pool *p, int n);

/* Items whose block no sequence maps (dropping one gives a block back). */
int prefix_cache_unmapped(const prefix_cache *c, const kv_pool *p);

/* Drop the least recently used of those; 0 when there is none. */
int prefix_cache_evict_unmapped(prefix_cache *c, kv_pool *p);

/* The chains the keys are made of: a hash of the tokens up to a block's
 * end extends the previous block's (n, the block's length, is hashed too);
 * a hash of entries 0..k extends 0..k-1's. */
uint64_t prefix_hash_tokens(uint64_t previous, const int *tokens, int n);
uint64_t prefix_hash_entry(uint64_t previous, int layer);

#endif
