/* GGUF: a model written as llama.cpp lays it out (permuted Llama q/k,
 * rope_freqs for llama3 scaling) runs like its safetensors twin; dequantised
 * blocks follow ggml's formulas; malformed files give clear errors. */
#include <unistd.h>

#include "gguf_util.h"
#include "harness.h"

static char dir[] = "/tmp/polar-gguf-XXXXXX";

static void gguf_matches_safetensors(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"};
    for (int i = 0; i < 5; i++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL, *g = NULL;
        CHECK_OK(polar_arch_default(archs[i], &a, &err));
        CHECK_OK(polar_model_random(&a, 11, &m, &err));
        char path[128];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, archs[i]);
        CHECK(m && gguf_write_model(m, path, GGUF_OK_FILE), "write %s", path);
        CHECK_OK(polar_model_load(path, &g, &err));
        if (!m || !g) continue;
        CHECK(g->arch.n_layers == a.n_layers && g->arch.head_dim == a.head_dim && g->arch.qkv_bias == a.qkv_bias &&
                  g->arch.qk_norm == a.qk_norm && g->arch.tied_embeddings == a.tied_embeddings &&
                  g->arch.n_experts == a.n_experts && g->arch.norm_topk == a.norm_topk &&
                  g->arch.shared_ffn == a.shared_ffn,
              "%s: architecture from metadata", archs[i]);
        CHECK(memcmp(g->layers[2].wq, m->layers[2].wq, (size_t)a.n_heads * a.head_dim * a.hidden * 2) == 0,
              "%s: q rows un-permuted", archs[i]);
        float want[256], got[256], d = 0;
        prompt_logits(m, "0,1-2x2,3", want);
        prompt_logits(g, "0,1-2x2,3", got);
        for (int v = 0; v < 256; v++) d = fmaxf(d, fabsf(want[v] - got[v]));
        /* rope_freqs round-trips llama3's inv_freq through a division in f32. */
        CHECK(d < 1e-4f, "%s: GGUF logits differ from safetensors by %g", archs[i], d);
        for (int l = 0; l < a.n_layers; l++)
            CHECK(polar_arch_layer_is_moe(&g->arch, l) == polar_arch_layer_is_moe(&a, l), "%s layer %d: MoE or dense",
                  archs[i], l);
        polar_model_free(m);
        polar_model_free(g);
    }
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
    RUN(gguf_dequantize);
    RUN(gguf_malformed);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    TEST_EXIT();
}
