#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../loader/config.h"
#include "../loader/gguf.h"
#include "error.h"

#define LAYER_TENSORS 13

int model_tensor_count(const polar_arch *a) { return 3 + a->n_layers * LAYER_TENSORS; }

static void add_ref(tensor_ref *r, int *n, const bf16 **slot, int rows, int cols, const char *hf, const char *gguf,
                    int layer) {
    snprintf(r[*n].name, sizeof r[*n].name, hf, layer);
    snprintf(r[*n].gguf_name, sizeof r[*n].gguf_name, gguf, layer);
    r[*n].slot = slot;
    r[*n].rows = rows;
    r[*n].cols = cols;
    r[*n].rope_permuted = 0;
    (*n)++;
}

void model_tensor_refs(polar_model *m, tensor_ref *r) {
    const polar_arch *a = &m->arch;
    int n = 0, q = a->n_heads * a->head_dim, kv = a->n_kv_heads * a->head_dim;
    add_ref(r, &n, &m->embed, a->vocab, a->hidden, "model.embed_tokens.weight", "token_embd.weight", 0);
    for (int l = 0; l < a->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        add_ref(r, &n, &w->attn_norm, a->hidden, 0, "model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", l);
        add_ref(r, &n, &w->wq, q, a->hidden, "model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", l);
        r[n - 1].rope_permuted = 1;
        add_ref(r, &n, &w->wk, kv, a->hidden, "model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", l);
        r[n - 1].rope_permuted = 1;
        add_ref(r, &n, &w->wv, kv, a->hidden, "model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", l);
        if (a->qkv_bias) {
            add_ref(r, &n, &w->bq, q, 0, "model.layers.%d.self_attn.q_proj.bias", "blk.%d.attn_q.bias", l);
            add_ref(r, &n, &w->bk, kv, 0, "model.layers.%d.self_attn.k_proj.bias", "blk.%d.attn_k.bias", l);
            add_ref(r, &n, &w->bv, kv, 0, "model.layers.%d.self_attn.v_proj.bias", "blk.%d.attn_v.bias", l);
        }
        if (a->qk_norm) {
            add_ref(r, &n, &w->q_norm, a->head_dim, 0, "model.layers.%d.self_attn.q_norm.weight", "blk.%d.attn_q_norm.weight", l);
            add_ref(r, &n, &w->k_norm, a->head_dim, 0, "model.layers.%d.self_attn.k_norm.weight", "blk.%d.attn_k_norm.weight", l);
        }
        add_ref(r, &n, &w->wo, a->hidden, q, "model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight", l);
        add_ref(r, &n, &w->mlp_norm, a->hidden, 0, "model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight", l);
        add_ref(r, &n, &w->w_gate, a->ffn, a->hidden, "model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight", l);
        add_ref(r, &n, &w->w_up, a->ffn, a->hidden, "model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight", l);
        add_ref(r, &n, &w->w_down, a->hidden, a->ffn, "model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight", l);
    }
    add_ref(r, &n, &m->final_norm, a->hidden, 0, "model.norm.weight", "output_norm.weight", 0);
    if (!a->tied_embeddings) add_ref(r, &n, &m->lm_head, a->vocab, a->hidden, "lm_head.weight", "output.weight", 0);
    /* Fewer than model_tensor_count when optional tensors are absent: the
     * caller stops at the first empty name. */
    if (n < model_tensor_count(a)) r[n].name[0] = 0;
}

int model_own(polar_model *m, void *buf) {
    if (!buf) return 0;
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **o = realloc(m->owned, (size_t)cap * sizeof *o);
        if (!o) {
            free(buf);
            return 0;
        }
        m->owned = o;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = buf;
    return 1;
}

/* inv_freq[i] = 1 / theta^(2i/d), as transformers computes it (f32), then
 * llama3's smooth blend between scaled low and unscaled high frequencies. */
