/* A small strict JSON parser (RFC 8259) into a read-only tree.
 * All nodes live in one arena owned by the json_doc; json_free releases all. */
#ifndef POLAR_JSON_H
#define POLAR_JSON_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "polar.h"

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    int is_integer;        /* JSON_NUMBER written without fraction or exponent */
    double number;         /* JSON_NUMBER; JSON_BOOL as 0/1 */
    const char *str;       /* JSON_STRING: UTF-8, NUL-terminated (may hold \0 inside) */
    size_t len;            /* JSON_STRING: bytes; JSON_ARRAY/OBJECT: members */
    const char **keys;     /* JSON_OBJECT: member names (NUL-terminated) */
    json_value **items;    /* JSON_ARRAY items / JSON_OBJECT values */
};

typedef struct json_doc json_doc;

/* Parse text[0..len). `what` names the source in error messages
 * ("config.json"). Nesting deeper than 128 levels is rejected. */
polar_status json_parse(const char *text, size_t len, const char *what, json_doc **out,
                        polar_error *err);
const json_value *json_root(const json_doc *doc);
void json_free(json_doc *doc);

/* Member of an object by name (the last one when repeated), or NULL. */
const json_value *json_get(const json_value *obj, const char *key);

/* Read a whole file (at most max_bytes) into a NUL-terminated buffer. */
polar_status json_read_file(const char *path, size_t max_bytes, char **text, size_t *len,
                            polar_error *err);

/* The longest JSONL line the readers take (labels, eval records): a longer
 * one is a corrupt file or a device, which would otherwise grow the buffer
 * until memory runs out. */
#define JSONL_MAX_LINE ((size_t)64 << 20)

/* One line of f, its newline kept, NUL-terminated, into *line (grown as
 * needed, as getline does; free it after): its length, 0 at the end of the
 * file, JSONL_TOO_LONG past max_bytes, JSONL_READ_ERROR on a read error. */
#define JSONL_TOO_LONG ((ssize_t)-2)
#define JSONL_READ_ERROR ((ssize_t)-1)
ssize_t jsonl_read_line(FILE *f, char **line, size_t *cap, size_t max_bytes);

/* The error of a jsonl_read_line result below 0 at path's line lineno:
 * "PATH:N: a line over 64 MiB: not a WHAT file" or a read error. */
polar_status jsonl_line_fail(ssize_t got, const char *path, long lineno, const char *what, polar_error *err);

/* Parse a file. */
polar_status json_parse_file(const char *path, json_doc **out, polar_error *err);

/* Write s as a JSON string literal (quotes and escapes) into buf; returns the
 * length needed, like snprintf. */
int json_escape(const char *s, char *buf, size_t size);

#endif
