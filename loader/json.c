#include "json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/error.h"
#include "../tokenizer/unicode.h"

#define JSON_MAX_DEPTH 128
#define ARENA_BLOCK (64 * 1024)

/* Arena: a list of blocks; objects are never freed one by one. */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_block;

struct json_doc {
    arena_block *blocks;
    json_value *root;
};

typedef struct {
    const char *text;
    size_t len, pos;
    const char *what;
    json_doc *doc;
    polar_error *err;
} parser;

static void *arena_alloc(json_doc *doc, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = doc->blocks;
        b->used = 0;
        b->cap = cap;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

/* Line and column (1-based) of a byte offset, for messages. */
static void line_col(const parser *p, size_t at, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        if (p->text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static polar_status syntax(parser *p, const char *why) {
    size_t line, col;
    line_col(p, p->pos, &line, &col);
    return polar_fail(p->err, POLAR_ERR_FORMAT, "%s: JSON syntax error at line %zu column %zu: %s",
                      p->what, line, col, why);
}

static polar_status nomem(parser *p) {
    return polar_fail(p->err, POLAR_ERR_NOMEM, "%s: out of memory parsing JSON", p->what);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->text[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int peek(const parser *p) { return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1; }

static polar_status parse_value(parser *p, int depth, json_value **out);

static int hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(parser *p, unsigned *u) {
    if (p->len - p->pos < 4) return 0;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit((unsigned char)p->text[p->pos + i]);
        if (d < 0) return 0;
        v = v * 16 + (unsigned)d;
    }
    p->pos += 4;
    *u = v;
    return 1;
}

/* A string starting at the opening quote. Escapes never lengthen the text
 * (\uXXXX is 6 bytes for at most 3 of UTF-8; a surrogate pair 12 for 4), so
 * the raw length bounds the decoded one. */
static polar_status parse_string(parser *p, const char **s, size_t *n) {
    size_t start = ++p->pos; /* past '"' */
    size_t end = start;
    while (end < p->len && p->text[end] != '"') end += p->text[end] == '\\' ? 2 : 1;
    if (end >= p->len) return syntax(p, "unterminated string");
    char *o = arena_alloc(p->doc, end - start + 1);
    if (!o) return nomem(p);
    size_t k = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->text[p->pos];
        if (c < 0x20) return syntax(p, "control character in string");
        if (c != '\\') {
            o[k++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        char e = p->text[p->pos++];
        switch (e) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            unsigned u;
            if (!read_hex4(p, &u)) return syntax(p, "bad \\u escape");
            if (u >= 0xDC00 && u <= 0xDFFF) return syntax(p, "lone low surrogate in \\u escape");
            if (u >= 0xD800 && u <= 0xDBFF) {
                unsigned lo;
                if (p->pos + 2 > end || p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u')
                    return syntax(p, "high surrogate not followed by a low one");
                p->pos += 2;
                if (!read_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return syntax(p, "high surrogate not followed by a low one");
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            k += (size_t)utf8_encode(u, o + k);
            break;
        }
        default:
            p->pos--;
            return syntax(p, "unknown escape in string");
        }
    }
    if (p->pos != end) return syntax(p, "bad escape at end of string");
    o[k] = 0;
    p->pos = end + 1;
    *s = o;
    *n = k;
    return POLAR_OK;
}

static polar_status parse_number(parser *p, json_value *v) {
    size_t start = p->pos;
    int integer = 1;
    if (peek(p) == '-') p->pos++;
    if (peek(p) == '0') {
        p->pos++;
    } else if (peek(p) >= '1' && peek(p) <= '9') {
        while (peek(p) >= '0' && peek(p) <= '9') p->pos++;
    } else {
        return syntax(p, "bad number");
    }
    if (peek(p) == '.') {
        integer = 0;
        p->pos++;
        if (!(peek(p) >= '0' && peek(p) <= '9')) return syntax(p, "digit expected after '.'");
        while (peek(p) >= '0' && peek(p) <= '9') p->pos++;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        integer = 0;
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-') p->pos++;
        if (!(peek(p) >= '0' && peek(p) <= '9')) return syntax(p, "digit expected in exponent");
        while (peek(p) >= '0' && peek(p) <= '9') p->pos++;
    }
    char buf[64];
    size_t n = p->pos - start;
    if (n >= sizeof buf) {
        /* Long literals: only the value matters, strtod needs a terminated copy. */
        char *tmp = malloc(n + 1);
        if (!tmp) return nomem(p);
        memcpy(tmp, p->text + start, n);
        tmp[n] = 0;
        v->number = strtod(tmp, NULL);
        free(tmp);
    } else {
        memcpy(buf, p->text + start, n);
        buf[n] = 0;
        v->number = strtod(buf, NULL);
    }
    v->type = JSON_NUMBER;
    v->is_integer = integer;
    return POLAR_OK;
}

static int match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->text + p->pos, w, n) != 0) return 0;
    p->pos += n;
    return 1;
}

/* Growable list of members while an array/object is parsed; moved into the
 * arena when complete. */
typedef struct {
    json_value **vals;
    const char **keys;
    size_t n, cap;
} member_list;

static int members_push(member_list *m, const char *key, json_value *v) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        json_value **nv = realloc(m->vals, cap * sizeof *nv);
        if (!nv) return 0;
        m->vals = nv;
        const char **nk = realloc(m->keys, cap * sizeof *nk);
        if (!nk) return 0;
        m->keys = nk;
        m->cap = cap;
    }
    m->keys[m->n] = key;
    m->vals[m->n++] = v;
    return 1;
}

static polar_status finish_members(parser *p, member_list *m, json_value *v, int with_keys) {
    v->len = m->n;
    if (m->n) {
        v->items = arena_alloc(p->doc, m->n * sizeof *v->items);
        if (!v->items) return nomem(p);
        memcpy(v->items, m->vals, m->n * sizeof *v->items);
        if (with_keys) {
            v->keys = arena_alloc(p->doc, m->n * sizeof *v->keys);
            if (!v->keys) return nomem(p);
            memcpy(v->keys, m->keys, m->n * sizeof *v->keys);
        }
    }
    return POLAR_OK;
}

static polar_status parse_container(parser *p, int depth, json_value *v, int is_object) {
    char close = is_object ? '}' : ']';
    member_list m = {0};
    polar_status st = POLAR_OK;
    p->pos++; /* past '[' or '{' */
    skip_ws(p);
    if (peek(p) == close) {
        p->pos++;
    } else {
        for (;;) {
            const char *key = NULL;
            skip_ws(p);
            if (is_object) {
                size_t klen;
                if (peek(p) != '"') {
                    st = syntax(p, "member name (a string) expected");
                    break;
                }
                if ((st = parse_string(p, &key, &klen)) != POLAR_OK) break;
                skip_ws(p);
                if (peek(p) != ':') {
                    st = syntax(p, "':' expected after member name");
                    break;
                }
                p->pos++;
            }
            json_value *item;
            if ((st = parse_value(p, depth + 1, &item)) != POLAR_OK) break;
            if (!members_push(&m, key, item)) {
                st = nomem(p);
                break;
            }
            skip_ws(p);
            if (peek(p) == ',') {
                p->pos++;
                continue;
            }
            if (peek(p) == close) {
                p->pos++;
                break;
            }
            st = syntax(p, is_object ? "',' or '}' expected" : "',' or ']' expected");
            break;
        }
    }
    if (st == POLAR_OK) st = finish_members(p, &m, v, is_object);
    free(m.vals);
    free(m.keys);
    return st;
}

static polar_status parse_value(parser *p, int depth, json_value **out) {
    if (depth > JSON_MAX_DEPTH) return syntax(p, "nesting too deep");
    skip_ws(p);
    json_value *v = arena_alloc(p->doc, sizeof *v);
    if (!v) return nomem(p);
    memset(v, 0, sizeof *v);
    *out = v;
    int c = peek(p);
    switch (c) {
    case '{': v->type = JSON_OBJECT; return parse_container(p, depth, v, 1);
    case '[': v->type = JSON_ARRAY; return parse_container(p, depth, v, 0);
    case '"': v->type = JSON_STRING; return parse_string(p, &v->str, &v->len);
    case 't':
    case 'f':
    case 'n':
        if (match_word(p, "true")) {
            v->type = JSON_BOOL;
            v->number = 1;
        } else if (match_word(p, "false")) {
            v->type = JSON_BOOL;
        } else if (match_word(p, "null")) {
            v->type = JSON_NULL;
        } else {
            return syntax(p, "unexpected word");
        }
        return POLAR_OK;
    case -1: return syntax(p, "unexpected end of input");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
        return syntax(p, "unexpected character");
    }
}

polar_status json_parse(const char *text, size_t len, const char *what, json_doc **out,
                        polar_error *err) {
    *out = NULL;
    json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory parsing JSON", what);
    parser p = {text, len, 0, what, doc, err};
    polar_status st = parse_value(&p, 0, &doc->root);
    if (st == POLAR_OK) {
        skip_ws(&p);
        if (p.pos != len) st = syntax(&p, "trailing characters after the JSON value");
    }
    if (st != POLAR_OK) {
        json_free(doc);
        return st;
    }
    *out = doc;
    return POLAR_OK;
}

const json_value *json_root(const json_doc *doc) { return doc->root; }

void json_free(json_doc *doc) {
    if (!doc) return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    free(doc);
}

const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = obj->len; i-- > 0;)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

