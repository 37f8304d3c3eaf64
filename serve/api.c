/* A request body -> serve_request (serve.h): the fields OpenAI defines for
 * completions and chat, and polar's own (program, top_k, min_p,
 * ignore_eos), each checked; the prompt tokenized (chat: the model's
 * template), the program parsed or predicted, the context and the KV pool
 * checked, so a request the engine takes can run. Unknown fields are
 * ignored; known ones polar does not do (echo, logit_bias, penalties,
 * tools, ...) are refused rather than ignored, so no client is told it got
 * what it did not. Every refusal names its field (docs/serve.md). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../loader/json.h"
#include "serve.h"

/* Refuse the request: fill f (its HTTP status, the field at fault, a
 * message naming it); returns -1. */
static int bad(serve_fail *f, int status, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int bad(serve_fail *f, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    f->status = status;
    snprintf(f->param, sizeof f->param, "%s", param);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *type_name(const json_value *v) {
    static const char *names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return names[v->type];
}

/* The getters: 0 when the field is absent or null (*out untouched), 1 when
 * read, -1 when refused (*f filled). */
static int get_int(const json_value *o, const char *key, double lo, double hi, long *out, serve_fail *f) {
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER || v->number != floor(v->number)) {
        return bad(f, 400, key, "%s: must be an integer, got %s", key, v->type == JSON_NUMBER ? "a fraction" : type_name(v));
    }
    if (v->number < lo || v->number > hi) {
        return bad(f, 400, key, "%s: must be from %.0f to %.0f, got %.0f", key, lo, hi, v->number);
    }
    *out = (long)v->number;
    return 1;
}

static int get_number(const json_value *o, const char *key, double lo, double hi, double *out, serve_fail *f) {
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER) {
        return bad(f, 400, key, "%s: must be a number, got %s", key, type_name(v));
    }
    if (!(v->number >= lo && v->number <= hi)) {
        return bad(f, 400, key, "%s: must be from %g to %g, got %g", key, lo, hi, v->number);
    }
    *out = v->number;
    return 1;
}

static int get_bool(const json_value *o, const char *key, int *out, serve_fail *f) {
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) {
        return bad(f, 400, key, "%s: must be true or false, got %s", key, type_name(v));
    }
    *out = v->number != 0;
    return 1;
}

/* Fields polar does not do: refused unless they ask for nothing. */
static int refuse_unsupported(const json_value *o, serve_fail *f) {
    static const char *const zero[] = {"presence_penalty", "frequency_penalty", "repetition_penalty"};
    static const char *const empty[] = {"logit_bias", "tools", "functions", "suffix", "tool_choice", "function_call"};
    for (size_t i = 0; i < sizeof zero / sizeof *zero; i++) {
        const json_value *v = json_get(o, zero[i]);
        if (v && v->type != JSON_NULL && !(v->type == JSON_NUMBER && v->number == 0))
            return bad(f, 400, zero[i], "%s: not supported by polar serve (only 0)", zero[i]);
    }
    for (size_t i = 0; i < sizeof empty / sizeof *empty; i++) {
        const json_value *v = json_get(o, empty[i]);
        if (v && v->type != JSON_NULL && !((v->type == JSON_STRING || v->type == JSON_ARRAY || v->type == JSON_OBJECT) &&
                                           v->len == 0) && !(v->type == JSON_STRING && !strcmp(v->str, "none")))
            return bad(f, 400, empty[i], "%s: not supported by polar serve", empty[i]);
    }
    int echo = 0;
    long best_of = 1;
    if (get_bool(o, "echo", &echo, f) < 0 || get_int(o, "best_of", 1, 1, &best_of, f) < 0) return -1;
    if (echo) return bad(f, 400, "echo", "echo: not supported by polar serve");
    const json_value *rf = json_get(o, "response_format"), *t = rf ? json_get(rf, "type") : NULL;
    if (rf && rf->type != JSON_NULL && !(t && t->type == JSON_STRING && !strcmp(t->str, "text")))
        return bad(f, 400, "response_format", "response_format: only {\"type\": \"text\"} is supported");
    return 0;
}

