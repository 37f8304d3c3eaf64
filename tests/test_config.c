/* config.json -> polar_arch: the fields of each supported model_type, both
 * rope forms, and clear errors for missing, mistyped or unsupported fields. */
#include "../loader/config.h"
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
    CHECK(a.rope_llama3 && a.rope_factor == 32 && a.rope_original_max_pos == 8192 && a.rope_theta == 500000, "rope");
    CHECK(a.tied_embeddings && !a.qkv_bias && !a.qk_norm, "flags");
    CHECK(a.n_eos == 2 && a.eos[0] == 7 && a.eos[1] == 9, "eos list");
    CHECK(fabs(a.rms_eps - 1e-5) < 1e-12, "eps");
}

static void config_qwen(void) {
    polar_arch a;
    polar_error err;
    CHECK_OK(parse("{\"model_type\":\"qwen2\"," BASE ",\"eos_token_id\":5}", &a, &err));
    CHECK(a.qkv_bias && !a.qk_norm && a.n_kv_heads == 4 && !a.tied_embeddings, "qwen2 defaults");
    CHECK(a.n_eos == 1 && a.eos[0] == 5 && a.rope_theta == 10000 && !a.rope_llama3, "qwen2 eos, rope");
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
    expect_bad("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
               POLAR_ERR_UNSUPPORTED, "'yarn'");
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
    CHECK(a.rope_llama3 && a.rope_original_max_pos == 32 && a.tied_embeddings && a.n_eos == 1 && a.eos[0] == 255,
          "golden llama config");
    /* config_write -> config_load round trip. */
    char dir[] = "/tmp/polar-cfg-XXXXXX", path[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/config.json", dir);
    polar_arch b;
    CHECK_OK(config_write(&a, path, &err));
    CHECK_OK(config_load(dir, &b, &err));
    CHECK(memcmp(&a, &b, sizeof a) == 0, "written config reads back the same");
    remove(path);
    remove(dir);
}

int main(void) {
    RUN(config_llama);
    RUN(config_qwen);
    RUN(config_moe);
    RUN(config_errors);
    RUN(config_files);
    TEST_EXIT();
}