int model_init_rope(polar_model *m) {
    const polar_arch *a = &m->arch;
    int half = a->head_dim / 2;
    float *f = malloc((size_t)half * sizeof *f);
    if (!model_own(m, f)) return 0;
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)a->head_dim;
        float inv = 1.0f / powf((float)a->rope_theta, expo);
        if (a->rope_llama3) {
            double low_wl = a->rope_original_max_pos / a->rope_low_freq_factor;
            double high_wl = a->rope_original_max_pos / a->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / inv;
            float scaled = wavelen > low_wl ? inv / (float)a->rope_factor : inv;
            if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
                float smooth = (float)((a->rope_original_max_pos / wavelen - a->rope_low_freq_factor) /
                                       (a->rope_high_freq_factor - a->rope_low_freq_factor));
                scaled = (1.0f - smooth) * scaled / (float)a->rope_factor + smooth * scaled;
            }
            inv = scaled;
        }
        f[i] = inv;
    }
    m->rope_inv_freq = f;
    return 1;
}

static polar_status model_alloc(const polar_arch *a, polar_model **out, polar_error *err) {
    polar_model *m = calloc(1, sizeof *m);
    if (!m) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory allocating the model");
    m->arch = *a;
    m->layers = calloc((size_t)a->n_layers, sizeof *m->layers);
    if (!m->layers || !model_init_rope(m)) {
        polar_model_free(m);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory allocating the model");
    }
    *out = m;
    return POLAR_OK;
}

/* A tensor as a file holds it, in Hugging Face order ([rows, cols]). */
typedef struct {
    const char *file;
    int ndim;
    int64_t shape[4];
    st_dtype dtype;     /* BF16, F16, F32 ... when quant == 0 */
    int quant;          /* a ggml quantised type (Q4_0, Q4_1, Q8_0), or 0 */
    const void *data;
} tensor_view;

/* Undo llama.cpp's per-head row permutation of q/k (adjacent-pair RoPE):
 * permuted row 2i+j of a head holds original row j*hd/2 + i. */
static int unpermute_rows(bf16 *w, int rows, int cols, int head_dim) {
    bf16 *tmp = malloc((size_t)head_dim * cols * sizeof *tmp);
    if (!tmp) return 0;
    int half = head_dim / 2;
    for (int h = 0; h < rows / head_dim; h++) {
        bf16 *head = w + (size_t)h * head_dim * cols;
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + (size_t)(j * half + i) * cols, head + (size_t)(2 * i + j) * cols, (size_t)cols * sizeof *tmp);
        memcpy(head, tmp, (size_t)head_dim * cols * sizeof *tmp);
    }
    free(tmp);
    return 1;
}

/* Bind one tensor: check its shape, use bf16 in place, convert the rest. */
static polar_status bind_view(polar_model *m, const tensor_ref *r, const tensor_view *t, int permuted,
                              polar_error *err) {
    int want_dims = r->cols ? 2 : 1;
    if (t->ndim != want_dims || t->shape[0] != r->rows || (r->cols && t->shape[1] != r->cols)) {
        char got[96] = "";
        for (int d = 0, k = 0; d < t->ndim && k < 80; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (r->cols)
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%d, %d]", t->file,
                              r->name, got, r->rows, r->cols);
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%d]", t->file, r->name, got,
                          r->rows);
    }
    size_t n = (size_t)r->rows * (size_t)(r->cols ? r->cols : 1);
    if (!t->quant && t->dtype == ST_BF16 && ((uintptr_t)t->data & 1) == 0 && !permuted) {
        *r->slot = t->data;
        return POLAR_OK;
    }
    if (!t->quant && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tensor '%s' has dtype %s (BF16, F16 or F32 expected)", t->file,
                          r->name, st_dtype_name(t->dtype));
    bf16 *buf = malloc(n * sizeof *buf);
    if (!model_own(m, buf)) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", r->name);
    const unsigned char *src = t->data;
    if (t->quant) {
        /* Dequantise a row at a time through a small f32 buffer. */
        size_t row = r->cols ? (size_t)r->cols : n;
        float *f = malloc(row * sizeof *f);
        if (!f) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", r->name);
        size_t row_bytes = row / ggml_block_elems(t->quant) * ggml_block_bytes(t->quant);
        for (size_t i = 0; i < n / row; i++) {
            ggml_dequantize(t->quant, src + i * row_bytes, f, row);
            for (size_t j = 0; j < row; j++) buf[i * row + j] = f32_to_bf16(f[j]);
        }
        free(f);
    } else {
        for (size_t i = 0; i < n; i++) {
            if (t->dtype == ST_BF16) {
                memcpy(&buf[i], src + 2 * i, 2);
            } else if (t->dtype == ST_F16) {
                uint16_t h;
                memcpy(&h, src + 2 * i, 2);
                buf[i] = f32_to_bf16(f16_to_f32(h));
            } else {
                float f;
                memcpy(&f, src + 4 * i, 4);
                buf[i] = f32_to_bf16(f);
            }
        }
    }
    if (permuted && !unpermute_rows(buf, r->rows, r->cols, m->arch.head_dim))
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory converting '%s'", r->name);
    *r->slot = buf;
    return POLAR_OK;
}

