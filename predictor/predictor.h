/* The PoLar predictor's weights (f32, PyTorch layout [out, in]). */
#ifndef POLAR_PREDICTOR_H
#define POLAR_PREDICTOR_H

#include "../loader/safetensors.h"
#include "polar.h"

#define PRED_BLOCKS 2       /* transformer encoder layers over the D positions */
#define PRED_MAX_TOKENS 512 /* the reference truncates questions to 512 tokens */

typedef struct {
    const float *in_w, *in_b;   /* [3d, d], [3d]  q, k, v projections stacked */
    const float *out_w, *out_b; /* [d, d], [d] */
} pred_mha;

typedef struct {
    pred_mha attn;
    const float *lin1_w, *lin1_b; /* [ff, d], [ff] */
    const float *lin2_w, *lin2_b; /* [d, ff], [d] */
    const float *norm1_w, *norm1_b, *norm2_w, *norm2_b; /* [d] */
} pred_block;

struct polar_predictor {
    int D, d, dq, heads, ff;
    const float *q_proj_w, *q_proj_b; /* [d, dq], [d] */
    const float *layer_emb;           /* [D, d] */
    pred_mha cross;
    pred_block blocks[PRED_BLOCKS];
    const float *seg_w, *seg_b;       /* [1, d], [1] */
    const float *op_w, *op_b;         /* [3, d], [3] */
    float *storage;                   /* every tensor above, converted to f32 */
    size_t storage_floats;
    void *cuda;                       /* device copy and workspaces, or NULL */
};

/* One tensor under its reference name; cols 0: a vector. The order of
 * pred_tensor_refs is the order of the tensors in storage. */
#define PRED_TENSORS (7 + 12 * PRED_BLOCKS + 4)
typedef struct {
    char name[64];
    const float **dst;
    int rows, cols;
} pred_ref;
int pred_tensor_refs(polar_predictor *p, pred_ref *r); /* fills PRED_TENSORS entries for p's shape */
static inline size_t pred_ref_count(const pred_ref *r) { return (size_t)r->rows * (size_t)(r->cols ? r->cols : 1); }

/* A string of a safetensors file's __metadata__ into out (cap bytes,
 * truncated); 0 when the header has none under key. */
int pred_st_meta(const st_file *f, const char *key, char *out, size_t cap);

/* Run on the device copy (predictor/cuda.c). h: host memory, or the
 * device input pred_cuda_input gives (then no upload). */
polar_status pred_cuda_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op, polar_error *err);
/* The device copy's token-state input [PRED_MAX_TOKENS, dq], for an encoder
 * on the same GPUs to write into; NULL without a device copy. */
float *pred_cuda_input(const polar_predictor *p);
void pred_cuda_free(void *state);

#endif
