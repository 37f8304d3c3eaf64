/* Loading predictor weights saved under the reference PyTorch module's
 * state-dict names (see predictor/convert_checkpoint.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/bf16.h"
#include "../loader/json.h"
#include "../loader/safetensors.h"
#include "../runtime/error.h"
#include "predictor.h"

int pred_tensor_refs(polar_predictor *p, pred_ref *r) {
    int n = 0, d = p->d;
#define REF(nm, ptr, R, C)                                    \
    do {                                                      \
        snprintf(r[n].name, sizeof r[n].name, "%s", nm);      \
        r[n].dst = ptr;                                       \
        r[n].rows = R;                                        \
        r[n++].cols = C;                                      \
    } while (0)
    REF("q_proj.weight", &p->q_proj_w, d, p->dq);
    REF("q_proj.bias", &p->q_proj_b, d, 0);
    REF("layer_embedding.weight", &p->layer_emb, p->D, d);
    REF("cross_attn.in_proj_weight", &p->cross.in_w, 3 * d, d);
    REF("cross_attn.in_proj_bias", &p->cross.in_b, 3 * d, 0);
    REF("cross_attn.out_proj.weight", &p->cross.out_w, d, d);
    REF("cross_attn.out_proj.bias", &p->cross.out_b, d, 0);
    static const char *const parts[12] = {"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                    "self_attn.out_proj.bias",  "linear1.weight",         "linear1.bias",
                                    "linear2.weight",           "linear2.bias",           "norm1.weight",
                                    "norm1.bias",               "norm2.weight",           "norm2.bias"};
    for (int b = 0; b < PRED_BLOCKS; b++) {
        pred_block *k = &p->blocks[b];
        const float **dst[12] = {&k->attn.in_w, &k->attn.in_b, &k->attn.out_w, &k->attn.out_b, &k->lin1_w, &k->lin1_b,
                                 &k->lin2_w,    &k->lin2_b,    &k->norm1_w,    &k->norm1_b,   &k->norm2_w, &k->norm2_b};
        int rows[12] = {3 * d, 3 * d, d, d, p->ff, p->ff, d, d, d, d, d, d};
        int cols[12] = {d, 0, d, 0, d, 0, p->ff, 0, 0, 0, 0, 0};
        for (int i = 0; i < 12; i++) {
            char name[64];
            snprintf(name, sizeof name, "layer_encoder.layers.%d.%s", b, parts[i]);
            REF(name, dst[i], rows[i], cols[i]);
        }
    }
    REF("seg_head.weight", &p->seg_w, 1, d);
    REF("seg_head.bias", &p->seg_b, 1, 0);
    REF("op_head.weight", &p->op_w, 3, d);
    REF("op_head.bias", &p->op_b, 3, 0);
#undef REF
    return n;
}

char *pred_st_meta_dup(const st_file *f, const char *key) {
    const unsigned char *b = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    json_doc *doc;
    if (json_parse((const char *)b + 8, (size_t)hlen, "header", &doc, NULL) != POLAR_OK) return NULL;
    const json_value *v = json_get(json_get(json_root(doc), "__metadata__"), key);
    char *out = NULL;
    if (v && v->type == JSON_STRING && (out = malloc(strlen(v->str) + 1))) strcpy(out, v->str);
    json_free(doc);
    return out;
}

int pred_st_meta(const st_file *f, const char *key, char *out, size_t cap) {
    char *v = pred_st_meta_dup(f, key);
    if (v) snprintf(out, cap, "%s", v);
    free(v);
    return v != NULL;
}

/* The head count: metadata "nheads" in the safetensors header, else 4; 0
 * when the text is not a count from 1 to 65536 (*text holds it). */
static int header_heads(const st_file *f, char *text, size_t cap) {
    if (!pred_st_meta(f, "nheads", text, cap)) return 4;
    char *end;
    long v = strtol(text, &end, 10);
    return end != text && !*end && v >= 1 && v <= 65536 ? (int)v : 0;
}

static polar_status shape_of(const st_file *f, const char *name, int dim, int64_t *out, polar_error *err) {
    const st_tensor *t = st_find(f, name);
    if (!t || t->ndim <= dim) return polar_fail(err, POLAR_ERR_FORMAT, "%s: no tensor '%s'", f->path, name);
    *out = t->shape[dim];
    return POLAR_OK;
}

