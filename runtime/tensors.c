/* The model's tensor table and binding checkpoint tensors into it.
 *
 * One table (model_tensor_refs) names every tensor an architecture needs in
 * each checkpoint layout, with its shape and the region of the model buffer
 * it fills. Loading (safetensors or GGUF), random initialisation and saving
 * all walk the same table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../loader/gguf.h"
#include "error.h"
#include "model.h"

typedef struct {
    tensor_ref *r;
    int n, cap;
    polar_model *m;
} ref_list;

/* Append a ref; hf/gguf are printf formats taking (layer, expert). */
static void add(ref_list *l, const bf16 **slot, int layer, int experts, int rows, int cols, size_t dst_elems,
                size_t dst_offset, size_t dst_stride, const char *hf, const char *gguf, int expert) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        tensor_ref *r = realloc(l->r, (size_t)cap * sizeof *r);
        if (!r) {
            l->cap = -1;
            return;
        }
        l->r = r;
        l->cap = cap;
    }
    if (l->cap < 0) return;
    tensor_ref *r = &l->r[l->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, hf, layer, expert);
    snprintf(r->gguf_name, sizeof r->gguf_name, gguf, layer, expert);
    r->slot = slot;
    r->layer = layer;
    r->experts = experts;
    r->rows = rows;
    r->cols = cols;
    r->dst_elems = dst_elems ? dst_elems : (size_t)rows * (size_t)(cols ? cols : 1);
    r->dst_offset = dst_offset;
    r->dst_stride = dst_stride;
}

/* A whole-buffer tensor [rows, cols] (cols = 0: a vector). */
static void add_plain(ref_list *l, const bf16 **slot, int layer, int rows, int cols, const char *hf, const char *gguf) {
    add(l, slot, layer, 0, rows, cols, 0, 0, 0, hf, gguf, 0);
}

/* A matrix that may stay in a GGUF block format; its type lands in *wtype. */
static void add_matrix(ref_list *l, const bf16 **slot, cpu_wtype *wtype, int layer, int rows, int cols, const char *hf,
                       const char *gguf) {
    add_plain(l, slot, layer, rows, cols, hf, gguf);
    if (l->cap >= 0) l->r[l->n - 1].wtype = wtype;
}

/* A stack of experts [experts, rows, cols] that may stay in a GGUF block
 * format, in a buffer of its own (a matrix of experts * rows rows). */
static void add_expert_matrix(ref_list *l, const bf16 **slot, cpu_wtype *wtype, int layer, int experts, int rows,
                              int cols, const char *gguf) {
    add(l, slot, layer, experts, rows, cols, (size_t)experts * rows * cols, 0, (size_t)rows * cols, gguf, gguf, 0);
    if (l->cap >= 0) l->r[l->n - 1].wtype = wtype;
}

