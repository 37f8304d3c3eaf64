#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/error.h"
#include "json.h"

static const struct {
    const char *name;
    st_dtype dtype;
    size_t size;
} dtypes[] = {
    {"BOOL", ST_BOOL, 1}, {"U8", ST_U8, 1},   {"I8", ST_I8, 1},     {"I16", ST_I16, 2},
    {"I32", ST_I32, 4},   {"I64", ST_I64, 8}, {"F16", ST_F16, 2},   {"BF16", ST_BF16, 2},
    {"F32", ST_F32, 4},   {"F64", ST_F64, 8}, {"F8_E4M3", ST_F8_E4M3, 1}, {"F8_E5M2", ST_F8_E5M2, 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *st_dtype_name(st_dtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

size_t st_dtype_size(st_dtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

static int dtype_from_name(const char *s, st_dtype *out) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, s) == 0) {
            *out = dtypes[i].dtype;
            return 1;
        }
    return 0;
}

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static int as_size(const json_value *v, uint64_t *out) {
    if (!v || v->type != JSON_NUMBER || !v->is_integer || v->number < 0 || v->number > 9007199254740992.0)
        return 0;
    *out = (uint64_t)v->number;
    return 1;
}

typedef struct {
    size_t begin, end, index;
} byte_range;

static int cmp_range(const void *a, const void *b) {
    const byte_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static polar_status parse_entry(const char *path, const char *name, const json_value *e,
                                const unsigned char *data, size_t data_size, st_tensor *t,
                                byte_range *r, polar_error *err) {
    if (e->type != JSON_OBJECT)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    const json_value *dt = json_get(e, "dtype"), *sh = json_get(e, "shape"),
                     *off = json_get(e, "data_offsets");
    if (!dt || dt->type != JSON_STRING)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': missing or non-string 'dtype'", path, name);
    if (!dtype_from_name(dt->str, &t->dtype))
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", path, name, dt->str);
    if (!sh || sh->type != JSON_ARRAY)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': missing or non-list 'shape'", path, name);
    if (sh->len > ST_MAX_DIMS)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", path, name,
                          sh->len, ST_MAX_DIMS);
    uint64_t count = 1;
    t->ndim = (int)sh->len;
    for (size_t d = 0; d < sh->len; d++) {
        uint64_t dim;
        if (!as_size(sh->items[d], &dim))
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                              path, name, d);
        t->shape[d] = (int64_t)dim;
        if (dim && count > UINT64_MAX / dim)
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
        count *= dim;
    }
    uint64_t esize = st_dtype_size(t->dtype);
    if (count > UINT64_MAX / esize)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
    uint64_t begin, end;
    if (!off || off->type != JSON_ARRAY || off->len != 2 || !as_size(off->items[0], &begin) ||
        !as_size(off->items[1], &end))
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be two non-negative integers",
                          path, name);
    if (begin > end)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) run backwards", path,
                          name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return polar_fail(err, POLAR_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets end %llu past the data section (%zu bytes)", path, name,
                          (unsigned long long)end, data_size);
    if (end - begin != count * esize)
        return polar_fail(err, POLAR_ERR_FORMAT,
                          "%s: tensor '%s': %llu bytes in data_offsets but shape x %s needs %llu", path, name,
                          (unsigned long long)(end - begin), dt->str, (unsigned long long)(count * esize));
    t->nbytes = (size_t)(end - begin);
    t->data = data + begin;
    r->begin = (size_t)begin;
    r->end = (size_t)end;
    return POLAR_OK;
}

polar_status st_parse(const char *path, const void *buf, size_t size, st_file *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    if (size < 8)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: truncated: %zu bytes, a safetensors file has at least 8",
                          path, size);
    const unsigned char *b = buf;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > ST_MAX_HEADER)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: header length %llu exceeds the %zu-byte limit", path,
                          (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > size - 8)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
                          path, (unsigned long long)hlen, size);
    json_doc *doc;
    polar_status st = json_parse((const char *)b + 8, (size_t)hlen, path, &doc, err);
    if (st != POLAR_OK) return st;
    const json_value *root = json_root(doc);
    const unsigned char *data = b + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    byte_range *ranges = NULL;
    if (root->type != JSON_OBJECT) {
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    out->tensors = calloc(root->len ? root->len : 1, sizeof *out->tensors);
    ranges = calloc(root->len ? root->len : 1, sizeof *ranges);
    if (!out->tensors || !ranges) {
        st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < root->len; i++) {
        const char *name = root->keys[i];
        if (strcmp(name, "__metadata__") == 0) continue;
        for (size_t j = 0; j < out->n; j++)
            if (strcmp(out->tensors[j].name, name) == 0) {
                st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path, name);
                goto done;
            }
        st_tensor *t = &out->tensors[out->n];
        st = parse_entry(path, name, root->items[i], data, data_size, t, &ranges[out->n], err);
        if (st != POLAR_OK) goto done;
        ranges[out->n].index = out->n;
        t->name = strdup(name);
        if (!t->name) {
            st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        out->n++;
    }
    qsort(ranges, out->n, sizeof *ranges, cmp_range);
    for (size_t i = 1; i < out->n; i++) {
        /* Empty tensors occupy no bytes and overlap nothing. */
        if (ranges[i].begin == ranges[i].end || ranges[i - 1].begin == ranges[i - 1].end) continue;
        if (ranges[i].begin < ranges[i - 1].end) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", path,
                            out->tensors[ranges[i - 1].index].name, out->tensors[ranges[i].index].name);
            goto done;
        }
    }