polar_status polar_predictor_load(const char *path, polar_predictor **out, polar_error *err) {
    *out = NULL;
    st_file f;
    polar_status st = st_open(path, &f, err);
    if (st != POLAR_OK) return st;
    polar_predictor *p = calloc(1, sizeof *p);
    int64_t D = 0, d = 0, dq = 0, ff = 0;
    if (!p) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    if (st == POLAR_OK) st = shape_of(&f, "layer_embedding.weight", 0, &D, err);
    if (st == POLAR_OK) st = shape_of(&f, "layer_embedding.weight", 1, &d, err);
    if (st == POLAR_OK) st = shape_of(&f, "q_proj.weight", 1, &dq, err);
    if (st == POLAR_OK) st = shape_of(&f, "layer_encoder.layers.0.linear1.weight", 0, &ff, err);
    char heads_text[32];
    if (st == POLAR_OK) {
        p->D = (int)D, p->d = (int)d, p->dq = (int)dq, p->ff = (int)ff;
        p->heads = header_heads(&f, heads_text, sizeof heads_text);
        if (D < 1 || D > 4096 || d < 1 || d > 65536 || dq < 1 || dq > 65536 || ff < 1 || ff > 1 << 20)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: implausible predictor shape (D %lld, d %lld, d_q %lld)", path,
                            (long long)D, (long long)d, (long long)dq);
        else if (!p->heads)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: metadata nheads \"%s\" is not a head count (1 to 65536)", path,
                            heads_text);
        else if (d % p->heads)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: d_model %lld is not divisible by %d heads", path, (long long)d,
                            p->heads);
    }
    pred_ref refs[PRED_TENSORS];
    const st_tensor *found[PRED_TENSORS];
    int n = st == POLAR_OK ? pred_tensor_refs(p, refs) : 0;
    /* Every tensor is checked before the storage its shapes imply is
     * allocated: a header that lies about one shape fails on it, not in malloc. */
    size_t total = 0;
    for (int i = 0; i < n && st == POLAR_OK; i++) {
        const st_tensor *t = found[i] = st_find(&f, refs[i].name);
        int dims = refs[i].cols ? 2 : 1;
        if (!t)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: predictor tensor '%s' is missing", path, refs[i].name);
        else if (t->ndim != dims || t->shape[0] != refs[i].rows || (dims == 2 && t->shape[1] != refs[i].cols))
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' does not fit D %d, d %d, d_q %d, ff %d", path,
                            refs[i].name, p->D, p->d, p->dq, p->ff);
        else if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has dtype %s (F32, BF16 or F16 expected)", path,
                            refs[i].name, st_dtype_name(t->dtype));
        total += pred_ref_count(&refs[i]);
    }
    if (st == POLAR_OK) {
        p->storage_floats = total;
        if (!(p->storage = malloc(total * sizeof(float)))) st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    }
    float *next = st == POLAR_OK ? p->storage : NULL;
    for (int i = 0; i < n && st == POLAR_OK; i++) {
        const st_tensor *t = found[i];
        size_t count = pred_ref_count(&refs[i]);
        const unsigned char *src = t->data;
        for (size_t k = 0; k < count; k++) {
            uint16_t h;
            if (t->dtype == ST_F32) memcpy(&next[k], src + 4 * k, 4);
            else if ((memcpy(&h, src + 2 * k, 2), t->dtype == ST_BF16)) next[k] = bf16_to_f32(h);
            else next[k] = f16_to_f32(h);
        }
        *refs[i].dst = next;
        next += count;
    }
    char *programs = st == POLAR_OK ? pred_st_meta_dup(&f, PRED_META_PROGRAMS) : NULL;
    if (programs) {
        polar_error why;
        if (pred_catalogue_parse(programs, p->D, polar_decode_defaults().kmax, &p->catalogue, &why) != POLAR_OK)
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: metadata %s: %s", path, PRED_META_PROGRAMS, why.msg);
        free(programs);
    }
    st_close(&f);
    if (st != POLAR_OK) {
        polar_predictor_free(p);
        return st;
    }
    *out = p;
    return POLAR_OK;
}

void polar_predictor_free(polar_predictor *p) {
    if (!p) return;
    pred_cuda_free(p->cuda);
    polar_catalogue_free(p->catalogue);
    free(p->storage);
    free(p);
}

int polar_predictor_layers(const polar_predictor *p) { return p ? p->D : 0; }
int polar_predictor_input_dim(const polar_predictor *p) { return p ? p->dq : 0; }
