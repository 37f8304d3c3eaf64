/* GGUF metadata -> polar_arch, for the architectures the runtime runs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../runtime/error.h"
#include "config.h"
#include "gguf.h"

typedef struct {
    const gguf_file *f;
    char arch[16];
    polar_error *err;
} meta;

static int is_int_type(gguf_vtype t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 || t == GGUF_I32 ||
           t == GGUF_U64 || t == GGUF_I64;
}

/* "{arch}.suffix" as a positive integer; absent -> dflt (0: required). */
static polar_status get_int(const meta *m, const char *suffix, int dflt, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    if (!kv) {
        if (!dflt) return polar_fail(m->err, POLAR_ERR_CONFIG, "%s: metadata '%s' is missing", m->f->path, key);
        *out = dflt;
        return POLAR_OK;
    }
    if (!is_int_type(kv->type) || kv->i < 1 || kv->i > (1 << 30))
        return polar_fail(m->err, POLAR_ERR_CONFIG, "%s: metadata '%s' must be a positive integer", m->f->path, key);
    *out = (int)kv->i;
    return POLAR_OK;
}

static polar_status get_float(const meta *m, const char *suffix, double dflt, double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    if (!kv) {
        *out = dflt;
        return POLAR_OK;
    }
    if ((kv->type != GGUF_F32 && kv->type != GGUF_F64 && !is_int_type(kv->type)) || !(kv->f > 0) || !isfinite(kv->f))
        return polar_fail(m->err, POLAR_ERR_CONFIG, "%s: metadata '%s' must be a positive finite number", m->f->path,
                          key);
    *out = kv->f;
    return POLAR_OK;
}

/* A llama.cpp rope knob transformers has no counterpart of: absent, or at
 * its neutral value (or below lowest, llama.cpp's "unset"). */
static polar_status rope_knob_neutral(const meta *m, const char *suffix, double neutral, double lowest) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    int number = kv && (kv->type == GGUF_F32 || kv->type == GGUF_F64 || is_int_type(kv->type));
    if (!kv || (number && (kv->f == neutral || kv->f < lowest))) return POLAR_OK;
    return polar_fail(m->err, POLAR_ERR_UNSUPPORTED, "%s: metadata '%s' is not supported (only %g)", m->f->path, key,
                      neutral);
}

/* A YaRN beta: absent or 0 (convert_hf_to_gguf copies a config's 0, which
 * transformers reads as the default) -> dflt. */
static polar_status yarn_beta(const meta *m, const char *suffix, double dflt, double *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    if (kv && (kv->type == GGUF_F32 || kv->type == GGUF_F64 || is_int_type(kv->type)) && kv->f == 0) {
        *out = dflt;
        return POLAR_OK;
    }
    return get_float(m, suffix, dflt, out);
}

/* {arch}.rope.scaling.*: none, linear (factor) or yarn (factor, original
 * context, betas, and the attention factor that convert_hf_to_gguf copies
 * from transformers' attention_factor; the ramp truncated as transformers
 * does by default). */
static polar_status gguf_rope_scaling(const meta *m, polar_arch *a) {
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    const gguf_kv *type = gguf_find_kv(m->f, key);
    if (!type || type->type != GGUF_STRING || gguf_str_eq(type->str, "none")) return POLAR_OK;
    polar_status st;
    if (gguf_str_eq(type->str, "linear")) {
        a->rope_type = POLAR_ROPE_LINEAR;
        return get_float(m, "rope.scaling.factor", 1.0, &a->rope_factor);
    }
    if (!gguf_str_eq(type->str, "yarn"))
        return polar_fail(m->err, POLAR_ERR_UNSUPPORTED, "%s: rope scaling '%.*s' is not supported (linear and yarn are)",
                          m->f->path, (int)(type->str.len > 40 ? 40 : type->str.len), type->str.s);
    a->rope_type = POLAR_ROPE_YARN;
    a->rope_truncate = 1;
    if ((st = get_int(m, "rope.scaling.original_context_length", a->max_pos, &a->rope_original_max_pos)) ||
        (st = get_float(m, "rope.scaling.factor", (double)a->max_pos / a->rope_original_max_pos, &a->rope_factor)) ||
        (st = yarn_beta(m, "rope.scaling.yarn_beta_fast", 32.0, &a->rope_beta_fast)) ||
        (st = yarn_beta(m, "rope.scaling.yarn_beta_slow", 1.0, &a->rope_beta_slow)) ||
        (st = get_float(m, "rope.scaling.yarn_attn_factor", 0.0, &a->rope_attention_factor)) ||
        (st = rope_knob_neutral(m, "rope.scaling.attn_factor", 1.0, 0.0)) ||
        (st = rope_knob_neutral(m, "rope.scaling.yarn_ext_factor", 1.0, 0.0)) ||
        (st = rope_knob_neutral(m, "rope.scaling.yarn_log_multiplier", 0.0, -HUGE_VAL)))
        return st;
    return POLAR_OK;
}

static void add_eos(const gguf_file *f, const char *key, polar_arch *a) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || !is_int_type(kv->type) || kv->i < 0 || kv->i >= a->vocab) return;
    for (int k = 0; k < a->n_eos; k++)
        if (a->eos[k] == (int)kv->i) return;
    if (a->n_eos < (int)(sizeof a->eos / sizeof a->eos[0])) a->eos[a->n_eos++] = (int)kv->i;
}