static void add_experts(ref_list *l, layer_weights *w, int layer, expert_layout layout) {
    const polar_arch *a = &l->m->arch;
    int E = a->n_experts, F = a->moe_ffn, H = a->hidden;
    size_t gu = (size_t)2 * F * H, dn = (size_t)H * F;
    add_plain(l, &w->router, layer, E, H, "model.layers.%d.mlp.gate.weight", "blk.%d.ffn_gate_inp.weight");
    if (layout == LAYOUT_PER_EXPERT) {
        for (int e = 0; e < E; e++) {
            add(l, &w->exp_gate_up, layer, 0, F, H, E * gu, e * gu, 0, "model.layers.%d.mlp.experts.%d.gate_proj.weight",
                "", e);
            add(l, &w->exp_gate_up, layer, 0, F, H, E * gu, e * gu + (size_t)F * H, 0,
                "model.layers.%d.mlp.experts.%d.up_proj.weight", "", e);
            add(l, &w->exp_down, layer, 0, H, F, E * dn, e * dn, 0, "model.layers.%d.mlp.experts.%d.down_proj.weight", "",
                e);
        }
    } else if (layout == LAYOUT_STACKED) {
        add(l, &w->exp_gate_up, layer, E, 2 * F, H, E * gu, 0, gu, "model.layers.%d.mlp.experts.gate_up_proj", "", 0);
        add(l, &w->exp_down, layer, E, H, F, E * dn, 0, dn, "model.layers.%d.mlp.experts.down_proj", "", 0);
    } else { /* separate gate and up stacks, each possibly kept in its blocks */
        add_expert_matrix(l, &w->exp_gate, &w->t_exp_gate, layer, E, F, H, "blk.%d.ffn_gate_exps.weight");
        add_expert_matrix(l, &w->exp_up, &w->t_exp_up, layer, E, F, H, "blk.%d.ffn_up_exps.weight");
        add_expert_matrix(l, &w->exp_down, &w->t_exp_down, layer, E, H, F, "blk.%d.ffn_down_exps.weight");
    }
    if (a->shared_ffn) {
        int S = a->shared_ffn;
        add_matrix(l, &w->sh_gate, &w->t_sh_gate, layer, S, H, "model.layers.%d.mlp.shared_expert.gate_proj.weight",
                   "blk.%d.ffn_gate_shexp.weight");
        add_matrix(l, &w->sh_up, &w->t_sh_up, layer, S, H, "model.layers.%d.mlp.shared_expert.up_proj.weight",
                   "blk.%d.ffn_up_shexp.weight");
        add_matrix(l, &w->sh_down, &w->t_sh_down, layer, H, S, "model.layers.%d.mlp.shared_expert.down_proj.weight",
                   "blk.%d.ffn_down_shexp.weight");
        add_plain(l, &w->sh_router, layer, 1, H, "model.layers.%d.mlp.shared_expert_gate.weight", "blk.%d.ffn_gate_inp_shexp.weight");
    }
}

