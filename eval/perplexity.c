/* Perplexity and KL divergence as llama-perplexity computes them
 * (polar.h's polar_perplexity): each chunk of ctx tokens is an opened
 * sequence of a batch of one, its first half appended without outputs,
 * then the rest of it but its last token with every row's logits; the
 * logits of positions ctx/2 .. ctx-2 score tokens ctx/2+1 .. ctx-1. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "logprobs.h"

/* Sums over the scored tokens, as llama-perplexity keeps them. */
typedef struct {
    double nll, nll2, ref_nll, ref_nll2, nll_ref_nll, kld, kld2, dp, dp2, dp4;
    long same_top, count;
} sums;

/* Mean and standard error of a sum and a sum of squares over count. */
static void mean_err(double sum, double sum2, long count, double *mean, double *err) {
    *mean = count ? sum / count : 0;
    double var = count ? sum2 / count - *mean * *mean : 0;
    *err = var > 0 && count > 1 ? sqrt(var / (count - 1)) : 0;
}

/* Linear interpolation between the sorted values around a fraction. */
static double percentile(const float *sorted, long n, double fraction) {
    double p = fraction * (double)(n - 1);
    long i = (long)p;
    return i + 1 < n ? (1 - (p - i)) * sorted[i] + (p - i) * sorted[i + 1] : sorted[n - 1];
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void finish(const sums *s, float *klds, polar_ppl_result *r) {
    double mean, err;
    mean_err(s->nll, s->nll2, s->count, &mean, &err);
    r->ppl = exp(mean), r->ppl_err = r->ppl * err, r->tokens = s->count;
    if (!r->compared || !s->count) return;
    double ref_mean, ref_err;
    mean_err(s->ref_nll, s->ref_nll2, s->count, &ref_mean, &ref_err);
    r->ref_ppl = exp(ref_mean), r->ref_ppl_err = r->ref_ppl * ref_err;
    /* the covariance of the two means, for the uncertainty of their difference */
    double cov = s->count > 1 ? (s->nll_ref_nll / s->count - mean * ref_mean) / (s->count - 1) : 0;
    r->cor = err > 0 && ref_err > 0 ? cov / (err * ref_err) : 0;
    r->ln_ratio = mean - ref_mean;
    double var = err * err + ref_err * ref_err - 2 * cov;
    r->ln_ratio_err = var > 0 ? sqrt(var) : 0;
    mean_err(s->kld, s->kld2, s->count, &r->kld, &r->kld_err);
    double mse, mse_err;
    mean_err(s->dp2, s->dp4, s->count, &mse, &mse_err);
    r->dp_rms = sqrt(mse), r->dp_rms_err = r->dp_rms > 0 ? 0.5 / r->dp_rms * mse_err : 0;
    r->same_top = (double)s->same_top / s->count;
    r->same_top_err = s->count > 1 ? sqrt(r->same_top * (1 - r->same_top) / (s->count - 1)) : 0;
    qsort(klds, (size_t)s->count, sizeof *klds, cmp_float);
    long n = s->count;
    r->kld_min = klds[0], r->kld_max = klds[n - 1];
    r->kld_median = n % 2 ? klds[n / 2] : 0.5 * (klds[n / 2 - 1] + klds[n / 2]);
    r->kld_p999 = percentile(klds, n, 0.999), r->kld_p99 = percentile(klds, n, 0.99);
    r->kld_p95 = percentile(klds, n, 0.95), r->kld_p90 = percentile(klds, n, 0.90);
    r->kld_p10 = percentile(klds, n, 0.10), r->kld_p5 = percentile(klds, n, 0.05), r->kld_p1 = percentile(klds, n, 0.01);
}

/* What a run holds: the batch, the rows' logits, the reference file. */
typedef struct {
    polar_batch *b;
    int ctx, vocab, scored;
    float *logits;         /* [scored, vocab] a chunk's scored rows */
    unsigned char *records;/* [scored, record bytes] a chunk's reference or saved records */
    float *work;           /* [threads, vocab] top-k selections */
    float *klds;           /* [chunks x scored] every token's KL divergence, for the percentiles */
    int *chunk;            /* [ctx] a chunk's tokens as run (its first maybe the bos) */
    logprobs_header h;
    FILE *save, *ref;
} run_state;

static void run_free(run_state *s) {
    polar_batch_free(s->b);
    free(s->logits), free(s->records), free(s->work), free(s->klds), free(s->chunk);
    if (s->save) fclose(s->save);
    if (s->ref) fclose(s->ref);
}

/* Chunk c's scored rows: their logits into s->logits. */
static polar_status run_chunk(run_state *s, const polar_program *program, const int *tokens, int bos,
                              polar_error *err) {
    int first = s->ctx / 2, id;
    memcpy(s->chunk, tokens, (size_t)s->ctx * sizeof *s->chunk);
    if (bos >= 0) s->chunk[0] = bos;
    polar_batch_outputs out = {.logits = s->logits};
    polar_status st = polar_batch_open(s->b, program, s->ctx, &id, err);
    if (st != POLAR_OK) return st;
    if ((st = polar_batch_append(s->b, id, s->chunk, first, NULL, NULL, err)) == POLAR_OK &&
        (st = polar_batch_run(s->b, 1 << 30, NULL, NULL, NULL, err)) == POLAR_OK &&
        (st = polar_batch_append(s->b, id, s->chunk + first, s->ctx - 1 - first, NULL, &out, err)) == POLAR_OK)
        st = polar_batch_run(s->b, 1 << 30, NULL, NULL, NULL, err);
    polar_error ignored;
    polar_batch_remove(s->b, id, st == POLAR_OK ? err : &ignored);
    return st;
}

/* The scored rows of a chunk into the sums (and the records, saved or
 * compared); next: the chunk's tokens from position ctx/2 + 1 on. */
static void score_chunk(run_state *s, const int *next, sums *total, float *klds) {
    size_t rec = logprobs_record_bytes(&s->h);
    sums part[64];
    int nt = omp_get_max_threads() < 64 ? omp_get_max_threads() : 64;
    memset(part, 0, sizeof part);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
    for (int i = 0; i < s->scored; i++) {
        sums *p = &part[omp_get_thread_num()];
        const float *row = s->logits + (size_t)i * s->vocab;
        unsigned char *record = s->records + (size_t)i * rec;
        double nll;
        if (s->ref) {
            logprobs_cmp c = logprobs_compare(&s->h, row, next[i], record);
            double dp = exp(-c.nll) - exp(-c.ref_nll);
            nll = c.nll;
            p->ref_nll += c.ref_nll, p->ref_nll2 += c.ref_nll * c.ref_nll, p->nll_ref_nll += c.nll * c.ref_nll;
            p->kld += c.kld, p->kld2 += c.kld * c.kld, p->same_top += c.same_top;
            p->dp += dp, p->dp2 += dp * dp, p->dp4 += dp * dp * dp * dp;
            klds[i] = (float)c.kld;
        } else if (s->save) {
            nll = logprobs_encode(&s->h, row, next[i], record, s->work + (size_t)omp_get_thread_num() * s->vocab);
        } else {
            nll = logprobs_nll(row, s->vocab, next[i]);
        }
        p->nll += nll, p->nll2 += nll * nll, p->count++;
    }
    for (int t = 0; t < nt; t++) {
        const sums *p = &part[t];
        total->nll += p->nll, total->nll2 += p->nll2, total->ref_nll += p->ref_nll, total->ref_nll2 += p->ref_nll2;
        total->nll_ref_nll += p->nll_ref_nll, total->kld += p->kld, total->kld2 += p->kld2;
        total->dp += p->dp, total->dp2 += p->dp2, total->dp4 += p->dp4;
        total->same_top += p->same_top, total->count += p->count;
    }
}

/* The run's tokens, ctx and chunks (from the reference when there is one),
 * the batch and the buffers. */
static polar_status run_open(run_state *s, const polar_model *m, const polar_program *program, const int **tokens,
                             int *n_tokens, const polar_ppl_opts *o, int **ref_tokens, polar_error *err) {
    polar_model_info info;
    polar_model_info_get(m, &info);
    s->vocab = info.arch.vocab;
    s->ctx = o->ctx ? o->ctx : 512;
    polar_status st;
    if (o->reference) {
        if (!(s->ref = fopen(o->reference, "rb")))
            return polar_fail(err, POLAR_ERR_IO, "%s: cannot open the reference's log-probabilities", o->reference);
        if ((st = logprobs_read_header(s->ref, o->reference, s->vocab, &s->h, ref_tokens, err)) != POLAR_OK) return st;
        size_t n = (size_t)s->h.chunks * s->h.ctx;
        if (*tokens && (o->ctx && (uint32_t)o->ctx != s->h.ctx))
            return polar_fail(err, POLAR_ERR_ARG, "%s: a reference of ctx %u, not %d", o->reference, s->h.ctx, o->ctx);
        if (*tokens && ((size_t)*n_tokens < n || memcmp(*tokens, *ref_tokens, n * sizeof(int))))
            return polar_fail(err, POLAR_ERR_ARG, "%s: the reference scored other tokens than these", o->reference);
        s->ctx = (int)s->h.ctx, *tokens = *ref_tokens, *n_tokens = (int)n;
    }
    if (s->ctx < 4) return polar_fail(err, POLAR_ERR_ARG, "perplexity: a context of %d tokens (4 at least)", s->ctx);
    if (*n_tokens < s->ctx)
        return polar_fail(err, POLAR_ERR_RANGE, "perplexity: %d tokens, fewer than one chunk of %d", *n_tokens, s->ctx);
    int chunks = *n_tokens / s->ctx;
    if (o->max_chunks > 0 && o->max_chunks < chunks) chunks = o->max_chunks;
    if (s->ref && o->max_chunks > 0 && (uint32_t)o->max_chunks > s->h.chunks)
        return polar_fail(err, POLAR_ERR_ARG, "%s: %u chunks, not %d", o->reference, s->h.chunks, o->max_chunks);
    for (int i = 0; i < chunks * s->ctx; i++)
        if ((*tokens)[i] < 0 || (*tokens)[i] >= s->vocab)
            return polar_fail(err, POLAR_ERR_RANGE, "perplexity: token %d (at %d) is outside the vocabulary 0..%d",
                              (*tokens)[i], i, s->vocab - 1);
    if (o->save_llama && o->save_top_k)
        return polar_fail(err, POLAR_ERR_ARG, "perplexity: llama-perplexity's layout keeps the whole vocabulary, "
                                              "not a top %d", o->save_top_k);
    if (!s->ref)
        s->h = (logprobs_header){(uint32_t)s->ctx, (uint32_t)s->vocab, (uint32_t)chunks, (uint32_t)o->save_top_k,
                                 o->save_llama};
    s->h.chunks = (uint32_t)chunks;
    if (o->save_top_k < 0 || o->save_top_k > s->vocab)
        return polar_fail(err, POLAR_ERR_ARG, "perplexity: top %d of a vocabulary of %d", o->save_top_k, s->vocab);
    s->scored = logprobs_scored(s->ctx);
    int nt = omp_get_max_threads();
    polar_batch_opts bo = {.max_seqs = 1, .max_ctx = s->ctx, .max_program_len = program->n, .n_threads = o->n_threads,
                           .device = o->device, .kv_bf16 = o->kv_bf16,
                           .step_tokens = o->device == POLAR_DEVICE_CPU ? 64 : s->ctx};
    bo.kv_bytes = polar_batch_kv_bytes(m, &bo, 1, program->n, s->ctx);
    if ((st = polar_batch_create(m, &bo, &s->b, err)) != POLAR_OK) return st;
    s->logits = malloc((size_t)s->scored * s->vocab * sizeof *s->logits);
    s->records = malloc((size_t)s->scored * logprobs_record_bytes(&s->h));
    s->work = malloc((size_t)nt * s->vocab * sizeof *s->work);
    s->klds = malloc((size_t)chunks * s->scored * sizeof *s->klds);
    s->chunk = malloc((size_t)s->ctx * sizeof *s->chunk);
    if (!s->logits || !s->records || !s->work || !s->klds || !s->chunk)
        return polar_fail(err, POLAR_ERR_NOMEM, "perplexity: out of memory for %d rows of %d logits", s->scored, s->vocab);
    if (o->save) {
        if (!(s->save = fopen(o->save, "wb")))
            return polar_fail(err, POLAR_ERR_IO, "%s: cannot create the log-probabilities file", o->save);
        return logprobs_write_header(s->save, o->save, &s->h, *tokens, err);
    }
    return POLAR_OK;
}

polar_status polar_perplexity(const polar_model *m, const polar_program *program, const int *tokens, int n_tokens,
                              const polar_ppl_opts *opts, polar_ppl_result *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    polar_ppl_opts o = opts ? *opts : (polar_ppl_opts){.bos = -1};
    if (!m || !program || (!tokens && !o.reference) || n_tokens < 0)
        return polar_fail(err, POLAR_ERR_ARG, "perplexity: missing argument");
    if (o.save && o.reference)
        return polar_fail(err, POLAR_ERR_ARG, "perplexity: a run either saves a reference or compares with one");
    run_state s = {0};
    int *ref_tokens = NULL;
    polar_status st = run_open(&s, m, program, &tokens, &n_tokens, &o, &ref_tokens, err);
    if (st == POLAR_OK && o.bos >= s.vocab)
        st = polar_fail(err, POLAR_ERR_RANGE, "perplexity: bos %d is outside the vocabulary", o.bos);
    sums total = {0};
    size_t rec = logprobs_record_bytes(&s.h);
    int chunks = (int)s.h.chunks;
    out->compared = s.ref != NULL, out->ctx = s.ctx;
    for (int c = 0; st == POLAR_OK && c < chunks; c++) {
        const int *chunk = tokens + (size_t)c * s.ctx;
        if (s.ref && fread(s.records, rec, (size_t)s.scored, s.ref) != (size_t)s.scored)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: truncated at chunk %d", o.reference, c);
        if (st == POLAR_OK) st = run_chunk(&s, program, chunk, o.bos, err);
        if (st != POLAR_OK) break;
        score_chunk(&s, chunk + s.ctx / 2 + 1, &total, s.klds + (size_t)c * s.scored);
        if (s.save && fwrite(s.records, rec, (size_t)s.scored, s.save) != (size_t)s.scored)
            st = polar_fail(err, POLAR_ERR_IO, "%s: cannot write the log-probabilities", o.save);
        out->chunks = c + 1;
        if (o.progress) o.progress(c + 1, chunks, exp(total.nll / total.count), o.user);
    }
    if (st == POLAR_OK && s.save && fflush(s.save))
        st = polar_fail(err, POLAR_ERR_IO, "%s: cannot write the log-probabilities", o.save);
    if (st == POLAR_OK) finish(&total, s.klds, out);
    run_free(&s);
    free(ref_tokens);
    return st;
}
