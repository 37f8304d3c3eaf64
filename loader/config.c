#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/error.h"
#include "json.h"

typedef struct {
    const json_value *root;
    const char *what;
    polar_error *err;
} cfg;

static const char *type_name(const json_value *v) {
    static const char *names[] = {"null", "boolean", "number", "string", "list", "object"};
    return names[v->type];
}

/* An integer field in [lo, hi]; absent -> *out = dflt unless required. */
static polar_status get_int(const cfg *c, const char *key, int required, int dflt, int lo, int hi, int *out) {
    const json_value *v = json_get(c->root, key);
    if (!v || v->type == JSON_NULL) {
        if (required) return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: required field '%s' is missing", c->what, key);
        *out = dflt;
        return POLAR_OK;
    }
    if (v->type != JSON_NUMBER || v->number != floor(v->number))
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' must be an integer, got %s", c->what, key,
                          type_name(v));
    if (v->number < lo || v->number > hi)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' = %.0f is outside [%d, %d]", c->what, key,
                          v->number, lo, hi);
    *out = (int)v->number;
    return POLAR_OK;
}

static polar_status get_num(const cfg *c, const json_value *obj, const char *key, double dflt, double lo,
                            double *out) {
    const json_value *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) {
        *out = dflt;
        return POLAR_OK;
    }
    if (v->type != JSON_NUMBER)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' must be a number, got %s", c->what, key,
                          type_name(v));
    if (!isfinite(v->number))
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' = %g is not finite", c->what, key, v->number);
    if (!(v->number > lo))
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' = %g must be greater than %g", c->what, key,
                          v->number, lo);
    *out = v->number;
    return POLAR_OK;
}

static polar_status get_bool(const cfg *c, const char *key, int dflt, int *out) {
    const json_value *v = json_get(c->root, key);
    if (!v || v->type == JSON_NULL) {
        *out = dflt;
        return POLAR_OK;
    }
    if (v->type != JSON_BOOL)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: field '%s' must be true or false, got %s", c->what, key,
                          type_name(v));
    *out = v->number != 0;
    return POLAR_OK;
}

/* eos_token_id: an int or a list of ints; adds to a->eos without repeats. */
static polar_status add_eos(const cfg *c, const json_value *v, polar_arch *a) {
    if (!v || v->type == JSON_NULL) return POLAR_OK;
    size_t n = v->type == JSON_ARRAY ? v->len : 1;
    for (size_t i = 0; i < n; i++) {
        const json_value *x = v->type == JSON_ARRAY ? v->items[i] : v;
        if (x->type != JSON_NUMBER || !x->is_integer || x->number < 0 || x->number > 2147483647.0)
            return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: 'eos_token_id' must be a non-negative integer or a list of them",
                              c->what);
        int id = (int)x->number, seen = 0;
        for (int k = 0; k < a->n_eos; k++) seen |= a->eos[k] == id;
        if (!seen && a->n_eos < (int)(sizeof a->eos / sizeof a->eos[0])) a->eos[a->n_eos++] = id;
    }
    return POLAR_OK;
}

/* The pretraining context of llama3 and YaRN scaling: rope_scaling's
 * original_max_position_embeddings (orig), unless config.json has one at
 * its top level, which transformers prefers (Phi-3 keeps it there). */
static polar_status original_context(const cfg *c, double orig, polar_arch *a) {
    polar_status st = POLAR_OK;
    if (json_get(c->root, "original_max_position_embeddings") &&
        (st = get_num(c, c->root, "original_max_position_embeddings", orig, 0.0, &orig)) != POLAR_OK)
        return st;
    if (orig > 1 << 30)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: original_max_position_embeddings = %g is too large", c->what,
                          orig);
    a->rope_original_max_pos = (int)orig;
    return POLAR_OK;
}

