/* What polar serve sends back, as OpenAI's API shapes it: errors, the model
 * list, whole completions and chat completions with usage, their streamed
 * chunks (server-sent events), and the Prometheus metrics. JSON is written
 * with the library's string builder (eval/eval.h: escapes, bytes that are
 * not UTF-8 as U+FFFD). Each choice also carries polar's "program": the
 * program of layers it ran. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

const int serve_status_codes[SERVE_N_STATUS] = {200, 400, 401, 404, 405, 413, 429, 500, 503, 504, 0};

int serve_status_index(int status) {
    int i = 0;
    while (serve_status_codes[i] && serve_status_codes[i] != status) i++;
    return i;
}

static const char *error_type(int status) {
    return status == 401 ? "authentication_error" : status == 429 ? "rate_limit_error"
                                                  : status >= 500 ? "server_error" : "invalid_request_error";
}

static int add_error(sbuf *b, const serve_fail *f) {
    return sbuf_add(b, "{\"error\":{\"message\":") && sbuf_json_string(b, f->msg) &&
           sbuf_add(b, ",\"type\":\"%s\",\"param\":", error_type(f->status)) &&
           sbuf_json_string(b, f->param[0] ? f->param : NULL) &&
           sbuf_add(b, ",\"code\":%s}}", f->status == 404 && !strcmp(f->param, "model") ? "\"model_not_found\"" : "null");
}

/* A finished text, or NULL (and nothing leaked) when out of memory. */
static char *done(sbuf *b, int ok) {
    if (ok) return b->s;
    free(b->s);
    return NULL;
}

char *reply_error(const serve_fail *f) {
    sbuf b = {0};
    return done(&b, add_error(&b, f) && sbuf_add(&b, "\n"));
}

char *reply_models(const serve_server *s) {
    sbuf b = {0};
    int ok = sbuf_add(&b, "{\"object\":\"list\",\"data\":[{\"id\":") && sbuf_json_string(&b, s->o.model_name) &&
             sbuf_add(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"polar\",\"max_model_len\":%d}]}\n",
                      s->started, s->batch.max_ctx);
    return done(&b, ok);
}

/* ---------------------------------------------------------- log-probs */

/* A log-probability as JSON (NaN, from a failed GPU copy, as null). */
static int add_lp(sbuf *b, float lp) { return isfinite(lp) ? sbuf_add(b, "%.6g", lp) : sbuf_add(b, "null"); }

static int add_piece(sbuf *b, const polar_tokenizer *tok, int id, int with_bytes) {
    const char *p = "";
    size_t n = 0;
    polar_token_piece(tok, id, &p, &n);
    int ok = sbuf_json_bytes(b, p, n);
    if (!with_bytes || !ok) return ok;
    ok = sbuf_add(b, ",\"bytes\":[");
    for (size_t i = 0; ok && i < n; i++) ok = sbuf_add(b, "%s%u", i ? "," : "", (unsigned char)p[i]);
    return ok && sbuf_add(b, "]");
}

/* Chat's form: {"content":[{token, logprob, bytes, top_logprobs}]}, tokens from..to. */
static int add_chat_logprobs(sbuf *b, const polar_tokenizer *tok, const serve_choice *c, int from, int to) {
    int top = c->req->top_logprobs, ok = sbuf_add(b, "{\"content\":[");
    for (int k = from; ok && k < to; k++) {
        ok = sbuf_add(b, "%s{\"token\":", k > from ? "," : "") && add_piece(b, tok, c->tokens[k], 1) &&
             sbuf_add(b, ",\"logprob\":") && add_lp(b, c->logprob[k]) && sbuf_add(b, ",\"top_logprobs\":[");
        for (int j = 0; ok && j < top; j++)
            ok = sbuf_add(b, "%s{\"token\":", j ? "," : "") && add_piece(b, tok, c->top_id[k * top + j], 1) &&
                 sbuf_add(b, ",\"logprob\":") && add_lp(b, c->top_lp[k * top + j]) && sbuf_add(b, "}");
        ok = ok && sbuf_add(b, "]}");
    }
    return ok && sbuf_add(b, "]}");
}

/* The completions' (legacy) form: tokens, token_logprobs, top_logprobs (a
 * token -> log-probability map per token), text_offset (where each token's
 * bytes start in the text). */
