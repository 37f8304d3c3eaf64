/* config.json -> polar_arch: the fields of each supported model_type, both
 * rope forms, and clear errors for missing, mistyped or unsupported fields. */
#include "../loader/config.h"
#include "../runtime/model.h"
#include "harness.h"

#define BASE "\"num_hidden_layers\":2,\"hidden_size\":64,\"intermediate_size\":96,\"num_attention_heads\":4,\"vocab_size\":100"

static polar_status parse(const char *text, polar_arch *a, polar_error *err) {
    return config_parse(text, strlen(text), "config.json", a, err);
}

static void config_llama(void) {
    polar_arch a;
    polar_error err;
    CHECK_OK(parse("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":2,\"rms_norm_eps\":1e-5,"
                   "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"eos_token_id\":[7,9],"
                   "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,"
                   "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
                   &a, &err));
    CHECK(strcmp(a.arch, "llama") == 0 && a.n_layers == 2 && a.hidden == 64 && a.ffn == 96, "sizes");
    CHECK(a.n_heads == 4 && a.n_kv_heads == 2 && a.head_dim == 16, "heads: head_dim = hidden / heads by default");
    CHECK(a.rope_type == POLAR_ROPE_LLAMA3 && a.rope_factor == 32 && a.rope_original_max_pos == 8192 &&
              a.rope_theta == 500000,
          "rope");
    CHECK(a.tied_embeddings && !a.qkv_bias && !a.qk_norm, "flags");
    CHECK(a.n_eos == 2 && a.eos[0] == 7 && a.eos[1] == 9, "eos list");
    CHECK(fabs(a.rms_eps - 1e-5) < 1e-12, "eps");
}

static void config_qwen(void) {
    polar_arch a;
    polar_error err;
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," BASE ",\"eos_token_id\":5}", &a, &err));
    CHECK(a.qkv_bias && !a.qk_norm && a.n_kv_heads == 4 && !a.tied_embeddings, "qwen2 defaults");
    CHECK(a.n_eos == 1 && a.eos[0] == 5 && a.rope_theta == 10000 && a.rope_type == POLAR_ROPE_DEFAULT, "qwen2 eos, rope");
    /* transformers v5 form: rope_theta inside rope_parameters; head_dim given. */
    CHECK_OK(parse("{\"model_type\":\"qwen3\"," BASE ",\"head_dim\":32,\"layer_types\":[\"full_attention\",\"full_attention\"],"
                   "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}",
                   &a, &err));
    CHECK(a.qk_norm && !a.qkv_bias && a.head_dim == 32 && a.rope_theta == 1000000, "qwen3 v5 rope_parameters");
}

static void expect_bad(const char *text, polar_status code, const char *why) {
    polar_arch a;
    polar_error err = {0};
    polar_status st = parse(text, &a, &err);
    CHECK(st == code, "%s: status %s, want %s", text, polar_status_name(st), polar_status_name(code));
    CHECK(strstr(err.msg, why) && strstr(err.msg, "config.json"), "message '%s' lacks '%s'", err.msg, why);
}

static void config_moe(void) {
    polar_arch a;
    polar_error err;
    CHECK_OK(parse("{\"model_type\":\"qwen2_moe\"," BASE ",\"num_experts\":60,\"num_experts_per_tok\":4,"
                   "\"moe_intermediate_size\":1408,\"shared_expert_intermediate_size\":5632,\"norm_topk_prob\":false,"
                   "\"decoder_sparse_step\":1,\"mlp_only_layers\":[1]}",
                   &a, &err));
    CHECK(a.n_experts == 60 && a.top_k == 4 && a.moe_ffn == 1408 && a.shared_ffn == 5632 && !a.norm_topk, "qwen2_moe");
    CHECK(a.qkv_bias && !a.qk_norm && polar_arch_layer_is_moe(&a, 0) && !polar_arch_layer_is_moe(&a, 1), "layers");
    CHECK_OK(parse("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_local_experts\":8,\"num_experts_per_tok\":2,"
                   "\"moe_intermediate_size\":32,\"norm_topk_prob\":true,\"decoder_sparse_step\":2}",
                   &a, &err));
    CHECK(a.n_experts == 8 && a.norm_topk && a.qk_norm && !a.qkv_bias && !a.shared_ffn, "qwen3_moe, num_local_experts");
    CHECK(!polar_arch_layer_is_moe(&a, 0) && polar_arch_layer_is_moe(&a, 1), "decoder_sparse_step 2");
}

/* linear and YaRN, as config.json files write them; the attention factor
 * and the frequencies a model derives from them. */
