/* What a loaded model holds. Weights are bf16, row-major [out, in] as in
 * Hugging Face checkpoints; either inside a mapped file or in buffers the
 * model owns. */
#ifndef POLAR_MODEL_H
#define POLAR_MODEL_H

#include "../kernels/cpu/bf16.h"
#include "../loader/safetensors.h"
#include "polar.h"

typedef struct {
    const bf16 *attn_norm;      /* [hidden] */
    const bf16 *wq;             /* [n_heads*head_dim, hidden] */
    const bf16 *wk, *wv;        /* [n_kv_heads*head_dim, hidden] */
    const bf16 *bq, *bk, *bv;   /* q/k/v bias or NULL (Qwen2) */
    const bf16 *q_norm, *k_norm;/* [head_dim] or NULL (Qwen3) */
    const bf16 *wo;             /* [hidden, n_heads*head_dim] */
    const bf16 *mlp_norm;       /* [hidden] */
    const bf16 *w_gate, *w_up;  /* [ffn, hidden] */
    const bf16 *w_down;         /* [hidden, ffn] */
} layer_weights;

struct polar_model {
    polar_arch arch;
    const bf16 *embed;          /* [vocab, hidden] */
    const bf16 *final_norm;     /* [hidden] */
    const bf16 *lm_head;        /* [vocab, hidden]; == embed when tied */
    layer_weights *layers;      /* [n_layers] */
    float *rope_inv_freq;       /* [head_dim/2], scaling applied */
    st_set files;               /* mapped safetensors checkpoint, or */
    void *gguf;                 /* a mapped GGUF file (gguf_file *) */
    void **owned;               /* buffers the model allocated */
    int n_owned, cap_owned;
};

/* One weight tensor of the model: its checkpoint name, where its pointer
 * lives in the model, and its shape (cols = 0 for vectors). */
typedef struct {
    char name[96];       /* Hugging Face name */
    char gguf_name[64];  /* the same tensor in a GGUF file */
    const bf16 **slot;
    int rows, cols;
    int rope_permuted;   /* q/k weights: GGUF llama rows are permuted per head */
} tensor_ref;

/* Every tensor the architecture needs, in checkpoint order. refs must hold
 * model_tensor_count(arch) entries. */
int model_tensor_count(const polar_arch *a);
void model_tensor_refs(polar_model *m, tensor_ref *refs);

/* Keep a buffer alive as long as the model; returns 0 when out of memory. */
int model_own(polar_model *m, void *buf);

/* Fill m->rope_inv_freq from the arch (default or llama3 scaling). */
int model_init_rope(polar_model *m);

#endif
