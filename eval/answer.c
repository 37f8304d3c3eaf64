/* Answer checking for `polar eval`: pull the answer out of a model's text
 * (\boxed{}, the last number, a choice letter), bring answers to a normal
 * form the way common math-eval harnesses do (their strip_string rules), and
 * compare two answers numerically or as text. Every function takes any bytes
 * and never fails: a missing answer is "not found", not an error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "polar.h"

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_alnum(int c) { return is_digit(c) || is_alpha(c); }
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int to_upper(int c) { return c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c; }

static void copy_out(char *out, size_t cap, const char *p, size_t n) {
    if (!out || cap == 0) return;
    if (n > cap - 1) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* --------------------------------------------------------- growing string */

/* Each normalisation pass reads a string and writes a new one here; a failed
 * allocation marks the buffer and the whole normal form becomes NULL. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_putn(sbuf *b, const char *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}
static void sb_put(sbuf *b, char c) { sb_putn(b, &c, 1); }
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* The finished string (never NULL unless out of memory); frees in. */
static char *sb_done(sbuf *b, char *in) {
    free(in);
    if (!b->s) sb_putn(b, "", 0);
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    return b->s;
}

static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* ------------------------------------------------------------- extraction */

/* The content [*b, *e) of the last \boxed or \fbox in t; 0 when there is
 * none or the last one is unclosed (a truncated answer is no answer). */
static int last_box(const char *t, const char **b, const char **e) {
    const char *at = NULL;
    size_t skip = 0;
    for (const char *p = strchr(t, '\\'); p; p = strchr(p + 1, '\\')) {
        size_t n = starts(p, "\\boxed") ? 6 : starts(p, "\\fbox") ? 5 : 0;
        if (n && !is_alpha((unsigned char)p[n])) at = p, skip = n; /* not \boxedfoo */
    }
    if (!at) return 0;
    const char *c = at + skip;
    const char *s = c;
    while (*s == ' ') s++;
    if (*s != '{') {
        /* "\boxed 5": the word after the space, as harnesses accept it. */
        if (s == c || !*s) return 0;
        const char *w = s;
        while (*w && !is_space((unsigned char)*w) && *w != '$') w++;
        if (w == s) return 0;
        *b = s;
        *e = w;
        return 1;
    }
    int depth = 0;
    for (const char *q = s; *q; q++) {
        if (*q == '\\' && (q[1] == '{' || q[1] == '}')) {
            q++; /* an escaped brace is text, not nesting */
            continue;
        }
        if (*q == '{') depth++;
        if (*q == '}' && --depth == 0) {
            *b = s + 1;
            *e = q;
            return 1;
        }
    }
    return 0;
}

int polar_answer_boxed(const char *text, char *out, size_t cap) {
    const char *b, *e;
    if (!text || !last_box(text, &b, &e)) {
        copy_out(out, cap, "", 0);
        return 0;
    }
    copy_out(out, cap, b, (size_t)(e - b));
    return 1;
}

/* End of the number starting at t[i] (a digit, or '.' before a digit):
 * digits with thousands separators, a fraction, a "/denominator". */
static size_t number_end(const char *t, size_t i) {
    size_t j = i;
    while (is_digit((unsigned char)t[j])) j++;
    while (j > i && t[j] == ',' && is_digit((unsigned char)t[j + 1]) && is_digit((unsigned char)t[j + 2]) &&
           is_digit((unsigned char)t[j + 3]) && !is_digit((unsigned char)t[j + 4]))
        j += 4;
    if (t[j] == '.' && is_digit((unsigned char)t[j + 1])) {
        j++;
        while (is_digit((unsigned char)t[j])) j++;
    }
    if (t[j] == '/' && is_digit((unsigned char)t[j + 1])) {
        j++;
        while (is_digit((unsigned char)t[j])) j++;
    }
    return j;
}

int polar_answer_last_number(const char *text, char *out, size_t cap) {
    const char *t = text ? text : "";
    size_t best = 0, best_n = 0, i = 0;
    int found = 0;
    while (t[i]) {
        int prev_num = i > 0 && (is_digit((unsigned char)t[i - 1]) || t[i - 1] == '.');
        int start = !prev_num && (is_digit((unsigned char)t[i]) || (t[i] == '.' && is_digit((unsigned char)t[i + 1])));
        if (!start) {
            i++;
            continue;
        }
        size_t s = i, j = number_end(t, i);
        /* A minus is a sign unless it follows an operand ("5-3" ends in 3). */
        if (s > 0 && t[s - 1] == '-' && (s == 1 || !(is_alnum((unsigned char)t[s - 2]) || t[s - 2] == ')'))) s--;
        best = s;
        best_n = j - s;
        found = 1;
        i = j;
    }
    copy_out(out, cap, t + best, found ? best_n : 0);
    return found;
}