static int add_completion_logprobs(sbuf *b, const polar_tokenizer *tok, const serve_choice *c, int from, int to) {
    int top = c->req->top_logprobs, ok = sbuf_add(b, "{\"tokens\":[");
    const char *p;
    size_t n, offset = 0;
    for (int k = 0; k < from; k++) offset += polar_token_piece(tok, c->tokens[k], &p, &n) ? n : 0;
    for (int k = from; ok && k < to; k++) ok = sbuf_add(b, "%s", k > from ? "," : "") && add_piece(b, tok, c->tokens[k], 0);
    ok = ok && sbuf_add(b, "],\"token_logprobs\":[");
    for (int k = from; ok && k < to; k++) ok = sbuf_add(b, "%s", k > from ? "," : "") && add_lp(b, c->logprob[k]);
    ok = ok && sbuf_add(b, "],\"top_logprobs\":[");
    for (int k = from; ok && k < to; k++) {
        ok = sbuf_add(b, "%s{", k > from ? "," : "");
        for (int j = 0; ok && j < top; j++)
            ok = sbuf_add(b, "%s", j ? "," : "") && add_piece(b, tok, c->top_id[k * top + j], 0) && sbuf_add(b, ":") &&
                 add_lp(b, c->top_lp[k * top + j]);
        ok = ok && sbuf_add(b, "}");
    }
    ok = ok && sbuf_add(b, "],\"text_offset\":[");
    for (int k = from; ok && k < to; k++) {
        ok = sbuf_add(b, "%s%zu", k > from ? "," : "", offset);
        offset += polar_token_piece(tok, c->tokens[k], &p, &n) ? n : 0;
    }
    return ok && sbuf_add(b, "]}");
}

static int add_logprobs(sbuf *b, const serve_server *s, const serve_choice *c, int from, int to) {
    if (!c->logprob) return sbuf_add(b, "null");
    return c->req->kind == SERVE_CHAT ? add_chat_logprobs(b, s->tok, c, from, to)
                                      : add_completion_logprobs(b, s->tok, c, from, to);
}

/* ---------------------------------------------------------- responses */

static int add_head(sbuf *b, const serve_server *s, const serve_request *r, const char *object) {
    return sbuf_add(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%ld,\"model\":", r->id, object, r->created) &&
           sbuf_json_string(b, s->o.model_name);
}

static int add_usage(sbuf *b, const serve_request *r) {
    long prompt = 0, completion = 0;
    for (int i = 0; i < r->n_prompts; i++) prompt += r->n_prompt[i];
    for (int i = 0; i < r->n_choices; i++) completion += r->choices[i].n_tokens;
    return sbuf_add(b, "\"usage\":{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,\"total_tokens\":%ld}", prompt,
                    completion, prompt + completion);
}

char *reply_complete(const serve_server *s, const serve_request *r) {
    sbuf b = {0};
    int chat = r->kind == SERVE_CHAT;
    int ok = add_head(&b, s, r, chat ? "chat.completion" : "text_completion") && sbuf_add(&b, ",\"choices\":[");
    for (int i = 0; ok && i < r->n_choices; i++) {
        const serve_choice *c = &r->choices[i];
        ok = sbuf_add(&b, "%s{\"index\":%d,", i ? "," : "", i) &&
             (chat ? sbuf_add(&b, "\"message\":{\"role\":\"assistant\",\"content\":") : sbuf_add(&b, "\"text\":")) &&
             sbuf_json_bytes(&b, c->text, c->len) && sbuf_add(&b, chat ? "}," : ",") && sbuf_add(&b, "\"logprobs\":") &&
             add_logprobs(&b, s, c, 0, c->n_tokens) &&
             sbuf_add(&b, ",\"finish_reason\":\"%s\",\"program\":", c->finish ? c->finish : "length") &&
             sbuf_json_string(&b, r->program_texts[c->prompt]) && sbuf_add(&b, "}");
    }
    ok = ok && sbuf_add(&b, "],") && add_usage(&b, r) && sbuf_add(&b, "}\n");
    return done(&b, ok);
}

/* One event: a chunk of choice c: its first (the program it runs; chat:
 * the assistant's role), text and log-probabilities, or its end. */
