/* polar serve: an OpenAI-compatible HTTP server on the batch engine, a
 * program of layers per request (docs/serve.md). Its files:
 *   http.c    libmicrohttpd: connections, routes, bodies, the API key, status codes, streaming
 *   api.c     a request body (JSON) -> serve_request, every field checked
 *   reply.c   what goes back: completions and chat as JSON and as server-sent events, errors,
 *             the model list, the metrics
 *   engine.c  the thread that owns the polar_batch: the admission queue, the steps, tokens back
 * cli/serve.c reads the options, opens the model and calls serve_run. The
 * state lives in a serve_server (no globals); the batch is touched by the
 * engine thread alone; HTTP threads and the engine meet under the engine's
 * mutex (requests queued, tokens and ends published, clients gone). */
#ifndef POLAR_SERVE_H
#define POLAR_SERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "../eval/eval.h"
#include "polar.h"

#define SERVE_MAX_STOP 4       /* stop strings per request (OpenAI's limit) */
#define SERVE_MAX_STOP_LEN 128 /* bytes per stop string */
#define SERVE_MAX_PROMPTS 64   /* prompts of one completions request */
#define SERVE_MAX_N 64         /* choices per prompt, and in all (prompts x n) */
#define SERVE_MAX_TOP 20       /* top log-probabilities per token (chat's limit; completions' is 5) */
#define SERVE_N_STATUS 11      /* the statuses counted apart (serve_status_codes) */

/* What polar serve was started with (cli/serve.c fills it). */
typedef struct {
    const char *host;        /* the address to bind: 127.0.0.1 unless told */
    int port;                /* 0: any free port (printed at start) */
    const char *api_key;     /* NULL: no key asked for */
    const char *model_name;  /* the id /v1/models lists and requests may name */
    size_t max_body;         /* bytes of a request body; more: 413 */
    int timeout_s;           /* a connection idle this long (slow headers or body) is closed */
    int deadline_s;          /* a request queued or running this long is cancelled: 504 */
    int queue;               /* requests that may wait beyond the batch's free slots; one more: 429 */
    int max_connections;     /* connections at once (a thread each) */
    int default_max_tokens;  /* completions without max_tokens (chat: what the context leaves) */
} serve_opts;

typedef enum { SERVE_COMPLETION, SERVE_CHAT } serve_kind;

struct serve_request;

/* One choice of a request: a sequence of the batch. */
typedef struct {
    struct serve_request *req;
    int index;               /* in the response */
    int prompt;              /* which of the request's prompts */
    polar_gen_opts gen;      /* the request's options, the seed + index */
    int seq;                 /* its batch sequence id while in the batch, else 0 */
    int admitted;            /* it has been added to the batch (and may have ended since) */
    /* written by the engine under its lock */
    char *text;              /* [cap] the text generated, NUL-terminated */
    size_t len, cap;
    size_t ready;            /* bytes of text that may be sent: no part of a character or of a stop string */
    int *tokens;             /* [max_tokens] the ids generated */
    int n_tokens;
    float *logprob;          /* [max_tokens] each chosen token's log-probability, or NULL: not asked for */
    int *top_id;             /* [max_tokens x top_logprobs] the most likely tokens at each step, */
    float *top_lp;           /* ... and theirs */
    const char *finish;      /* "stop" or "length" once ended, else NULL */
    int stop_hit;            /* a stop string ended it (text cut where it starts) */
    /* read and written by the HTTP thread alone */
    size_t sent;             /* bytes of text sent (streaming) */
    int sent_tokens;         /* log-probabilities sent (streaming) */
    int started, closed;     /* its first and last chunks went out (streaming) */
} serve_choice;

/* A request, parsed and checked (api.c), then queued for the engine. */
typedef struct serve_request {
    serve_kind kind;
    int stream, include_usage;
    int n_prompts;
    int **prompts, *n_prompt;     /* [n_prompts] token ids */
    polar_program *programs;      /* [n_prompts] */
    char **program_texts;         /* [n_prompts] their text form */
    int n;                        /* choices per prompt */
    polar_gen_opts gen;           /* sampling, max_new, ignore_eos; stop: &stop_id */
    int stop_id;                  /* the end of an assistant turn, or -1 */
    char *stops[SERVE_MAX_STOP];  /* stop strings */
    int n_stops;
    int logprobs;                 /* 1: each token's log-probability */
    int top_logprobs;             /* and this many most likely tokens' */
    serve_choice *choices;        /* [n_prompts x n] */
    int n_choices;
    char id[48];
    long created;                 /* Unix seconds */
    double arrived_ms;            /* polar_time_ms() */
    double deadline_ms;           /* cancelled (504) when still queued or running then */
    /* the engine's side, under its lock */
    pthread_cond_t news;          /* signalled on tokens, an end, or done */
    int queued;                   /* waiting in the admission queue */
    int ended;                    /* choices ended */
    int cancelled;                /* the client left: drop it */
    int done;                     /* the engine holds it no more (ended, dropped or failed): free to free */
    int status;                   /* 0, or an HTTP status it failed with after it was accepted (500, 504) */
    char error[600];
} serve_request;