/* llama3's fields: factor, low/high_freq_factor, original context. */
static polar_status parse_llama3(const cfg *c, const json_value *rs, polar_arch *a) {
    double orig = 0;
    polar_status st;
    if ((st = get_num(c, rs, "factor", 8.0, 0.0, &a->rope_factor)) != POLAR_OK ||
        (st = get_num(c, rs, "low_freq_factor", 1.0, 0.0, &a->rope_low_freq_factor)) != POLAR_OK ||
        (st = get_num(c, rs, "high_freq_factor", 4.0, 0.0, &a->rope_high_freq_factor)) != POLAR_OK ||
        (st = get_num(c, rs, "original_max_position_embeddings", 8192.0, 0.0, &orig)) != POLAR_OK)
        return st;
    if (a->rope_high_freq_factor <= a->rope_low_freq_factor)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: llama3 rope needs high_freq_factor > low_freq_factor", c->what);
    return original_context(c, orig, a);
}

/* YaRN's fields as transformers 5.24 reads them: original context
 * (default max_position_embeddings), factor (required; null: max_position_
 * embeddings over the original context), beta_fast/beta_slow (32/1 when
 * absent, null or 0), truncate (absent: true; null or false: no), and the
 * attention factor: given, else mscale over mscale_all_dim when both are
 * non-zero, else (0 here) 0.1 ln(factor) + 1. */
static polar_status parse_yarn(const cfg *c, const json_value *rs, polar_arch *a) {
    double orig = 0, mscale = 0, mscale_all = 0;
    polar_status st;
    if (!json_get(rs, "factor")) return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: yarn rope needs a 'factor'", c->what);
    if ((st = get_num(c, rs, "original_max_position_embeddings", a->max_pos, 0.0, &orig)) != POLAR_OK ||
        (st = original_context(c, orig, a)) != POLAR_OK ||
        (st = get_num(c, rs, "factor", (double)a->max_pos / a->rope_original_max_pos, 0.0, &a->rope_factor)) != POLAR_OK ||
        (st = get_num(c, rs, "attention_factor", 0.0, 0.0, &a->rope_attention_factor)) != POLAR_OK ||
        (st = get_num(c, rs, "mscale", 0.0, -HUGE_VAL, &mscale)) != POLAR_OK ||
        (st = get_num(c, rs, "mscale_all_dim", 0.0, -HUGE_VAL, &mscale_all)) != POLAR_OK)
        return st;
    const char *beta_names[2] = {"beta_fast", "beta_slow"};
    double *betas[2] = {&a->rope_beta_fast, &a->rope_beta_slow};
    for (int i = 0; i < 2; i++) {
        const json_value *b = json_get(rs, beta_names[i]);
        int zero = b && b->type == JSON_NUMBER && b->number == 0; /* transformers: `or` the default */
        if ((st = get_num(c, zero ? NULL : rs, beta_names[i], i ? 1.0 : 32.0, 0.0, betas[i])) != POLAR_OK) return st;
    }
    const json_value *tr = json_get(rs, "truncate");
    if (tr && tr->type != JSON_NULL && tr->type != JSON_BOOL)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: yarn 'truncate' must be true or false, got %s", c->what,
                          type_name(tr));
    a->rope_truncate = !tr || (tr->type == JSON_BOOL && tr->number != 0);
    if (a->rope_attention_factor == 0 && mscale != 0 && mscale_all != 0) {
        double f = a->rope_factor, ln = f <= 1 ? 0 : log(f); /* transformers' get_mscale: 1 at f <= 1 */
        double num = 0.1 * mscale * ln + 1, den = 0.1 * mscale_all * ln + 1;
        if (!(num / den > 0) || !isfinite(num / den))
            return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: yarn mscale %g / mscale_all_dim %g give no positive attention "
                              "factor", c->what, mscale, mscale_all);
        a->rope_attention_factor = num / den;
    }
    return POLAR_OK;
}

/* rope_theta, then rope_scaling (transformers v4) or rope_parameters (v5):
 * absent or type "default" is plain RoPE; "llama3", "linear" and "yarn" are
 * supported; any other type is refused by name rather than run with the
 * wrong frequencies. */
