/* A model's weights on a GPU: uploaded by the first CUDA batch that needs
 * them and shared by every later one until the model is freed
 * (model_device.weights). A tensor-parallel rank uploads only its share
 * (tp_shard.h): rows of the q/k/v, gate/up and head matrices, columns of
 * o_proj and down_proj, its experts; norms, the router and the embedding
 * are whole on every rank. The uploads are kept per (device, rank, world):
 * a one-GPU batch and a tensor-parallel group of one share theirs. A GGUF's
 * blocks go up as bf16, or with POLAR_CUDA_BLOCKS=1 stay blocks on the
 * device (the block kernels of quant.cu read them; correct but slower, see
 * backend.h), the routed experts as the GGUF's gate, up and down stacks
 * (else as one [E, 2F, H] gate-then-up block and the down stack, bf16).
 * Built with POLAR_CUDA. */
#include "backend.h"

#ifndef POLAR_CUDA

void cuda_weights_free(void *weights) { (void)weights; }

#else

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

void *dev_alloc_in(dev_allocs *l, size_t bytes) {
    void *p = NULL;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        void **a = realloc(l->p, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        l->p = a;
        l->cap = cap;
    }
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) return NULL;
    l->p[l->n++] = p;
    l->bytes += bytes;
    return p;
}

void dev_free_all(dev_allocs *l) {
    for (int i = 0; i < l->n; i++) cudaFree(l->p[i]);
    free(l->p);
    memset(l, 0, sizeof *l);
}

