/* A reference's log-probabilities: the file and the per-token comparison
 * (logprobs.h). */
#include "logprobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../runtime/error.h"

#define MAGIC "POLARLP1"
#define LLAMA_MAGIC "_logits_"
#define FLOOR_NATS 20.0f /* below the most likely token's log-probability less this: left out */
#define LLAMA_FLOOR_NATS 16.0f /* llama-perplexity's floor, and its KL divergence's cut (-16) */

static size_t even(size_t n) { return (n + 1) & ~(size_t)1; }

size_t logprobs_record_bytes(const logprobs_header *h) {
    if (h->llama) return 8 + 2 * even(h->vocab);
    return h->top_k ? 8 + (size_t)h->top_k * 8 : 12 + 2 * even(h->vocab);
}

/* The header's u32 fields as stored: polar's four, llama-perplexity's three. */
static size_t header_fields(const logprobs_header *h) { return h->llama ? 3 : 4; }

polar_status logprobs_write_header(FILE *f, const char *path, const logprobs_header *h, const int *tokens,
                                   polar_error *err) {
    uint32_t v[4] = {h->ctx, h->vocab, h->chunks, h->top_k};
    size_t n = (size_t)h->chunks * h->ctx, fields = header_fields(h);
    if (fwrite(h->llama ? LLAMA_MAGIC : MAGIC, 1, 8, f) != 8 || fwrite(v, sizeof *v, fields, f) != fields ||
        fwrite(tokens, sizeof *tokens, n, f) != n)
        return polar_fail(err, POLAR_ERR_IO, "%s: cannot write the log-probabilities", path);
    return POLAR_OK;
}

polar_status logprobs_read_header(FILE *f, const char *path, int vocab, logprobs_header *h, int **tokens,
                                  polar_error *err) {
    *tokens = NULL;
    char magic[8];
    uint32_t v[4] = {0};
    int llama = 0;
    if (fread(magic, 1, 8, f) != 8 || (memcmp(magic, MAGIC, 8) && !(llama = !memcmp(magic, LLAMA_MAGIC, 8))) ||
        fread(v, sizeof *v, llama ? 3 : 4, f) != (llama ? 3u : 4u))
        return polar_fail(err, POLAR_ERR_FORMAT,
                          "%s: not a file of log-probabilities (neither polar's nor llama-perplexity's)", path);
    *h = (logprobs_header){v[0], v[1], v[2], v[3], llama};
    if (h->ctx < 4 || h->ctx > (1u << 20) || h->chunks < 1 || h->chunks > (1u << 24) || h->top_k > h->vocab ||
        h->top_k > (1u << 16))
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: ctx %u, %u chunks, top %u: not a valid header", path, h->ctx,
                          h->chunks, h->top_k);
    if ((int)h->vocab != vocab)
        return polar_fail(err, POLAR_ERR_ARG, "%s: log-probabilities over %u tokens, the model's vocabulary has %d",
                          path, h->vocab, vocab);
    size_t n = (size_t)h->chunks * h->ctx, body = (size_t)h->chunks * logprobs_scored((int)h->ctx) *
                                                   logprobs_record_bytes(h),
           head = 8 + header_fields(h) * sizeof *v;
    if (n > ((size_t)1 << 28)) /* what no size check bounds (a pipe) */
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: %u chunks of %u tokens: more than 2^28 tokens", path, h->chunks,
                          h->ctx);
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && (size_t)sb.st_size != head + n * sizeof(int) + body)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: %lld bytes, where %u chunks of %u tokens take %zu", path,
                          (long long)sb.st_size, h->chunks, h->ctx, head + n * sizeof(int) + body);
    int *t = malloc(n * sizeof *t);
    if (!t) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory for %zu tokens", path, n);
    if (fread(t, sizeof *t, n, f) != n) {
        free(t);
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: truncated in its tokens", path);
    }
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= vocab) {
            polar_status st = polar_fail(err, POLAR_ERR_FORMAT, "%s: token %zu is %d, outside the vocabulary", path, i, t[i]);
            free(t);
            return st;
        }
    *tokens = t;
    return POLAR_OK;
}

/* The largest logit and the log-sum-exp (in double) of a row. */
static double log_sum_exp(const float *logits, int n, float *max_out, int *argmax) {
    float mx = logits[0];
    int at = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > mx) mx = logits[i], at = i;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    if (max_out) *max_out = mx;
    if (argmax) *argmax = at;
    return mx + log(sum);
}

double logprobs_nll(const float *logits, int n, int target) { return log_sum_exp(logits, n, NULL, NULL) - logits[target]; }

/* The top k logits' ids, most likely first (ties to the lower id), by a
 * min-heap of k; heap: k ints. */