static polar_status parse_rope(const cfg *c, polar_arch *a) {
    const json_value *rs = json_get(c->root, "rope_parameters");
    const char *field = "rope_parameters";
    if (!rs || rs->type == JSON_NULL) {
        rs = json_get(c->root, "rope_scaling");
        field = "rope_scaling";
    }
    polar_status st = get_num(c, c->root, "rope_theta", 10000.0, 0.0, &a->rope_theta);
    if (st != POLAR_OK) return st;
    if (!rs || rs->type == JSON_NULL) return POLAR_OK;
    if (rs->type != JSON_OBJECT)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: '%s' must be an object, got %s", c->what, field, type_name(rs));
    /* v5 keeps rope_theta inside rope_parameters. */
    if (json_get(rs, "rope_theta") && (st = get_num(c, rs, "rope_theta", a->rope_theta, 0.0, &a->rope_theta)) != POLAR_OK)
        return st;
    const json_value *type = json_get(rs, "rope_type");
    if (!type) type = json_get(rs, "type");
    if (!type || type->type != JSON_STRING)
        return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: '%s' has no string 'rope_type'", c->what, field);
    if (strcmp(type->str, "default") == 0) return POLAR_OK;
    if (strcmp(type->str, "llama3") == 0) {
        a->rope_type = POLAR_ROPE_LLAMA3;
        return parse_llama3(c, rs, a);
    }
    if (strcmp(type->str, "linear") == 0) {
        a->rope_type = POLAR_ROPE_LINEAR;
        if (!json_get(rs, "factor"))
            return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: linear rope needs a 'factor'", c->what);
        return get_num(c, rs, "factor", 1.0, 0.0, &a->rope_factor);
    }
    if (strcmp(type->str, "yarn") == 0) {
        a->rope_type = POLAR_ROPE_YARN;
        return parse_yarn(c, rs, a);
    }
    return polar_fail(c->err, POLAR_ERR_UNSUPPORTED,
                      "%s: %s type '%s' is not supported (default, llama3, linear and yarn are)", c->what, field,
                      type->str);
}

/* num_experts (or num_local_experts), num_experts_per_tok,
 * moe_intermediate_size, shared_expert_intermediate_size (qwen2_moe),
 * norm_topk_prob, decoder_sparse_step, mlp_only_layers. */
static polar_status parse_moe(const cfg *c, polar_arch *a) {
    const int BIG = 1 << 30;
    const char *experts_key = json_get(c->root, "num_experts") ? "num_experts" : "num_local_experts";
    polar_status st;
    if ((st = get_int(c, experts_key, 1, 0, 1, 4096, &a->n_experts)) ||
        (st = get_int(c, "num_experts_per_tok", 1, 0, 1, MAX_TOP_K, &a->top_k)) ||
        (st = get_int(c, "moe_intermediate_size", 1, 0, 1, BIG, &a->moe_ffn)) ||
        (st = get_int(c, "decoder_sparse_step", 0, 1, 1, 4096, &a->sparse_step)) ||
        (st = get_bool(c, "norm_topk_prob", 0, &a->norm_topk)))
        return st;
    if (strcmp(a->arch, "qwen2_moe") == 0 &&
        (st = get_int(c, "shared_expert_intermediate_size", 1, 0, 1, BIG, &a->shared_ffn)) != POLAR_OK)
        return st;
    const json_value *only = json_get(c->root, "mlp_only_layers");
    if (only && only->type != JSON_NULL) {
        if (only->type != JSON_ARRAY || only->len > sizeof a->mlp_only / sizeof a->mlp_only[0])
            return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: 'mlp_only_layers' must be a list of at most 64 layers", c->what);
        for (size_t i = 0; i < only->len; i++) {
            const json_value *v = only->items[i];
            if (v->type != JSON_NUMBER || !v->is_integer || v->number < 0 || v->number >= a->n_layers)
                return polar_fail(c->err, POLAR_ERR_CONFIG, "%s: mlp_only_layers[%zu] is not a layer index", c->what, i);
            a->mlp_only[a->n_mlp_only++] = (int)v->number;
        }
    }
    return POLAR_OK;
}