/* The index of letter c among n choices, or -1. */
static int letter_index(int c, int n) {
    c = to_upper(c);
    return c >= 'A' && c < 'A' + n ? c - 'A' : -1;
}

/* A letter at s followed by no other letter or digit ("B", "B)", "B. 42"),
 * after an optional "(", "$", "\text{", "**" or spaces. */
static int letter_at(const char *s, int n, int upper_only) {
    for (;;) {
        while (*s == ' ' || *s == '(' || *s == '$' || *s == '*' || *s == '{' || *s == '[') s++;
        if (starts(s, "\\text{") || starts(s, "\\mathrm{") || starts(s, "\\textbf{")) {
            s = strchr(s, '{') + 1;
            continue;
        }
        break;
    }
    if (upper_only && !(*s >= 'A' && *s <= 'Z')) return -1;
    if (!is_alpha((unsigned char)*s) || is_alnum((unsigned char)s[1])) return -1;
    return letter_index((unsigned char)*s, n);
}

/* The last case-insensitive occurrence of needle in t, or NULL. */
static const char *last_icase(const char *t, const char *needle) {
    size_t n = strlen(needle);
    const char *last = NULL;
    for (const char *p = t; *p; p++) {
        size_t k = 0;
        while (k < n && p[k] && to_upper((unsigned char)p[k]) == to_upper((unsigned char)needle[k])) k++;
        if (k == n) last = p;
    }
    return last;
}

int polar_answer_choice(const char *text, int n_choices) {
    if (!text || n_choices < 1 || n_choices > 26) return -1;
    const char *b, *e;
    if (last_box(text, &b, &e)) {
        char buf[64];
        copy_out(buf, sizeof buf, b, (size_t)(e - b));
        int k = letter_at(buf, n_choices, 0);
        if (k >= 0) return k;
    }
    static const char *const cues[] = {"answer is", "answer:", "answer is:", "option", "choice is"};
    const char *best = NULL;
    size_t best_len = 0;
    for (size_t i = 0; i < sizeof cues / sizeof cues[0]; i++) {
        const char *p = last_icase(text, cues[i]);
        if (p && (!best || p > best || (p == best && strlen(cues[i]) > best_len))) best = p, best_len = strlen(cues[i]);
    }
    if (best) {
        const char *s = best + best_len;
        while (*s == ' ' || *s == ':') s++;
        int k = letter_at(s, n_choices, 1);
        if (k >= 0) return k;
    }
    const char *s = text;
    while (is_space((unsigned char)*s)) s++;
    const char *l = *s == '(' ? s + 1 : s;
    if (*l >= 'A' && *l <= 'Z') {
        /* "B", "(B)", "B)", "B." or "B: ..." at the start; not "A cell ...". */
        char after = l[1];
        int word = is_space((unsigned char)after) && l[2] >= 'a' && l[2] <= 'z'; /* "A cell", "I think" */
        if (!word && (after == '\0' || after == ')' || after == '.' || after == ':' || is_space((unsigned char)after))) {
            int k = letter_index(*l, n_choices);
            if (k >= 0) return k;
        }
    }
    int k = -1;
    for (const char *p = text; *p; p++)
        if (p[0] == '(' && p[1] >= 'A' && p[1] <= 'Z' && p[2] == ')' && letter_index(p[1], n_choices) >= 0)
            k = letter_index(p[1], n_choices);
    if (k >= 0) return k;
    for (const char *p = text; *p; p++) {
        if (!(*p >= 'A' && *p <= 'Z') || (p > text && (is_alnum((unsigned char)p[-1]) || p[-1] == '\\'))) continue;
        if (is_alnum((unsigned char)p[1]) || p[1] == '\'') continue;
        if ((*p == 'A' || *p == 'I') && p[1] == ' ' && p[2] >= 'a' && p[2] <= 'z') continue; /* words */
        if (letter_index(*p, n_choices) >= 0) k = letter_index(*p, n_choices);
    }
    return k;
}

/* ---------------------------------------------------------- normalisation */

/* A boxed answer's content, else the text itself. */
static char *pass_unbox(char *in) {
    sbuf o = {0};
    const char *b, *e;
    if (last_box(in, &b, &e))
        sb_putn(&o, b, (size_t)(e - b));
    else
        sb_puts(&o, in);
    return sb_done(&o, in);
}

