/* Test helper: a PoLar predictor with weights from an integer hash (the
 * formula tests/golden/make_predictor_golden.py uses too), written as
 * safetensors under the reference's PyTorch names. */
#ifndef POLAR_TEST_PRED_UTIL_H
#define POLAR_TEST_PRED_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loader/safetensors.h"

#define D_MODEL 256

/* A predictor's shape: the reference's is d 256, ff 1024, 4 heads. nheads,
 * when set, is written as the metadata's text instead of heads. */
typedef struct {
    int D, dq, d, ff, heads;
    const char *nheads;
} pred_shape;

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void weight_value(const char *name, size_t n, double scale, double center, float *out) {
    uint64_t h = name_hash(name);
    for (size_t i = 0; i < n; i++) {
        double u = (double)((i * 2654435761ull + h) % 4294967296ull) / 4294967296.0;
        out[i] = (float)(center + scale * (2.0 * u - 1.0));
    }
}

typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2];
} param;

static int params(const pred_shape *sh, param *p) {
    int n = 0, D = sh->D, dq = sh->dq, d = sh->d, ff = sh->ff;
#define P(nm, R, C)                                                     \
    do {                                                                \
        snprintf(p[n].name, sizeof p[n].name, "%s", nm);                \
        p[n].ndim = (C) ? 2 : 1;                                        \
        p[n].shape[0] = R;                                              \
        p[n++].shape[1] = C;                                            \
    } while (0)
    P("q_proj.weight", d, dq);
    P("q_proj.bias", d, 0);
    P("layer_embedding.weight", D, d);
    P("cross_attn.in_proj_weight", 3 * d, d);
    P("cross_attn.in_proj_bias", 3 * d, 0);
    P("cross_attn.out_proj.weight", d, d);
    P("cross_attn.out_proj.bias", d, 0);
    for (int b = 0; b < 2; b++) {
        static const char *parts[] = {"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                      "self_attn.out_proj.bias",  "linear1.weight",         "linear1.bias",
                                      "linear2.weight",           "linear2.bias",           "norm1.weight",
                                      "norm1.bias",               "norm2.weight",           "norm2.bias"};
        int rows[] = {3 * d, 3 * d, d, d, ff, ff, d, d, d, d, d, d};
        int cols[] = {d, 0, d, 0, d, 0, ff, 0, 0, 0, 0, 0};
        for (int i = 0; i < 12; i++) {
            char name[64];
            snprintf(name, sizeof name, "layer_encoder.layers.%d.%s", b, parts[i]);
            P(name, rows[i], cols[i]);
        }
    }
    P("seg_head.weight", 1, d);
    P("seg_head.bias", 1, 0);
    P("op_head.weight", 3, d);
    P("op_head.bias", 3, 0);
#undef P
    return n;
}

static void scale_of(const param *p, double *center, double *scale) {
    const char *n = p->name;
    int bias = strstr(n, "bias") && !strstr(n, "weight"), norm = strstr(n, "norm") != NULL;
    *center = 0.0;
    if (bias) {
        *center = norm ? 0.1 : 0.0;
        *scale = 0.1;
    } else if (norm) {
        *center = 1.0;
        *scale = 0.2;
    } else if (!strcmp(n, "layer_embedding.weight")) {
        *scale = 1.0;
    } else {
        *scale = sqrt(3.0 / (double)(p->ndim == 2 ? p->shape[1] : p->shape[0]));
    }
}

/* Write the hash-formula predictor of shape sh (heads 0: no "nheads"
 * metadata, the loader's default of 4); omit/resize one tensor. */
static polar_status write_predictor_shape(const char *path, const pred_shape *sh, const char *omit,
                                          const char *widen) {
    param p[64];
    int n = params(sh, p), k = 0;
    st_write_tensor w[64];
    float *bufs[64];
    for (int i = 0; i < n; i++) {
        if (omit && !strcmp(p[i].name, omit)) continue;
        size_t cnt = (size_t)p[i].shape[0] * (size_t)(p[i].ndim == 2 ? p[i].shape[1] : 1);
        double c, s;
        scale_of(&p[i], &c, &s);
        bufs[k] = malloc((cnt + 1024) * sizeof(float));
        weight_value(p[i].name, cnt, s, c, bufs[k]);
        w[k] = (st_write_tensor){p[i].name, ST_F32, p[i].ndim, {p[i].shape[0], p[i].shape[1]}, bufs[k]};
        if (widen && !strcmp(p[i].name, widen)) w[k].shape[0] += 1;
        k++;
    }
    polar_error err;
    char meta[128];
    if (sh->nheads) snprintf(meta, sizeof meta, "{\"nheads\": \"%s\"}", sh->nheads);
    else snprintf(meta, sizeof meta, "{\"nheads\": \"%d\"}", sh->heads);
    polar_status st = st_write_meta(path, w, (size_t)k, sh->heads || sh->nheads ? meta : NULL, &err);
    for (int i = 0; i < k; i++) free(bufs[i]);
    return st;
}

/* The reference's shape for D layers over dq-wide token states. */
static polar_status write_predictor(const char *path, int D, int dq, const char *omit, const char *widen) {
    pred_shape sh = {D, dq, D_MODEL, 4 * D_MODEL, 0, NULL};
    return write_predictor_shape(path, &sh, omit, widen);
}

#endif
