/* safetensors: 8-byte little-endian header length, a JSON header naming each
 * tensor's dtype, shape and [begin, end) byte range in the data section that
 * follows. Files are mmap'd read-only; every field is validated on open. */
#ifndef POLAR_SAFETENSORS_H
#define POLAR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "polar.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER ((size_t)100 << 20) /* the format's own reference limit */

typedef enum { ST_BOOL, ST_U8, ST_I8, ST_I16, ST_I32, ST_I64, ST_F16, ST_BF16, ST_F32, ST_F64, ST_F8_E4M3, ST_F8_E5M2 } st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    const void *data; /* inside the mapping */
} st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t map_size;
    st_tensor *tensors;
    size_t n;
} st_file;

/* A checkpoint: one file, or the shards a model.safetensors.index.json names. */
typedef struct {
    st_file *files;
    size_t n_files;
} st_set;

const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

/* Parse and validate a header held in memory: buf is the whole file. */
polar_status st_parse(const char *path, const void *buf, size_t size, st_file *out,
                      polar_error *err);
polar_status st_open(const char *path, st_file *out, polar_error *err);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name);

/* Open dir/model.safetensors, or the shards of dir/model.safetensors.index.json. */
polar_status st_set_open(const char *dir, st_set *out, polar_error *err);
void st_set_close(st_set *s);
const st_tensor *st_set_find(const st_set *s, const char *name, const char **file);

/* A tensor to write. */
typedef struct {
    const char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;
} st_write_tensor;

polar_status st_write(const char *path, const st_write_tensor *t, size_t n, polar_error *err);
/* The same with a "__metadata__" entry: metadata is a JSON object of strings. */
polar_status st_write_meta(const char *path, const st_write_tensor *t, size_t n, const char *metadata,
                           polar_error *err);

#endif
