/* Architectures by name: tiny defaults for tests and demos, and the real
 * shapes of the models the PoLar paper uses (weights are random). */
#include <stdio.h>
#include <string.h>

#include "error.h"

static void set_llama3_rope(polar_arch *a, double theta, double factor, int orig) {
    a->rope_theta = theta;
    a->rope_type = POLAR_ROPE_LLAMA3;
    a->rope_factor = factor;
    a->rope_low_freq_factor = 1.0;
    a->rope_high_freq_factor = 4.0;
    a->rope_original_max_pos = orig;
}

static void shape(polar_arch *a, const char *arch, int layers, int hidden, int heads, int kv, int head_dim, int ffn,
                  int vocab) {
    memset(a, 0, sizeof *a);
    snprintf(a->arch, sizeof a->arch, "%s", arch);
    a->n_layers = layers;
    a->hidden = hidden;
    a->n_heads = heads;
    a->n_kv_heads = kv;
    a->head_dim = head_dim;
    a->ffn = ffn;
    a->vocab = vocab;
    a->qkv_bias = strncmp(arch, "qwen2", 5) == 0;
    a->qk_norm = strncmp(arch, "qwen3", 5) == 0;
}

static void experts(polar_arch *a, int n, int top_k, int moe_ffn, int shared_ffn, int norm_topk, int sparse_step) {
    a->n_experts = n;
    a->top_k = top_k;
    a->moe_ffn = moe_ffn;
    a->shared_ffn = shared_ffn;
    a->norm_topk = norm_topk;
    a->sparse_step = sparse_step;
}

int polar_arch_layer_is_moe(const polar_arch *a, int l) {
    if (!a->n_experts || (l + 1) % a->sparse_step) return 0;
    for (int i = 0; i < a->n_mlp_only; i++)
        if (a->mlp_only[i] == l) return 0;
    return 1;
}

polar_status polar_arch_default(const char *arch, polar_arch *a, polar_error *err) {
    if (!arch || !a) return polar_fail(err, POLAR_ERR_ARG, "no architecture name given");
    if (strcmp(arch, "llama") == 0) {
        shape(a, arch, 4, 64, 4, 2, 16, 128, 256);
        set_llama3_rope(a, 10000.0, 8.0, 32);
        a->rms_eps = 1e-5;
        a->tied_embeddings = 1;
    } else if (strcmp(arch, "qwen2") == 0) {
        shape(a, arch, 4, 64, 4, 2, 16, 160, 256);
        a->rope_theta = 1000000.0;
        a->rms_eps = 1e-6;
    } else if (strcmp(arch, "qwen3") == 0) {
        shape(a, arch, 4, 64, 4, 2, 32, 128, 256);
        a->rope_theta = 1000000.0;
        a->rms_eps = 1e-6;
    } else if (strcmp(arch, "qwen2_moe") == 0) {
        /* MoE in layers 1 and 5 (3 is listed as dense), shared expert, no renorm. */
        shape(a, arch, 6, 64, 4, 2, 16, 160, 256);
        experts(a, 8, 2, 48, 96, 0, 2);
        a->n_mlp_only = 1;
        a->mlp_only[0] = 3;
        a->rope_theta = 1000000.0;
        a->rms_eps = 1e-6;
    } else if (strcmp(arch, "qwen3_moe") == 0) {
        shape(a, arch, 4, 64, 4, 2, 32, 128, 256);
        experts(a, 8, 2, 48, 0, 1, 1);
        a->rope_theta = 1000000.0;
        a->rms_eps = 1e-6;
    } else {
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "unknown architecture '%s' (llama, qwen2, qwen3, qwen2_moe, qwen3_moe)",
                          arch);
    }
    a->max_pos = 2048;
    a->n_eos = 1;
    a->eos[0] = a->vocab - 1;
    return POLAR_OK;
}

static const char *const preset_names[] = {"llama-3.2-1b",      "llama-3.2-3b",         "qwen2.5-3b",
                                           "qwen3-8b",          "qwen1.5-moe-a2.7b",    "qwen3-embedding-0.6b",
                                           "qwen2.5-0.5b",      NULL};

const char *const *polar_preset_names(void) { return preset_names; }

polar_status polar_arch_preset(const char *name, polar_arch *a, polar_error *err) {
    if (!name || !a) return polar_fail(err, POLAR_ERR_ARG, "no preset name given");
    if (strcmp(name, "llama-3.2-1b") == 0) {
        shape(a, "llama", 16, 2048, 32, 8, 64, 8192, 128256);
    } else if (strcmp(name, "llama-3.2-3b") == 0) {
        shape(a, "llama", 28, 3072, 24, 8, 128, 8192, 128256);
    } else if (strcmp(name, "qwen2.5-3b") == 0) {
        shape(a, "qwen2", 36, 2048, 16, 2, 128, 11008, 151936);
    } else if (strcmp(name, "qwen2.5-0.5b") == 0) { /* hidden 896: k-quant files fall back to Q5_0 / Q5_1 / Q8_0 */
        shape(a, "qwen2", 24, 896, 14, 2, 64, 4864, 151936);
    } else if (strcmp(name, "qwen3-8b") == 0) {
        shape(a, "qwen3", 36, 4096, 32, 8, 128, 12288, 151936);
    } else if (strcmp(name, "qwen3-embedding-0.6b") == 0) { /* the predictor's default encoder */
        shape(a, "qwen3", 28, 1024, 16, 8, 128, 3072, 151669);
    } else if (strcmp(name, "qwen1.5-moe-a2.7b") == 0) {
        shape(a, "qwen2_moe", 24, 2048, 16, 16, 128, 5632, 151936);
        experts(a, 60, 4, 1408, 5632, 0, 1);
    } else {
        return polar_fail(err, POLAR_ERR_ARG,
                          "unknown preset '%s' (llama-3.2-1b, llama-3.2-3b, qwen2.5-3b, qwen3-8b, qwen1.5-moe-a2.7b, "
                          "qwen3-embedding-0.6b, qwen2.5-0.5b)", name);
    }
    if (strcmp(a->arch, "llama") == 0) {
        set_llama3_rope(a, 500000.0, 32.0, 8192);
        a->rms_eps = 1e-5;
        a->max_pos = 131072;
        a->tied_embeddings = 1;
        a->n_eos = 3;
        a->eos[0] = 128001;
        a->eos[1] = 128008;
        a->eos[2] = 128009;
    } else {
        a->rope_theta = 1000000.0;
        a->rms_eps = 1e-6;
        a->max_pos = strcmp(a->arch, "qwen2") == 0 ? 32768 : strcmp(a->arch, "qwen2_moe") == 0 ? 8192 : 40960;
        a->tied_embeddings = strcmp(a->arch, "qwen2") == 0 || a->hidden == 1024;
        a->n_eos = 2;
        a->eos[0] = 151645;
        a->eos[1] = 151643;
    }
    return POLAR_OK;
}