/* Experts from {arch}.expert_*; a block without a router is a dense layer.
 * Renormalising the top-k is Qwen3-MoE's rule and not Qwen2-MoE's unless
 * expert_weights_norm says otherwise. */
static polar_status gguf_moe(const meta *m, polar_arch *a) {
    polar_status st;
    if ((st = get_int(m, "expert_count", 0, &a->n_experts)) || (st = get_int(m, "expert_used_count", 0, &a->top_k)) ||
        (st = get_int(m, "expert_feed_forward_length", 0, &a->moe_ffn)))
        return st;
    char key[128];
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", m->arch);
    if (gguf_find_kv(m->f, key) && (st = get_int(m, "expert_shared_feed_forward_length", 0, &a->shared_ffn)))
        return st;
    snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch);
    const gguf_kv *norm = gguf_find_kv(m->f, key);
    a->norm_topk = norm ? norm->u != 0 : strcmp(a->arch, "qwen3_moe") == 0;
    a->sparse_step = 1;
    for (int l = 0; l < a->n_layers; l++) {
        snprintf(key, sizeof key, "blk.%d.ffn_gate_inp.weight", l);
        if (gguf_find_tensor(m->f, key)) continue;
        if (a->n_mlp_only == (int)(sizeof a->mlp_only / sizeof a->mlp_only[0]))
            return polar_fail(m->err, POLAR_ERR_UNSUPPORTED, "%s: more than 64 dense layers in an MoE model", m->f->path);
        a->mlp_only[a->n_mlp_only++] = l;
    }
    return POLAR_OK;
}

polar_status gguf_model_arch(const gguf_file *f, polar_arch *a, polar_error *err) {
    memset(a, 0, sizeof *a);
    meta m = {f, "", err};
    const gguf_kv *kv = gguf_find_kv(f, "general.architecture");
    if (!kv || kv->type != GGUF_STRING)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: metadata 'general.architecture' is missing", f->path);
    snprintf(m.arch, sizeof m.arch, "%.*s", (int)(kv->str.len < 15 ? kv->str.len : 15), kv->str.s);
    static const char *const names[][2] = {
        {"llama", "llama"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"}, {"qwen2moe", "qwen2_moe"}, {"qwen3moe", "qwen3_moe"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (gguf_str_eq(kv->str, names[i][0])) snprintf(a->arch, sizeof a->arch, "%s", names[i][1]);
    if (!a->arch[0])
        return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                          "%s: GGUF architecture '%.40s' is not supported (llama, qwen2, qwen3, qwen2moe, qwen3moe are)",
                          f->path, m.arch);
    const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    polar_status st;
    if ((st = get_int(&m, "block_count", 0, &a->n_layers)) || (st = get_int(&m, "embedding_length", 0, &a->hidden)) ||
        (st = get_int(&m, "feed_forward_length", 0, &a->ffn)) ||
        (st = get_int(&m, "attention.head_count", 0, &a->n_heads)) ||
        (st = get_int(&m, "attention.head_count_kv", a->n_heads, &a->n_kv_heads)) ||
        (st = get_int(&m, "attention.key_length", a->hidden / a->n_heads, &a->head_dim)) ||
        (st = get_int(&m, "context_length", 4096, &a->max_pos)) ||
        (st = get_int(&m, "vocab_size", embd && embd->n_dims == 2 ? (int)embd->ne[1] : 0, &a->vocab)) ||
        (st = get_float(&m, "rope.freq_base", 10000.0, &a->rope_theta)) ||
        (st = get_float(&m, "attention.layer_norm_rms_epsilon", 1e-6, &a->rms_eps)))
        return st;
    if ((st = gguf_rope_scaling(&m, a)) != POLAR_OK) return st;
    a->tied_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    a->qkv_bias = strncmp(a->arch, "qwen2", 5) == 0 && gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    a->qk_norm = strncmp(a->arch, "qwen3", 5) == 0;
    if (strstr(a->arch, "_moe") && (st = gguf_moe(&m, a)) != POLAR_OK) return st;
    add_eos(f, "tokenizer.ggml.eos_token_id", a);
    add_eos(f, "tokenizer.ggml.eot_token_id", a);
    return config_validate(a, f->path, err);
}

polar_status gguf_apply_rope_freqs(const gguf_file *f, float *inv_freq, int half, polar_error *err) {
    const gguf_tensor *t = gguf_find_tensor(f, "rope_freqs.weight");
    if (!t) return POLAR_OK;
    if (t->type != GGML_F32 || t->n_elements != (uint64_t)half)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: rope_freqs.weight must be F32 with %d elements", f->path, half);
    for (int i = 0; i < half; i++) {
        float d;
        memcpy(&d, (const char *)t->data + 4 * i, 4);
        if (!(d > 0)) return polar_fail(err, POLAR_ERR_FORMAT, "%s: rope_freqs.weight[%d] is not positive", f->path, i);
        inv_freq[i] /= d;
    }
    return POLAR_OK;
}