polar_status config_parse(const char *text, size_t len, const char *what, polar_arch *a, polar_error *err) {
    memset(a, 0, sizeof *a);
    json_doc *doc;
    polar_status st = json_parse(text, len, what, &doc, err);
    if (st != POLAR_OK) return st;
    cfg c = {json_root(doc), what, err};
    const json_value *mt = json_get(c.root, "model_type");
    if (c.root->type != JSON_OBJECT) {
        st = polar_fail(err, POLAR_ERR_CONFIG, "%s: not a JSON object", what);
        goto done;
    }
    if (!mt || mt->type != JSON_STRING) {
        st = polar_fail(err, POLAR_ERR_CONFIG, "%s: required field 'model_type' is missing or not a string", what);
        goto done;
    }
    if (strcmp(mt->str, "llama") && strcmp(mt->str, "qwen2") && strcmp(mt->str, "qwen3") &&
        strcmp(mt->str, "qwen2_moe") && strcmp(mt->str, "qwen3_moe")) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED,
                        "%s: model_type '%.40s' is not supported (llama, qwen2, qwen3, qwen2_moe, qwen3_moe are)", what,
                        mt->str);
        goto done;
    }
    snprintf(a->arch, sizeof a->arch, "%s", mt->str);
    const int BIG = 1 << 30;
    int bias, mlp_bias, sliding;
    if ((st = get_int(&c, "num_hidden_layers", 1, 0, 1, 4096, &a->n_layers)) ||
        (st = get_int(&c, "hidden_size", 1, 0, 1, BIG, &a->hidden)) ||
        (st = get_int(&c, "intermediate_size", 1, 0, 1, BIG, &a->ffn)) ||
        (st = get_int(&c, "num_attention_heads", 1, 0, 1, 4096, &a->n_heads)) ||
        (st = get_int(&c, "num_key_value_heads", 0, a->n_heads, 1, 4096, &a->n_kv_heads)) ||
        (st = get_int(&c, "head_dim", 0, a->hidden / a->n_heads, 2, 65536, &a->head_dim)) ||
        (st = get_int(&c, "vocab_size", 1, 0, 1, BIG, &a->vocab)) ||
        (st = get_int(&c, "max_position_embeddings", 0, 4096, 1, BIG, &a->max_pos)) ||
        (st = get_num(&c, c.root, "rms_norm_eps", 1e-6, 0.0, &a->rms_eps)) ||
        (st = get_bool(&c, "tie_word_embeddings", 0, &a->tied_embeddings)) ||
        (st = get_bool(&c, "attention_bias", 0, &bias)) || (st = get_bool(&c, "mlp_bias", 0, &mlp_bias)) ||
        (st = get_bool(&c, "use_sliding_window", 0, &sliding)) || (st = parse_rope(&c, a)) ||
        (st = add_eos(&c, json_get(c.root, "eos_token_id"), a)))
        goto done;
    const json_value *types = json_get(c.root, "layer_types");
    for (size_t i = 0; types && types->type == JSON_ARRAY && i < types->len; i++)
        if (types->items[i]->type != JSON_STRING || strcmp(types->items[i]->str, "full_attention") != 0) {
            st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: layer_types[%zu] is not \"full_attention\" "
                            "(sliding_attention is not supported)", what, i);
            goto done;
        }
    const json_value *act = json_get(c.root, "hidden_act");
    if (act && (act->type != JSON_STRING || strcmp(act->str, "silu") != 0)) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\"", what);
        goto done;
    }
    if (mlp_bias) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: mlp_bias = true is not supported", what);
        goto done;
    }
    if (sliding) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: use_sliding_window = true is not supported", what);
        goto done;
    }
    /* Qwen2 always has q/k/v bias, Qwen2-MoE unless qkv_bias says otherwise;
     * the Qwen3 families have q_norm/k_norm. */
    int qwen2 = strcmp(a->arch, "qwen2") == 0, qwen2_moe = strcmp(a->arch, "qwen2_moe") == 0;
    a->qkv_bias = qwen2 || bias;
    if (qwen2_moe && (st = get_bool(&c, "qkv_bias", 1, &a->qkv_bias)) != POLAR_OK) goto done;
    a->qk_norm = strncmp(a->arch, "qwen3", 5) == 0;
    if (bias && !qwen2 && !qwen2_moe) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: attention_bias = true is only supported for qwen2", what);
        goto done;
    }
    if (strstr(a->arch, "_moe") && (st = parse_moe(&c, a)) != POLAR_OK) goto done;
    st = config_validate(a, what, err);