int model_tensor_refs(polar_model *m, expert_layout layout, tensor_ref **out) {
    const polar_arch *a = &m->arch;
    ref_list l = {NULL, 0, 0, m};
    int q = a->n_heads * a->head_dim, kv = a->n_kv_heads * a->head_dim;
    add_matrix(&l, &m->embed, &m->t_embed, -1, a->vocab, a->hidden, "model.embed_tokens.weight", "token_embd.weight");
    for (int i = 0; i < a->n_layers; i++) {
        layer_weights *w = &m->layers[i];
        add_plain(&l, &w->attn_norm, i, a->hidden, 0, "model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight");
        add_matrix(&l, &w->wq, &w->t_wq, i, q, a->hidden, "model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight");
        if (l.n) l.r[l.n - 1].rope_permuted = 1;
        add_matrix(&l, &w->wk, &w->t_wk, i, kv, a->hidden, "model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight");
        if (l.n) l.r[l.n - 1].rope_permuted = 1;
        add_matrix(&l, &w->wv, &w->t_wv, i, kv, a->hidden, "model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight");
        if (a->qkv_bias) {
            add_plain(&l, &w->bq, i, q, 0, "model.layers.%d.self_attn.q_proj.bias", "blk.%d.attn_q.bias");
            add_plain(&l, &w->bk, i, kv, 0, "model.layers.%d.self_attn.k_proj.bias", "blk.%d.attn_k.bias");
            add_plain(&l, &w->bv, i, kv, 0, "model.layers.%d.self_attn.v_proj.bias", "blk.%d.attn_v.bias");
        }
        if (a->qk_norm) {
            add_plain(&l, &w->q_norm, i, a->head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", "blk.%d.attn_q_norm.weight");
            add_plain(&l, &w->k_norm, i, a->head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", "blk.%d.attn_k_norm.weight");
        }
        add_matrix(&l, &w->wo, &w->t_wo, i, a->hidden, q, "model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight");
        add_plain(&l, &w->mlp_norm, i, a->hidden, 0, "model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight");
        if (polar_arch_layer_is_moe(a, i)) {
            add_experts(&l, w, i, layout);
        } else {
            add_matrix(&l, &w->w_gate, &w->t_gate, i, a->ffn, a->hidden, "model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight");
            add_matrix(&l, &w->w_up, &w->t_up, i, a->ffn, a->hidden, "model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight");
            add_matrix(&l, &w->w_down, &w->t_down, i, a->hidden, a->ffn, "model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight");
        }
    }
    add_plain(&l, &m->final_norm, -1, a->hidden, 0, "model.norm.weight", "output_norm.weight");
    if (!a->tied_embeddings) add_matrix(&l, &m->lm_head, &m->t_lm_head, -1, a->vocab, a->hidden, "lm_head.weight", "output.weight");
    if (l.cap < 0) {
        free(l.r);
        return -1;
    }
    *out = l.r;
    return l.n;
}

size_t ref_elems(const tensor_ref *r) {
    return (size_t)(r->experts ? r->experts : 1) * (size_t)r->rows * (size_t)(r->cols ? r->cols : 1);
}

/* The chunk of a ref: one expert's rows x cols, or the whole tensor. */
static size_t chunk_elems(const tensor_ref *r) { return ref_elems(r) / (size_t)(r->experts ? r->experts : 1); }

/* The bf16 rows [first, first + n) of expert e's gate and up rows (gate
 * rows 0..F-1, up rows F..2F-1) in m's layer w, whichever way it holds them
 * (one [E, 2F, H] block, or a GGUF's two stacks, which must be bf16 then). */
static const bf16 *gate_up_rows(const polar_model *m, const layer_weights *w, size_t e, size_t first) {
    size_t F = (size_t)m->arch.moe_ffn, H = (size_t)m->arch.hidden;
    if (w->exp_gate_up) return w->exp_gate_up + (e * 2 * F + first) * H;
    if (first < F) return w->t_exp_gate == CPU_W_BF16 && w->exp_gate ? w->exp_gate + (e * F + first) * H : NULL;
    return w->t_exp_up == CPU_W_BF16 && w->exp_up ? w->exp_up + (e * F + first - F) * H : NULL;
}

const bf16 *ref_chunk(const polar_model *m, const tensor_ref *r, int e) {
    if (*r->slot) return *r->slot + r->dst_offset + (size_t)e * r->dst_stride;
    const layer_weights *w = r->layer >= 0 ? &m->layers[r->layer] : NULL;
    if (!w) return NULL;
    size_t F = (size_t)m->arch.moe_ffn, H = (size_t)m->arch.hidden;
    if (r->slot == &w->exp_gate_up && r->rows == (int)F) { /* one expert's gate or up rows (per-expert layout) */
        size_t off = r->dst_offset + (size_t)e * r->dst_stride;
        return gate_up_rows(m, w, off / (2 * F * H), off % (2 * F * H) / H);
    }
    if (r->slot == &w->exp_gate || r->slot == &w->exp_up) /* a GGUF stack's expert e */
        return gate_up_rows(m, w, (size_t)e, r->slot == &w->exp_up ? F : 0);
    return NULL;
}

int ref_gather(const polar_model *m, const tensor_ref *r, bf16 *out) {
    size_t c = chunk_elems(r);
    for (int e = 0; e < (r->experts ? r->experts : 1); e++) {
        const bf16 *chunk = ref_chunk(m, r, e);
        if (!chunk) return 0;
        memcpy(out + (size_t)e * c, chunk, c * sizeof *out);
    }
    return 1;
}

/* Place a ref's elements (src, ref_elems long) into its region, allocating
 * the destination buffer on first use. */
static polar_status ref_scatter(polar_model *m, const tensor_ref *r, const bf16 *src, polar_error *err) {
    if (!*r->slot) {
        bf16 *buf = malloc(r->dst_elems * sizeof *buf);
        if (!model_own(m, buf)) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for '%s'", r->name);
        *r->slot = buf;
    }
    bf16 *dst = (bf16 *)*r->slot;
    size_t c = chunk_elems(r);
    for (int e = 0; e < (r->experts ? r->experts : 1); e++)
        memcpy(dst + r->dst_offset + (size_t)e * r->dst_stride, src + (size_t)e * c, c * sizeof *src);
    return POLAR_OK;
}

/* ------------------------------------------------------------- binding */

/* A tensor as a file holds it, in Hugging Face order ([experts,] rows, cols). */
typedef struct {
    const char *file;
    int ndim;
    int64_t shape[4];
    st_dtype dtype;     /* BF16, F16, F32 ... when quant == 0 */
    int quant;          /* a ggml quantised type (Q4_0, Q4_1, Q8_0), or 0 */
    const void *data;
} tensor_view;

/* Undo llama.cpp's per-head row permutation of q/k (adjacent-pair RoPE):
 * permuted row 2i+j of a head holds original row j*hd/2 + i. Rows are
 * row_bytes long (bf16 or quantized blocks alike). */
static int unpermute_rows(void *w, int rows, size_t row_bytes, int head_dim) {
    unsigned char *tmp = malloc((size_t)head_dim * row_bytes);
    if (!tmp) return 0;
    int half = head_dim / 2;
    for (int h = 0; h < rows / head_dim; h++) {
        unsigned char *head = (unsigned char *)w + (size_t)h * head_dim * row_bytes;
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + (size_t)(j * half + i) * row_bytes, head + (size_t)(2 * i + j) * row_bytes, row_bytes);
        memcpy(head, tmp, (size_t)head_dim * row_bytes);
    }
    free(tmp);
    return 1;
}

static int shape_matches(const tensor_ref *r, const tensor_view *t) {
    int64_t want[3];
    int n = 0;
    if (r->experts) want[n++] = r->experts;
    want[n++] = r->rows;
    if (r->cols) want[n++] = r->cols;
    if (t->ndim == n) {
        for (int d = 0; d < n; d++)
            if (t->shape[d] != want[d]) return 0;
        return 1;
    }
    /* A [1, cols] matrix may be stored as a vector (GGUF's shared-expert gate). */
    return !r->experts && r->rows == 1 && t->ndim == 1 && t->shape[0] == r->cols;
}

static polar_status shape_error(const tensor_ref *r, const tensor_view *t, const char *name, polar_error *err) {
    char got[96] = "", want[96] = "";
    for (int d = 0, k = 0; d < t->ndim && k < 80; d++)
        k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    int k = 0;
    if (r->experts) k += snprintf(want + k, sizeof want - (size_t)k, "%d, ", r->experts);
    k += snprintf(want + k, sizeof want - (size_t)k, "%d", r->rows);
    if (r->cols) snprintf(want + k, sizeof want - (size_t)k, ", %d", r->cols);
    return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%s]", t->file, name, got, want);
}

