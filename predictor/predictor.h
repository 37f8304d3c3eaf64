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
    polar_catalogue *catalogue;       /* the programs polar train stored (metadata "programs"), or NULL */
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

/* The metadata key of the catalogue: its programs' text forms joined by ';'. */
#define PRED_META_PROGRAMS "programs"
int pred_same_program(const polar_program *a, const polar_program *b);
char *pred_catalogue_format(const polar_catalogue *c); /* malloc'd; NULL when out of memory */
polar_status pred_catalogue_parse(const char *text, int D, int kmax, polar_catalogue **out, polar_error *err);
/* A string of the metadata (malloc'd), or NULL when the header has none under key. */
char *pred_st_meta_dup(const st_file *f, const char *key);

/* The beam, or the predictor's catalogue when opts asks for it. */
polar_status pred_decode(const polar_predictor *p, const float *seg, const float *op, const polar_decode_opts *opts,
                         polar_candidate *out, int max_out, int *n_out, polar_error *err);

/* Run on the device copy (predictor/cuda.c). h: host memory, or the
 * device input pred_cuda_input gives (then no upload). */
polar_status pred_cuda_logits(const polar_predictor *p, const float *h, int T, float *seg, float *op, polar_error *err);
/* The device copy's token-state input [PRED_MAX_TOKENS, dq], for an encoder
 * on the same GPUs to write into; NULL without a device copy. */
float *pred_cuda_input(const polar_predictor *p);
void pred_cuda_free(void *state);

#endif
