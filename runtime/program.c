/* Program text -> layer index list.
 *
 *   program := "base" | json-list | term ("," term)*
 *   term    := INT | INT "-" INT, optionally followed by "x" INT (N >= 1)
 *   json-list := "[" INT ("," INT)* "]"
 * Whitespace anywhere is ignored. Errors give a 1-based column. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

typedef struct {
    const char *text;
    size_t pos;
    int n_layers, max_len;
    int *out;
    int n;
    polar_error *err;
} prog_parser;

static void skip_space(prog_parser *p) {
    while (p->text[p->pos] == ' ' || p->text[p->pos] == '\t' || p->text[p->pos] == '\n' || p->text[p->pos] == '\r')
        p->pos++;
}

static polar_status perr(prog_parser *p, size_t at, const char *fmt, ...) POLAR_PRINTF(3, 4);
static polar_status perr(prog_parser *p, size_t at, const char *fmt, ...) {
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return polar_fail(p->err, POLAR_ERR_PROGRAM, "program: %s at column %zu", why, at + 1);
}

/* A non-negative decimal integer; *at receives its column. */
static polar_status read_int(prog_parser *p, const char *what, long *v, size_t *at) {
    skip_space(p);
    *at = p->pos;
    const char *s = p->text + p->pos;
    if (*s < '0' || *s > '9') return perr(p, p->pos, *s ? "%s expected" : "%s expected, found the end", what);
    long x = 0;
    while (*s >= '0' && *s <= '9') {
        x = x * 10 + (*s - '0');
        if (x > INT_MAX) return perr(p, *at, "%s too large", what);
        s++;
    }
    p->pos = (size_t)(s - p->text);
    *v = x;
    return POLAR_OK;
}

static polar_status check_layer(prog_parser *p, long v, size_t at) {
    if (v >= p->n_layers)
        return perr(p, at, "layer %ld out of range (the model has layers 0..%d)", v, p->n_layers - 1);
    return POLAR_OK;
}

static polar_status emit(prog_parser *p, int layer, size_t at) {
    if (p->n >= p->max_len) return perr(p, at, "program longer than the limit of %d layers", p->max_len);
    p->out[p->n++] = layer;
    return POLAR_OK;
}

static polar_status parse_json_list(prog_parser *p) {
    p->pos++; /* '[' */
    skip_space(p);
    if (p->text[p->pos] == ']') return perr(p, p->pos, "empty program");
    for (;;) {
        long v;
        size_t at;
        polar_status st;
        if ((st = read_int(p, "layer index", &v, &at)) || (st = check_layer(p, v, at)) || (st = emit(p, (int)v, at)))
            return st;
        skip_space(p);
        char c = p->text[p->pos];
        if (c == ']') {
            p->pos++;
            skip_space(p);
            if (p->text[p->pos]) return perr(p, p->pos, "unexpected text after ']'");
            return POLAR_OK;
        }
        if (c != ',') return perr(p, p->pos, c ? "',' or ']' expected" : "',' or ']' expected, found the end");
        p->pos++;
    }
}

static polar_status parse_terms(prog_parser *p) {
    for (;;) {
        long a, b, reps = 1;
        size_t at_a, at_b, at_n;
        polar_status st;
        if ((st = read_int(p, "layer index", &a, &at_a)) || (st = check_layer(p, a, at_a))) return st;
        b = a;
        skip_space(p);
        if (p->text[p->pos] == '-') {
            p->pos++;
            if ((st = read_int(p, "range end", &b, &at_b)) || (st = check_layer(p, b, at_b))) return st;
            if (a > b) return perr(p, at_a, "range %ld-%ld runs backwards", a, b);
            skip_space(p);
        }
        if (p->text[p->pos] == 'x' || p->text[p->pos] == 'X') {
            p->pos++;
            if ((st = read_int(p, "repeat count", &reps, &at_n)) != POLAR_OK) return st;
            if (reps == 0) return perr(p, at_n, "repeat count x0 (must be at least 1)");
            skip_space(p);
        }
        for (long r = 0; r < reps; r++)
            for (long l = a; l <= b; l++)
                if ((st = emit(p, (int)l, at_a)) != POLAR_OK) return st;
        char c = p->text[p->pos];
        if (!c) return POLAR_OK;
        if (c != ',') return perr(p, p->pos, "',' expected between terms");
        p->pos++;
    }
}

