/* The tokenizer's tables and byte-pair encoding.
 *
 * BPE of a word: start from one token per byte; repeatedly merge the
 * adjacent pair of lowest rank (leftmost on ties), as Hugging Face
 * tokenizers and tiktoken both do. A binary heap of candidate pairs with
 * lazy invalidation keeps this O(n log n), so a long word (a run of 100k
 * spaces) costs no more than its length. */
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "tokenizer.h"
#include "unicode.h"

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

polar_status tok_init(polar_tokenizer *t, int n_vocab, polar_error *err) {
    memset(t, 0, sizeof *t);
    if (n_vocab < 256 || n_vocab > (1 << 24))
        return polar_fail(err, POLAR_ERR_FORMAT, "tokenizer: vocabulary of %d tokens (256 to 16M expected)", n_vocab);
    t->n_vocab = n_vocab;
    t->map_cap = 1;
    while (t->map_cap < (size_t)n_vocab * 2) t->map_cap <<= 1;
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)n_vocab, sizeof *t->piece_len);
    t->map = calloc(t->map_cap, sizeof *t->map);
    if (!t->piece || !t->piece_len || !t->map) return polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return POLAR_OK;
}

int tok_find(const polar_tokenizer *t, const char *bytes, size_t len) {
    size_t mask = t->map_cap - 1;
    for (size_t i = hash_bytes(bytes, len) & mask;; i = (i + 1) & mask) {
        uint32_t v = t->map[i];
        if (!v) return -1;
        int id = (int)v - 1;
        if (t->piece_len[id] == len && memcmp(t->piece[id], bytes, len) == 0) return id;
    }
}

polar_status tok_set_piece(polar_tokenizer *t, int id, const char *bytes, size_t len, polar_error *err) {
    if (id < 0 || id >= t->n_vocab)
        return polar_fail(err, POLAR_ERR_FORMAT, "tokenizer: token id %d outside 0..%d", id, t->n_vocab - 1);
    if (t->piece[id])
        return polar_fail(err, POLAR_ERR_FORMAT, "tokenizer: token id %d is defined twice", id);
    if (len == 0 || len > (1u << 16)) return polar_fail(err, POLAR_ERR_FORMAT, "tokenizer: token %d is empty or huge", id);
    char *p = malloc(len + 1);
    if (!p) return polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(p, bytes, len);
    p[len] = 0;
    t->piece[id] = p;
    t->piece_len[id] = (uint32_t)len;
    /* The first id of a given byte string wins a lookup (duplicates occur in
     * some vocabularies for added tokens). */
    if (tok_find(t, bytes, len) < 0) {
        size_t mask = t->map_cap - 1, i = hash_bytes(bytes, len) & mask;
        while (t->map[i]) i = (i + 1) & mask;
        t->map[i] = (uint32_t)id + 1;
    }
    if (len == 1 && t->byte_id[(unsigned char)bytes[0]] < 0) t->byte_id[(unsigned char)bytes[0]] = id;
    return POLAR_OK;
}

