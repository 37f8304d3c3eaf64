/* GGUF: a model written as llama.cpp lays it out (permuted Llama q/k,
 * rope_freqs for llama3 scaling) runs like its safetensors twin; dequantised
 * blocks follow ggml's formulas; malformed files give clear errors. */
#include <unistd.h>

#include "gguf_util.h"
#include "harness.h"

static char dir[] = "/tmp/polar-gguf-XXXXXX";

/* A random model of arch a written as GGUF loads back with the same
 * architecture and gives its safetensors twin's logits. */
static void check_twin(const polar_arch *a, const char *label) {
    polar_error err;
    polar_model *m = NULL, *g = NULL;
    CHECK_OK(polar_model_random(a, 11, &m, &err));
    char path[128];
    snprintf(path, sizeof path, "%s/%s.gguf", dir, label);
    CHECK(m && gguf_write_model(m, path, GGUF_OK_FILE), "write %s", path);
    CHECK_OK(polar_model_load(path, &g, &err));
    if (m && g) {
        const polar_arch *b = &g->arch;
        CHECK(b->n_layers == a->n_layers && b->head_dim == a->head_dim && b->qkv_bias == a->qkv_bias &&
                  b->qk_norm == a->qk_norm && b->tied_embeddings == a->tied_embeddings &&
                  b->n_experts == a->n_experts && b->norm_topk == a->norm_topk && b->shared_ffn == a->shared_ffn,
              "%s: architecture from metadata", label);
        /* llama3 travels as rope_freqs.weight, the others as rope.scaling.* */
        if (a->rope_type != POLAR_ROPE_LLAMA3)
            CHECK(b->rope_type == a->rope_type && b->rope_factor == a->rope_factor &&
                      b->rope_original_max_pos == a->rope_original_max_pos && b->rope_beta_fast == a->rope_beta_fast &&
                      b->rope_beta_slow == a->rope_beta_slow && b->rope_attention_factor == a->rope_attention_factor &&
                      m->rope_scale == g->rope_scale,
                  "%s: rope scaling from metadata", label);
        CHECK(memcmp(g->layers[2].wq, m->layers[2].wq, (size_t)a->n_heads * a->head_dim * a->hidden * 2) == 0,
              "%s: q rows un-permuted", label);
        float want[256], got[256], d = 0;
        prompt_logits(m, "0,1-2x2,3", want);
        prompt_logits(g, "0,1-2x2,3", got);
        for (int v = 0; v < 256; v++) d = nan_max(d, fabsf(want[v] - got[v]));
        /* rope_freqs round-trips llama3's inv_freq through a division in f32. */
        CHECK(d < 1e-4f, "%s: GGUF logits differ from safetensors by %g", label, d);
        for (int l = 0; l < a->n_layers; l++)
            CHECK(polar_arch_layer_is_moe(b, l) == polar_arch_layer_is_moe(a, l), "%s layer %d: MoE or dense", label, l);
    }
    polar_model_free(m);
    polar_model_free(g);
}

static void gguf_matches_safetensors(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"};
    for (int i = 0; i < 5; i++) {
        polar_error err;
        polar_arch a;
        CHECK_OK(polar_arch_default(archs[i], &a, &err));
        check_twin(&a, archs[i]);
    }
}

/* Linear and YaRN scaling (derived and given attention factors) through
 * {arch}.rope.scaling.*, as convert_hf_to_gguf writes them. */
static void gguf_rope_scaling(void) {
    polar_error err;
    polar_arch a;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    a.rope_type = POLAR_ROPE_LINEAR, a.rope_factor = 4, a.rope_original_max_pos = 0; /* the default is llama3's */
    check_twin(&a, "llama-linear");
    CHECK_OK(polar_arch_default("qwen3", &a, &err));
    a.rope_theta = 10000, a.rope_type = POLAR_ROPE_YARN, a.rope_factor = 4, a.rope_original_max_pos = 4096;
    a.rope_beta_fast = 32, a.rope_beta_slow = 1, a.rope_truncate = 1;
    check_twin(&a, "qwen3-yarn");
    CHECK_OK(polar_arch_default("qwen2", &a, &err));
    a.rope_theta = 10000, a.rope_type = POLAR_ROPE_YARN, a.rope_factor = 8, a.rope_original_max_pos = 2048;
    a.rope_beta_fast = 16, a.rope_beta_slow = 2, a.rope_truncate = 1, a.rope_attention_factor = 1.25;
    check_twin(&a, "qwen2-yarn");
}

/* Dequantisation follows ggml: Q4_0 d*(q-8), Q4_1 d*q+m, Q8_0 d*q, low
 * nibbles first. */