polar_status polar_program_parse(const char *text, int n_layers, int max_len, polar_program *out, polar_error *err) {
    out->n = 0;
    out->layers = NULL;
    if (!text) return polar_fail(err, POLAR_ERR_ARG, "no program text given");
    if (n_layers < 1) return polar_fail(err, POLAR_ERR_ARG, "program: the model has no layers");
    if (max_len <= 0) max_len = n_layers > INT_MAX / 4 ? INT_MAX : 4 * n_layers;
    prog_parser p = {text, 0, n_layers, max_len, NULL, 0, err};
    skip_space(&p);
    const char *s = text + p.pos;
    if (!*s) return polar_fail(err, POLAR_ERR_PROGRAM, "program: empty program");
    size_t word = strlen("base");
    if (strncmp(s, "base", word) == 0) {
        p.pos += word;
        skip_space(&p);
        if (text[p.pos]) return perr(&p, p.pos, "unexpected text after 'base'");
        if (n_layers > max_len) return perr(&p, 0, "base program longer than the limit");
        return polar_program_base(n_layers, out, err);
    }
    p.out = malloc((size_t)max_len * sizeof *p.out);
    if (!p.out) return polar_fail(err, POLAR_ERR_NOMEM, "program: out of memory");
    polar_status st = *s == '[' ? parse_json_list(&p) : parse_terms(&p);
    if (st != POLAR_OK) {
        free(p.out);
        return st;
    }
    out->n = p.n;
    out->layers = p.out;
    return POLAR_OK;
}

polar_status polar_program_base(int n_layers, polar_program *out, polar_error *err) {
    out->n = 0;
    out->layers = NULL;
    if (n_layers < 1) return polar_fail(err, POLAR_ERR_ARG, "program: the model has no layers");
    out->layers = malloc((size_t)n_layers * sizeof *out->layers);
    if (!out->layers) return polar_fail(err, POLAR_ERR_NOMEM, "program: out of memory");
    for (int i = 0; i < n_layers; i++) out->layers[i] = i;
    out->n = n_layers;
    return POLAR_OK;
}

/* Length of the run of consecutive layers starting at i. */
static int run_length(const polar_program *p, int i) {
    int j = i + 1;
    while (j < p->n && p->layers[j] == p->layers[j - 1] + 1) j++;
    return j - i;
}

/* How many times layers[i .. i+len) occurs back to back from i. */
static int repeat_count(const polar_program *p, int i, int len) {
    int r = 1;
    while (i + (r + 1) * len <= p->n &&
           memcmp(p->layers + i, p->layers + i + r * len, (size_t)len * sizeof(int)) == 0)
        r++;
    return r;
}

/* The shortest text: a DP over suffixes choosing terms "A-B" repeated xN,
 * fewest terms first, then the most layers covered by repeats, so that
 * 0-5,6-7x2 is preferred to the equally short 0-7,6-7. */
int polar_program_format(const polar_program *p, char *buf, size_t size) {
    int n = p->n;
    int *terms = malloc((size_t)(n + 1) * sizeof *terms), *rep = malloc((size_t)(n + 1) * sizeof *rep);
    int *len = malloc((size_t)(n + 1) * sizeof *len), *cnt = malloc((size_t)(n + 1) * sizeof *cnt);
    if (size) buf[0] = 0;
    if (!terms || !rep || !len || !cnt) {
        free(terms);
        free(rep);
        free(len);
        free(cnt);
        return -1;
    }
    terms[n] = rep[n] = 0;
    for (int i = n - 1; i >= 0; i--) {
        terms[i] = INT_MAX;
        for (int L = 1, run = run_length(p, i); L <= run; L++)
            for (int r = 1, rmax = repeat_count(p, i, L); r <= rmax; r++) {
                int t = 1 + terms[i + L * r], cov = L * (r - 1) + rep[i + L * r];
                if (t < terms[i] || (t == terms[i] && cov > rep[i])) {
                    terms[i] = t;
                    rep[i] = cov;
                    len[i] = L;
                    cnt[i] = r;
                }
            }
    }
    size_t k = 0;
    for (int i = 0; i < n; i += len[i] * cnt[i]) {
        char term[48];
        int a = p->layers[i], b = p->layers[i + len[i] - 1];
        int t = a == b ? snprintf(term, sizeof term, "%d", a) : snprintf(term, sizeof term, "%d-%d", a, b);
        if (cnt[i] > 1) snprintf(term + t, sizeof term - (size_t)t, "x%d", cnt[i]);
        k += (size_t)snprintf(k < size ? buf + k : NULL, k < size ? size - k : 0, "%s%s", i ? "," : "", term);
    }
    free(terms);
    free(rep);
    free(len);
    free(cnt);
    return (int)k;
}

void polar_program_free(polar_program *p) {
    if (!p) return;
    free(p->layers);
    p->layers = NULL;
    p->n = 0;
}
