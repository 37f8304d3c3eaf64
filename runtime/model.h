/* What a loaded model holds. Weights are bf16, row-major [out, in] as in
 * Hugging Face checkpoints; either inside a mapped file or in buffers the
 * model owns. A GGUF's quantized projections, embedding and head stay in
 * their block format: then the pointer holds blocks (rows of
 * cpu_wtype_row_bytes, or Q8_0/Q4_0/Q4_1 interleaved by 16 rows when the
 * CPU kernels want that, quant.h) and the matrix's t_* field says which. */
#ifndef POLAR_MODEL_H
#define POLAR_MODEL_H

#include <pthread.h>

#include "../kernels/cpu/bf16.h"
#include "../kernels/cpu/quant.h"
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
    const bf16 *w_gate, *w_up;  /* [ffn, hidden]   dense MLP (NULL in MoE layers) */
    const bf16 *w_down;         /* [hidden, ffn] */
    const bf16 *router;         /* [n_experts, hidden]                MoE layers only */
    const bf16 *exp_gate_up;    /* [n_experts, 2*moe_ffn, hidden]  gate rows, then up rows (Hugging Face checkpoints) */
    const bf16 *exp_gate, *exp_up; /* [n_experts, moe_ffn, hidden] each: a GGUF's stacks (exp_gate_up NULL) */
    const bf16 *exp_down;       /* [n_experts, hidden, moe_ffn] */
    const bf16 *sh_gate, *sh_up;/* [shared_ffn, hidden]  shared expert, or NULL */
    const bf16 *sh_down;        /* [hidden, shared_ffn] */
    const bf16 *sh_router;      /* [1, hidden]  sigmoid gate of the shared expert */
    /* storage of the projections and experts (CPU_W_BF16 unless a GGUF kept them quantized; a GGUF's expert
     * stacks as matrices of n_experts * rows rows) */
    cpu_wtype t_wq, t_wk, t_wv, t_wo, t_gate, t_up, t_down;
    cpu_wtype t_exp_gate, t_exp_up, t_exp_down, t_sh_gate, t_sh_up, t_sh_down;
} layer_weights;

/* The model's weights on the GPU: uploaded by its first CUDA session and
 * shared by every later one until the model is freed. */
typedef struct {
    pthread_mutex_t lock;
    void *weights; /* cuda_weights * (runtime/cuda_backend.c), NULL until needed */
} model_device;

struct polar_model {
    polar_arch arch;
    const bf16 *embed;          /* [vocab, hidden] */
    const bf16 *final_norm;     /* [hidden] */
    const bf16 *lm_head;        /* [vocab, hidden]; == embed when tied */
    cpu_wtype t_embed, t_lm_head; /* their storage */
    int quantized;              /* some weight is kept in a block format */
    layer_weights *layers;      /* [n_layers] */
    float *rope_inv_freq;       /* [head_dim/2], scaling applied */
    float rope_scale;           /* cos and sin times this (YaRN's attention factor; 1 otherwise) */
    st_set files;               /* mapped safetensors checkpoint, or */
    void *gguf;                 /* a mapped GGUF file (gguf_file *) */
    void **owned;               /* buffers the model allocated */
    int n_owned, cap_owned;
    model_device *device;
};

/* One weight tensor as a checkpoint holds it, and where its elements live in
 * the model: a region of a destination buffer (*slot, dst_elems long).
 * A stack of experts [experts, rows, cols] lands chunk by chunk, expert e at
 * dst_offset + e * dst_stride; a plain tensor at dst_offset. */
typedef struct {
    char name[96];       /* Hugging Face name */
    char gguf_name[64];  /* the same tensor in a GGUF file */
    const bf16 **slot;
    cpu_wtype *wtype;    /* where its storage type goes, if it may stay quantized; else NULL */
    int layer;           /* -1 for embedding, final norm and head */
    int experts;         /* 0: a 1-D/2-D tensor; E: a 3-D stack */
    int rows, cols;      /* cols = 0 for vectors */
    size_t dst_elems, dst_offset, dst_stride;
    int rope_permuted;   /* q/k weights: GGUF llama rows are permuted per head */
} tensor_ref;

/* How a checkpoint lays out expert weights. */
typedef enum {
    LAYOUT_PER_EXPERT, /* mlp.experts.E.{gate,up,down}_proj.weight (transformers v4, the Qwen releases) */
    LAYOUT_STACKED,    /* mlp.experts.gate_up_proj / down_proj (transformers v5) */
    LAYOUT_GGUF,       /* blk.N.ffn_{gate,up,down}_exps stacks */
} expert_layout;

/* Every tensor the architecture needs, in checkpoint order: allocates the
 * list (free it) and returns its length, or -1 when out of memory. */
int model_tensor_refs(polar_model *m, expert_layout layout, tensor_ref **refs);

/* Elements of a ref (all experts). */
size_t ref_elems(const tensor_ref *r);

/* Where chunk e of a ref (an expert, or the whole tensor) lies in m as
 * bf16: its own region, or the same rows of the model's other layout of
 * the experts' gate and up rows (a Hugging Face [E, 2F, H] block against a
 * GGUF's two stacks); NULL when they are not held as bf16 or the chunk is
 * not contiguous there (a stacked gate_up_proj of a GGUF-loaded model). */
const bf16 *ref_chunk(const polar_model *m, const tensor_ref *r, int e);

/* Copy a ref's elements out of the model (for writers): n = ref_elems.
 * 0 when some chunk has no bf16 rows to copy (ref_chunk). */
int ref_gather(const polar_model *m, const tensor_ref *r, bf16 *out);

/* Bind every tensor of a checkpoint (m->files or m->gguf) into the model. */
polar_status model_bind(polar_model *m, polar_error *err);

/* Fill every tensor with deterministic random values. */
polar_status model_fill_random(polar_model *m, uint64_t seed, polar_error *err);

/* Keep a buffer alive as long as the model; returns 0 when out of memory. */
int model_own(polar_model *m, void *buf);

/* 1 when token ends a generation: an eos id of the model or a stop id of o
 * (ignore_eos is the caller's to check). Sessions and batches both. */
int gen_stops_at(const polar_arch *a, const polar_gen_opts *o, int token);

/* Fill m->rope_inv_freq and m->rope_scale from the arch's rope_type. */
int model_init_rope(polar_model *m);

#endif
