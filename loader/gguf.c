#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/cpu/bf16.h"
#include "../runtime/error.h"

#define GGUF_MAX_COUNT ((uint64_t)1 << 24) /* tensors, keys, array elements: far above real files */
#define GGUF_MAX_DEPTH 4                   /* arrays of arrays */

typedef struct {
    const uint8_t *b;
    size_t size, pos;
    const char *path;
    polar_error *err;
} reader;

static polar_status truncated(reader *r, const char *what) {
    return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: truncated or corrupt: %s runs past the end of the file (offset %zu)",
                      r->path, what, r->pos);
}

static int take(reader *r, size_t n, const uint8_t **p) {
    if (n > r->size - r->pos) return 0;
    *p = r->b + r->pos;
    r->pos += n;
    return 1;
}

static int read_u32(reader *r, uint32_t *v) {
    const uint8_t *p;
    if (!take(r, 4, &p)) return 0;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return 1;
}

static int read_u64(reader *r, uint64_t *v) {
    uint32_t lo, hi;
    if (!read_u32(r, &lo) || !read_u32(r, &hi)) return 0;
    *v = (uint64_t)hi << 32 | lo;
    return 1;
}

static int read_str(reader *r, gguf_str *s) {
    const uint8_t *p;
    if (!read_u64(r, &s->len) || s->len > r->size - r->pos || !take(r, (size_t)s->len, &p)) return 0;
    s->s = (const char *)p;
    return 1;
}

static size_t scalar_size(gguf_vtype t) {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < sizeof sizes / sizeof sizes[0] ? sizes[t] : 0;
}

static void decode_scalar(gguf_vtype t, const uint8_t *p, gguf_kv *kv) {
    uint64_t u = 0;
    size_t n = scalar_size(t);
    for (size_t k = 0; k < n; k++) u |= (uint64_t)p[k] << (8 * k);
    kv->u = u;
    switch (t) {
    case GGUF_I8: kv->i = (int8_t)u; break;
    case GGUF_I16: kv->i = (int16_t)u; break;
    case GGUF_I32: kv->i = (int32_t)u; break;
    case GGUF_I64: kv->i = (int64_t)u; break;
    case GGUF_F32: {
        uint32_t w = (uint32_t)u;
        float f;
        memcpy(&f, &w, 4);
        kv->f = f;
        break;
    }
    case GGUF_F64: memcpy(&kv->f, &u, 8); break;
    default: kv->i = (int64_t)u; break;
    }
    if (t != GGUF_F32 && t != GGUF_F64) kv->f = (double)kv->i;
}

/* One value of type t; arrays are kept by reference (strings indexed). */
static polar_status read_value(reader *r, gguf_vtype t, gguf_kv *kv, int depth) {
    if (t == GGUF_STRING) return read_str(r, &kv->str) ? POLAR_OK : truncated(r, "a string value");
    if (t == GGUF_ARRAY) {
        uint32_t et;
        if (depth >= GGUF_MAX_DEPTH)
            return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: arrays nested too deeply", r->path);
        if (!read_u32(r, &et) || !read_u64(r, &kv->arr_n)) return truncated(r, "an array header");
        if (et > GGUF_F64)
            return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: unknown array element type %u", r->path, et);
        if (kv->arr_n > GGUF_MAX_COUNT)
            return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: array of %llu elements is absurd", r->path,
                              (unsigned long long)kv->arr_n);
        kv->arr_type = (gguf_vtype)et;
        size_t min_elem = et == GGUF_STRING ? 8 : et == GGUF_ARRAY ? 12 : scalar_size((gguf_vtype)et);
        if (kv->arr_n > (r->size - r->pos) / min_elem) return truncated(r, "an array");
        if (et == GGUF_STRING) {
            kv->arr_strs = malloc((size_t)(kv->arr_n ? kv->arr_n : 1) * sizeof *kv->arr_strs);
            if (!kv->arr_strs) return polar_fail(r->err, POLAR_ERR_NOMEM, "%s: out of memory", r->path);
            for (uint64_t k = 0; k < kv->arr_n; k++)
                if (!read_str(r, &kv->arr_strs[k])) return truncated(r, "a string array");
            return POLAR_OK;
        }
        if (et == GGUF_ARRAY) { /* validated and skipped: no reader needs nested arrays */
            for (uint64_t k = 0; k < kv->arr_n; k++) {
                gguf_kv inner = {0};
                polar_status st = read_value(r, GGUF_ARRAY, &inner, depth + 1);
                free(inner.arr_strs);
                if (st != POLAR_OK) return st;
            }
            return POLAR_OK;
        }
        const uint8_t *p;
        if (kv->arr_n * scalar_size(kv->arr_type) > r->size - r->pos ||
            !take(r, (size_t)(kv->arr_n * scalar_size(kv->arr_type)), &p))
            return truncated(r, "a numeric array");
        kv->arr_data = p;
        return POLAR_OK;
    }
    size_t n = scalar_size(t);
    const uint8_t *p;
    if (!n) return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: unknown metadata value type %d", r->path, (int)t);
    if (!take(r, n, &p)) return truncated(r, "a metadata value");
    decode_scalar(t, p, kv);
    return POLAR_OK;
}