polar_status json_read_file(const char *path, size_t max_bytes, char **text, size_t *len,
                            polar_error *err) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return polar_fail(err, POLAR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    polar_status st = POLAR_OK;
    for (;;) {
        if (n == cap) {
            if (cap >= max_bytes) {
                st = polar_fail(err, POLAR_ERR_FORMAT, "%s: larger than the %zu-byte limit", path,
                                max_bytes);
                break;
            }
            cap = cap ? cap * 2 : 4096;
            if (cap > max_bytes) cap = max_bytes;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory reading", path);
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = polar_fail(err, POLAR_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (st != POLAR_OK) {
        free(buf);
        return st;
    }
    if (!buf) {
        buf = malloc(1);
        if (!buf) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory reading", path);
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return POLAR_OK;
}

ssize_t jsonl_read_line(FILE *f, char **line, size_t *cap, size_t max_bytes) {
    size_t n = 0;
    int c;
    do {
        if ((c = getc_unlocked(f)) == EOF) break;
        if (n + 1 >= *cap) { /* room for c and the NUL */
            if (n >= max_bytes) return JSONL_TOO_LONG;
            size_t grown = *cap ? *cap * 2 : 256;
            char *b = realloc(*line, grown);
            if (!b) return JSONL_READ_ERROR;
            *line = b, *cap = grown;
        }
        (*line)[n++] = (char)c;
    } while (c != '\n');
    if (ferror(f)) return JSONL_READ_ERROR;
    if (*line) (*line)[n] = 0;
    return (ssize_t)n;
}

polar_status jsonl_line_fail(ssize_t got, const char *path, long lineno, const char *what, polar_error *err) {
    if (got == JSONL_TOO_LONG)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s:%ld: a line over %zu MiB: not a %s file", path, lineno,
                          JSONL_MAX_LINE >> 20, what);
    return polar_fail(err, POLAR_ERR_IO, "%s:%ld: read error", path, lineno);
}

polar_status json_parse_file(const char *path, json_doc **out, polar_error *err) {
    char *text;
    size_t len;
    polar_status st = json_read_file(path, (size_t)64 << 20, &text, &len, err);
    if (st != POLAR_OK) return st;
    st = json_parse(text, len, path, out, err);
    free(text);
    return st;
}

int json_escape(const char *s, char *buf, size_t size) {
    size_t k = 0;
#define PUT(ch)                            \
    do {                                   \
        if (k + 1 < size) buf[k] = (ch);   \
        k++;                               \
    } while (0)
    PUT('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            PUT('\\');
            PUT((char)*c);
        } else if (*c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            for (char *e = esc; *e; e++) PUT(*e);
        } else {
            PUT((char)*c);
        }
    }
    PUT('"');
#undef PUT
    if (size) buf[k < size ? k : size - 1] = 0;
    return (int)k;
}