static int grow_pairs(polar_tokenizer *t) {
    size_t cap = t->pair_cap ? t->pair_cap * 2 : 1 << 16;
    uint64_t *keys = calloc(cap, sizeof *keys);
    uint32_t *rank = malloc(cap * sizeof *rank), *out = malloc(cap * sizeof *out);
    if (!keys || !rank || !out) {
        free(keys);
        free(rank);
        free(out);
        return 0;
    }
    for (size_t i = 0; i < t->pair_cap; i++) {
        if (!t->pair_key[i]) continue;
        size_t j = mix64(t->pair_key[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = t->pair_key[i];
        rank[j] = t->pair_rank[i];
        out[j] = t->pair_out[i];
    }
    free(t->pair_key);
    free(t->pair_rank);
    free(t->pair_out);
    t->pair_key = keys;
    t->pair_rank = rank;
    t->pair_out = out;
    t->pair_cap = cap;
    return 1;
}

/* Keys are (left+1, right+1) so that 0 marks an empty slot. */
static uint64_t pair_key(int left, int right) { return (uint64_t)(left + 1) << 32 | (uint32_t)(right + 1); }

static long find_pair(const polar_tokenizer *t, int left, int right) {
    if (!t->pair_cap) return -1;
    uint64_t k = pair_key(left, right);
    for (size_t i = mix64(k) & (t->pair_cap - 1);; i = (i + 1) & (t->pair_cap - 1)) {
        if (!t->pair_key[i]) return -1;
        if (t->pair_key[i] == k) return (long)i;
    }
}

int tok_add_merge(polar_tokenizer *t, int left, int right, uint32_t rank, polar_error *err, polar_status *st) {
    *st = POLAR_OK;
    size_t ll = t->piece_len[left], rl = t->piece_len[right];
    char stack[256], *cat = ll + rl <= sizeof stack ? stack : malloc(ll + rl);
    if (!cat) {
        *st = polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
        return 0;
    }
    memcpy(cat, t->piece[left], ll);
    memcpy(cat + ll, t->piece[right], rl);
    int out = tok_find(t, cat, ll + rl);
    if (cat != stack) free(cat);
    if (out < 0) return 0;
    if (find_pair(t, left, right) >= 0) return 1; /* a repeated merge keeps its first (lowest) rank */
    if ((t->n_pairs + 1) * 2 > t->pair_cap && !grow_pairs(t)) {
        *st = polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
        return 0;
    }
    uint64_t k = pair_key(left, right);
    size_t i = mix64(k) & (t->pair_cap - 1);
    while (t->pair_key[i]) i = (i + 1) & (t->pair_cap - 1);
    t->pair_key[i] = k;
    t->pair_rank[i] = rank;
    t->pair_out[i] = (uint32_t)out;
    t->n_pairs++;
    return 1;
}

polar_status tok_add_special(polar_tokenizer *t, int id, polar_error *err) {
    if (id < 0 || id >= t->n_vocab || !t->piece[id])
        return polar_fail(err, POLAR_ERR_FORMAT, "tokenizer: special token id %d has no text", id);
    special_token *s = realloc(t->specials, (size_t)(t->n_specials + 1) * sizeof *s);
    if (!s) return polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
    t->specials = s;
    s[t->n_specials++] = (special_token){id, t->piece[id], t->piece_len[id]};
    return POLAR_OK;
}

static int by_length_desc(const void *a, const void *b) {
    const special_token *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return x->id - y->id;
}

polar_status tok_finish(polar_tokenizer *t, const char *what, polar_error *err) {
    int bytes = 0;
    for (int b = 0; b < 256; b++) bytes += t->byte_id[b] >= 0;
    /* Some trained vocabularies lack a few control bytes (SmolLM2 has 244 of
     * 256), but one without most of them is no byte-level vocabulary. */
    if (bytes < 128)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: only %d of the 256 byte tokens exist: not a byte-level BPE", what,
                          bytes);
    qsort(t->specials, (size_t)t->n_specials, sizeof *t->specials, by_length_desc);
    return POLAR_OK;
}

/* ------------------------------------------------------------ encoding */

typedef struct {
    int id, prev, next; /* linked list of live symbols; -1 ends */
    size_t start;       /* byte offset: the tie-break (leftmost first) */
} symbol;

typedef struct {
    uint32_t rank;
    size_t start;
    int left, right, left_id, right_id;
} candidate;

static int cand_less(const candidate *a, const candidate *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->start < b->start;
}

static void heap_push(candidate *h, int *n, candidate c) {
    int i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static candidate heap_pop(candidate *h, int *n) {
    candidate top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void consider(const polar_tokenizer *t, const symbol *sym, int left, candidate *heap, int *n_heap) {
    if (left < 0 || sym[left].next < 0) return;
    int right = sym[left].next;
    long p = find_pair(t, sym[left].id, sym[right].id);
    if (p >= 0)
        heap_push(heap, n_heap, (candidate){t->pair_rank[p], sym[left].start, left, right, sym[left].id, sym[right].id});
}

typedef struct {
    int *ids;
    int n, cap;
} id_list;

static int push_id(id_list *l, int id) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        int *ids = realloc(l->ids, (size_t)cap * sizeof *ids);
        if (!ids) return 0;
        l->ids = ids;
        l->cap = cap;
    }
    l->ids[l->n++] = id;
    return 1;
}

/* BPE of one word; scratch holds room for n symbols and 3n candidates. */
static int bpe_word(const polar_tokenizer *t, const unsigned char *w, size_t n, symbol *sym, candidate *heap,
                    id_list *out) {
    if (t->ignore_merges) {
        int whole = tok_find(t, (const char *)w, n);
        if (whole >= 0) return push_id(out, whole);
    }
    /* Bytes without a token of their own are dropped, as Hugging Face's BPE
     * does when there is no unknown token; their neighbours may then merge. */
    int m = 0;
    for (size_t i = 0; i < n; i++)
        if (t->byte_id[w[i]] >= 0) {
            sym[m] = (symbol){t->byte_id[w[i]], m - 1, m + 1, i};
            m++;
        }
    if (m == 0) return 1;
    sym[m - 1].next = -1;
    int n_heap = 0;
    for (int i = 0; i + 1 < m; i++) consider(t, sym, i, heap, &n_heap);
    while (n_heap) {
        candidate c = heap_pop(heap, &n_heap);
        /* Stale if either side was merged away or changed since. */
        if (sym[c.left].id != c.left_id || sym[c.left].next != c.right || sym[c.right].id != c.right_id) continue;
        long p = find_pair(t, c.left_id, c.right_id);
        sym[c.left].id = (int)t->pair_out[p];
        sym[c.left].next = sym[c.right].next;
        if (sym[c.right].next >= 0) sym[sym[c.right].next].prev = c.left;
        sym[c.right].id = -1;
        consider(t, sym, sym[c.left].prev, heap, &n_heap);
        consider(t, sym, c.left, heap, &n_heap);
    }
    for (int i = 0; i >= 0; i = sym[i].next)
        if (!push_id(out, sym[i].id)) return 0;
    return 1;
}

/* The bytes of the number character (\p{N}: what Rust's char::is_numeric,
 * and so the Digits pre-tokenizer, means) at s[i], or 0 if it is not one. */
static size_t number_at(const unsigned char *s, size_t n, size_t i) {
    if (s[i] < 0x80) return s[i] >= '0' && s[i] <= '9';
    uint32_t cp;
    int valid, len = utf8_decode(s + i, n - i, &cp, &valid);
    return valid && uc_is_number(cp) ? (size_t)len : 0;
}

/* Split a stretch of ordinary text into words and BPE each. With a Digits
 * pre-tokenizer first (digits_split), every number character is a piece of
 * its own and the regex runs within the pieces between them, as Hugging
 * Face's Sequence does: a whitespace run before a digit ends its piece, so
 * it stays whole rather than leaving its last space to start a word. */
static int encode_text(const polar_tokenizer *t, const unsigned char *s, size_t n, symbol *sym, candidate *heap,
                       id_list *out) {
    size_t piece_end = 0, number;
    for (size_t i = 0; i < n;) {
        size_t end;
        if (t->digits_split && (number = number_at(s, n, i))) {
            end = i + number;
        } else {
            if (t->digits_split && piece_end <= i)
                for (piece_end = i + 1; piece_end < n && !number_at(s, n, piece_end); piece_end++) {
                }
            end = pretok_next(t->style, s, t->digits_split ? piece_end : n, i);
        }
        if (!bpe_word(t, s + i, end - i, sym, heap, out)) return 0;
        i = end;
    }
    return 1;
}

static const special_token *special_at(const polar_tokenizer *t, const char *s, size_t n) {
    for (int k = 0; k < t->n_specials; k++)
        if (t->specials[k].len <= n && memcmp(s, t->specials[k].text, t->specials[k].len) == 0) return &t->specials[k];
    return NULL;
}

static polar_status encode_segment(const polar_tokenizer *t, const char *s, size_t n, symbol *sym, candidate *heap,
                                   id_list *out, polar_error *err) {
    if (!n) return POLAR_OK;
    const char *text = s;
    char *norm = NULL;
    size_t len = n;
    if (t->nfc && !uc_nfc(s, n, &norm, &len)) return polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
    if (norm) text = norm;
    /* NFC may lengthen text (rarely): the scratch must fit the new length. */
    symbol *sym2 = sym;
    candidate *heap2 = heap;
    if (len > n) {
        sym2 = malloc(len * sizeof *sym2);
        heap2 = malloc(3 * len * sizeof *heap2);
    }
    int ok = sym2 && heap2 && encode_text(t, (const unsigned char *)text, len, sym2, heap2, out);
    if (sym2 != sym) free(sym2);
    if (heap2 != heap) free(heap2);
    free(norm);
    return ok ? POLAR_OK : polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
}

polar_status polar_tokenize(const polar_tokenizer *t, const char *text, size_t n, int parse_special, int add_special,
                            int **ids, int *n_ids, polar_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && n)) return polar_fail(err, POLAR_ERR_ARG, "tokenize: no tokenizer or text");
    id_list out = {0};
    symbol *sym = malloc((n + 1) * sizeof *sym);
    candidate *heap = malloc(3 * (n + 1) * sizeof *heap); /* n-1 pairs, then at most 2 per merge */
    polar_status st = POLAR_OK;
    if (!sym || !heap) st = polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
    for (int k = 0; add_special && st == POLAR_OK && k < t->n_prefix; k++)
        if (!push_id(&out, t->prefix[k])) st = polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
    size_t seg = 0;
    for (size_t i = 0; st == POLAR_OK && i < n;) {
        const special_token *sp = parse_special ? special_at(t, text + i, n - i) : NULL;
        if (!sp) {
            i++;
            continue;
        }
        st = encode_segment(t, text + seg, i - seg, sym, heap, &out, err);
        if (st == POLAR_OK && !push_id(&out, sp->id)) st = polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
        i += sp->len;
        seg = i;
    }
    if (st == POLAR_OK) st = encode_segment(t, text + seg, n - seg, sym, heap, &out, err);
    for (int k = 0; add_special && st == POLAR_OK && k < t->n_suffix; k++)
        if (!push_id(&out, t->suffix[k])) st = polar_fail(err, POLAR_ERR_NOMEM, "tokenize: out of memory");
    free(sym);
    free(heap);
    if (st != POLAR_OK) {
        free(out.ids);
        return st;
    }
    *ids = out.ids;
    *n_ids = out.n;
    return POLAR_OK;
}

