/* GGUF (versions 2 and 3): a header, typed metadata key/values, tensor
 * infos, then aligned tensor data. The file is mmap'd read-only and every
 * count, length and offset is checked against the file's size on open. */
#ifndef POLAR_GGUF_H
#define POLAR_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/cpu/quant.h"
#include "polar.h"

typedef enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
    GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12,
} gguf_vtype;

/* ggml tensor types this loader knows (values are ggml's). */
typedef enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23, GGML_BF16 = 30,
} ggml_type;

typedef struct {
    const char *s; /* not NUL-terminated: inside the mapping */
    uint64_t len;
} gguf_str;

typedef struct {
    gguf_str key;
    gguf_vtype type;
    /* Scalars: integer types in i (signed) / u (unsigned), floats in f. */
    int64_t i;
    uint64_t u;
    double f;
    gguf_str str;            /* GGUF_STRING */
    gguf_vtype arr_type;     /* GGUF_ARRAY: element type */
    uint64_t arr_n;          /* GGUF_ARRAY: element count */
    const uint8_t *arr_data; /* numeric arrays: packed little-endian elements */
    gguf_str *arr_strs;      /* string arrays: [arr_n] */
} gguf_kv;

typedef struct {
    gguf_str name;
    int n_dims;
    uint64_t ne[4];          /* ne[0] is the fastest-moving dimension (row length) */
    ggml_type type;
    uint64_t n_elements;
    size_t nbytes;
    const void *data;
} gguf_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
    uint32_t version;
    gguf_kv *kv;
    uint64_t n_kv;
    gguf_tensor *tensors;
    uint64_t n_tensors;
    size_t alignment;
} gguf_file;

/* Parse a whole file image (buf of size bytes). */
polar_status gguf_parse(const char *path, const void *buf, size_t size, gguf_file *out, polar_error *err);
polar_status gguf_open(const char *path, gguf_file *out, polar_error *err);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
int gguf_str_eq(gguf_str s, const char *c);

/* Name of a ggml type; bytes of one block and elements per block (0 if unknown). */
const char *ggml_type_name(ggml_type t);
size_t ggml_block_bytes(ggml_type t);
size_t ggml_block_elems(ggml_type t);

/* The model's architecture from GGUF metadata (llama, qwen2, qwen3). */
polar_status gguf_model_arch(const gguf_file *f, polar_arch *out, polar_error *err);

/* llama.cpp stores llama3 rope scaling as per-frequency divisors
 * (rope_freqs.weight); apply them to inv_freq[half] when present. */
polar_status gguf_apply_rope_freqs(const gguf_file *f, float *inv_freq, int half, polar_error *err);

/* n elements of a tensor of type t (n a multiple of its block size) -> f32. */
void ggml_dequantize(ggml_type t, const void *src, float *dst, size_t n);

/* The block format of a quantized ggml type (CPU_W_BF16 for the float
 * types). */
cpu_wtype ggml_block_format(ggml_type t);

#endif
