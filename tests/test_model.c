/* Models: deterministic random weights, save/load round trips, every dtype
 * the loader converts, sharded checkpoints, and clear errors for missing,
 * misshapen or mistyped tensors. */
#include <unistd.h>

#include "ckpt_util.h"
#include "harness.h"

static char tmp_root[] = "/tmp/polar-model-XXXXXX";

static int same_weights(const polar_model *a, const polar_model *b) {
    polar_model_info ia;
    polar_model_info_get(a, &ia);
    const polar_arch *r = &a->arch;
    const layer_weights *x = &a->layers[1], *y = &b->layers[1];
    if (memcmp(a->embed, b->embed, ia.embed_bytes) != 0) return 0;
    if (!x->router) return memcmp(x->w_down, y->w_down, (size_t)r->hidden * r->ffn * 2) == 0;
    size_t gu = (size_t)r->n_experts * 2 * r->moe_ffn * r->hidden;
    return memcmp(x->router, y->router, (size_t)r->n_experts * r->hidden * 2) == 0 &&
           memcmp(x->exp_gate_up, y->exp_gate_up, gu * 2) == 0 && memcmp(x->exp_down, y->exp_down, gu) == 0;
}

static void model_random_deterministic(void) {
    polar_error err;
    polar_arch a;
    polar_model *m1 = NULL, *m2 = NULL, *m3 = NULL;
    CHECK_OK(polar_arch_default("qwen2", &a, &err));
    CHECK_OK(polar_model_random(&a, 7, &m1, &err));
    CHECK_OK(polar_model_random(&a, 7, &m2, &err));
    CHECK_OK(polar_model_random(&a, 8, &m3, &err));
    if (!m1 || !m2 || !m3) return;
    CHECK(same_weights(m1, m2), "same seed, same weights");
    CHECK(!same_weights(m1, m3), "another seed, other weights");
    polar_model_info info;
    polar_model_info_get(m1, &info);
    CHECK(info.n_params == 4 * (2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64 + 64 + 2 * 32) + 2 * 256 * 64 + 64,
          "parameter count %zu", info.n_params);
    polar_model_free(m1);
    polar_model_free(m2);
    polar_model_free(m3);
    a.n_kv_heads = 3;
    CHECK(polar_model_random(&a, 1, &m1, &err) == POLAR_ERR_CONFIG && strstr(err.msg, "multiple"), "bad arch: %s",
          err.msg);
}

/* Save -> load gives the same weights, and F32, F16 and sharded checkpoints
 * of the same bf16 values give bit-identical logits. */
static void model_round_trips(void) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"};
    for (int ai = 0; ai < 5; ai++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL;
        CHECK_OK(polar_arch_default(archs[ai], &a, &err));
        CHECK_OK(polar_model_random(&a, 3, &m, &err));
        if (!m) continue;
        float *want = malloc(256 * sizeof(float)), *got = malloc(256 * sizeof(float));
        prompt_logits(m, "0,1-2x2,3", want);
        struct {
            const char *name;
            ckpt_opts o;
        } variants[] = {{"saved", {ST_BF16, NULL, NULL, 1, 0}},
                        {"f32", {ST_F32, NULL, NULL, 1, 0}},
                        {"f16", {ST_F16, NULL, NULL, 1, 0}},
                        {"sharded", {ST_BF16, NULL, NULL, 2, 0}},
                        {"stacked", {ST_BF16, NULL, NULL, 1, 1}}};
        for (int v = 0; v < 5; v++) {
            char dir[256];
            snprintf(dir, sizeof dir, "%s/%s-%s", tmp_root, archs[ai], variants[v].name);
            if (v == 0) CHECK_OK(polar_model_save(m, dir, &err));
            else CHECK_OK(ckpt_write(m, dir, &variants[v].o, &err));
            polar_model *l = NULL;
            CHECK_OK(polar_model_load(dir, &l, &err));
            if (!l) continue;
            prompt_logits(l, "0,1-2x2,3", got);
            if (variants[v].o.dtype != ST_F16) {
                CHECK(same_weights(m, l), "%s %s: weights differ after loading", archs[ai], variants[v].name);
                CHECK(memcmp(want, got, 256 * sizeof(float)) == 0, "%s %s: logits differ", archs[ai],
                      variants[v].name);
            } else {
                /* f16 keeps every bf16 value above 2^-17 exactly; the few
                 * smaller weights lose bits, so compare with a tolerance. */
                float d = 0;
                for (int i = 0; i < 256; i++) d = nan_max(d, fabsf(want[i] - got[i]));
                CHECK(d < 1e-4f, "%s f16: logits differ by %g", archs[ai], d);
            }
            polar_model_free(l);
        }
        free(want);
        free(got);
        polar_model_free(m);
    }
}