/* Markup that carries no value: spacing, $, \left/\right, degrees, percent;
 * \text{}-like wrappers unwrapped to their content between spaces. */
static char *pass_markup(char *in) {
    static const char *const drop[] = {"\\displaystyle", "^{\\circ}", "^\\circ", "\\circ", "\\degree", "\xc2\xb0",
                                       "\\!", "\\,", "\\;", "\\:", "\\$", "$", "\\%", "%"};
    static const char *const wrap[] = {"\\text{", "\\textbf{", "\\textit{", "\\textnormal{", "\\mbox{",
                                       "\\mathrm{", "\\mathbf{"};
    sbuf o = {0};
    int depth = 0, nwrap = 0, wrap_depth[32];
    const char *p = in;
    while (*p) {
        unsigned char c = (unsigned char)*p;
        if (c != '\\' && c != '^' && c != '$' && c != '%' && c != '{' && c != '}' && c != 0xc2 && c != 0xe2) {
            sb_put(&o, is_space(c) || c == '~' ? ' ' : *p); /* the common case: no markup starts here */
            p++;
            continue;
        }
        size_t i, n = 0;
        for (i = 0; i < sizeof drop / sizeof drop[0] && !n; i++)
            if (starts(p, drop[i])) n = strlen(drop[i]);
        if (n) {
            p += n;
            continue;
        }
        for (i = 0; i < sizeof wrap / sizeof wrap[0] && !n; i++)
            if (starts(p, wrap[i])) n = strlen(wrap[i]);
        if (n && nwrap < 32) {
            wrap_depth[nwrap++] = ++depth;
            sb_put(&o, ' ');
            p += n;
            continue;
        }
        if ((starts(p, "\\left") && !is_alpha((unsigned char)p[5])) ||
            (starts(p, "\\right") && !is_alpha((unsigned char)p[6]))) {
            p += p[1] == 'l' ? 5 : 6;
            continue;
        }
        if (starts(p, "\\dfrac") || starts(p, "\\tfrac")) {
            sb_puts(&o, "\\frac");
            p += 6;
        } else if (starts(p, "{,}")) {
            sb_put(&o, ',');
            p += 3;
        } else if (starts(p, "\xe2\x88\x92")) { /* U+2212 minus sign */
            sb_put(&o, '-');
            p += 3;
        } else if (*p == '\\' && (p[1] == '{' || p[1] == '}')) {
            sb_putn(&o, p, 2);
            p += 2;
        } else if (*p == '\\' && p[1] == ' ') {
            sb_put(&o, ' ');
            p += 2;
        } else if (*p == '\\' && is_alpha((unsigned char)p[1])) {
            /* A command copied whole, so \leftarrow is not \left + arrow. */
            const char *q = p + 1;
            while (is_alpha((unsigned char)*q)) q++;
            sb_putn(&o, p, (size_t)(q - p));
            p = q;
        } else if (*p == '{') {
            depth++;
            sb_put(&o, *p++);
        } else if (*p == '}') {
            if (nwrap && wrap_depth[nwrap - 1] == depth) {
                nwrap--;
                if (p[1] != '^') sb_put(&o, ' '); /* \text{ cm}^2 stays one word */
            } else {
                sb_put(&o, '}');
            }
            depth--;
            p++;
        } else {
            sb_put(&o, *p++);
        }
    }
    return sb_done(&o, in);
}

/* Trailing spaces and periods ("18." -> "18"). */
static void trim_end(char *s) {
    size_t n = strlen(s);
    while (n && (is_space((unsigned char)s[n - 1]) || s[n - 1] == '.')) s[--n] = '\0';
}

/* A unit word: letters (with . ' /) and an optional power ^2 or ^{2}. */
static int unit_word(const char *b, const char *e) {
    if (b >= e || !is_alpha((unsigned char)*b)) return 0;
    const char *p = b;
    while (p < e && (is_alpha((unsigned char)*p) || *p == '.' || *p == '\'' || *p == '/')) p++;
    if (p < e && *p == '^') {
        p++;
        if (p < e && *p == '{') p++;
        if (p >= e || !is_digit((unsigned char)*p)) return 0;
        while (p < e && is_digit((unsigned char)*p)) p++;
        if (p < e && *p == '}') p++;
    }
    return p == e;
}

