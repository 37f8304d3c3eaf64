/* polar eval's per-question record as one JSON line, and reading the lines
 * of a results file back (for resuming a run and for its summary). The
 * format lives here only: the CLI writes through polar_eval_record_json and
 * the summary reads through eval_read_records. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loader/json.h"
#include "../runtime/error.h"
#include "eval.h"

int sbuf_add(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return 0;
        if (b->s && (size_t)n < room) {
            b->len += (size_t)n;
            return 1;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) return 0;
        b->s = s, b->cap = cap;
    }
}

/* Bytes that are not well-formed UTF-8 (a generation cut mid-character)
 * become U+FFFD, so that every line we write parses again. avail: the
 * bytes left at c. */
static size_t utf8_valid_len(const unsigned char *c, size_t avail) {
    size_t n = c[0] < 0x80 ? 1 : (c[0] & 0xe0) == 0xc0 && c[0] >= 0xc2 ? 2 : (c[0] & 0xf0) == 0xe0 ? 3
                                                                     : (c[0] & 0xf8) == 0xf0 && c[0] <= 0xf4 ? 4 : 0;
    if (n > avail) return 0;
    for (size_t i = 1; i < n; i++)
        if ((c[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((c[0] == 0xe0 && c[1] < 0xa0) || (c[0] == 0xed && c[1] >= 0xa0))) return 0;
    if (n == 4 && ((c[0] == 0xf0 && c[1] < 0x90) || (c[0] == 0xf4 && c[1] >= 0x90))) return 0;
    return n;
}

int sbuf_json_bytes(sbuf *b, const char *s, size_t len) {
    if (!sbuf_add(b, "\"")) return 0;
    const unsigned char *c = (const unsigned char *)s, *end = c + len;
    while (c < end) {
        size_t n = utf8_valid_len(c, (size_t)(end - c));
        int ok;
        if (!n) ok = sbuf_add(b, "\\ufffd"), n = 1;
        else if (*c == '"' || *c == '\\') ok = sbuf_add(b, "\\%c", *c);
        else if (*c == '\n') ok = sbuf_add(b, "\\n");
        else if (*c < 0x20) ok = sbuf_add(b, "\\u%04x", *c);
        else ok = sbuf_add(b, "%.*s", (int)n, (const char *)c);
        if (!ok) return 0;
        c += n;
    }
    return sbuf_add(b, "\"");
}

int sbuf_json_string(sbuf *b, const char *s) { return s ? sbuf_json_bytes(b, s, strlen(s)) : sbuf_add(b, "null"); }

polar_status sbuf_hand_out(polar_status st, sbuf *j, sbuf *t, char **json, char **table) {
    if (st != POLAR_OK) {
        free(j->s), free(t->s);
        return st;
    }
    if (json) *json = j->s;
    if (table) *table = t->s;
    return POLAR_OK;
}

char *polar_json_quote(const char *s) {
    sbuf b = {0};
    if (!sbuf_json_string(&b, s)) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

static int add_runs(sbuf *b, const char *key, const polar_eval_run *runs, int n) {
    int ok = sbuf_add(b, ",\"%s\":[", key);
    for (int i = 0; ok && i < n; i++) {
        const polar_eval_run *r = &runs[i];
        ok = sbuf_add(b, "%s{\"program\":", i ? "," : "") && sbuf_json_string(b, r->program) &&
             sbuf_add(b, ",\"executed_layers\":%d,\"sample\":%d,\"text\":", r->executed_layers, r->sample) &&
             sbuf_json_string(b, r->text) && sbuf_add(b, ",\"answer\":") && sbuf_json_string(b, r->answer) &&
             sbuf_add(b, ",\"correct\":%s,\"fallback_answer\":", r->correct ? "true" : "false") &&
             sbuf_json_string(b, r->fallback_answer) &&
             sbuf_add(b, ",\"fallback_correct\":%s,\"tokens\":%d,\"ms\":%.3f}", r->fallback_correct ? "true" : "false",
                      r->tokens, r->ms);
    }
    return ok && sbuf_add(b, "]");
}

polar_status polar_eval_record_json(const polar_eval_record *r, char **out, polar_error *err) {
    sbuf b = {0};
    /* "index" first: a resumed run finds the done questions without parsing */
    int ok = sbuf_add(&b, "{\"index\":%ld,\"line\":%ld,\"question\":", r->index, r->line) &&
             sbuf_json_string(&b, r->question) && sbuf_add(&b, ",\"gold\":") && sbuf_json_string(&b, r->gold) &&
             sbuf_add(&b, ",\"prompt\":") && sbuf_json_string(&b, r->prompt) &&
             sbuf_add(&b, ",\"prompt_tokens\":%d", r->prompt_tokens) &&
             add_runs(&b, "runs", r->runs, r->n_runs) && add_runs(&b, "samples", r->samples, r->n_samples) &&
             sbuf_add(&b, "}");
    if (!ok) {
        free(b.s);
        return polar_fail(err, POLAR_ERR_NOMEM, "eval: no memory for the record of question %ld", r->index);
    }
    *out = b.s;
    return POLAR_OK;
}

long polar_eval_record_index(const char *line) {
    long index;
    char close;
    /* a torn last line (the run was stopped mid-write) has no closing brace */
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
    if (n < 2 || line[n - 1] != '}') return -1;
    if (sscanf(line, "{\"index\":%ld%c", &index, &close) != 2 || close != ',' || index < 0) return -1;
    return index;
}

static int read_runs(const json_value *arr, eval_run_view **out, int *n) {
    *out = NULL, *n = 0;
    if (!arr || arr->type != JSON_ARRAY) return 1;
    if (!arr->len) return 1;
    eval_run_view *v = calloc(arr->len, sizeof *v);
    if (!v) return 0;
    for (size_t i = 0; i < arr->len; i++) {
        const json_value *r = arr->items[i], *p = json_get(r, "program"), *l = json_get(r, "executed_layers");
        const json_value *a = json_get(r, "answer"), *c = json_get(r, "correct");
        const json_value *fa = json_get(r, "fallback_answer"), *fc = json_get(r, "fallback_correct");
        v[i].program = p && p->type == JSON_STRING ? p->str : "";
        v[i].executed_layers = l && l->type == JSON_NUMBER ? (int)l->number : 0;
        v[i].answer = a && a->type == JSON_STRING ? a->str : NULL;
        v[i].correct = c && c->type == JSON_BOOL && c->number != 0;
        v[i].fallback_answer = fa && fa->type == JSON_STRING ? fa->str : NULL;
        v[i].fallback_correct = fc && fc->type == JSON_BOOL && fc->number != 0;
    }
    *out = v, *n = (int)arr->len;
    return 1;
}

void eval_records_free(eval_records *rs) {
    for (int i = 0; i < rs->n; i++) {
        free(rs->q[i].runs), free(rs->q[i].samples);
        json_free(rs->q[i].doc);
    }
    free(rs->q);
    memset(rs, 0, sizeof *rs);
}

polar_status eval_read_records(const char *path, eval_records *rs, polar_error *err) {
    memset(rs, 0, sizeof *rs);
    FILE *f = fopen(path, "rb");
    if (!f) return polar_fail(err, POLAR_ERR_IO, "%s: cannot open the results file", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    polar_status st = POLAR_OK;
    while (st == POLAR_OK && (got = jsonl_read_line(f, &line, &cap, JSONL_MAX_LINE)) > 0) {
        lineno++;
        if (polar_eval_record_index(line) < 0) continue; /* torn or foreign line: a resumed run rewrites it */
        eval_question q = {0};
        char what[64];
        snprintf(what, sizeof what, "line %ld", lineno);
        if ((st = json_parse(line, (size_t)got, what, &q.doc, err)) != POLAR_OK) break;
        const json_value *root = json_root(q.doc);
        q.index = (long)json_get(root, "index")->number;
        if (!read_runs(json_get(root, "runs"), &q.runs, &q.n_runs) ||
            !read_runs(json_get(root, "samples"), &q.samples, &q.n_samples)) {
            json_free(q.doc);
            st = polar_fail(err, POLAR_ERR_NOMEM, "%s: no memory for line %ld", path, lineno);
            break;
        }
        eval_question *grown = realloc(rs->q, (size_t)(rs->n + 1) * sizeof *grown);
        if (!grown) {
            free(q.runs), free(q.samples), json_free(q.doc);
            st = polar_fail(err, POLAR_ERR_NOMEM, "%s: no memory for line %ld", path, lineno);
            break;
        }
        rs->q = grown;
        rs->q[rs->n++] = q;
    }
    if (st == POLAR_OK && got < 0) st = jsonl_line_fail(got, path, lineno + 1, "results", err);
    free(line);
    fclose(f);
    if (st != POLAR_OK) eval_records_free(rs);
    return st;
}