/* Upload bytes of a host buffer (NULL stays NULL). */
static int upload_bytes(cuda_weights *w, const void **dst, const void *src, size_t bytes) {
    if (!src) {
        *dst = NULL;
        return 1;
    }
    void *d = dev_alloc_in(&w->allocs, bytes);
    if (!d || cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return 0;
    *dst = d;
    return 1;
}

/* Upload n elements of a host bf16 tensor. */
static int upload(cuda_weights *w, const bf16 **dst, const bf16 *src, size_t n) {
    return upload_bytes(w, (const void **)dst, src, n * sizeof(bf16));
}

/* Rows r0..r0+nr-1, columns c0..c0+nc-1 of a [rows, cols] matrix of the
 * model on the device, *dt (when given) its storage there: a GGUF's blocks
 * stay blocks, as the file lays them out (the CPU's interleaved layouts
 * read back), where the columns cut at whole blocks and POLAR_CUDA_BLOCKS
 * is 1 (cuda_keeps_blocks); otherwise bf16: rows as they are when whole,
 * else each row read (blocks dequantized) and cut. */
static int upload_part(cuda_weights *w, const bf16 **dst, cpu_wtype *dt, const bf16 *src, cpu_wtype t, size_t cols,
                       size_t r0, size_t nr, size_t c0, size_t nc) {
    if (dt) *dt = CPU_W_BF16;
    if (!src) return upload(w, dst, NULL, 0);
    if (t == CPU_W_BF16 && c0 == 0 && nc == cols) return upload(w, dst, src + r0 * cols, nr * nc);
    cpu_wtype rt = cpu_row_type(t);
    size_t elems = (size_t)cpu_wtype_block_elems(rt);
    if (dt && t != CPU_W_BF16 && c0 % elems == 0 && nc % elems == 0 && cuda_keeps_blocks()) {
        size_t full = cpu_wtype_row_bytes(rt, cols), part = cpu_wtype_row_bytes(rt, nc), skip = cpu_wtype_row_bytes(rt, c0);
        uint8_t *buf = malloc(nr * part + 1), *row = malloc(full);
        int ok = buf && row;
        for (size_t r = 0; ok && r < nr; r++) {
            cpu_matrix_row_blocks(t, src, cols, (int)(r0 + r), row);
            memcpy(buf + r * part, row + skip, part);
        }
        ok = ok && upload_bytes(w, (const void **)dst, buf, nr * part);
        free(buf);
        free(row);
        if (ok) *dt = rt, w->has_blocks = 1;
        return ok;
    }
    bf16 *buf = malloc(nr * nc * sizeof *buf);
    float *f = malloc(cols * sizeof *f);
    int ok = buf && f;
    for (size_t r = 0; ok && r < nr; r++) {
        cpu_dequantize_matrix_row(t, src, cols, (int)(r0 + r), f);
        for (size_t j = 0; j < nc; j++) buf[r * nc + j] = f32_to_bf16(f[c0 + j]);
    }
    ok = ok && upload(w, dst, buf, nr * nc);
    free(buf);
    free(f);
    return ok;
}

/* A whole matrix. */
static int upload_w(cuda_weights *w, const bf16 **dst, cpu_wtype *dt, const bf16 *src, cpu_wtype t, size_t rows,
                    size_t cols) {
    return upload_part(w, dst, dt, src, t, cols, 0, rows, 0, cols);
}

/* Experts e0..e0+n-1's gate and up rows as the CUDA kernels read them,
 * [n, 2F, H] bf16 (gate rows, then up rows, per expert): a Hugging Face
 * checkpoint's block as it is, or a GGUF's two stacks (possibly kept in
 * blocks) interleaved expert by expert. */
static int upload_gate_up(cuda_weights *w, const bf16 **dst, const layer_weights *l, size_t e0, size_t n, size_t F,
                          size_t H) {
    if (l->exp_gate_up) return upload(w, dst, l->exp_gate_up + e0 * 2 * F * H, n * 2 * F * H);
    bf16 *buf = malloc(n * 2 * F * H * sizeof *buf);
    float *f = malloc(H * sizeof *f);
    int ok = buf && f;
    for (size_t r = 0; ok && r < n * 2 * F; r++) { /* row r: expert e0 + r / 2F, gate when r % 2F < F */
        size_t e = e0 + r / (2 * F), i = r % (2 * F);
        int gate = i < F;
        cpu_dequantize_matrix_row(gate ? l->t_exp_gate : l->t_exp_up, gate ? l->exp_gate : l->exp_up, H,
                                  (int)(e * F + (gate ? i : i - F)), f);
        for (size_t j = 0; j < H; j++) buf[r * H + j] = f32_to_bf16(f[j]);
    }
    ok = ok && upload(w, dst, buf, n * 2 * F * H);
    free(buf);
    free(f);
    return ok;
}

/* Layer l's share on the device (s: the rank's). */
static int upload_layer(cuda_weights *c, const polar_model *m, int l, const tp_shard *s) {
    const polar_arch *a = &m->arch;
    const layer_weights *w = &m->layers[l];
    layer_weights *d = &c->layers[l];
    size_t H = (size_t)a->hidden, hd = (size_t)a->head_dim, q = (size_t)a->n_heads * hd;
    size_t q0 = (size_t)s->q0 * hd, nq = (size_t)s->n_heads * hd, k0 = (size_t)s->kv0 * hd, nk = (size_t)s->n_kv * hd;
    size_t F = (size_t)a->ffn, f0 = (size_t)s->f0, nf = (size_t)s->ffn;
    int ok = upload(c, &d->attn_norm, w->attn_norm, H) &&
             upload_part(c, &d->wq, &d->t_wq, w->wq, w->t_wq, H, q0, nq, 0, H) &&
             upload_part(c, &d->wk, &d->t_wk, w->wk, w->t_wk, H, k0, nk, 0, H) &&
             upload_part(c, &d->wv, &d->t_wv, w->wv, w->t_wv, H, k0, nk, 0, H) &&
             upload(c, &d->bq, w->bq ? w->bq + q0 : NULL, nq) &&
             upload(c, &d->bk, w->bk ? w->bk + k0 : NULL, nk) && upload(c, &d->bv, w->bv ? w->bv + k0 : NULL, nk) &&
             upload(c, &d->q_norm, w->q_norm, hd) && upload(c, &d->k_norm, w->k_norm, hd) &&
             upload_part(c, &d->wo, &d->t_wo, w->wo, w->t_wo, q, 0, H, q0, nq) &&
             upload(c, &d->mlp_norm, w->mlp_norm, H) &&
             upload_part(c, &d->w_gate, &d->t_gate, w->w_gate, w->t_gate, H, f0, nf, 0, H) &&
             upload_part(c, &d->w_up, &d->t_up, w->w_up, w->t_up, H, f0, nf, 0, H) &&
             upload_part(c, &d->w_down, &d->t_down, w->w_down, w->t_down, F, 0, H, f0, nf);
    if (ok && w->router) {
        size_t E = (size_t)a->n_experts, MF = (size_t)a->moe_ffn, S = (size_t)a->shared_ffn;
        size_t e0 = (size_t)s->e0, ne = (size_t)s->n_experts, s0 = (size_t)s->s0, ns = (size_t)s->shared_ffn;
        /* a GGUF's expert stacks stay blocks (POLAR_CUDA_BLOCKS=1): the rank's experts' rows of each */
        int keep = cuda_keeps_expert_blocks(a, w);
        ok = upload(c, &d->router, w->router, E * H) &&
             (keep ? upload_part(c, &d->exp_gate, &d->t_exp_gate, w->exp_gate, w->t_exp_gate, H, e0 * MF, ne * MF, 0, H) &&
                         upload_part(c, &d->exp_up, &d->t_exp_up, w->exp_up, w->t_exp_up, H, e0 * MF, ne * MF, 0, H)
                   : upload_gate_up(c, &d->exp_gate_up, w, e0, ne, MF, H)) &&
             upload_part(c, &d->exp_down, keep ? &d->t_exp_down : NULL, w->exp_down, w->t_exp_down, MF, e0 * H, ne * H,
                         0, MF) &&
             upload_part(c, &d->sh_gate, &d->t_sh_gate, w->sh_gate, w->t_sh_gate, H, s0, ns, 0, H) &&
             upload_part(c, &d->sh_up, &d->t_sh_up, w->sh_up, w->t_sh_up, H, s0, ns, 0, H) &&
             upload_part(c, &d->sh_down, &d->t_sh_down, w->sh_down, w->t_sh_down, S, 0, H, s0, ns) &&
             upload(c, &d->sh_router, w->sh_router, H);
    }
    return ok;
}

/* The rank's share of every weight on the current device; NULL when out of memory. */
static cuda_weights *weights_upload(const polar_model *m, const tp_shard *s, int device) {
    const polar_arch *a = &m->arch;
    cuda_weights *c = calloc(1, sizeof *c);
    if (!c || !(c->layers = calloc((size_t)a->n_layers, sizeof *c->layers))) {
        free(c);
        return NULL;
    }
    c->device = device, c->rank = s->rank, c->world = s->world;
    size_t H = (size_t)a->hidden, V = (size_t)a->vocab, hd = (size_t)a->head_dim;
    int ok = upload_w(c, &c->embed, &c->t_embed, m->embed, m->t_embed, V, H) &&
             upload(c, &c->final_norm, m->final_norm, H);
    /* a tied head is the embedding's rows of the rank's vocabulary */
    c->lm_head = (const bf16 *)((const uint8_t *)c->embed + (size_t)s->v0 * cpu_wtype_row_bytes(c->t_embed, H));
    c->t_lm_head = c->t_embed;
    if (ok && !a->tied_embeddings)
        ok = upload_part(c, &c->lm_head, &c->t_lm_head, m->lm_head, m->t_lm_head, H, (size_t)s->v0, (size_t)s->vocab,
                         0, H);
    for (int l = 0; ok && l < a->n_layers; l++) ok = upload_layer(c, m, l, s);
    ok = ok && (c->inv_freq = dev_alloc_in(&c->allocs, hd / 2 * sizeof(float))) &&
         cudaMemcpy(c->inv_freq, m->rope_inv_freq, hd / 2 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
    if (!ok) {
        cuda_weights *one = c;
        one->next = NULL;
        cuda_weights_free(one);
        return NULL;
    }
    return c;
}

void cuda_weights_free(void *weights) {
    int previous = 0;
    (void)cudaGetDevice(&previous);
    for (cuda_weights *w = weights, *next; w; w = next) {
        next = w->next;
        (void)cudaSetDevice(w->device); /* each upload's memory freed on its own device */
        dev_free_all(&w->allocs);
        free(w->layers);
        free(w);
    }
    (void)cudaSetDevice(previous);
}

const cuda_weights *cuda_model_weights(const polar_model *m, const tp_shard *s) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return NULL;
    pthread_mutex_lock(&m->device->lock);
    cuda_weights *w = m->device->weights;
    while (w && !(w->device == device && w->rank == s->rank && w->world == s->world)) w = w->next;
    if (!w && (w = weights_upload(m, s, device))) {
        w->next = m->device->weights;
        m->device->weights = w;
    }
    pthread_mutex_unlock(&m->device->lock);
    return w;
}

#endif
