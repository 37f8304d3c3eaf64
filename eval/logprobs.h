/* A reference's log-probabilities (polar_ppl_opts.save / .reference): the
 * file that carries them from one perplexity run to another, and what one
 * scored token's logits give against it.
 *
 * The file: "POLARLP1", then u32 ctx, vocab, chunks, top_k, then the
 * chunks' tokens (chunks x ctx i32), then per chunk one record per scored
 * token (ctx - 1 - ctx/2 of them), all native-endian:
 *   top_k 0: f32 the scored token's log-probability, f32 floor, f32 step,
 *            then u16 q[vocab rounded up to even]: a token's log-probability
 *            is floor + step x (q - 1), q = 0 below the floor (the most likely
 *            one's less 20: probabilities under 2e-9 of it are left out);
 *   top_k k: f32 the scored token's log-probability, f32 log of the
 *            probability outside the top k, then k x (i32 id, f32
 *            log-probability), most likely first.
 * llama-perplexity's file (--kl-divergence-base), read and written too:
 * "_logits_", u32 ctx, i32 vocab, i32 chunks, the tokens (chunks x ctx
 * i32), then per scored token f32 step, f32 floor and u16 q[vocab rounded
 * up to even]: a log-probability is floor + step x q, with the floor the
 * most likely one's less 16 (q = 0 at and below it). Its comparison is
 * llama.cpp's: only the reference's log-probabilities above -16 count in
 * the KL divergence. */
#ifndef POLAR_EVAL_LOGPROBS_H
#define POLAR_EVAL_LOGPROBS_H

#include <stdint.h>
#include <stdio.h>

#include "polar.h"

typedef struct {
    uint32_t ctx, vocab, chunks, top_k;
    int llama; /* llama-perplexity's layout (top_k 0) */
} logprobs_header;

/* Bytes of one scored token's record. */
size_t logprobs_record_bytes(const logprobs_header *h);

/* Scored tokens per chunk: the second half's, less its first. */
static inline int logprobs_scored(int ctx) { return ctx - 1 - ctx / 2; }

/* Write the header and tokens (chunks x ctx). */
polar_status logprobs_write_header(FILE *f, const char *path, const logprobs_header *h, const int *tokens,
                                   polar_error *err);

/* Read and check a header against the model's vocabulary and the file's
 * size; *tokens (allocated, chunks x ctx, each checked) the tokens. */
polar_status logprobs_read_header(FILE *f, const char *path, int vocab, logprobs_header *h, int **tokens,
                                  polar_error *err);

/* One token's logits (vocab floats) into its record; work: vocab floats
 * (top_k > 0: the selection). Returns the negative log-likelihood of
 * target. */
double logprobs_encode(const logprobs_header *h, const float *logits, int target, void *record, float *work);

/* What one token's logits give against its reference record. */
typedef struct {
    double nll, ref_nll; /* negative log-likelihoods of the scored token here and in the reference */
    double kld;          /* KL divergence of these log-probabilities from the reference's */
    int same_top;        /* the same most likely token */
} logprobs_cmp;

logprobs_cmp logprobs_compare(const logprobs_header *h, const float *logits, int target, const void *record);

/* The negative log-likelihood of target under logits (log-sum-exp in double). */
double logprobs_nll(const float *logits, int n, int target);

#endif