done:
    json_free(doc);
    return st;
}

polar_status config_validate(const polar_arch *a, const char *what, polar_error *err) {
    if (a->n_layers < 1 || a->hidden < 1 || a->ffn < 1 || a->n_heads < 1 || a->n_kv_heads < 1 || a->vocab < 1 ||
        a->max_pos < 1)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: every size must be positive", what);
    if (a->n_heads % a->n_kv_heads)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          what, a->n_heads, a->n_kv_heads);
    if (a->head_dim < 2 || a->head_dim % 2)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: head_dim %d must be even and at least 2", what, a->head_dim);
    if (a->n_experts && (a->top_k < 1 || a->moe_ffn < 1 || a->sparse_step < 1))
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: an MoE model needs num_experts_per_tok, moe_intermediate_size and "
                          "decoder_sparse_step >= 1", what);
    for (int i = 0; i < a->n_mlp_only; i++)
        if (a->mlp_only[i] < 0 || a->mlp_only[i] >= a->n_layers)
            return polar_fail(err, POLAR_ERR_CONFIG, "%s: mlp_only_layers names layer %d of %d", what, a->mlp_only[i],
                              a->n_layers);
    if (a->n_experts && a->top_k > MAX_TOP_K)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: num_experts_per_tok %d (at most %d supported)", what, a->top_k,
                          MAX_TOP_K);
    if (a->top_k > a->n_experts && a->n_experts)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: num_experts_per_tok %d is larger than num_experts %d", what,
                          a->top_k, a->n_experts);
    if (!(a->rope_theta > 0) || !(a->rms_eps > 0))
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: rope_theta and rms_norm_eps must be positive", what);
    if (a->rope_type != POLAR_ROPE_DEFAULT && !(a->rope_factor > 0 && isfinite(a->rope_factor)))
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: the rope scaling factor must be positive and finite", what);
    if (!(a->rope_attention_factor >= 0 && isfinite(a->rope_attention_factor)))
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: the rope attention factor must be positive and finite", what);
    /* YaRN divides by ln(theta) and takes the log of the original context. */
    if (a->rope_type == POLAR_ROPE_YARN && (!(a->rope_theta > 1) || a->rope_original_max_pos < 1 ||
                                            !(a->rope_beta_fast > 0) || !(a->rope_beta_slow > 0)))
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: yarn rope needs rope_theta > 1, an original context of at least 1 "
                          "and positive betas", what);
    /* Keep every weight matrix indexable with size_t and rows with int. */
    if ((double)a->n_heads * a->head_dim > (1 << 24) || (double)a->vocab * a->hidden > 1e12 ||
        (double)a->ffn * a->hidden > 1e12)
        return polar_fail(err, POLAR_ERR_CONFIG, "%s: shape too large", what);
    return POLAR_OK;
}

