/* The engine of polar serve: one thread owns the polar_batch. HTTP threads
 * queue requests (engine_submit); between steps the engine drops those
 * whose client left or whose deadline passed, adds the queued ones the
 * batch has room for (oldest first: a request that does not fit yet holds
 * back those behind it, so none starves), runs one step, and publishes
 * each new token (text, log-probabilities) to its request and wakes its
 * thread. One step per polar_batch_run, so a request joins the batch at the
 * next step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/error.h"
#include "serve.h"

struct serve_engine {
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* the engine's: a request queued or cancelled, or stop */
    pthread_t thread;
    polar_batch *batch;         /* the engine thread's alone */
    const polar_tokenizer *tok;
    polar_arch arch;            /* vocab, the model's eos ids */
    serve_request **queue;      /* [queue_cap] a ring of requests waiting for room */
    int queue_cap, head, n_queued;
    int queue_max;              /* requests that may wait beyond the free slots of the batch */
    serve_choice **active;      /* [max_seqs] the choices in the batch; NULL: a free entry */
    int max_seqs, n_active;
    int stopping, failed;
    char fail_msg[600];
    serve_engine_stats st;      /* counters and the last snapshot of the pool */
};

/* ---------------------------------------------------------------- tokens */

static serve_choice *active_choice(const serve_engine *e, int id) {
    for (int i = 0; i < e->max_seqs; i++)
        if (e->active[i] && e->active[i]->seq == id) return e->active[i];
    return NULL;
}

/* A token that ends the turn (the batch stops the sequence on it): its
 * text is not part of the answer. */
static int ends_turn(const serve_engine *e, const serve_choice *c, int token) {
    if (c->gen.ignore_eos) return 0;
    if (token == c->req->stop_id) return 1;
    for (int i = 0; i < e->arch.n_eos; i++)
        if (e->arch.eos[i] == token) return 1;
    return 0;
}

/* token's log-probability under softmax(logits) (the model's distribution,
 * before temperature), and the k most likely tokens' (ties to the lower id). */
static void token_logprobs(const float *logits, int V, int token, int k, float *lp, int *top_id, float *top_lp) {
    if (!logits) { /* a GPU copy that failed: nothing to report */
        *lp = NAN;
        for (int j = 0; j < k; j++) top_id[j] = 0, top_lp[j] = NAN;
        return;
    }
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    *lp = (float)(logits[token] - lse);
    int n = 0; /* top_id[0..n) sorted by logit, descending */
    for (int i = 0; i < V && k > 0; i++) {
        if (n == k && logits[i] <= logits[top_id[n - 1]]) continue;
        int j = n < k ? n++ : n - 1;
        for (; j > 0 && logits[top_id[j - 1]] < logits[i]; j--) top_id[j] = top_id[j - 1];
        top_id[j] = i;
    }
    for (int j = 0; j < k; j++) top_lp[j] = (float)(logits[top_id[j]] - lse);
}

/* Bytes at the end of text that may be the start of a stop string: held
 * back until the next token says. */
static size_t stop_prefix_held(const serve_request *r, const char *text, size_t len) {
    size_t held = 0;
    for (int i = 0; i < r->n_stops; i++) {
        size_t m = strlen(r->stops[i]);
        for (size_t k = m - 1 < len ? m - 1 : len; k > held; k--)
            if (!memcmp(text + len - k, r->stops[i], k)) {
                held = k;
                break;
            }
    }
    return held;
}

/* The first stop string that ends in the bytes from `from` on: where it
 * starts, or -1. */
static long find_stop(const serve_request *r, const char *text, size_t len, size_t from) {
    long at = -1;
    for (int i = 0; i < r->n_stops; i++) {
        size_t m = strlen(r->stops[i]);
        size_t start = from >= m - 1 ? from - (m - 1) : 0;
        const char *hit = start < len ? memmem(text + start, len - start, r->stops[i], m) : NULL;
        if (hit && (at < 0 || hit - text < at)) at = hit - text;
    }
    return at;
}

/* Append a token's bytes to c's text; 1 when a stop string completes
 * (the text is cut where it starts) or memory runs out. Lock held. */
static int add_text(serve_choice *c, const char *p, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *t = realloc(c->text, cap);
        if (!t) {
            c->req->status = 500;
            snprintf(c->req->error, sizeof c->req->error, "out of memory for the generated text");
            return 1;
        }
        c->text = t, c->cap = cap;
    }
    size_t from = c->len;
    memcpy(c->text + c->len, p, n);
    c->len += n;
    c->text[c->len] = 0;
    long at = find_stop(c->req, c->text, c->len, from);
    if (at >= 0) {
        c->len = c->ready = (size_t)at;
        c->text[c->len] = 0;
        c->stop_hit = 1;
        return 1;
    }
    size_t ready = polar_utf8_complete(c->text, c->len - stop_prefix_held(c->req, c->text, c->len));
    if (ready > c->ready) c->ready = ready;
    return 0;
}