static void config_rope_scaling(void) {
    polar_arch a;
    polar_error err;
    CHECK_OK(parse("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}", &a,
                   &err));
    CHECK(a.rope_type == POLAR_ROPE_LINEAR && a.rope_factor == 2, "linear (the v4 'type' key)");
    /* what Qwen's model cards add to config.json for long contexts */
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," BASE ",\"max_position_embeddings\":32768,\"rope_theta\":1000000.0,"
                   "\"rope_scaling\":{\"factor\":4.0,\"original_max_position_embeddings\":32768,\"type\":\"yarn\"}}",
                   &a, &err));
    CHECK(a.rope_type == POLAR_ROPE_YARN && a.rope_factor == 4 && a.rope_original_max_pos == 32768 &&
              a.rope_beta_fast == 32 && a.rope_beta_slow == 1 && a.rope_truncate && a.rope_attention_factor == 0,
          "yarn, Qwen's model card");
    polar_model *m = NULL;
    CHECK_OK(polar_model_random(&a, 1, &m, &err));
    if (m) {
        CHECK(fabsf(m->rope_scale - (float)(0.1 * log(4.0) + 1)) < 1e-7f, "attention factor 0.1 ln 4 + 1: %g",
              m->rope_scale);
        /* beta_fast 32 and beta_slow 1 over 32768 positions at theta 1e6 put the ramp's ends at
         * dimensions 2.95 and 4.96 of head_dim 16, truncated to 2 and 5 */
        int half = a.head_dim / 2;
        for (int i = 0; i < half; i++) {
            double orig = pow(1e6, -2.0 * i / a.head_dim), f = m->rope_inv_freq[i];
            double want = i <= 2 ? orig : i >= 5 ? orig / 4 : 0;
            if (want) CHECK(fabs(f - want) <= 1e-6 * want, "yarn inv_freq[%d] = %g, want %g", i, f, want);
            else CHECK(f < orig && f > orig / 4, "yarn inv_freq[%d] = %g between %g and %g", i, f, orig / 4, orig);
        }
        polar_model_free(m);
    }
    /* defaults as transformers takes them: a null factor from the ratio of
     * max_position_embeddings to the original context, betas 0 / null -> 32 and 1 */
    CHECK_OK(parse("{\"model_type\":\"qwen3\"," BASE ",\"max_position_embeddings\":8192,"
                   "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":null,\"original_max_position_embeddings\":2048,"
                   "\"beta_fast\":0,\"beta_slow\":null,\"truncate\":false,\"mscale\":1.0,\"mscale_all_dim\":0.5}}",
                   &a, &err));
    double f4 = 0.1 * log(4.0);
    CHECK(a.rope_factor == 4 && a.rope_beta_fast == 32 && a.rope_beta_slow == 1 && !a.rope_truncate &&
              fabs(a.rope_attention_factor - (f4 + 1) / (0.5 * f4 + 1)) < 1e-15,
          "yarn defaults, mscale / mscale_all_dim: factor %g, attention %g", a.rope_factor, a.rope_attention_factor);
    /* truncate null is false (transformers tests it for truth); a top-level
     * original_max_position_embeddings wins over rope_scaling's */
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," BASE ",\"original_max_position_embeddings\":1024,"
                   "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2,\"original_max_position_embeddings\":4096,"
                   "\"truncate\":null}}",
                   &a, &err));
    CHECK(!a.rope_truncate && a.rope_original_max_pos == 1024, "truncate null, top-level original context: %d, %d",
          a.rope_truncate, a.rope_original_max_pos);
}