int polar_token_piece(const polar_tokenizer *t, int id, const char **bytes, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || !t->piece[id]) return 0;
    *bytes = t->piece[id];
    *len = t->piece_len[id];
    return 1;
}

polar_status polar_detokenize(const polar_tokenizer *t, const int *ids, int n, char **text, size_t *len,
                              polar_error *err) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!t || ids[i] < 0 || ids[i] >= t->n_vocab || !t->piece[ids[i]])
            return polar_fail(err, POLAR_ERR_RANGE, "detokenize: token %d (at index %d) is not in the vocabulary", ids[i], i);
        total += t->piece_len[ids[i]];
    }
    char *o = malloc(total + 1);
    if (!o) return polar_fail(err, POLAR_ERR_NOMEM, "detokenize: out of memory");
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        memcpy(o + k, t->piece[ids[i]], t->piece_len[ids[i]]);
        k += t->piece_len[ids[i]];
    }
    o[k] = 0;
    *text = o;
    *len = k;
    return POLAR_OK;
}

int polar_tokenizer_vocab(const polar_tokenizer *t) { return t ? t->n_vocab : 0; }

void polar_tokenizer_free(polar_tokenizer *t) {
    if (!t) return;
    for (int i = 0; t->piece && i < t->n_vocab; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->map);
    free(t->pair_key);
    free(t->pair_rank);
    free(t->pair_out);
    free(t->specials);
    free(t);
}

void polar_free(void *p) { free(p); }