static int add_chunk(sbuf *b, const serve_server *s, const serve_choice *c, const char *text, size_t n, int from,
                     int to, const char *finish) {
    const serve_request *r = c->req;
    int chat = r->kind == SERVE_CHAT;
    int ok = sbuf_add(b, "data: ") && add_head(b, s, r, chat ? "chat.completion.chunk" : "text_completion") &&
             sbuf_add(b, ",\"choices\":[{\"index\":%d,", c->index);
    if (chat && !c->started) ok = ok && sbuf_add(b, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    else if (chat && finish) ok = ok && sbuf_add(b, "\"delta\":{}");
    else ok = ok && sbuf_add(b, chat ? "\"delta\":{\"content\":" : "\"text\":") && sbuf_json_bytes(b, text, n) &&
              sbuf_add(b, chat ? "}" : "");
    ok = ok && sbuf_add(b, ",\"logprobs\":") &&
         (from < to ? add_logprobs(b, s, c, from, to) : sbuf_add(b, "null")) &&
         sbuf_add(b, ",\"finish_reason\":");
    ok = ok && (finish ? sbuf_add(b, "\"%s\"", finish) : sbuf_add(b, "null"));
    if (!c->started) ok = ok && sbuf_add(b, ",\"program\":") && sbuf_json_string(b, r->program_texts[c->prompt]);
    return ok && sbuf_add(b, "}]}\n\n");
}

int reply_stream(const serve_server *s, serve_request *r, sbuf *out, int *finished) {
    int ok = 1;
    *finished = 0;
    for (int i = 0; ok && i < r->n_choices; i++) {
        serve_choice *c = &r->choices[i];
        if (c->closed || (!c->admitted && !r->done)) continue;
        if (!c->started) {
            ok = add_chunk(out, s, c, "", 0, 0, 0, NULL);
            c->started = 1;
        }
        int to = c->logprob ? c->n_tokens : c->sent_tokens;
        if (ok && (c->ready > c->sent || to > c->sent_tokens)) {
            size_t n = c->ready - c->sent;
            c->sent = c->ready;
            ok = add_chunk(out, s, c, c->text + c->sent - n, n, c->sent_tokens, to, NULL);
            c->sent_tokens = to;
        }
        if (ok && c->finish) {
            ok = add_chunk(out, s, c, "", 0, 0, 0, c->finish);
            c->closed = 1;
        }
    }
    if (!ok || !r->done) return ok;
    if (r->status) { /* it failed after the stream began: say why, as an error event */
        serve_fail f = {.status = r->status};
        snprintf(f.msg, sizeof f.msg, "%s", r->error);
        ok = sbuf_add(out, "data: ") && add_error(out, &f) && sbuf_add(out, "\n\n");
    }
    if (ok && r->include_usage)
        ok = sbuf_add(out, "data: ") && add_head(out, s, r, r->kind == SERVE_CHAT ? "chat.completion.chunk"
                                                                                  : "text_completion") &&
             sbuf_add(out, ",\"choices\":[],") && add_usage(out, r) && sbuf_add(out, "}\n\n");
    ok = ok && sbuf_add(out, "data: [DONE]\n\n");
    *finished = ok;
    return ok;
}

/* ------------------------------------------------------------ metrics */

static int metric(sbuf *b, const char *name, const char *type, const char *help) {
    return sbuf_add(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *reply_metrics(serve_server *s) {
    serve_engine_stats e;
    engine_stats(s->engine, &e);
    sbuf b = {0};
    int ok = metric(&b, "polar_requests_total", "counter", "HTTP responses by status code (\"other\": the rest).");
    for (int i = 0; ok && i < SERVE_N_STATUS; i++) {
        long n = atomic_load(&s->by_status[i]);
        if (serve_status_codes[i]) ok = sbuf_add(&b, "polar_requests_total{code=\"%d\"} %ld\n", serve_status_codes[i], n);
        else ok = sbuf_add(&b, "polar_requests_total{code=\"other\"} %ld\n", n);
    }
    polar_batch_kv_info kv = e.kv;
    ok = ok && metric(&b, "polar_prompt_tokens_total", "counter", "Prompt tokens of the sequences added to the batch.") &&
         sbuf_add(&b, "polar_prompt_tokens_total %ld\n", e.prompt_tokens) &&
         metric(&b, "polar_generation_tokens_total", "counter", "Tokens generated.") &&
         sbuf_add(&b, "polar_generation_tokens_total %ld\n", e.generated_tokens) &&
         metric(&b, "polar_busy_seconds_total", "counter", "Time spent in batch steps.") &&
         sbuf_add(&b, "polar_busy_seconds_total %.3f\n", e.busy_s) &&
         metric(&b, "polar_tokens_per_second", "gauge", "Tokens generated per second of batch steps, since start.") &&
         sbuf_add(&b, "polar_tokens_per_second %.2f\n", e.busy_s > 0 ? e.generated_tokens / e.busy_s : 0.0) &&
         metric(&b, "polar_queue_depth", "gauge", "Requests waiting for room in the batch.") &&
         sbuf_add(&b, "polar_queue_depth %d\n", e.queued) &&
         metric(&b, "polar_batch_running", "gauge", "Sequences in the batch.") &&
         sbuf_add(&b, "polar_batch_running %d\n", e.running) &&
         metric(&b, "polar_requests_in_flight", "gauge", "Requests being answered.") &&
         sbuf_add(&b, "polar_requests_in_flight %d\n", atomic_load(&s->in_flight)) &&
         metric(&b, "polar_kv_blocks", "gauge",
                "KV pool blocks (16 tokens at one program entry): held, promised to running sequences, free.") &&
         sbuf_add(&b, "polar_kv_blocks{state=\"used\"} %d\npolar_kv_blocks{state=\"promised\"} %d\n"
                      "polar_kv_blocks{state=\"free\"} %d\n",
                  kv.used, kv.promised, kv.blocks - kv.used - kv.promised) &&
         metric(&b, "polar_kv_blocks_total", "gauge", "KV pool blocks.") &&
         sbuf_add(&b, "polar_kv_blocks_total %d\n", kv.blocks) &&
         metric(&b, "polar_prefix_cache_items", "gauge", "Prompt blocks kept by the prefix cache.") &&
         sbuf_add(&b, "polar_prefix_cache_items %d\n", kv.cached) &&
         metric(&b, "polar_up", "gauge", "1 while the batch works (0: it failed and every request is refused).") &&
         sbuf_add(&b, "polar_up %d\n", !e.failed);
    return done(&b, ok);
}