/* polar_batch_run's callback, on the engine thread: record the token and
 * tell the request's thread. Returns 1 to end the sequence (a stop string). */
static int on_token(int id, int token, void *user) {
    serve_engine *e = user;
    serve_choice *c = active_choice(e, id);
    if (!c) return 1;
    serve_request *r = c->req;
    float lp = 0, top_lp[SERVE_MAX_TOP];
    int top_id[SERVE_MAX_TOP];
    if (c->logprob) /* outside the lock: a pass over the vocabulary */
        token_logprobs(polar_batch_logits(e->batch, id), e->arch.vocab, token, r->top_logprobs, &lp, top_id, top_lp);
    const char *piece = NULL;
    size_t n = 0;
    int text = !ends_turn(e, c, token) && polar_token_piece(e->tok, token, &piece, &n);
    pthread_mutex_lock(&e->mu);
    int k = c->n_tokens++, stop = 0;
    c->tokens[k] = token;
    if (c->logprob) {
        c->logprob[k] = lp;
        memcpy(c->top_id + (size_t)k * r->top_logprobs, top_id, (size_t)r->top_logprobs * sizeof *top_id);
        memcpy(c->top_lp + (size_t)k * r->top_logprobs, top_lp, (size_t)r->top_logprobs * sizeof *top_lp);
    }
    if (text) stop = add_text(c, piece, n);
    pthread_cond_broadcast(&r->news);
    pthread_mutex_unlock(&e->mu);
    return stop;
}

/* ------------------------------------------------------------ requests */

static void queue_pop_at(serve_engine *e, int i) {
    for (int k = i; k < e->n_queued - 1; k++)
        e->queue[(e->head + k) % e->queue_cap] = e->queue[(e->head + k + 1) % e->queue_cap];
    e->n_queued--;
}

/* Choice in entry i of the batch leaves it (ended or cancelled): its
 * sequence removed, its KV blocks back in the pool. */
static void release_choice(serve_engine *e, int i) {
    serve_choice *c = e->active[i];
    serve_request *r = c->req;
    polar_batch_remove(e->batch, c->seq, NULL);
    c->seq = 0;
    e->active[i] = NULL;
    e->n_active--;
    r->ended++;
    r->done = !r->queued && r->ended == r->n_choices;
    pthread_cond_broadcast(&r->news);
}

/* The engine lets go of r now: its sequences cancelled, out of the queue;
 * status (when not 0) and why are what its client is told. */
static void drop(serve_engine *e, serve_request *r, int status, const char *why) {
    for (int i = 0; i < e->max_seqs; i++)
        if (e->active[i] && e->active[i]->req == r) release_choice(e, i);
    for (int i = 0; r->queued && i < e->n_queued; i++)
        if (e->queue[(e->head + i) % e->queue_cap] == r) queue_pop_at(e, i), r->queued = 0;
    if (status && !r->status) {
        r->status = status;
        snprintf(r->error, sizeof r->error, "%s", why);
    }
    r->done = 1;
    pthread_cond_broadcast(&r->news);
}

/* Requests whose client left or whose deadline passed, and (stopping or
 * failed) every request, are dropped. Backwards: a drop moves only the
 * entries after it, seen already. */
static void drop_gone(serve_engine *e) {
    double now = polar_time_ms();
    int all = e->stopping || e->failed;
    const char *why = e->failed ? e->fail_msg : "the server is shutting down";
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? e->n_queued : e->max_seqs;
        for (int i = n - 1; i >= 0; i--) {
            serve_request *r = pass ? e->queue[(e->head + i) % e->queue_cap] : e->active[i] ? e->active[i]->req : NULL;
            if (!r || r->done) continue;
            if (r->cancelled) drop(e, r, 0, "");
            else if (all) drop(e, r, e->failed ? 500 : 503, why);
            else if (now > r->deadline_ms) drop(e, r, 504, "the request's deadline passed before it finished");
        }
    }
}

/* Add the queued requests' choices while the batch has room, oldest
 * first. */
static void admit(serve_engine *e) {
    while (e->n_queued > 0) {
        serve_request *r = e->queue[e->head];
        for (int i = 0; i < r->n_choices; i++) {
            serve_choice *c = &r->choices[i];
            if (c->admitted) continue;
            polar_error err;
            int id = 0;
            polar_status st = polar_batch_add(e->batch, &r->programs[c->prompt], r->prompts[c->prompt],
                                              r->n_prompt[c->prompt], &c->gen, &id, &err);
            if (st == POLAR_ERR_FULL) return; /* room comes when a sequence ends */
            if (st != POLAR_OK) {
                drop(e, r, st == POLAR_ERR_RANGE || st == POLAR_ERR_ARG ? 400 : 500, err.msg);
                break;
            }
            int slot = 0;
            while (e->active[slot]) slot++; /* the batch holds at most max_seqs: there is one */
            e->active[slot] = c;
            e->n_active++;
            c->seq = id, c->admitted = 1;
            e->st.prompt_tokens += r->n_prompt[c->prompt];
        }
        if (r->queued) { /* every choice is in: out of the queue */
            e->head = (e->head + 1) % e->queue_cap;
            e->n_queued--;
            r->queued = 0;
            r->done = r->ended == r->n_choices;
        }
    }
}