/* Convert a view's elements to bf16 (n of them) into out. */
static polar_status convert(const tensor_view *t, const char *name, size_t n, size_t row, bf16 *out, polar_error *err) {
    const unsigned char *src = t->data;
    if (t->quant) {
        float *f = malloc(row * sizeof *f);
        if (!f) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", name);
        size_t row_bytes = row / ggml_block_elems(t->quant) * ggml_block_bytes(t->quant);
        for (size_t i = 0; i < n / row; i++) {
            ggml_dequantize(t->quant, src + i * row_bytes, f, row);
            for (size_t j = 0; j < row; j++) out[i * row + j] = f32_to_bf16(f[j]);
        }
        free(f);
        return POLAR_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == ST_BF16) {
            memcpy(&out[i], src + 2 * i, 2);
        } else if (t->dtype == ST_F16) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = f32_to_bf16(f16_to_f32(h));
        } else {
            float f;
            memcpy(&f, src + 4 * i, 4);
            out[i] = f32_to_bf16(f);
        }
    }
    return POLAR_OK;
}

/* Bind one tensor: check its shape, use bf16 in place when it fills its
 * whole buffer, else convert and place it. */
static polar_status bind_view(polar_model *m, const tensor_ref *r, const tensor_view *t, const char *name,
                              int permuted, polar_error *err) {
    if (!shape_matches(r, t)) return shape_error(r, t, name, err);
    if (!t->quant && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has dtype %s (BF16, F16 or F32 expected)", t->file,
                          name, st_dtype_name(t->dtype));
    size_t n = ref_elems(r);
    if (!t->quant && t->dtype == ST_BF16 && ((uintptr_t)t->data & 1) == 0 && !permuted && r->dst_offset == 0 &&
        n == r->dst_elems && !*r->slot) {
        *r->slot = t->data;
        return POLAR_OK;
    }
    bf16 *buf = malloc(n * sizeof *buf);
    if (!buf) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", name);
    polar_status st = convert(t, name, n, r->cols ? (size_t)r->cols : n, buf, err);
    if (st == POLAR_OK && permuted && !unpermute_rows(buf, r->rows, (size_t)r->cols * sizeof *buf, m->arch.head_dim))
        st = polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", name);
    if (st == POLAR_OK) st = ref_scatter(m, r, buf, err);
    free(buf);
    return st;
}