static void expect_load_error(polar_model *m, const char *tag, const ckpt_opts *o, polar_status code, const char *why) {
    polar_error err = {0};
    char dir[256];
    snprintf(dir, sizeof dir, "%s/bad-%s", tmp_root, tag);
    CHECK_OK(ckpt_write(m, dir, o, &err));
    polar_model *l = NULL;
    polar_status st = polar_model_load(dir, &l, &err);
    CHECK(st == code && l == NULL, "%s: status %s", tag, polar_status_name(st));
    CHECK(strstr(err.msg, why), "%s: message '%s' lacks '%s'", tag, err.msg, why);
}

static void model_bad_checkpoints(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    CHECK_OK(polar_arch_default("qwen2", &a, &err));
    CHECK_OK(polar_model_random(&a, 3, &m, &err));
    if (!m) return;
    ckpt_opts missing = {ST_BF16, "model.layers.2.self_attn.k_proj.bias", NULL, 1, 0};
    expect_load_error(m, "missing", &missing, POLAR_ERR_FORMAT, "no tensor 'model.layers.2.self_attn.k_proj.bias'");
    ckpt_opts head = {ST_BF16, "lm_head.weight", NULL, 2, 0};
    expect_load_error(m, "nohead", &head, POLAR_ERR_FORMAT, "'lm_head.weight'");
    ckpt_opts shape = {ST_BF16, NULL, "model.layers.0.mlp.up_proj.weight", 1, 0};
    expect_load_error(m, "shape", &shape, POLAR_ERR_FORMAT, "has shape [161, 64], expected [160, 64]");
    ckpt_opts vshape = {ST_BF16, NULL, "model.norm.weight", 1, 0};
    expect_load_error(m, "vshape", &vshape, POLAR_ERR_FORMAT, "expected [64]");
    ckpt_opts dtype = {ST_I32, NULL, NULL, 1, 0};
    expect_load_error(m, "dtype", &dtype, POLAR_ERR_FORMAT, "dtype I32");
    polar_model *l = NULL;
    CHECK(polar_model_load("/nonexistent", &l, &err) == POLAR_ERR_IO && strstr(err.msg, "not a model"),
          "no folder: %s", err.msg);
    CHECK(polar_model_load(GOLDEN_DIR, &l, &err) == POLAR_ERR_IO && strstr(err.msg, "config.json"),
          "no config: %s", err.msg);
    polar_model_free(m);
}

/* MoE checkpoints: a missing expert, a checkpoint with fewer experts than
 * its config claims (both layouts), a config asking top-k > experts. */
