/* Writes the broken checkpoints tests/cli_test.sh feeds to the CLI: one
 * folder per fault, each next to a good model. Usage: mkbad DIR */
#include <unistd.h>

#include "ckpt_util.h"

/* A safetensors file with this exact header and data_size zero bytes. */
static void write_raw_st(const char *path, const char *header, size_t data_size) {
    FILE *f = fopen(path, "wb");
    uint64_t len = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i)) & 0xFF, f);
    fputs(header, f);
    for (size_t i = 0; i < data_size; i++) fputc(0, f);
    fclose(f);
}

static void put(const char *dir, const char *name, const char *file, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, file);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static polar_status variant(polar_model *m, const char *root, const char *name, ckpt_opts o, polar_error *err) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    return ckpt_write(m, dir, &o, err);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mkbad DIR\n");
        return 2;
    }
    const char *root = argv[1];
    polar_error err;
    polar_arch a;
    polar_model *m;
    if (polar_arch_default("llama", &a, &err) || polar_model_random(&a, 5, &m, &err)) {
        fprintf(stderr, "mkbad: %s\n", err.msg);
        return 1;
    }
    const ckpt_opts good = {ST_BF16, NULL, NULL, 1, 0};
    static const char *copies[] = {"good", "truncated", "tiny", "hdrlen", "offsets", "overlap", "cfg_missing",
                                   "cfg_type", "cfg_unknown", "cfg_syntax", "sharded_missing"};
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++)
        if (variant(m, root, copies[i], good, &err) != POLAR_OK) {
            fprintf(stderr, "mkbad: %s\n", err.msg);
            return 1;
        }
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/truncated/model.safetensors", root);
    if (stat(path, &sb) != 0 || truncate(path, sb.st_size / 2) != 0) return 1;
    snprintf(path, sizeof path, "%s/tiny/model.safetensors", root);
    if (truncate(path, 4) != 0) return 1;
    snprintf(path, sizeof path, "%s/hdrlen/model.safetensors", root);
    FILE *f = fopen(path, "r+b");
    if (!f) return 1;
    uint64_t len = (uint64_t)sb.st_size; /* the whole file: past the end by 8 bytes */
    for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i)) & 0xFF, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/offsets/model.safetensors", root);
    write_raw_st(path, "{\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[64],\"data_offsets\":[0,128000]}}", 128);
    snprintf(path, sizeof path, "%s/overlap/model.safetensors", root);
    write_raw_st(path,
                 "{\"a\":{\"dtype\":\"BF16\",\"shape\":[64],\"data_offsets\":[0,128]},"
                 "\"b\":{\"dtype\":\"BF16\",\"shape\":[64],\"data_offsets\":[64,192]}}",
                 192);
    put(root, "cfg_missing", "config.json", "{\"model_type\": \"llama\", \"num_hidden_layers\": 4}");
    put(root, "cfg_type", "config.json",
        "{\"model_type\": \"llama\", \"num_hidden_layers\": 4, \"hidden_size\": \"64\"}");
    put(root, "cfg_unknown", "config.json", "{\"model_type\": \"mixtral\"}");
    put(root, "cfg_syntax", "config.json", "{\"model_type\": \"llama\",\n  \"hidden_size\" 64}");
    snprintf(path, sizeof path, "%s/sharded_missing/model.safetensors", root);
    unlink(path);
    put(root, "sharded_missing", "model.safetensors.index.json",
        "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    ckpt_opts dtype = {ST_I32, NULL, NULL, 1, 0}, shape = {ST_BF16, NULL, "model.layers.1.self_attn.o_proj.weight", 1, 0},
              missing = {ST_BF16, "model.layers.3.mlp.down_proj.weight", NULL, 1, 0};
    if (variant(m, root, "dtype", dtype, &err) || variant(m, root, "shape", shape, &err) ||
        variant(m, root, "missing", missing, &err)) {
        fprintf(stderr, "mkbad: %s\n", err.msg);
        return 1;
    }
    polar_model_free(m);
    return 0;
}