/* stop: a string or up to SERVE_MAX_STOP of them. */
static int get_stops(const json_value *o, serve_request *r, serve_fail *f) {
    const json_value *v = json_get(o, "stop");
    if (!v || v->type == JSON_NULL) return 0;
    int n = v->type == JSON_ARRAY ? (int)v->len : 1;
    if ((v->type != JSON_STRING && v->type != JSON_ARRAY) || n > SERVE_MAX_STOP)
        return bad(f, 400, "stop", "stop: must be a string or a list of up to %d strings", SERVE_MAX_STOP);
    for (int i = 0; i < n; i++) {
        const json_value *s = v->type == JSON_ARRAY ? v->items[i] : v;
        if (s->type != JSON_STRING || s->len == 0 || s->len > SERVE_MAX_STOP_LEN || strlen(s->str) != s->len)
            return bad(f, 400, "stop", "stop[%d]: must be a string of 1 to %d bytes", i, SERVE_MAX_STOP_LEN);
        if (!(r->stops[r->n_stops++] = strdup(s->str))) return bad(f, 500, "", "out of memory");
    }
    return 0;
}

/* The sampling and length fields into r->gen (max_new is set once the
 * prompt's length is known), n, logprobs, stream. */
static int get_options(serve_server *s, const json_value *o, serve_request *r, long *max_tokens, serve_fail *f) {
    long n = 1, top_k = 0, seed = 0, lp = 0, top = 0;
    double temperature = 1, top_p = 1, min_p = 0;
    int logprobs = 0, include_usage = 0, have_seed, st = 0;
    const char *max_key = r->kind == SERVE_CHAT && json_get(o, "max_completion_tokens") ? "max_completion_tokens"
                                                                                         : "max_tokens";
    const double max_seed = 9007199254740992.0; /* 2^53: beyond it a JSON number is not exact */
    if (get_bool(o, "stream", &r->stream, f) < 0 || get_int(o, "n", 1, SERVE_MAX_N, &n, f) < 0 ||
        get_int(o, max_key, 1, s->batch.max_ctx, max_tokens, f) < 0 ||
        get_number(o, "temperature", 0, 2, &temperature, f) < 0 || get_number(o, "top_p", 0, 1, &top_p, f) < 0 ||
        get_int(o, "top_k", 0, s->arch.vocab, &top_k, f) < 0 || get_number(o, "min_p", 0, 1, &min_p, f) < 0 ||
        (have_seed = get_int(o, "seed", -max_seed, max_seed, &seed, f)) < 0 ||
        get_bool(o, "ignore_eos", &r->gen.ignore_eos, f) < 0 || get_stops(o, r, f) < 0 || refuse_unsupported(o, f) < 0)
        return -1;
    if (top_p == 0) return bad(f, 400, "top_p", "top_p: must be above 0");
    const json_value *so = json_get(o, "stream_options");
    if (so && so->type != JSON_NULL && (so->type != JSON_OBJECT || get_bool(so, "include_usage", &include_usage, f) < 0))
        return bad(f, 400, "stream_options", "stream_options: must be an object {\"include_usage\": bool}");
    if (r->kind == SERVE_COMPLETION) { /* logprobs: how many top tokens, 0..5 */
        st = get_int(o, "logprobs", 0, 5, &lp, f);
        logprobs = st > 0, top = lp;
    } else { /* logprobs: a flag; top_logprobs: 0..20 with it */
        if (get_bool(o, "logprobs", &logprobs, f) < 0 || (st = get_int(o, "top_logprobs", 0, SERVE_MAX_TOP, &top, f)) < 0)
            return -1;
        if (st > 0 && top > 0 && !logprobs)
            return bad(f, 400, "top_logprobs", "top_logprobs: needs logprobs: true");
    }
    if (st < 0) return -1;
    r->n = (int)n, r->logprobs = logprobs, r->top_logprobs = (int)top, r->include_usage = include_usage;
    r->gen.temperature = (float)temperature, r->gen.top_p = (float)top_p, r->gen.top_k = (int)top_k;
    r->gen.min_p = (float)min_p;
    /* no seed: a different one each request */
    r->gen.seed = have_seed ? (uint64_t)seed : (uint64_t)(polar_time_ms() * 1e3) ^ ((uint64_t)r->created << 32);
    return 0;
}

/* ---------------------------------------------------------------- prompts */