static void config_errors(void) {
    expect_bad("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":5,"
               "\"moe_intermediate_size\":32}",
               POLAR_ERR_CONFIG, "num_experts_per_tok 5 is larger than num_experts 4");
    expect_bad("{\"model_type\":\"qwen2_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
               "\"moe_intermediate_size\":32}",
               POLAR_ERR_CONFIG, "'shared_expert_intermediate_size' is missing");
    expect_bad("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts_per_tok\":2,\"moe_intermediate_size\":32}",
               POLAR_ERR_CONFIG, "'num_local_experts' is missing");
    expect_bad("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
               "\"moe_intermediate_size\":32,\"mlp_only_layers\":[7]}",
               POLAR_ERR_CONFIG, "mlp_only_layers[0]");
    expect_bad("{" BASE "}", POLAR_ERR_CONFIG, "'model_type' is missing");
    expect_bad("{\"model_type\":\"mixtral\"," BASE "}", POLAR_ERR_UNSUPPORTED, "model_type 'mixtral'");
    expect_bad("{\"model_type\":\"gpt2\"," BASE "}", POLAR_ERR_UNSUPPORTED, "'gpt2'");
    expect_bad("{\"model_type\":\"llama\",\"num_hidden_layers\":2}", POLAR_ERR_CONFIG, "'hidden_size' is missing");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":\"2\"}", POLAR_ERR_CONFIG,
               "'num_key_value_heads' must be an integer, got string");
    expect_bad("{\"model_type\":\"llama\",\"num_hidden_layers\":2.5,\"hidden_size\":64}", POLAR_ERR_CONFIG,
               "'num_hidden_layers' must be an integer");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":3}", POLAR_ERR_CONFIG, "not a multiple");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":0}", POLAR_ERR_CONFIG, "outside");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rms_norm_eps\":\"x\"}", POLAR_ERR_CONFIG, "must be a number");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"tie_word_embeddings\":1}", POLAR_ERR_CONFIG, "true or false");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":4}}",
               POLAR_ERR_UNSUPPORTED, "type 'dynamic' is not supported (default, llama3, linear and yarn are)");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"linear\"}}", POLAR_ERR_CONFIG,
               "linear rope needs a 'factor'");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}}",
               POLAR_ERR_CONFIG, "'factor' = 0 must be greater than 0");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
               "\"truncate\":1}}",
               POLAR_ERR_CONFIG, "yarn 'truncate' must be true or false, got number");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_theta\":1,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
               POLAR_ERR_CONFIG, "yarn rope needs rope_theta > 1");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
               "\"attention_factor\":-1}}",
               POLAR_ERR_CONFIG, "'attention_factor' = -1 must be greater than 0");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
               "\"mscale\":-200,\"mscale_all_dim\":1}}",
               POLAR_ERR_CONFIG, "give no positive attention factor");
    /* mscale_all_dim -10 / ln 4: a zero denominator, an infinite ratio */
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,"
               "\"mscale\":1,\"mscale_all_dim\":-7.2134752044448170}}",
               POLAR_ERR_CONFIG, "give no positive attention factor");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":1e999}}",
               POLAR_ERR_CONFIG, "'factor' = inf is not finite");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\","
               "\"original_max_position_embeddings\":4096}}",
               POLAR_ERR_CONFIG, "yarn rope needs a 'factor'");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"factor\":4}}", POLAR_ERR_CONFIG, "rope_type");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"hidden_act\":\"gelu\"}", POLAR_ERR_UNSUPPORTED, "silu");
    expect_bad("{\"model_type\":\"qwen2\"," BASE ",\"use_sliding_window\":true}", POLAR_ERR_UNSUPPORTED, "sliding");
    expect_bad("{\"model_type\":\"qwen3\"," BASE ",\"layer_types\":[\"full_attention\",\"sliding_attention\"]}",
               POLAR_ERR_UNSUPPORTED, "sliding_attention");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":[1,\"x\"]}", POLAR_ERR_CONFIG, "eos_token_id");
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"head_dim\":15}", POLAR_ERR_CONFIG, "even");
    expect_bad("[]", POLAR_ERR_CONFIG, "not a JSON object");
    expect_bad("{\"model_type\":", POLAR_ERR_FORMAT, "syntax error");
}

static void config_files(void) {
    polar_arch a;
    polar_error err;
    CHECK(config_load("/nonexistent", &a, &err) == POLAR_ERR_IO && strstr(err.msg, "config.json"), "missing: %s",
          err.msg);
    /* The fixtures as transformers wrote them, with generation_config.json. */
    CHECK_OK(config_load(GOLDEN_DIR "/llama", &a, &err));
    CHECK(a.rope_type == POLAR_ROPE_LLAMA3 && a.rope_original_max_pos == 32 && a.tied_embeddings && a.n_eos == 1 && a.eos[0] == 255,
          "golden llama config");
    /* config_write -> config_load round trips, every rope scaling. */
    char dir[] = "/tmp/polar-cfg-XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/config.json", dir);
    static const char *fixtures[] = {"llama", "llama_linear", "qwen3_yarn", "qwen2_yarn"};
    for (int i = 0; i < 4; i++) {
        char fixture[256];
        snprintf(fixture, sizeof fixture, "%s/%s", GOLDEN_DIR, fixtures[i]);
        polar_arch b;
        CHECK_OK(config_load(fixture, &a, &err));
        CHECK_OK(config_write(&a, path, &err));
        CHECK_OK(config_load(dir, &b, &err));
        CHECK(memcmp(&a, &b, sizeof a) == 0, "%s: written config reads back the same", fixtures[i]);
    }
    CHECK(a.rope_type == POLAR_ROPE_YARN && a.rope_attention_factor == 1.25 && a.rope_beta_fast == 16 &&
              a.rope_beta_slow == 2 && !a.rope_truncate && a.rope_original_max_pos == 2048,
          "golden qwen2_yarn config (transformers v5 rope_parameters)");
    remove(path);
    remove(dir);
}

int main(void) {
    RUN(config_llama);
    RUN(config_qwen);
    RUN(config_moe);
    RUN(config_rope_scaling);
    RUN(config_errors);
    RUN(config_files);
    TEST_EXIT();
}