done:
    free(ranges);
    json_free(doc);
    if (st != POLAR_OK) st_close(out);
    return st;
}

polar_status st_open(const char *path, st_file *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return polar_fail(err, POLAR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return polar_fail(err, POLAR_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return polar_fail(err, POLAR_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        }
    }
    close(fd);
    static const unsigned char empty[1];
    polar_status st = st_parse(path, map ? map : empty, size, out, err);
    if (st != POLAR_OK) {
        if (map) munmap(map, size);
        return st;
    }
    out->map = map;
    out->map_size = size;
    out->path = strdup(path);
    if (!out->path) {
        st_close(out);
        return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", path);
    }
    return POLAR_OK;
}

void st_close(st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->map_size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

/* Shard file names come from the index: keep them inside the model folder. */
static int safe_shard_name(const char *s) {
    return s[0] && s[0] != '/' && !strstr(s, "..") && strlen(s) < 512;
}

static polar_status open_sharded(const char *dir, const char *index_path, st_set *out, polar_error *err) {
    json_doc *doc;
    polar_status st = json_parse_file(index_path, &doc, err);
    if (st != POLAR_OK) return st;
    const json_value *map = json_get(json_root(doc), "weight_map");
    char path[4096];
    if (!map || map->type != JSON_OBJECT || map->len == 0) {
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: missing or empty 'weight_map' object", index_path);
        goto done;
    }
    const char **names = calloc(map->len, sizeof *names);
    out->files = calloc(map->len, sizeof *out->files);
    if (!names || !out->files) {
        free(names);
        st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (size_t i = 0; i < map->len && st == POLAR_OK; i++) {
        const json_value *v = map->items[i];
        if (v->type != JSON_STRING || !safe_shard_name(v->str)) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: weight_map['%s'] is not a file name inside the folder",
                            index_path, map->keys[i]);
            break;
        }
        size_t f = 0;
        while (f < out->n_files && strcmp(names[f], v->str) != 0) f++;
        if (f == out->n_files) {
            snprintf(path, sizeof path, "%s/%s", dir, v->str);
            st = st_open(path, &out->files[f], err);
            if (st != POLAR_OK) break;
            names[f] = v->str;
            out->n_files++;
        }
        if (!st_find(&out->files[f], map->keys[i]))
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' listed in the index is not in %s", index_path,
                            map->keys[i], v->str);
    }
    free(names);
done:
    json_free(doc);
    if (st != POLAR_OK) st_set_close(out);
    return st;
}

polar_status st_set_open(const char *dir, st_set *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) == 0) return open_sharded(dir, path, out, err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) != 0)
        return polar_fail(err, POLAR_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    out->files = calloc(1, sizeof *out->files);
    if (!out->files) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", dir);
    polar_status st = st_open(path, &out->files[0], err);
    if (st != POLAR_OK) {
        st_set_close(out);
        return st;
    }
    out->n_files = 1;
    return POLAR_OK;
}

void st_set_close(st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) st_close(&s->files[i]);
    free(s->files);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_set_find(const st_set *s, const char *name, const char **file) {
    for (size_t i = 0; i < s->n_files; i++) {
        const st_tensor *t = st_find(&s->files[i], name);
        if (t) {
            if (file) *file = s->files[i].path;
            return t;
        }
    }
    return NULL;
}

static size_t tensor_bytes(const st_write_tensor *t) {
    size_t n = st_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

polar_status st_write(const char *path, const st_write_tensor *t, size_t n, polar_error *err) {
    return st_write_meta(path, t, n, NULL, err);
}

polar_status st_write_meta(const char *path, const st_write_tensor *t, size_t n, const char *metadata,
                           polar_error *err) {
    /* Header: {"__metadata__":{..},"name":{"dtype":"BF16","shape":[..],"data_offsets":[b,e]},...}
     * padded with spaces so the data section starts 8-byte aligned. */
    size_t cap = 256 + n * 256 + (metadata ? strlen(metadata) : 0), len = 0, offset = 0;
    for (size_t i = 0; i < n; i++) cap += strlen(t[i].name) * 6;
    char *hdr = malloc(cap);
    if (!hdr) return polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory writing header", path);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    if (metadata) len += (size_t)snprintf(hdr + len, cap - len, "\"__metadata__\":%s%s", metadata, n ? "," : "");
    for (size_t i = 0; i < n; i++) {
        size_t bytes = tensor_bytes(&t[i]);
        len += (size_t)json_escape(t[i].name, hdr + len, cap - len);
        len += (size_t)snprintf(hdr + len, cap - len, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}%s", offset, offset + bytes,
                                i + 1 < n ? "," : "");
        offset += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while ((len + 8) % 8) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return polar_fail(err, POLAR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    for (size_t i = 0; ok && i < n; i++) {
        size_t bytes = tensor_bytes(&t[i]);
        ok = fwrite(t[i].data, 1, bytes, f) == bytes;
    }
    free(hdr);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return polar_fail(err, POLAR_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return POLAR_OK;
}
