#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../loader/config.h"
#include "../loader/gguf.h"
#include "backend.h"
#include "error.h"

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

/* llama3: a smooth blend between low frequencies divided by factor and high
 * ones kept. */
static float llama3_freq(const polar_arch *a, float inv) {
    double low_wl = a->rope_original_max_pos / a->rope_low_freq_factor;
    double high_wl = a->rope_original_max_pos / a->rope_high_freq_factor;
    double wavelen = 2.0 * M_PI / inv;
    float scaled = wavelen > low_wl ? inv / (float)a->rope_factor : inv;
    if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
        float smooth = (float)((a->rope_original_max_pos / wavelen - a->rope_low_freq_factor) /
                               (a->rope_high_freq_factor - a->rope_low_freq_factor));
        scaled = (1.0f - smooth) * scaled / (float)a->rope_factor + smooth * scaled;
    }
    return scaled;
}

/* YaRN: the dimension whose frequency turns `rotations` times over the
 * original context. */
static double yarn_dim(const polar_arch *a, double rotations) {
    return a->head_dim * log(a->rope_original_max_pos / (rotations * 2 * M_PI)) / (2 * log(a->rope_theta));
}

/* inv_freq[i] = 1 / theta^(2i/d) in f32, as transformers computes it, then
 * the scaling of the arch's rope_type, in transformers' f32 operations:
 * llama3's blend, linear's division, or YaRN's ramp from the original
 * frequencies (dimensions below low) to those divided by factor (above
 * high), with cos and sin scaled by its attention factor. */