static polar_status bind_safetensors(polar_model *m, const tensor_ref *r, polar_error *err) {
    tensor_view v = {0};
    const st_tensor *t = st_set_find(&m->files, r->name, &v.file);
    if (!t) return polar_fail(err, POLAR_ERR_FORMAT, "checkpoint has no tensor '%s'", r->name);
    v.ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < 4; d++) v.shape[d] = t->shape[d];
    v.dtype = t->dtype;
    v.data = t->data;
    return bind_view(m, r, &v, 0, err);
}

static polar_status bind_gguf(polar_model *m, const tensor_ref *r, polar_error *err) {
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
    polar_status st = bind_view(m, r, &v, permuted, err);
    if (st != POLAR_OK && strstr(err->msg, "has shape")) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return polar_fail(err, POLAR_ERR_FORMAT, "%s (GGUF name '%s')", why, r->gguf_name);
    }
    return st;
}

static polar_status for_each_ref(polar_model *m, polar_status (*fn)(polar_model *, const tensor_ref *, void *,
                                                                    polar_error *),
                                 void *ctx, polar_error *err) {
    int n = model_tensor_count(&m->arch);
    tensor_ref *refs = malloc((size_t)n * sizeof *refs);
    if (!refs) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    model_tensor_refs(m, refs);
    polar_status st = POLAR_OK;
    for (int i = 0; i < n && refs[i].name[0] && st == POLAR_OK; i++) st = fn(m, &refs[i], ctx, err);
    free(refs);
    if (st == POLAR_OK && m->arch.tied_embeddings) m->lm_head = m->embed;
    return st;
}

static polar_status bind_cb(polar_model *m, const tensor_ref *r, void *ctx, polar_error *err) {
    (void)ctx;
    return m->gguf ? bind_gguf(m, r, err) : bind_safetensors(m, r, err);
}

static int is_gguf_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

static polar_status load_gguf(const char *path, polar_model **out, polar_error *err) {
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    polar_status st = gguf_open(path, g, err);
    polar_arch a;
    if (st == POLAR_OK) st = gguf_model_arch(g, &a, err);
    polar_model *m = NULL;
    if (st == POLAR_OK) st = model_alloc(&a, &m, err);
    if (st != POLAR_OK) {
        gguf_close(g);
        free(g);
        return st;
    }
    m->gguf = g;
    if ((st = gguf_apply_rope_freqs(g, m->rope_inv_freq, m->arch.head_dim / 2, err)) == POLAR_OK) st = for_each_ref(m, bind_cb, NULL, err);
    if (st != POLAR_OK) {
        polar_model_free(m);
        return st;
    }
    *out = m;
    return POLAR_OK;
}