static polar_status bind_safetensors(polar_model *m, const tensor_ref *r, polar_error *err) {
    tensor_view v = {0};
    const st_tensor *t = st_set_find(&m->files, r->name, &v.file);
    if (!t) return polar_fail(err, POLAR_ERR_FORMAT, "checkpoint has no tensor '%s'", r->name);
    v.ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < 4; d++) v.shape[d] = t->shape[d];
    v.dtype = t->dtype;
    v.data = t->data;
    return bind_view(m, r, &v, r->name, 0, err);
}

/* The block format a GGUF type stays in, or CPU_W_BF16. */
static cpu_wtype kept_type(ggml_type t) { return cpu_wtype_kept(ggml_block_format(t)) ? ggml_block_format(t) : CPU_W_BF16; }

/* The whole pages of a mapped tensor nothing reads any more (its blocks
 * were repacked): handed back, so the model's resident memory stays about
 * its size rather than twice it. The file stays mapped; a read would bring
 * them back. */
static void release_pages(const void *data, size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)data + page - 1) / page * page, hi = ((uintptr_t)data + n) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: its failure changes nothing */
}

/* Keep a quantized matrix in its blocks: in place in the mapping, or (q/k
 * of llama, whose rows must be unpermuted) in a copy the model owns; or,
 * when the CPU kernels multiply it faster so (cpu_x16_active), repacked
 * into an interleaved copy the model owns (the mapped blocks are then no
 * longer read). */
static polar_status keep_blocks(polar_model *m, const tensor_ref *r, const gguf_tensor *t, cpu_wtype wt, int permuted,
                                polar_error *err) {
    /* a stack of experts is one matrix of all their rows */
    int rows = r->rows * (r->experts ? r->experts : 1);
    size_t row_bytes = cpu_wtype_row_bytes(wt, (size_t)r->cols);
    if (row_bytes * (size_t)rows != t->nbytes)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s': %zu bytes of %s blocks, expected %zu",
                          ((const gguf_file *)m->gguf)->path, r->gguf_name, t->nbytes, cpu_wtype_name(wt),
                          row_bytes * (size_t)rows);
    const void *blocks = t->data; /* blocks are read bytewise: any alignment will do */
    void *copy = NULL;
    if (permuted) {
        copy = malloc(t->nbytes);
        if (!copy) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for '%s'", r->gguf_name);
        memcpy(copy, t->data, t->nbytes);
        if (!unpermute_rows(copy, r->rows, row_bytes, m->arch.head_dim)) {
            free(copy);
            return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for '%s'", r->gguf_name);
        }
        blocks = copy;
    }
    /* interleaved when each expert's rows start a group of 16 */
    cpu_wtype x16 = !r->experts || r->rows % 16 == 0 ? cpu_x16_active(wt) : CPU_W_BF16;
    if (x16 != CPU_W_BF16) {
        void *packed = malloc(cpu_x16_bytes(x16, rows, (size_t)r->cols));
        if (packed) {
            cpu_repack_x16(wt, blocks, rows, (size_t)r->cols, packed);
            release_pages(t->data, t->nbytes);
        }
        free(copy);
        if (!model_own(m, packed)) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for '%s'", r->gguf_name);
        blocks = packed, wt = x16;
    } else if (copy && !model_own(m, copy)) {
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for '%s'", r->gguf_name);
    }
    *r->slot = blocks;
    *r->wtype = wt;
    m->quantized = 1;
    return POLAR_OK;
}

static polar_status bind_gguf(polar_model *m, const tensor_ref *r, int keep_quant, polar_error *err) {
    const gguf_file *g = m->gguf;
    const gguf_tensor *t = gguf_find_tensor(g, r->gguf_name);
    if (!t) return polar_fail(err, POLAR_ERR_FORMAT, "%s: no tensor '%s'", g->path, r->gguf_name);
    tensor_view v = {.file = g->path, .ndim = t->n_dims, .data = t->data};
    for (int d = 0; d < t->n_dims; d++) v.shape[d] = (int64_t)t->ne[t->n_dims - 1 - d]; /* ggml order is reversed */
    if (t->type == GGML_F32) v.dtype = ST_F32;
    else if (t->type == GGML_F16) v.dtype = ST_F16;
    else if (t->type == GGML_BF16) v.dtype = ST_BF16;
    else v.quant = t->type;
    int permuted = r->rope_permuted && strcmp(m->arch.arch, "llama") == 0;
    cpu_wtype wt = kept_type(t->type);
    if (keep_quant && wt != CPU_W_BF16 && r->wtype && r->dst_offset == 0 && r->dst_elems == ref_elems(r) && !*r->slot) {
        if (!shape_matches(r, &v)) return shape_error(r, &v, r->gguf_name, err);
        return keep_blocks(m, r, t, wt, permuted, err);
    }
    return bind_view(m, r, &v, r->gguf_name, permuted, err);
}