int model_init_rope(polar_model *m) {
    const polar_arch *a = &m->arch;
    int half = a->head_dim / 2;
    float *f = malloc((size_t)half * sizeof *f);
    if (!model_own(m, f)) return 0;
    double lo = 0, hi = 1;
    m->rope_scale = 1.0f;
    if (a->rope_type == POLAR_ROPE_YARN) {
        lo = yarn_dim(a, a->rope_beta_fast), hi = yarn_dim(a, a->rope_beta_slow);
        if (a->rope_truncate) lo = floor(lo), hi = ceil(hi);
        lo = fmax(lo, 0), hi = fmin(hi, a->head_dim - 1);
        if (lo == hi) hi += 0.001;
        double factor = a->rope_attention_factor;
        if (!(factor > 0)) factor = a->rope_factor <= 1 ? 1.0 : 0.1 * log(a->rope_factor) + 1.0;
        m->rope_scale = (float)factor;
    }
    for (int i = 0; i < half; i++) {
        float expo = (float)(2 * i) / (float)a->head_dim;
        float base = powf((float)a->rope_theta, expo), inv = 1.0f / base;
        if (a->rope_type == POLAR_ROPE_LLAMA3) inv = llama3_freq(a, inv);
        if (a->rope_type == POLAR_ROPE_LINEAR) inv /= (float)a->rope_factor;
        if (a->rope_type == POLAR_ROPE_YARN) {
            float interp = 1.0f / ((float)a->rope_factor * base);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            float keep = 1.0f - fminf(fmaxf(ramp, 0.0f), 1.0f); /* weight of the original frequency */
            inv = interp * (1.0f - keep) + inv * keep;
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
    m->device = calloc(1, sizeof *m->device);
    if (m->device && pthread_mutex_init(&m->device->lock, NULL) != 0) {
        free(m->device);
        m->device = NULL;
    }
    if (!m->layers || !m->device || !model_init_rope(m)) {
        polar_model_free(m);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory allocating the model");
    }
    *out = m;
    return POLAR_OK;
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
    if ((st = gguf_apply_rope_freqs(g, m->rope_inv_freq, m->arch.head_dim / 2, err)) == POLAR_OK) st = model_bind(m, err);
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
    if ((st = st_set_open(path, &m->files, err)) == POLAR_OK) st = model_bind(m, err);
    if (st != POLAR_OK) {
        polar_model_free(m);
        return st;
    }
    *out = m;
    return POLAR_OK;
}

polar_status polar_model_random(const polar_arch *a, uint64_t seed, polar_model **out, polar_error *err) {
    *out = NULL;
    if (!a) return polar_fail(err, POLAR_ERR_ARG, "no architecture given");
    polar_status st = config_validate(a, "architecture", err);
    if (st != POLAR_OK) return st;
    polar_arch known;
    if (polar_arch_default(a->arch, &known, NULL) != POLAR_OK)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                          "architecture '%s' is not supported (llama, qwen2, qwen3, qwen2_moe, qwen3_moe are)", a->arch);
    polar_model *m;
    if ((st = model_alloc(a, &m, err)) != POLAR_OK) return st;
    if ((st = model_fill_random(m, seed, err)) != POLAR_OK) {
        polar_model_free(m);
        return st;
    }
    *out = m;
    return POLAR_OK;
}

polar_status polar_model_save(const polar_model *m, const char *dir, polar_error *err) {
    if (m && m->quantized)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "the model keeps GGUF-quantized weights, which a bf16 "
                          "safetensors checkpoint cannot hold; load it with POLAR_GGUF_BF16=1 to save it");
    if (mkdir(dir, 0755) != 0) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return polar_fail(err, POLAR_ERR_IO, "%s: cannot create the folder", dir);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    polar_status st = config_write(&m->arch, path, err);
    if (st != POLAR_OK) return st;
    /* The refs only read the slots here, so the const cast is safe. Each
     * per-expert tensor is a contiguous region of its stacked buffer. */
    tensor_ref *refs;
    int n = model_tensor_refs((polar_model *)m, LAYOUT_PER_EXPERT, &refs);
    st_write_tensor *w = n > 0 ? malloc((size_t)n * sizeof *w) : NULL;
    if (!w) {
        if (n > 0) free(refs);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory saving the model");
    }
    st = POLAR_OK;
    for (int k = 0; k < n && st == POLAR_OK; k++) {
        w[k].name = refs[k].name;
        w[k].dtype = ST_BF16;
        w[k].ndim = refs[k].cols ? 2 : 1;
        w[k].shape[0] = refs[k].rows;
        w[k].shape[1] = refs[k].cols;
        w[k].data = ref_chunk(m, &refs[k], 0);
        if (!w[k].data) st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor '%s' has no bf16 rows to save", refs[k].name);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == POLAR_OK) st = st_write(path, w, (size_t)n, err);
    free(refs);
    free(w);
    return st;
}

polar_status polar_model_info_get(const polar_model *m, polar_model_info *out) {
    if (!m || !out) return POLAR_ERR_ARG;
    memset(out, 0, sizeof *out);
    const polar_arch *a = &m->arch;
    polar_model tmp = {0};
    tmp.arch = *a;
    layer_weights *lw = calloc((size_t)a->n_layers, sizeof *lw);
    tensor_ref *refs;
    tmp.layers = lw;
    int n = lw ? model_tensor_refs(&tmp, LAYOUT_PER_EXPERT, &refs) : -1;
    free(lw);
    if (n < 0) return POLAR_ERR_NOMEM;
    size_t layers = 0;
    for (int i = 0; i < n; i++) {
        out->n_params += ref_elems(&refs[i]);
        if (refs[i].layer >= 0) layers += ref_elems(&refs[i]);
    }
    free(refs);
    size_t embed = (size_t)a->vocab * a->hidden;
    out->arch = *a;
    out->layer_bytes = layers / (size_t)a->n_layers * sizeof(bf16);
    out->embed_bytes = embed * sizeof(bf16);
    out->head_bytes = (out->n_params - layers - embed) * sizeof(bf16);
    out->weight_bytes = out->n_params * sizeof(bf16);
    /* the model's own storage types (a shape without weights: bf16): any
     * layout's refs count the same elements, the GGUF one says the experts'
     * types too */
    out->stored_bytes = out->weight_bytes;
    if (!m->layers) return POLAR_OK;
    out->stored_bytes = 0;
    n = model_tensor_refs((polar_model *)m, LAYOUT_GGUF, &refs);
    if (n < 0) return POLAR_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        const tensor_ref *r = &refs[i];
        cpu_wtype t = r->wtype ? cpu_row_type(*r->wtype) : CPU_W_BF16;
        out->stored_bytes += t == CPU_W_BF16 || !r->cols ? ref_elems(r) * sizeof(bf16)
                                                         : (size_t)(r->experts ? r->experts : 1) * (size_t)r->rows *
                                                               cpu_wtype_row_bytes(t, (size_t)r->cols);
    }
    free(refs);
    return POLAR_OK;
}

void polar_model_free(polar_model *m) {
    if (!m) return;
    if (m->device) {
        cuda_weights_free(m->device->weights);
        pthread_mutex_destroy(&m->device->lock);
        free(m->device);
    }
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