static int add_prompt(serve_request *r, int *ids, int n) {
    if (!ids) return 0;
    r->prompts[r->n_prompts] = ids;
    r->n_prompt[r->n_prompts++] = n;
    return 1;
}

/* A text tokenized as the model's own tokenizer would: special tokens
 * parsed, the tokenizer's BOS added (or, for a chat prompt, spelled by the
 * template). */
static int tokenize_text(serve_server *s, serve_request *r, const char *text, size_t len, int chat, const char *param,
                         serve_fail *f) {
    polar_error err;
    int *ids = NULL, n = 0;
    if (polar_tokenize(s->tok, text, len, 1, !chat, &ids, &n, &err) != POLAR_OK)
        return bad(f, err.code == POLAR_ERR_NOMEM ? 500 : 400, param, "%s: %s", param, err.msg);
    if (n == 0) {
        polar_free(ids);
        return bad(f, 400, param, "%s: gives no tokens", param);
    }
    r->prompts[r->n_prompts] = ids;
    r->n_prompt[r->n_prompts++] = n;
    return 0;
}

static int token_list(serve_server *s, serve_request *r, const json_value *v, const char *param, serve_fail *f) {
    if (v->len == 0) return bad(f, 400, param, "%s: an empty list of tokens", param);
    int *ids = malloc(v->len * sizeof *ids);
    if (!add_prompt(r, ids, (int)v->len)) return bad(f, 500, "", "out of memory");
    for (size_t i = 0; i < v->len; i++) {
        const json_value *t = v->items[i];
        if (t->type != JSON_NUMBER || t->number != floor(t->number) || t->number < 0 || t->number >= s->arch.vocab)
            return bad(f, 400, param, "%s[%zu]: must be a token id from 0 to %d", param, i, s->arch.vocab - 1);
        ids[i] = (int)t->number;
    }
    return 0;
}

/* prompt: a string, a list of token ids, or a list of either. question
 * (for program auto): the text of each prompt, NULL for token ids. */
static int completion_prompts(serve_server *s, const json_value *o, serve_request *r, const char **question,
                              serve_fail *f) {
    const json_value *v = json_get(o, "prompt");
    if (!v || v->type == JSON_NULL) return bad(f, 400, "prompt", "prompt: required");
    int list = v->type == JSON_ARRAY && v->len > 0 && (v->items[0]->type == JSON_STRING || v->items[0]->type == JSON_ARRAY);
    size_t n = list ? v->len : 1;
    if ((v->type != JSON_STRING && v->type != JSON_ARRAY) || n > SERVE_MAX_PROMPTS)
        return bad(f, 400, "prompt", "prompt: must be a string, a list of token ids, or a list of up to %d of "
                                          "either", SERVE_MAX_PROMPTS);
    r->prompts = calloc(n, sizeof *r->prompts);
    r->n_prompt = calloc(n, sizeof *r->n_prompt);
    if (!r->prompts || !r->n_prompt) return bad(f, 500, "", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_value *p = list ? v->items[i] : v;
        char param[32];
        snprintf(param, sizeof param, list ? "prompt[%zu]" : "prompt", i);
        question[i] = p->type == JSON_STRING ? p->str : NULL;
        if (p->type == JSON_STRING) {
            if (tokenize_text(s, r, p->str, p->len, 0, param, f) < 0) return -1;
        } else if (p->type != JSON_ARRAY || token_list(s, r, p, param, f) < 0) {
            return p->type == JSON_ARRAY ? -1 : bad(f, 400, param, "%s: must be a string or token ids", param);
        }
    }
    return 0;
}

/* A message's content: a string, or text parts joined by newlines, into
 * *out (malloc'd). */
static int message_text(const json_value *c, const char *param, char **out, serve_fail *f) {
    if (!c || c->type == JSON_NULL) return (*out = strdup("")) ? 0 : bad(f, 500, "", "out of memory");
    if (c->type == JSON_STRING) return (*out = strdup(c->str)) ? 0 : bad(f, 500, "", "out of memory");
    if (c->type != JSON_ARRAY) return bad(f, 400, param, "%s: must be a string or a list of text parts", param);
    sbuf b = {0};
    int ok = sbuf_add(&b, "%s", "");
    for (size_t i = 0; ok && i < c->len; i++) {
        const json_value *part = c->items[i], *type = json_get(part, "type"), *text = json_get(part, "text");
        if (part->type != JSON_OBJECT || !type || type->type != JSON_STRING || strcmp(type->str, "text") || !text ||
            text->type != JSON_STRING) {
            free(b.s);
            return bad(f, 400, param, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported", param,
                            i);
        }
        ok = sbuf_add(&b, "%s%s", i ? "\n" : "", text->str);
    }
    if (!ok) free(b.s);
    *out = ok ? b.s : NULL;
    return ok ? 0 : bad(f, 500, "", "out of memory");
}