static void model_bad_moe(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *few = NULL;
    CHECK_OK(polar_arch_default("qwen2_moe", &a, &err));
    CHECK_OK(polar_model_random(&a, 4, &m, &err));
    a.n_experts = 6;
    CHECK_OK(polar_model_random(&a, 4, &few, &err));
    if (!m || !few) return;
    ckpt_opts missing = {ST_BF16, "model.layers.5.mlp.experts.3.up_proj.weight", NULL, 1, 0};
    expect_load_error(m, "moe-missing", &missing, POLAR_ERR_FORMAT, "no tensor 'model.layers.5.mlp.experts.3.up_proj.weight'");
    ckpt_opts shared = {ST_BF16, "model.layers.1.mlp.shared_expert_gate.weight", NULL, 1, 0};
    expect_load_error(m, "moe-shared", &shared, POLAR_ERR_FORMAT, "'model.layers.1.mlp.shared_expert_gate.weight'");
    /* A 6-expert checkpoint under a config that says 8. */
    char path[300];
    for (int stacked = 0; stacked < 2; stacked++) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/moe-count-%d", tmp_root, stacked);
        ckpt_opts o = {ST_BF16, NULL, NULL, 1, stacked};
        CHECK_OK(ckpt_write(few, dir, &o, &err));
        snprintf(path, sizeof path, "%s/config.json", dir);
        CHECK_OK(config_write(&m->arch, path, &err));
        polar_model *l = NULL;
        polar_status st = polar_model_load(dir, &l, &err);
        CHECK(st == POLAR_ERR_FORMAT && !l, "expert count mismatch must fail (%s)", err.msg);
        CHECK(strstr(err.msg, "'model.layers.1.mlp.gate.weight' has shape [6, 64], expected [8, 64]"),
              "expert count mismatch: %s", err.msg);
    }
    polar_arch bad = m->arch;
    bad.top_k = 9;
    polar_model *l = NULL;
    CHECK(polar_model_random(&bad, 1, &l, &err) == POLAR_ERR_CONFIG && strstr(err.msg, "larger than num_experts 8"),
          "top-k > experts: %s", err.msg);
    polar_model_free(m);
    polar_model_free(few);
}

/* Sharded index naming a tensor its shard lacks, or a file outside the folder. */
static void model_bad_index(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *l = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    CHECK_OK(polar_model_random(&a, 3, &m, &err));
    if (!m) return;
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/index", tmp_root);
    ckpt_opts o = {ST_BF16, NULL, NULL, 2, 0};
    CHECK_OK(ckpt_write(m, dir, &o, &err));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    fclose(f);
    CHECK(polar_model_load(dir, &l, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "'model.norm.weight' listed in the index"),
          "index: %s", err.msg);
    f = fopen(path, "w");
    fprintf(f, "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}");
    fclose(f);
    CHECK(polar_model_load(dir, &l, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "inside the folder"), "escape: %s",
          err.msg);
    polar_model_free(m);
}

/* Presets have the real shapes: their parameter counts are the published ones. */
static void model_presets(void) {
    static const struct {
        const char *name;
        size_t params;
    } want[] = {{"llama-3.2-1b", 1235814400}, {"llama-3.2-3b", 3212749824}, {"qwen2.5-3b", 3085938688},
                {"qwen3-8b", 8190735360}, {"qwen1.5-moe-a2.7b", 14315784192}};
    const char *const *names = polar_preset_names();
    for (size_t i = 0; i < 5; i++) {
        polar_error err;
        polar_model m = {0};
        polar_model_info info;
        CHECK(names[i] && strcmp(names[i], want[i].name) == 0, "preset %zu is %s", i, names[i]);
        CHECK_OK(polar_arch_preset(want[i].name, &m.arch, &err));
        CHECK_OK(polar_model_info_get(&m, &info));
        CHECK(info.n_params == want[i].params, "%s: %zu params, want %zu", want[i].name, info.n_params, want[i].params);
    }
    CHECK(names[5] && !strcmp(names[5], "qwen3-embedding-0.6b") && names[6] && !strcmp(names[6], "qwen2.5-0.5b") &&
              names[7] == NULL,
          "seven presets");
    polar_error err;
    polar_model m = {0};
    polar_model_info info;
    CHECK_OK(polar_arch_preset("qwen2.5-0.5b", &m.arch, &err));
    CHECK_OK(polar_model_info_get(&m, &info));
    CHECK(info.n_params == 494032768, "qwen2.5-0.5b: %zu params, want 494032768", info.n_params);
}

int main(void) {
    if (!mkdtemp(tmp_root)) return 1;
    RUN(model_presets);
    RUN(model_random_deterministic);
    RUN(model_round_trips);
    RUN(model_bad_checkpoints);
    RUN(model_bad_index);
    RUN(model_bad_moe);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd) != 0) return 1;
    TEST_EXIT();
}