/* "x = 5" -> "5"; then unit words after a number dropped ("5 apples"). */
static char *pass_words(char *in) {
    sbuf o = {0};
    const char *s = in;
    while (is_space((unsigned char)*s)) s++;
    const char *eq = strchr(s, '=');
    if (eq && !strchr(eq + 1, '=')) {
        const char *l = eq;
        while (l > s && is_space((unsigned char)l[-1])) l--;
        if (l > s && l - s <= 2) s = eq + 1;
    }
    while (is_space((unsigned char)*s)) s++;
    sb_puts(&o, s);
    if (o.oom || !o.s) return sb_done(&o, in);
    trim_end(o.s);
    /* The run of unit words at the end ("sq ft"), then the head before it. */
    char *t = o.s, *cut = t + strlen(t), *h;
    for (;;) {
        h = cut;
        while (h > t && is_space((unsigned char)h[-1])) h--;
        char *w = h;
        while (w > t && !is_space((unsigned char)w[-1])) w--;
        if (w == t || !unit_word(w, h)) break;
        cut = w;
    }
    h = cut;
    while (h > t && is_space((unsigned char)h[-1])) h--;
    int has_digit = 0;
    for (char *q = t; q < h && !has_digit; q++) has_digit = is_digit((unsigned char)*q);
    if (h < cut && has_digit && (is_digit((unsigned char)h[-1]) || h[-1] == '}' || h[-1] == ')')) {
        *h = '\0';
        trim_end(t);
    }
    o.n = strlen(o.s);
    return sb_done(&o, in);
}

/* Thousands separators and spaces removed. */
static char *pass_compact(char *in) {
    sbuf o = {0};
    for (const char *p = in; *p; p++) {
        if (is_space((unsigned char)*p)) continue;
        if (*p == ',' && o.n && is_digit((unsigned char)o.s[o.n - 1]) && is_digit((unsigned char)p[1]) &&
            is_digit((unsigned char)p[2]) && is_digit((unsigned char)p[3]) && !is_digit((unsigned char)p[4]))
            continue;
        sb_put(&o, *p);
    }
    return sb_done(&o, in);
}

/* One-character arguments braced: \frac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}. */
static char *pass_braces(char *in) {
    sbuf o = {0};
    const char *p = in;
    while (*p) {
        int args = *p != '\\' ? 0 : starts(p, "\\frac") ? 2 : starts(p, "\\sqrt") ? 1 : 0;
        if (!args) {
            sb_put(&o, *p++);
            continue;
        }
        sb_putn(&o, p, 5);
        p += 5;
        for (int a = 0; a < args && *p; a++) {
            if (*p == '[' || *p == '\\') break; /* a root's index, or a command */
            if (*p != '{') {
                sb_put(&o, '{');
                sb_put(&o, *p++);
                sb_put(&o, '}');
                continue;
            }
            /* An argument already braced: copied through its closing brace. */
            const char *q = p;
            int depth = 0;
            do {
                if (*q == '{') depth++;
                if (*q == '}') depth--;
                q++;
            } while (*q && depth > 0);
            sb_putn(&o, p, (size_t)(q - p));
            p = q;
        }
    }
    return sb_done(&o, in);
}

/* Numbers written one way: no leading +, 0 before a bare point, no trailing
 * zeros after the point; a whole "a/b" of integers as \frac{a}{b}. */
static char *pass_numbers(char *in) {
    sbuf o = {0};
    const char *p = in;
    if (*p == '+') p++;
    while (*p) {
        const char *s = p;
        int prev = s > in ? (unsigned char)s[-1] : 0;
        int start = !is_digit(prev) && prev != '.' && (is_digit((unsigned char)*s) || (*s == '.' && is_digit((unsigned char)s[1])));
        if (!start) {
            sb_put(&o, *p++);
            continue;
        }
        const char *q = s;
        while (is_digit((unsigned char)*q)) q++;
        if (q == s) sb_put(&o, '0');
        sb_putn(&o, s, (size_t)(q - s));
        if (*q == '.' && is_digit((unsigned char)q[1])) {
            const char *f = q + 1, *fe = f;
            while (is_digit((unsigned char)*fe)) fe++;
            const char *z = fe;
            if (*fe != '.')
                while (z > f && z[-1] == '0') z--; /* not inside "1.2.3" */
            if (z > f) {
                sb_put(&o, '.');
                sb_putn(&o, f, (size_t)(z - f));
            }
            q = fe;
        }
        p = q;
    }
    char *s = sb_done(&o, in);
    if (!s) return NULL;
    const char *d = s + (*s == '-'), *q = d;
    while (is_digit((unsigned char)*q)) q++;
    const char *slash = q;
    if (q > d && *q == '/' && is_digit((unsigned char)q[1])) {
        q++;
        while (is_digit((unsigned char)*q)) q++;
        if (!*q) {
            sbuf f = {0};
            if (*s == '-') sb_put(&f, '-');
            sb_puts(&f, "\\frac{");
            sb_putn(&f, d, (size_t)(slash - d));
            sb_puts(&f, "}{");
            sb_puts(&f, slash + 1);
            sb_put(&f, '}');
            return sb_done(&f, s);
        }
    }
    return s;
}