/* messages -> the model's chat template -> tokens; *question: the last
 * user turn (for program auto; malloc'd). */
static int chat_prompt(serve_server *s, const json_value *o, serve_request *r, char **question, serve_fail *f) {
    const json_value *v = json_get(o, "messages");
    if (!v || v->type != JSON_ARRAY || v->len == 0)
        return bad(f, 400, "messages", "messages: must be a non-empty list of {role, content}");
    if (!strcmp(polar_chat_template_name(s->tok), "none"))
        return bad(f, 400, "messages", "messages: this model carries no chat template polar knows; use "
                                            "/v1/completions");
    polar_chat_message *turns = calloc(v->len, sizeof *turns);
    char **texts = calloc(v->len, sizeof *texts);
    r->prompts = calloc(1, sizeof *r->prompts);
    r->n_prompt = calloc(1, sizeof *r->n_prompt);
    int rc = turns && texts && r->prompts && r->n_prompt ? 0 : bad(f, 500, "", "out of memory");
    for (size_t i = 0; !rc && i < v->len; i++) {
        const json_value *m = v->items[i], *role = json_get(m, "role");
        char param[48];
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const char *name = role && role->type == JSON_STRING ? role->str : "";
        if (m->type != JSON_OBJECT || (strcmp(name, "system") && strcmp(name, "developer") && strcmp(name, "user") &&
                                       strcmp(name, "assistant"))) {
            rc = bad(f, 400, param, "%s: must be system, developer, user or assistant", param);
            break;
        }
        snprintf(param, sizeof param, "messages[%zu].content", i);
        rc = message_text(json_get(m, "content"), param, &texts[i], f);
        turns[i] = (polar_chat_message){strcmp(name, "developer") ? name : "system", texts[i]};
        if (!rc && !strcmp(name, "user")) *question = texts[i];
    }
    char *text = NULL;
    polar_error err;
    if (!rc && polar_chat_format(s->tok, turns, (int)v->len, &text, &err) != POLAR_OK)
        rc = bad(f, 400, "messages", "messages: %s", err.msg);
    if (!rc) rc = tokenize_text(s, r, text, strlen(text), 1, "messages", f);
    polar_free(text);
    if (!rc && *question && !(*question = strdup(*question))) rc = bad(f, 500, "", "out of memory");
    if (rc) *question = NULL;
    for (size_t i = 0; texts && i < v->len; i++) free(texts[i]);
    free(texts);
    free(turns);
    return rc;
}

/* --------------------------------------------------------------- programs */

/* program: "base", a spec, "auto" (the predictor's best for the
 * question), or a list of layer indices; for prompt i. */