polar_status polar_model_load(const char *path, polar_model **out, polar_error *err) {
    *out = NULL;
    if (!path) return polar_fail(err, POLAR_ERR_ARG, "no model path given");
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && is_gguf_path(path)) return load_gguf(path, out, err);
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return polar_fail(err, POLAR_ERR_IO, "%s: not a model (a folder with config.json + model.safetensors, or a .gguf file)",
                          path);
    polar_arch a;
    polar_status st = config_load(path, &a, err);
    if (st != POLAR_OK) return st;
    polar_model *m;
    if ((st = model_alloc(&a, &m, err)) != POLAR_OK) return st;
    if ((st = st_set_open(path, &m->files, err)) == POLAR_OK) st = for_each_ref(m, bind_cb, NULL, err);
    if (st != POLAR_OK) {
        polar_model_free(m);
        return st;
    }
    *out = m;
    return POLAR_OK;
}

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
static polar_status random_cb(polar_model *m, const tensor_ref *r, void *ctx, polar_error *err) {
    uint64_t seed = *(const uint64_t *)ctx;
    size_t n = (size_t)r->rows * (size_t)(r->cols ? r->cols : 1);
    bf16 *buf = malloc(n * sizeof *buf);
    if (!model_own(m, buf)) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory for tensor '%s'", r->name);
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
    *r->slot = buf;
    return POLAR_OK;
}

polar_status polar_model_random(const polar_arch *a, uint64_t seed, polar_model **out, polar_error *err) {
    *out = NULL;
    if (!a) return polar_fail(err, POLAR_ERR_ARG, "no architecture given");
    polar_status st = config_validate(a, "architecture", err);
    if (st != POLAR_OK) return st;
    if (strcmp(a->arch, "llama") && strcmp(a->arch, "qwen2") && strcmp(a->arch, "qwen3"))
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "architecture '%s' is not supported (llama, qwen2, qwen3 are)",
                          a->arch);
    polar_model *m;
    if ((st = model_alloc(a, &m, err)) != POLAR_OK) return st;
    if ((st = for_each_ref(m, random_cb, &seed, err)) != POLAR_OK) {
        polar_model_free(m);
        return st;
    }
    *out = m;
    return POLAR_OK;
}

polar_status polar_model_save(const polar_model *m, const char *dir, polar_error *err) {
    if (mkdir(dir, 0755) != 0) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return polar_fail(err, POLAR_ERR_IO, "%s: cannot create the folder", dir);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    polar_status st = config_write(&m->arch, path, err);
    if (st != POLAR_OK) return st;
    int n = model_tensor_count(&m->arch);
    tensor_ref *refs = malloc((size_t)n * sizeof *refs);
    st_write_tensor *w = malloc((size_t)n * sizeof *w);
    if (!refs || !w) {
        free(refs);
        free(w);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory saving the model");
    }
    /* The refs only read the slots here, so the const cast is safe. */
    model_tensor_refs((polar_model *)m, refs);
    int k = 0;
    for (; k < n && refs[k].name[0]; k++) {
        w[k].name = refs[k].name;
        w[k].dtype = ST_BF16;
        w[k].ndim = refs[k].cols ? 2 : 1;
        w[k].shape[0] = refs[k].rows;
        w[k].shape[1] = refs[k].cols;
        w[k].data = *refs[k].slot;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st = st_write(path, w, (size_t)k, err);
    free(refs);
    free(w);
    return st;
}

polar_status polar_model_info_get(const polar_model *m, polar_model_info *out) {
    if (!m || !out) return POLAR_ERR_ARG;
    memset(out, 0, sizeof *out);
    const polar_arch *a = &m->arch;
    size_t q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t layer = 2 * (size_t)a->hidden + 2 * q * a->hidden + 2 * kv * a->hidden + 3 * (size_t)a->ffn * a->hidden;
    if (a->qkv_bias) layer += q + 2 * kv;
    if (a->qk_norm) layer += 2 * (size_t)a->head_dim;
    size_t embed = (size_t)a->vocab * a->hidden;
    size_t head = (size_t)a->hidden + (a->tied_embeddings ? 0 : embed);
    out->arch = *a;
    out->n_params = layer * a->n_layers + embed + head;
    out->layer_bytes = layer * sizeof(bf16);
    out->embed_bytes = embed * sizeof(bf16);
    out->head_bytes = head * sizeof(bf16);
    out->weight_bytes = out->n_params * sizeof(bf16);
    return POLAR_OK;
}

void polar_model_free(polar_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    st_set_close(&m->files);
    if (m->gguf) {
        gguf_close(m->gguf);
        free(m->gguf);
    }
    free(m);
}