polar_status config_load(const char *dir, polar_arch *out, polar_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    polar_status st = json_read_file(path, (size_t)16 << 20, &text, &len, err);
    if (st != POLAR_OK) return st;
    st = config_parse(text, len, path, out, err);
    free(text);
    if (st != POLAR_OK) return st;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) != 0) return POLAR_OK;
    json_doc *doc;
    if ((st = json_parse_file(path, &doc, err)) != POLAR_OK) return st;
    cfg c = {json_root(doc), path, err};
    st = add_eos(&c, json_get(c.root, "eos_token_id"), out);
    json_free(doc);
    return st;
}

polar_status config_write(const polar_arch *a, const char *path, polar_error *err) {
    FILE *f = fopen(path, "w");
    if (!f) return polar_fail(err, POLAR_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    static const char *archs[][2] = {{"llama", "LlamaForCausalLM"},         {"qwen2", "Qwen2ForCausalLM"},
                                     {"qwen3", "Qwen3ForCausalLM"},         {"qwen2_moe", "Qwen2MoeForCausalLM"},
                                     {"qwen3_moe", "Qwen3MoeForCausalLM"}};
    const char *cls = "LlamaForCausalLM";
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(a->arch, archs[i][0]) == 0) cls = archs[i][1];
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls, a->arch);
    fprintf(f, "  \"num_hidden_layers\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", a->n_layers,
            a->hidden, a->ffn);
    fprintf(f, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", a->n_heads,
            a->n_kv_heads, a->head_dim);
    fprintf(f, "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n", a->vocab, a->max_pos);
    fprintf(f, "  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.17g,\n", a->rms_eps, a->rope_theta);
    if (a->rope_type == POLAR_ROPE_LLAMA3)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d},\n",
                a->rope_factor, a->rope_low_freq_factor, a->rope_high_freq_factor, a->rope_original_max_pos);
    if (a->rope_type == POLAR_ROPE_LINEAR)
        fprintf(f, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.17g},\n", a->rope_factor);
    if (a->rope_type == POLAR_ROPE_YARN) {
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.17g, \"original_max_position_embeddings\": %d, "
                "\"beta_fast\": %.17g, \"beta_slow\": %.17g, \"truncate\": %s",
                a->rope_factor, a->rope_original_max_pos, a->rope_beta_fast, a->rope_beta_slow,
                a->rope_truncate ? "true" : "false");
        if (a->rope_attention_factor > 0) fprintf(f, ", \"attention_factor\": %.17g", a->rope_attention_factor);
        fprintf(f, "},\n");
    }
    fprintf(f, "  \"tie_word_embeddings\": %s,\n", a->tied_embeddings ? "true" : "false");
    if (strcmp(a->arch, "llama") == 0) fprintf(f, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n");
    if (strncmp(a->arch, "qwen3", 5) == 0) fprintf(f, "  \"attention_bias\": false,\n");
    if (strcmp(a->arch, "qwen2_moe") == 0) fprintf(f, "  \"qkv_bias\": %s,\n", a->qkv_bias ? "true" : "false");
    if (a->n_experts) {
        fprintf(f, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n",
                a->n_experts, a->top_k, a->moe_ffn);
        if (a->shared_ffn) fprintf(f, "  \"shared_expert_intermediate_size\": %d,\n", a->shared_ffn);
        fprintf(f, "  \"norm_topk_prob\": %s,\n  \"decoder_sparse_step\": %d,\n  \"mlp_only_layers\": [",
                a->norm_topk ? "true" : "false", a->sparse_step);
        for (int i = 0; i < a->n_mlp_only; i++) fprintf(f, "%s%d", i ? ", " : "", a->mlp_only[i]);
        fprintf(f, "],\n");
    }
    if (strcmp(a->arch, "llama") != 0) fprintf(f, "  \"use_sliding_window\": false,\n");
    fprintf(f, "  \"hidden_act\": \"silu\",\n  \"torch_dtype\": \"bfloat16\",\n  \"eos_token_id\": [");
    for (int i = 0; i < a->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", a->eos[i]);
    fprintf(f, "]\n}\n");
    if (fclose(f) != 0) return polar_fail(err, POLAR_ERR_IO, "%s: write failed", path);
    return POLAR_OK;
}