static int get_program(serve_server *s, const json_value *o, serve_request *r, int i, const char *question,
                       serve_fail *f) {
    const json_value *v = json_get(o, "program");
    polar_program *p = &r->programs[i];
    polar_error err;
    int D = s->arch.n_layers, cap = s->batch.max_program_len;
    if (v && v->type == JSON_ARRAY) {
        if (v->len == 0 || v->len > (size_t)cap)
            return bad(f, 400, "program", "program: must list 1 to %d layer indices", cap);
        if (!(p->layers = malloc(v->len * sizeof *p->layers))) return bad(f, 500, "", "out of memory");
        p->n = (int)v->len;
        for (size_t k = 0; k < v->len; k++) {
            const json_value *l = v->items[k];
            if (l->type != JSON_NUMBER || l->number != floor(l->number) || l->number < 0 || l->number >= D)
                return bad(f, 400, "program", "program[%zu]: must be a layer index from 0 to %d", k, D - 1);
            p->layers[k] = (int)l->number;
        }
    } else if (v && v->type != JSON_NULL && v->type != JSON_STRING) {
        return bad(f, 400, "program", "program: must be a string (base, auto or a spec such as 0-5,6-7x2) or a "
                                           "list of layer indices, got %s", type_name(v));
    } else if (v && v->type == JSON_STRING && !strcmp(v->str, "auto")) {
        if (!s->planner)
            return bad(f, 400, "program", "program: auto needs a predictor (start polar serve with --predictor)");
        if (!question) return bad(f, 400, "program", "program: auto predicts from text, not token ids");
        polar_candidate best;
        int n = 0;
        polar_decode_opts dopts = polar_decode_defaults();
        pthread_mutex_lock(&s->planner_mu);
        polar_status st = polar_planner_predict(s->planner, question, &dopts, &best, 1, &n, NULL, &err);
        pthread_mutex_unlock(&s->planner_mu);
        if (st != POLAR_OK || n < 1)
            return bad(f, st == POLAR_ERR_NOMEM ? 500 : 400, "program", "program: auto: %s", err.msg);
        *p = best.program;
        if (p->n > cap) return bad(f, 400, "program", "program: auto chose %d entries, more than %d", p->n, cap);
    } else if (polar_program_parse(v && v->type == JSON_STRING ? v->str : "base", D, cap, p, &err) != POLAR_OK) {
        return bad(f, 400, "program", "%s", err.msg); /* "program: ... at column N" */
    }
    int len = polar_program_format(p, NULL, 0);
    if (len < 0 || !(r->program_texts[i] = malloc((size_t)len + 1))) return bad(f, 500, "", "out of memory");
    polar_program_format(p, r->program_texts[i], (size_t)len + 1);
    return 0;
}

/* ---------------------------------------------------------------- choices */

/* The room each choice writes its tokens into, and its options. */
static int make_choices(serve_request *r, serve_fail *f) {
    int n = r->n_prompts * r->n;
    if (n > SERVE_MAX_N)
        return bad(f, 400, "n", "n: %d prompts x %d choices make %d, more than %d", r->n_prompts, r->n, n, SERVE_MAX_N);
    if (!(r->choices = calloc((size_t)n, sizeof *r->choices))) return bad(f, 500, "", "out of memory");
    r->n_choices = n;
    size_t max = (size_t)r->gen.max_new, top = (size_t)r->top_logprobs;
    for (int i = 0; i < r->n_choices; i++) {
        serve_choice *c = &r->choices[i];
        c->req = r, c->index = i, c->prompt = i / r->n;
        c->gen = r->gen;
        c->gen.seed = r->gen.seed + (uint64_t)i; /* the same seed, the same choices; and they differ */
        c->cap = 64 + 4 * max;
        c->text = malloc(c->cap);
        c->tokens = malloc(max * sizeof *c->tokens);
        int ok = c->text && c->tokens;
        if (ok && r->logprobs) {
            c->logprob = malloc(max * sizeof *c->logprob);
            c->top_id = malloc((max * top + 1) * sizeof *c->top_id);
            c->top_lp = malloc((max * top + 1) * sizeof *c->top_lp);
            ok = c->logprob && c->top_id && c->top_lp;
        }
        if (!ok) return bad(f, 500, "", "out of memory");
        c->text[0] = 0;
    }
    return 0;
}

/* Each prompt's length, with max_tokens, against the context and the KV
 * pool: what the batch checks when it adds, said before the request is
 * taken. */
static int check_room(serve_server *s, serve_request *r, long max_tokens, int chat, serve_fail *f) {
    const char *param = chat ? "messages" : "prompt";
    int ctx = s->batch.max_ctx, longest = 0;
    for (int i = 0; i < r->n_prompts; i++) longest = r->n_prompt[i] > longest ? r->n_prompt[i] : longest;
    if (longest >= ctx)
        return bad(f, 400, param, "%s: %d tokens, the context holds %d (with at least one to generate)", param,
                        longest, ctx);
    /* the last generated token is never run: it needs no room */
    if (!max_tokens) { /* chat: as long as the context allows; completions: the default, if it fits */
        max_tokens = ctx - longest + 1;
        if (!chat && s->o.default_max_tokens < max_tokens) max_tokens = s->o.default_max_tokens;
    }
    if (longest + max_tokens - 1 > ctx)
        return bad(f, 400, "max_tokens",
                        "max_tokens: %d prompt tokens + %ld to generate exceed the context of %d", longest, max_tokens,
                        ctx);
    r->gen.max_new = (int)max_tokens;
    for (int i = 0; i < r->n_prompts; i++) {
        size_t need = polar_batch_kv_bytes(s->model, &s->batch, 1, r->programs[i].n, r->n_prompt[i] + r->gen.max_new - 1);
        if (need > s->batch.kv_bytes)
            return bad(f, 400, "max_tokens", "max_tokens: %d tokens under a program of %d entries need %zu MiB of "
                                                  "KV cache, the pool holds %zu MiB",
                            r->n_prompt[i] + r->gen.max_new - 1, r->programs[i].n, need >> 20,
                            s->batch.kv_bytes >> 20);
    }
    return 0;
}