/* After a step: the choices whose sequence ended leave the batch. */
static void collect_ended(serve_engine *e) {
    for (int i = 0; i < e->max_seqs; i++) {
        serve_choice *c = e->active[i];
        polar_seq_info info;
        if (!c || polar_batch_seq(e->batch, c->seq, &info, NULL) != POLAR_OK || info.state != POLAR_SEQ_ENDED)
            continue;
        c->finish = c->stop_hit || info.stopped_at_eos ? "stop" : "length";
        c->ready = c->len; /* a held-back start of a stop string that never came is text after all */
        release_choice(e, i);
    }
}

static void *engine_main(void *arg) {
    serve_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        drop_gone(e);
        if (!e->failed) admit(e);
        polar_batch_kv(e->batch, &e->st.kv);
        if (e->stopping && !e->n_active) break;
        if (!e->n_active) { /* idle: wait for a request, waking now and then for the queue's deadlines */
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 200 * 1000000L;
            if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->wake, &e->mu, &t);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        polar_error err;
        polar_batch_run_stats rs;
        double t0 = polar_time_ms();
        polar_status st = polar_batch_run(e->batch, 1, on_token, e, &rs, &err);
        double ms = polar_time_ms() - t0;
        pthread_mutex_lock(&e->mu);
        e->st.busy_s += ms / 1000, e->st.generated_tokens += rs.tokens;
        if (st != POLAR_OK) { /* a device error: the batch is unusable from now on */
            e->failed = 1;
            snprintf(e->fail_msg, sizeof e->fail_msg, "the batch failed: %s", err.msg);
            fprintf(stderr, "polar serve: error: %s\n", e->fail_msg);
            continue;
        }
        collect_ended(e);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ------------------------------------------------------------- the API */

polar_status engine_start(const polar_model *m, const polar_tokenizer *tok, const polar_batch_opts *bo, int queue,
                          serve_engine **out, polar_error *err) {
    *out = NULL;
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory starting the engine");
    polar_model_info info;
    polar_model_info_get(m, &info);
    e->arch = info.arch, e->tok = tok;
    /* requests that arrive during a step wait for the next even when the batch has room for them */
    e->queue_max = queue > 0 ? queue : 1, e->max_seqs = bo->max_seqs, e->queue_cap = e->queue_max + e->max_seqs;
    e->queue = calloc((size_t)e->queue_cap, sizeof *e->queue);
    e->active = calloc((size_t)e->max_seqs, sizeof *e->active);
    polar_status st = !e->queue || !e->active ? polar_fail(err, POLAR_ERR_NOMEM, "out of memory starting the engine")
                                              : polar_batch_create(m, bo, &e->batch, err);
    if (st == POLAR_OK) {
        pthread_mutex_init(&e->mu, NULL);
        pthread_cond_init(&e->wake, NULL);
        if (pthread_create(&e->thread, NULL, engine_main, e)) {
            pthread_cond_destroy(&e->wake);
            pthread_mutex_destroy(&e->mu);
            st = polar_fail(err, POLAR_ERR_NOMEM, "cannot start the engine thread");
        }
    }
    if (st != POLAR_OK) {
        polar_batch_free(e->batch);
        free(e->queue);
        free(e->active);
        free(e);
        return st;
    }
    polar_batch_kv(e->batch, &e->st.kv);
    e->st.device = polar_batch_device(e->batch), e->st.kv_type = polar_batch_kv_type(e->batch);
    *out = e;
    return POLAR_OK;
}

void engine_stop(serve_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->mu);
    polar_batch_free(e->batch);
    free(e->queue);
    free(e->active);
    free(e);
}

int engine_submit(serve_engine *e, serve_request *r, double deadline_ms) {
    pthread_mutex_lock(&e->mu);
    int status = e->failed || e->stopping ? 503 : e->n_queued >= e->queue_max + e->max_seqs - e->n_active ? 429 : 0;
    if (!status) {
        e->queue[(e->head + e->n_queued++) % e->queue_cap] = r;
        r->queued = 1, r->deadline_ms = deadline_ms;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->mu);
    return status;
}

void engine_lock(serve_engine *e) { pthread_mutex_lock(&e->mu); }
void engine_unlock(serve_engine *e) { pthread_mutex_unlock(&e->mu); }

void engine_wait(serve_engine *e, serve_request *r, int ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&r->news, &e->mu, &t);
}

void engine_cancel(serve_engine *e, serve_request *r) {
    if (r->done) return;
    r->cancelled = 1;
    pthread_cond_signal(&e->wake);
    while (!r->done) pthread_cond_wait(&r->news, &e->mu);
}

void engine_stats(serve_engine *e, serve_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->queued = e->n_queued, out->running = e->n_active, out->failed = e->failed;
    pthread_mutex_unlock(&e->mu);
}