static const struct {
    ggml_type type;
    const char *name;
    size_t block_bytes, block_elems;
} ggml_types[] = {
    {GGML_F32, "F32", 4, 1},      {GGML_F16, "F16", 2, 1},      {GGML_BF16, "BF16", 2, 1},
    {GGML_Q4_0, "Q4_0", 18, 32},  {GGML_Q4_1, "Q4_1", 20, 32},  {GGML_Q5_0, "Q5_0", 22, 32},
    {GGML_Q5_1, "Q5_1", 24, 32},  {GGML_Q8_0, "Q8_0", 34, 32},  {GGML_Q2_K, "Q2_K", 84, 256},
    {GGML_Q3_K, "Q3_K", 110, 256}, {GGML_Q4_K, "Q4_K", 144, 256}, {GGML_Q5_K, "Q5_K", 176, 256},
    {GGML_Q6_K, "Q6_K", 210, 256}, {GGML_IQ4_NL, "IQ4_NL", 18, 32}, {GGML_IQ4_XS, "IQ4_XS", 136, 256},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *ggml_type_name(ggml_type t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].type == t) return ggml_types[i].name;
    return "unknown";
}
size_t ggml_block_bytes(ggml_type t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].type == t) return ggml_types[i].block_bytes;
    return 0;
}
size_t ggml_block_elems(ggml_type t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].type == t) return ggml_types[i].block_elems;
    return 0;
}

static polar_status read_tensor_info(reader *r, gguf_tensor *t, uint64_t *offset) {
    uint32_t n_dims, type;
    if (!read_str(r, &t->name) || !read_u32(r, &n_dims)) return truncated(r, "a tensor info");
    if (n_dims < 1 || n_dims > 4)
        return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: tensor '%.*s' has %u dimensions (1 to 4 allowed)", r->path,
                          (int)(t->name.len > 200 ? 200 : t->name.len), t->name.s, n_dims);
    t->n_dims = (int)n_dims;
    t->n_elements = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (!read_u64(r, &t->ne[d])) return truncated(r, "a tensor shape");
        if (t->ne[d] && t->n_elements > ((uint64_t)1 << 40) / t->ne[d])
            return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: tensor '%.*s' has an absurd shape", r->path,
                              (int)(t->name.len > 200 ? 200 : t->name.len), t->name.s);
        t->n_elements *= t->ne[d];
    }
    if (!read_u32(r, &type) || !read_u64(r, offset)) return truncated(r, "a tensor info");
    t->type = (ggml_type)type;
    size_t be = ggml_block_elems(t->type);
    if (!be)
        return polar_fail(r->err, POLAR_ERR_UNSUPPORTED, "%s: tensor '%.*s' has ggml type %u, which polar cannot read "
                          "(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)", r->path, (int)(t->name.len > 200 ? 200 : t->name.len),
                          t->name.s, type);
    if (t->ne[0] % be)
        return polar_fail(r->err, POLAR_ERR_FORMAT, "%s: tensor '%.*s': row of %llu is not a multiple of the %s block",
                          r->path, (int)(t->name.len > 200 ? 200 : t->name.len), t->name.s,
                          (unsigned long long)t->ne[0], ggml_type_name(t->type));
    t->nbytes = (size_t)(t->n_elements / be * ggml_block_bytes(t->type));
    return POLAR_OK;
}