serve_request *api_parse(serve_server *s, serve_kind kind, const char *body, size_t len, serve_fail *f) {
    polar_error err;
    json_doc *doc = NULL;
    if (json_parse(body, len, "request body", &doc, &err) != POLAR_OK) {
        bad(f, err.code == POLAR_ERR_NOMEM ? 500 : 400, "", "%s", err.msg);
        return NULL;
    }
    const json_value *o = json_root(doc), *model = json_get(o, "model");
    serve_request *r = calloc(1, sizeof *r);
    const char *questions[SERVE_MAX_PROMPTS] = {0};
    char *chat_question = NULL;
    long max_tokens = 0;
    int rc = r ? 0 : bad(f, 500, "", "out of memory");
    if (r) {
        pthread_cond_init(&r->news, NULL);
        r->kind = kind, r->created = (long)time(NULL), r->arrived_ms = polar_time_ms(), r->stop_id = -1;
        snprintf(r->id, sizeof r->id, "%s-%ld", kind == SERVE_CHAT ? "chatcmpl" : "cmpl", ++s->next_id);
    }
    if (!rc && o->type != JSON_OBJECT) rc = bad(f, 400, "", "request body: must be a JSON object");
    if (!rc && model && model->type != JSON_NULL && (model->type != JSON_STRING || strcmp(model->str, s->o.model_name)))
        rc = bad(f, 404, "model", "model: '%s' is not served here (GET /v1/models lists '%s')",
                      model->type == JSON_STRING ? model->str : "?", s->o.model_name);
    if (!rc) rc = get_options(s, o, r, &max_tokens, f);
    if (!rc) rc = kind == SERVE_CHAT ? chat_prompt(s, o, r, &chat_question, f) : completion_prompts(s, o, r, questions, f);
    if (!rc) {
        r->programs = calloc((size_t)r->n_prompts, sizeof *r->programs);
        r->program_texts = calloc((size_t)r->n_prompts, sizeof *r->program_texts);
        if (!r->programs || !r->program_texts) rc = bad(f, 500, "", "out of memory");
    }
    for (int i = 0; !rc && i < r->n_prompts; i++)
        rc = get_program(s, o, r, i, kind == SERVE_CHAT ? chat_question : questions[i], f);
    if (!rc) rc = check_room(s, r, max_tokens, kind == SERVE_CHAT, f);
    if (!rc) {
        /* the end of an assistant turn stops completions too, as polar run's text prompts do */
        r->stop_id = polar_tokenizer_end_of_turn(s->tok);
        r->gen.stop = &r->stop_id, r->gen.n_stop = r->stop_id >= 0;
        rc = make_choices(r, f);
    }
    free(chat_question);
    json_free(doc);
    if (rc) {
        api_request_free(r);
        return NULL;
    }
    return r;
}

void api_request_free(serve_request *r) {
    if (!r) return;
    for (int i = 0; i < r->n_prompts; i++) {
        polar_free(r->prompts[i]);
        if (r->programs) polar_program_free(&r->programs[i]);
        if (r->program_texts) free(r->program_texts[i]);
    }
    free(r->prompts);
    free(r->n_prompt);
    free(r->programs);
    free(r->program_texts);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    for (int i = 0; i < r->n_choices; i++) {
        serve_choice *c = &r->choices[i];
        free(c->text);
        free(c->tokens);
        free(c->logprob);
        free(c->top_id);
        free(c->top_lp);
    }
    free(r->choices);
    pthread_cond_destroy(&r->news);
    free(r);
}