static void gguf_dequantize(void) {
    unsigned char q40[18], q41[20], q80[34];
    uint16_t d = 0x3800, mn = 0xBC00; /* 0.5, -1.0 in f16 */
    memcpy(q40, &d, 2);
    memcpy(q41, &d, 2);
    memcpy(q41 + 2, &mn, 2);
    memcpy(q80, &d, 2);
    for (int i = 0; i < 16; i++) q40[2 + i] = q41[4 + i] = (unsigned char)(i | (15 - i) << 4);
    for (int i = 0; i < 32; i++) q80[2 + i] = (unsigned char)(int8_t)(i - 16);
    float out[32];
    ggml_dequantize(GGML_Q4_0, q40, out, 32);
    for (int i = 0; i < 16; i++) CHECK(out[i] == 0.5f * (i - 8) && out[16 + i] == 0.5f * (7 - i), "q4_0[%d]", i);
    ggml_dequantize(GGML_Q4_1, q41, out, 32);
    for (int i = 0; i < 16; i++) CHECK(out[i] == 0.5f * i - 1 && out[16 + i] == 0.5f * (15 - i) - 1, "q4_1[%d]", i);
    ggml_dequantize(GGML_Q8_0, q80, out, 32);
    for (int i = 0; i < 32; i++) CHECK(out[i] == 0.5f * (i - 16), "q8_0[%d]", i);
}

/* polar_model_info's stored_bytes: a GGUF's Q8_0 blocks at 34 bytes per 32
 * weights, its vectors (norms) at bf16's 2 bytes an element; the same file
 * loaded as bf16 holds weight_bytes. */
static void gguf_stored_bytes(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *kept = NULL, *as_bf16 = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    CHECK_OK(polar_model_random(&a, 5, &m, &err));
    char path[128];
    snprintf(path, sizeof path, "%s/stored.gguf", dir);
    CHECK(m && gguf_write_model(m, path, GGUF_Q8_0_FILE), "write %s", path);
    CHECK_OK(load_kept_and_bf16(path, &kept, &as_bf16, &err));
    if (kept && as_bf16) {
        polar_model_info k, b;
        polar_model_info_get(kept, &k);
        polar_model_info_get(as_bf16, &b);
        size_t vec = (size_t)(2 * a.n_layers + 1) * a.hidden; /* two norms a layer and the final one */
        size_t want = (k.n_params - vec) / 32 * 34 + vec * 2;
        CHECK(k.stored_bytes == want && k.weight_bytes == k.n_params * 2, "Q8_0 kept: %zu stored bytes, want %zu",
              k.stored_bytes, want);
        CHECK(b.stored_bytes == b.weight_bytes, "loaded as bf16: %zu stored bytes, %zu bf16", b.stored_bytes,
              b.weight_bytes);
    }
    polar_model_free(m);
    polar_model_free(kept);
    polar_model_free(as_bf16);
}

static void gguf_malformed(void) {
    static const struct {
        gguf_fault fault;
        polar_status code;
        const char *why;
    } cases[] = {
        {GGUF_BAD_MAGIC, POLAR_ERR_FORMAT, "bad magic"},
        {GGUF_BAD_VERSION, POLAR_ERR_UNSUPPORTED, "GGUF version 1"},
        {GGUF_HUGE_COUNT, POLAR_ERR_FORMAT, "absurd counts"},
        {GGUF_HUGE_STRING, POLAR_ERR_FORMAT, "runs past the end"},
        {GGUF_UNKNOWN_TYPE, POLAR_ERR_UNSUPPORTED, "ggml type 99"},
        {GGUF_OFFSET_PAST_END, POLAR_ERR_FORMAT, "past the end of the file"},
        {GGUF_MISALIGNED, POLAR_ERR_FORMAT, "not aligned"},
        {GGUF_TRUNCATED, POLAR_ERR_FORMAT, "truncated or corrupt"},
        {GGUF_BAD_VALUE_TYPE, POLAR_ERR_FORMAT, "unknown value type 77"},
        {GGUF_NO_TENSOR, POLAR_ERR_FORMAT, "no tensor 'blk.0.attn_norm.weight'"},
    };
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_default("qwen2", &a, &err));
    CHECK_OK(polar_model_random(&a, 2, &m, &err));
    for (size_t i = 0; m && i < sizeof cases / sizeof cases[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/bad%zu.gguf", dir, i);
        gguf_write_model(m, path, cases[i].fault);
        polar_model *g = NULL;
        polar_status st = polar_model_load(path, &g, &err);
        CHECK(st == cases[i].code && !g, "case %zu: status %s (%s)", i, polar_status_name(st), err.msg);
        CHECK(strstr(err.msg, cases[i].why) && strstr(err.msg, path), "case %zu: '%s' lacks '%s'", i, err.msg,
              cases[i].why);
    }
    polar_model_free(m);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    RUN(gguf_matches_safetensors);
    RUN(gguf_rope_scaling);
    RUN(gguf_dequantize);
    RUN(gguf_stored_bytes);
    RUN(gguf_malformed);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    TEST_EXIT();
}