polar_status gguf_parse(const char *path, const void *buf, size_t size, gguf_file *f, polar_error *err) {
    memset(f, 0, sizeof *f);
    reader r = {buf, size, 0, path, err};
    const uint8_t *magic;
    uint32_t version;
    if (!take(&r, 4, &magic) || memcmp(magic, "GGUF", 4) != 0)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: not a GGUF file (bad magic)", path);
    if (!read_u32(&r, &version)) return truncated(&r, "the header");
    if (version != 2 && version != 3)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: GGUF version %u (2 and 3 are supported)", path, version);
    f->version = version;
    if (!read_u64(&r, &f->n_tensors) || !read_u64(&r, &f->n_kv)) return truncated(&r, "the header");
    /* A key/value takes at least 12 bytes and a tensor info 32: counts the
     * file cannot hold are refused before anything is allocated for them. */
    if (f->n_tensors > GGUF_MAX_COUNT || f->n_kv > GGUF_MAX_COUNT)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: absurd counts (%llu tensors, %llu metadata keys)", path,
                          (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv);
    if (f->n_kv > (size - r.pos) / 12 || f->n_tensors > (size - r.pos) / 32)
        return polar_fail(err, POLAR_ERR_FORMAT,
                          "%s: truncated or corrupt: %llu tensors and %llu metadata keys cannot fit in %zu bytes", path,
                          (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv, size);
    f->kv = calloc((size_t)(f->n_kv ? f->n_kv : 1), sizeof *f->kv);
    f->tensors = calloc((size_t)(f->n_tensors ? f->n_tensors : 1), sizeof *f->tensors);
    uint64_t *offsets = calloc((size_t)(f->n_tensors ? f->n_tensors : 1), sizeof *offsets);
    polar_status st = POLAR_OK;
    if (!f->kv || !f->tensors || !offsets) {
        st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    f->alignment = 32;
    for (uint64_t i = 0; i < f->n_kv && st == POLAR_OK; i++) {
        gguf_kv *kv = &f->kv[i];
        uint32_t t;
        if (!read_str(&r, &kv->key) || !read_u32(&r, &t)) {
            st = truncated(&r, "a metadata key");
            break;
        }
        kv->type = (gguf_vtype)t;
        if (t > GGUF_F64) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: metadata '%.*s' has unknown value type %u", path,
                            (int)(kv->key.len > 200 ? 200 : kv->key.len), kv->key.s, t);
            break;
        }
        st = read_value(&r, kv->type, kv, 0);
        if (st == POLAR_OK && gguf_str_eq(kv->key, "general.alignment")) {
            if (kv->type != GGUF_U32 || kv->u == 0 || (kv->u & (kv->u - 1)) || kv->u > 65536)
                st = polar_fail(err, POLAR_ERR_FORMAT, "%s: general.alignment must be a power of two u32", path);
            else
                f->alignment = (size_t)kv->u;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors && st == POLAR_OK; i++)
        st = read_tensor_info(&r, &f->tensors[i], &offsets[i]);
    if (st != POLAR_OK) goto done;
    size_t data_start = (r.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (data_start > size && f->n_tensors) {
        st = truncated(&r, "the tensor data");
        goto done;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        int nl = (int)(t->name.len > 200 ? 200 : t->name.len);
        if (offsets[i] % f->alignment) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%.*s' offset %llu is not aligned to %zu", path, nl,
                            t->name.s, (unsigned long long)offsets[i], f->alignment);
            goto done;
        }
        if (offsets[i] > size - data_start || t->nbytes > size - data_start - offsets[i]) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%.*s' data [%llu, +%zu) lies past the end of the file",
                            path, nl, t->name.s, (unsigned long long)offsets[i], t->nbytes);
            goto done;
        }
        t->data = (const uint8_t *)buf + data_start + offsets[i];
    }
done:
    free(offsets);
    if (st != POLAR_OK) gguf_close(f);
    return st;
}

polar_status gguf_open(const char *path, gguf_file *out, polar_error *err) {
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return polar_fail(err, POLAR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 4) {
        close(fd);
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: not a GGUF file (too short)", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return polar_fail(err, POLAR_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    polar_status st = gguf_parse(path, map, (size_t)sb.st_size, out, err);
    if (st == POLAR_OK && !(out->path = strdup(path))) st = polar_fail(err, POLAR_ERR_NOMEM, "%s: out of memory", path);
    if (st != POLAR_OK) {
        gguf_close(out);
        munmap(map, (size_t)sb.st_size);
        return st;
    }
    out->map = map;
    out->size = (size_t)sb.st_size;
    return POLAR_OK;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) free(f->kv[i].arr_strs);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    memset(f, 0, sizeof *f);
}

int gguf_str_eq(gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.s, c, s.len) == 0; }

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static float read_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

cpu_wtype ggml_block_format(ggml_type t) {
    switch (t) {
    case GGML_Q4_0: return CPU_W_Q4_0;
    case GGML_Q4_1: return CPU_W_Q4_1;
    case GGML_Q5_0: return CPU_W_Q5_0;
    case GGML_Q5_1: return CPU_W_Q5_1;
    case GGML_Q8_0: return CPU_W_Q8_0;
    case GGML_Q2_K: return CPU_W_Q2_K;
    case GGML_Q3_K: return CPU_W_Q3_K;
    case GGML_IQ4_NL: return CPU_W_IQ4_NL;
    case GGML_IQ4_XS: return CPU_W_IQ4_XS;
    case GGML_Q4_K: return CPU_W_Q4_K;
    case GGML_Q5_K: return CPU_W_Q5_K;
    case GGML_Q6_K: return CPU_W_Q6_K;
    default: return CPU_W_BF16;
    }
}

void ggml_dequantize(ggml_type t, const void *src, float *dst, size_t n) {
    const uint8_t *b = src;
    switch (t) {
    case GGML_F32: memcpy(dst, src, n * 4); break;
    case GGML_F16:
        for (size_t i = 0; i < n; i++) dst[i] = read_f16(b + 2 * i);
        break;
    case GGML_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32((bf16)(b[2 * i] | b[2 * i + 1] << 8));
        break;
    default: /* the block formats, by their one definition (kernels/cpu/quant_formats.c) */
        if (ggml_block_format(t) != CPU_W_BF16) cpu_dequantize_row(ggml_block_format(t), src, dst, (int)n);
        break;
    }
}