static void top_k(const float *logits, int n, int k, int *heap) {
#define LESS(a, b) (logits[a] < logits[b] || (logits[a] == logits[b] && (a) > (b)))
    int size = 0;
    for (int i = 0; i < n; i++) {
        if (size == k && !LESS(heap[0], i)) continue;
        int at;
        if (size < k) { /* sift up from the end */
            at = size++;
            while (at > 0 && LESS(i, heap[(at - 1) / 2])) heap[at] = heap[(at - 1) / 2], at = (at - 1) / 2;
        } else { /* replace the root, sift down */
            at = 0;
            for (;;) {
                int c = 2 * at + 1;
                if (c >= size) break;
                if (c + 1 < size && LESS(heap[c + 1], heap[c])) c++;
                if (!LESS(heap[c], i)) break;
                heap[at] = heap[c], at = c;
            }
        }
        heap[at] = i;
    }
    for (int end = size - 1; end > 0; end--) { /* heap sort: the smallest goes last */
        int last = heap[end];
        heap[end] = heap[0];
        int at = 0;
        for (;;) {
            int c = 2 * at + 1;
            if (c >= end) break;
            if (c + 1 < end && LESS(heap[c + 1], heap[c])) c++;
            if (!LESS(heap[c], last)) break;
            heap[at] = heap[c], at = c;
        }
        heap[at] = last;
    }
#undef LESS
}

double logprobs_encode(const logprobs_header *h, const float *logits, int target, void *record, float *work) {
    int V = (int)h->vocab;
    float mx;
    double lse = log_sum_exp(logits, V, &mx, NULL);
    float *r = record;
    if (h->llama) { /* llama-perplexity's rounding, step over 65535 */
        float lo = mx;
        for (int i = 0; i < V; i++) lo = logits[i] < lo ? logits[i] : lo;
        if (lo < mx - LLAMA_FLOOR_NATS) lo = mx - LLAMA_FLOOR_NATS;
        float step = (mx - lo) / 65535.0f;
        r[0] = step, r[1] = (float)(lo - lse);
        uint16_t *q = (uint16_t *)(r + 2);
        for (int i = 0; i < V; i++) q[i] = logits[i] > lo && step > 0 ? (uint16_t)lrintf((logits[i] - lo) / step) : 0;
        if (V % 2) q[V] = 0;
        return lse - logits[target];
    }
    r[0] = (float)(logits[target] - lse);
    if (h->top_k) {
        int k = (int)h->top_k, *ids = (int *)work;
        top_k(logits, V, k, ids);
        double in_top = 0;
        unsigned char *entry = (unsigned char *)record + 8;
        for (int i = 0; i < k; i++, entry += 8) {
            float lp = (float)(logits[ids[i]] - lse);
            in_top += exp((double)logits[ids[i]] - lse);
            memcpy(entry, &ids[i], 4);
            memcpy(entry + 4, &lp, 4);
        }
        r[1] = in_top < 1 ? (float)log(1 - in_top) : -INFINITY;
        return lse - logits[target];
    }
    float lo = mx;
    for (int i = 0; i < V; i++) lo = logits[i] < lo ? logits[i] : lo;
    if (lo < mx - FLOOR_NATS) lo = mx - FLOOR_NATS;
    float step = (mx - lo) / 65534.0f;
    r[1] = (float)(lo - lse), r[2] = step;
    uint16_t *q = (uint16_t *)(r + 3);
    for (int i = 0; i < V; i++)
        q[i] = logits[i] < lo ? 0 : step > 0 ? (uint16_t)(1 + lrintf((logits[i] - lo) / step)) : 1;
    if (V % 2) q[V] = 0;
    return lse - logits[target];
}

logprobs_cmp logprobs_compare(const logprobs_header *h, const float *logits, int target, const void *record) {
    int V = (int)h->vocab, top;
    float mx;
    double lse = log_sum_exp(logits, V, &mx, &top);
    const float *r = record;
    logprobs_cmp c = {.nll = lse - logits[target], .ref_nll = -r[0]};
    double kld = 0;
    if (h->llama) {
        const uint16_t *q = (const uint16_t *)(r + 2);
        int ref_top = 0;
        c.ref_nll = -((double)r[0] * q[target] + r[1]);
        for (int i = 0; i < V; i++) {
            if (q[i] > q[ref_top]) ref_top = i;
            double lp = (double)r[0] * q[i] + r[1];
            if (lp > -LLAMA_FLOOR_NATS) kld += exp(lp) * (lp - (logits[i] - lse));
        }
        c.same_top = ref_top == top;
        c.kld = kld;
        return c;
    }
    if (h->top_k) {
        const unsigned char *entry = (const unsigned char *)record + 8;
        double q_top = 0;
        int first = -1;
        for (uint32_t i = 0; i < h->top_k; i++, entry += 8) {
            int id;
            float lp;
            memcpy(&id, entry, 4), memcpy(&lp, entry + 4, 4);
            if (id < 0 || id >= V) continue; /* checked when read: a torn record counts nothing */
            if (first < 0) first = id;
            double lq = logits[id] - lse;
            kld += exp(lp) * (lp - lq);
            q_top += exp(lq);
        }
        if (isfinite(r[1]) && q_top < 1) kld += exp(r[1]) * (r[1] - log(1 - q_top));
        c.same_top = first == top;
    } else {
        const uint16_t *q = (const uint16_t *)(r + 3);
        int ref_top = 0;
        for (int i = 0; i < V; i++) {
            if (q[i] > q[ref_top]) ref_top = i;
            if (!q[i]) continue;
            double lp = r[1] + (double)r[2] * (q[i] - 1);
            kld += exp(lp) * (lp - (logits[i] - lse));
        }
        c.same_top = ref_top == top;
    }
    c.kld = kld;
    return c;
}