/* The normal form as a malloc'd string, or NULL when out of memory. */
static char *normal_form(const char *in) {
    sbuf o = {0};
    sb_puts(&o, in ? in : "");
    char *s = sb_done(&o, NULL);
    char *(*passes[])(char *) = {pass_unbox, pass_markup, pass_words, pass_compact, pass_braces, pass_numbers};
    for (size_t i = 0; s && i < sizeof passes / sizeof passes[0]; i++) s = passes[i](s);
    if (s) trim_end(s);
    return s;
}

void polar_answer_normalize(const char *in, char *out, size_t cap) {
    char *s = normal_form(in);
    copy_out(out, cap, s ? s : "", s ? strlen(s) : 0);
    free(s);
}

/* ------------------------------------------------------------- comparison */

/* A decimal at *p ("-12", "3.5", "0.25"), advancing *p; 0 when none. */
static int read_decimal(const char **p, double *v) {
    const char *s = *p, *q = s;
    if (*q == '-' || *q == '+') q++;
    const char *d = q;
    while (is_digit((unsigned char)*q)) q++;
    int int_digits = q > d;
    if (*q == '.') {
        q++;
        const char *f = q;
        while (is_digit((unsigned char)*q)) q++;
        if (q == f) return 0;
    } else if (!int_digits) {
        return 0;
    }
    /* Only [sign] digits [. digits] reach strtod: no hex, inf or nan. */
    char buf[400];
    size_t n = (size_t)(q - s);
    if (n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *v = strtod(buf, NULL);
    *p = q;
    return isfinite(*v);
}

/* A normal form that is a number: a decimal, a/b, \frac{a}{b}, signed,
 * possibly in parentheses ("-(1/3)", as ASDiv writes one gold). */
static int as_number(const char *s, double *v) {
    double sign = 1, a, b;
    size_t n = strlen(s);
    const char *in = s + (*s == '-');
    if (*in == '(' && n >= 3 && s[n - 1] == ')' && in[1] != '(') {
        char buf[400];
        size_t k = n - 1 - (size_t)(in + 1 - s);
        if (k >= sizeof buf || memchr(in + 1, '(', k) || memchr(in + 1, ')', k)) return 0;
        memcpy(buf, in + 1, k);
        buf[k] = '\0';
        if (!as_number(buf, v)) return 0;
        if (*s == '-') *v = -*v;
        return 1;
    }
    if (*s == '-' && starts(s + 1, "\\frac{")) sign = -1, s++;
    if (starts(s, "\\frac{")) {
        s += 6;
        if (!read_decimal(&s, &a) || *s++ != '}' || *s++ != '{' || !read_decimal(&s, &b) || *s++ != '}' || *s)
            return 0;
    } else {
        if (!read_decimal(&s, &a)) return 0;
        b = 1;
        if (*s == '/') {
            s++;
            if (!read_decimal(&s, &b)) return 0;
        }
        if (*s) return 0;
    }
    if (b == 0) return 0;
    *v = sign * a / b;
    return isfinite(*v);
}

/* Plain words ("Yes", "Mrs.Hilt"), compared without case. */
static int plain_words(const char *s) {
    for (; *s; s++)
        if (!is_alpha((unsigned char)*s) && *s != '\'' && *s != '.' && *s != '-') return 0;
    return 1;
}

static int same_text(const char *a, const char *b) {
    if (!plain_words(a) || !plain_words(b)) return strcmp(a, b) == 0;
    for (; *a && *b; a++, b++)
        if (to_upper((unsigned char)*a) != to_upper((unsigned char)*b)) return 0;
    return *a == *b;
}

int polar_answer_equal(const char *pred, const char *gold) {
    char *a = normal_form(pred), *b = normal_form(gold);
    int eq = 0;
    double x, y;
    if (a && b && *a && *b) {
        if (as_number(a, &x) && as_number(b, &y)) {
            double m = fabs(x) > fabs(y) ? fabs(x) : fabs(y);
            double tol = 1e-4 * m > 1e-4 ? 1e-4 * m : 1e-4;
            eq = fabs(x - y) <= tol;
        } else {
            eq = same_text(a, b);
        }
    }
    free(a);
    free(b);
    return eq;
}
