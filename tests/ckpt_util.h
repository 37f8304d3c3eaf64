/* Test helper: write a model's weights as a checkpoint with deliberate
 * variations (dtype, a missing or misshapen tensor, sharding), and raw
 * safetensors files with a hand-written header. */
#ifndef POLAR_TEST_CKPT_UTIL_H
#define POLAR_TEST_CKPT_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../loader/config.h"
#include "../loader/safetensors.h"
#include "../runtime/error.h"
#include "../runtime/model.h"

typedef struct {
    st_dtype dtype;      /* ST_BF16, ST_F16, ST_F32, or another to test rejection */
    const char *omit;    /* tensor left out */
    const char *widen;   /* tensor written one row too many */
    int shards;          /* 1 or 2 (+ model.safetensors.index.json) */
    int stacked;         /* experts as transformers v5 stacks them */
} ckpt_opts;

/* The data of one tensor in the requested dtype (malloc'd). */
static void *ckpt_convert(const bf16 *src, size_t n, size_t extra, st_dtype dtype) {
    size_t es = st_dtype_size(dtype);
    unsigned char *out = calloc(n + extra, es);
    for (size_t i = 0; out && i < n; i++) {
        float f = bf16_to_f32(src[i]);
        if (dtype == ST_F32) {
            memcpy(out + 4 * i, &f, 4);
        } else if (dtype == ST_F16) {
            _Float16 h = (_Float16)f; /* round to nearest even, subnormals included */
            memcpy(out + 2 * i, &h, 2);
        } else if (dtype == ST_BF16) {
            memcpy(out + 2 * i, &src[i], 2);
        } else {
            int32_t v = (int32_t)f;
            memcpy(out + es * i, &v, es < 4 ? es : 4);
        }
    }
    return out;
}

static polar_status ckpt_write(polar_model *m, const char *dir, const ckpt_opts *o, polar_error *err) {
    mkdir(dir, 0755);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    polar_status st = config_write(&m->arch, path, err);
    if (st != POLAR_OK) return st;
    tensor_ref *refs;
    int n = model_tensor_refs(m, o->stacked ? LAYOUT_STACKED : LAYOUT_PER_EXPERT, &refs), k = 0;
    st_write_tensor *w = calloc((size_t)n, sizeof *w);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    int gathered = 1;
    for (int i = 0; i < n; i++) {
        if (o->omit && strcmp(refs[i].name, o->omit) == 0) continue;
        int widen = o->widen && strcmp(refs[i].name, o->widen) == 0;
        size_t cols = refs[i].cols ? (size_t)refs[i].cols : 1, elems = ref_elems(&refs[i]);
        bf16 *vals = malloc(elems * sizeof *vals);
        if (!ref_gather(m, &refs[i], vals)) memset(vals, 0, elems * sizeof *vals), gathered = 0;
        bufs[k] = ckpt_convert(vals, elems, widen ? cols : 0, o->dtype);
        free(vals);
        st_write_tensor t = {refs[i].name, o->dtype, 0, {0}, bufs[k]};
        if (refs[i].experts) t.shape[t.ndim++] = refs[i].experts;
        t.shape[t.ndim++] = refs[i].rows + widen;
        if (refs[i].cols) t.shape[t.ndim++] = refs[i].cols;
        w[k++] = t;
    }
    if (!gathered) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "the model does not hold all its weights as bf16");
    } else if (o->shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = st_write(path, w, (size_t)k, err);
    } else {
        int half = k / 2;
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
        st = st_write(path, w, (size_t)half, err);
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        if (st == POLAR_OK) st = st_write(path, w + half, (size_t)(k - half), err);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "w");
        fprintf(f, "{\"metadata\": {}, \"weight_map\": {");
        for (int i = 0; i < k; i++)
            fprintf(f, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "", w[i].name, i < half ? 1 : 2);
        fprintf(f, "}}\n");
        fclose(f);
    }
    for (int i = 0; i < k; i++) free(bufs[i]);
    free(bufs);
    free(w);
    free(refs);
    return st;
}

#endif