typedef struct serve_engine serve_engine;

/* What /metrics reports of the engine. */
typedef struct {
    long prompt_tokens, generated_tokens; /* since start */
    double busy_s;                        /* time spent in steps */
    int queued, running;                  /* requests waiting; sequences in the batch */
    polar_batch_kv_info kv;
    int failed;                           /* the batch failed: every request is refused */
    const char *device, *kv_type;         /* polar_batch_device, polar_batch_kv_type */
} serve_engine_stats;

/* The server: its options, the model, the engine, the counters. */
typedef struct {
    serve_opts o;
    const polar_model *model;
    const polar_tokenizer *tok;
    polar_arch arch;
    polar_batch_opts batch;       /* as the batch was created (kv_bytes, max_ctx, max_program_len set) */
    polar_planner *planner;       /* --predictor: program "auto"; NULL: none */
    pthread_mutex_t planner_mu;   /* one question at a time */
    serve_engine *engine;
    long started;                 /* Unix seconds */
    atomic_int draining;          /* SIGTERM came: new requests get 503 */
    atomic_int in_flight;         /* requests being answered */
    atomic_long next_id;
    atomic_long by_status[SERVE_N_STATUS]; /* responses by status (serve_status_codes) */
} serve_server;

/* ---- engine.c */

/* Start the engine thread on a batch made with bo (it owns the batch from
 * now on). queue: requests that may wait beyond the batch's free slots. */
polar_status engine_start(const polar_model *m, const polar_tokenizer *tok, const polar_batch_opts *bo, int queue,
                          serve_engine **out, polar_error *err);
/* Let the engine finish what it has, then stop it and free the batch. */
void engine_stop(serve_engine *e);
/* Queue r: 0, or the HTTP status refusing it (429: the queue is full,
 * 503: the batch failed). */
int engine_submit(serve_engine *e, serve_request *r, double deadline_ms);
void engine_lock(serve_engine *e);
void engine_unlock(serve_engine *e);
/* With the lock held: wait up to ms milliseconds for news of r. */
void engine_wait(serve_engine *e, serve_request *r, int ms);
/* With the lock held: r's client left; returns once the engine has let
 * go of it (its sequences cancelled, their KV blocks back). */
void engine_cancel(serve_engine *e, serve_request *r);
void engine_stats(serve_engine *e, serve_engine_stats *out);

/* ---- api.c */

/* Why a request was refused: its HTTP status, the field at fault ("" when
 * none) and a message naming it. */
typedef struct {
    int status;
    char param[64];
    char msg[640];
} serve_fail;

/* The request a body asks for, checked against the model and the batch;
 * NULL with *f filled when refused. */
serve_request *api_parse(serve_server *s, serve_kind kind, const char *body, size_t len, serve_fail *f);
void api_request_free(serve_request *r);

/* ---- reply.c (each returns a malloc'd NUL-terminated text, NULL when out of memory) */

char *reply_error(const serve_fail *f);
char *reply_models(const serve_server *s);
char *reply_metrics(serve_server *s);
/* The whole response of a finished request, with usage. */
char *reply_complete(const serve_server *s, const serve_request *r);
/* With the engine's lock held: the server-sent events for what r has
 * gained since the last call (choices started, text, ends) appended to
 * out; then, once r is done, its usage (when asked for) and "data:
 * [DONE]", *finished set. Returns 0 when out of memory. */
int reply_stream(const serve_server *s, serve_request *r, sbuf *out, int *finished);
/* The statuses /metrics counts apart, the last (0) standing for any other;
 * the index of a status among them. */
extern const int serve_status_codes[SERVE_N_STATUS];
int serve_status_index(int status);

/* ---- http.c */

/* Block SIGTERM and SIGINT in the calling thread and the threads it makes
 * from now on (call it before any: serve_run waits for them with sigwait,
 * and a thread that did not block them would die of them). */
void serve_block_signals(void);
/* Serve until SIGTERM or SIGINT, then let the requests in flight finish
 * (new ones refused) and return. Prints "listening on http://HOST:PORT" on
 * stdout once the socket is bound. Returns 0, or 1 after printing why it
 * could not start. */
int serve_run(serve_server *s);

#endif