/* The expert layout of a safetensors checkpoint: stacked if it has the v5
 * tensors for its first MoE layer. */
static expert_layout safetensors_layout(const polar_model *m) {
    for (int l = 0; l < m->arch.n_layers; l++)
        if (polar_arch_layer_is_moe(&m->arch, l)) {
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
            return st_set_find(&m->files, name, NULL) ? LAYOUT_STACKED : LAYOUT_PER_EXPERT;
        }
    return LAYOUT_PER_EXPERT;
}

polar_status model_bind(polar_model *m, polar_error *err) {
    tensor_ref *refs;
    int n = model_tensor_refs(m, m->gguf ? LAYOUT_GGUF : safetensors_layout(m), &refs);
    if (n < 0) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    /* POLAR_GGUF_BF16=1: dequantize every GGUF weight to bf16 at load, as
     * before quantized execution (to compare with it). */
    const char *bf = getenv("POLAR_GGUF_BF16");
    int keep_quant = !(bf && *bf && strcmp(bf, "0") != 0);
    polar_status st = POLAR_OK;
    for (int i = 0; i < n && st == POLAR_OK; i++)
        st = m->gguf ? bind_gguf(m, &refs[i], keep_quant, err) : bind_safetensors(m, &refs[i], err);
    free(refs);
    if (st == POLAR_OK && m->arch.tied_embeddings) m->lm_head = m->embed, m->t_lm_head = m->t_embed;
    return st;
}

/* --------------------------------------------------------- random init */

/* splitmix64: a tiny, well-mixed generator; one stream per tensor so the
 * weights do not depend on the order or threading of initialisation. */
static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Matrices uniform with std 1/sqrt(fan_in), so every layer moves the
 * residual stream by O(1) at any width (at real widths this is close to HF's
 * 0.02); norms uniform in [0.8, 1.2] and biases small, so each kernel's
 * scale matters in tests. */
static polar_status random_fill(polar_model *m, const tensor_ref *r, uint64_t seed, polar_error *err) {
    size_t n = ref_elems(r);
    bf16 *buf = malloc(n * sizeof *buf);
    if (!buf) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for tensor '%s'", r->name);
    int is_norm = strstr(r->name, "norm") != NULL, is_bias = strstr(r->name, "bias") != NULL;
    float center = is_norm ? 1.0f : 0.0f;
    float halfwidth = is_norm ? 0.2f : is_bias ? 0.1f : 1.7320508f / sqrtf((float)r->cols);
    const size_t chunk = (size_t)1 << 16;
    uint64_t base = hash_name(r->name, seed);
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (n + chunk - 1) / chunk; c++) {
        uint64_t s = base ^ (c * 0xD1B54A32D192ED03ull);
        size_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (size_t i = c * chunk; i < end; i++) {
            float u = (float)(splitmix64(&s) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
            buf[i] = f32_to_bf16(center + (2.0f * u - 1.0f) * halfwidth);
        }
    }
    polar_status st = ref_scatter(m, r, buf, err);
    free(buf);
    return st;
}

polar_status model_fill_random(polar_model *m, uint64_t seed, polar_error *err) {
    tensor_ref *refs;
    int n = model_tensor_refs(m, LAYOUT_PER_EXPERT, &refs);
    if (n < 0) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    polar_status st = POLAR_OK;
    for (int i = 0; i < n && st == POLAR_OK; i++) st = random_fill(m, &refs[i], seed, err);
    free(refs);
    if (st == POLAR_OK && m->arch.tied_embeddings) m->lm_head = m->embed, m->t_lm_head = m->t_embed;
    return st;
}
