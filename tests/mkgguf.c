/* A random-weight model of a preset as a GGUF file, for benchmarks of the
 * block formats on real shapes (polar bench, bench/compare_llamacpp.sh):
 *
 *   build/tests/mkgguf PRESET OUT.gguf [q8_0|q4_k_m|q5_k_m|q6_k|iq4_xs] [SEED] [LAYERS]
 *
 * q4_k_m: llama.cpp's Q4_K_M mix (Q6_K attn_v, ffn_down and embedding, Q4_K
 * the rest, expert stacks too; where 256 does not divide a row, llama.cpp's
 * fallbacks Q8_0 and Q5_0), q5_k_m: the same with Q5_K (Q5_1) in place of Q4_K (Q5_0),
 * q8_0: Q8_0 matrices, q6_k: Q6_K (Q8_0 where 256 does not divide a row),
 * iq4_xs: IQ4_XS (IQ4_NL where 256 does not divide a
 * row; a plain nearest-level quantizer, not llama.cpp's); norms, biases and
 * routers F32. LAYERS cuts the preset to its first layers (a large MoE's
 * weights are made in bf16 first, and must fit in memory). The file
 * carries no vocabulary (tokenizer.ggml.model "no_vocab"): run it with
 * token ids or prompt lengths, not text. */
#include "gguf_util.h"

int main(int argc, char **argv) {
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: mkgguf PRESET OUT.gguf [q8_0|q4_k_m|q5_k_m|q6_k|iq4_xs] [SEED] [LAYERS]\n");
        return 2;
    }
    const char *format = argc > 3 ? argv[3] : "q4_k_m";
    if (strcmp(format, "q8_0") && strcmp(format, "q4_k_m") && strcmp(format, "q5_k_m") && strcmp(format, "q6_k") &&
        strcmp(format, "iq4_xs")) {
        fprintf(stderr, "mkgguf: error: unknown format '%s' (q8_0, q4_k_m, q5_k_m, q6_k or iq4_xs)\n", format);
        return 2;
    }
    polar_error err;
    polar_arch a;
    polar_model *m = NULL;
    if (polar_arch_preset(argv[1], &a, &err) != POLAR_OK) {
        fprintf(stderr, "mkgguf: error: %s\n", err.msg);
        return 1;
    }
    int layers = argc > 5 ? atoi(argv[5]) : a.n_layers;
    if (layers < 1 || layers > a.n_layers) {
        fprintf(stderr, "mkgguf: error: LAYERS must be 1 to %d for %s\n", a.n_layers, argv[1]);
        return 2;
    }
    a.n_layers = layers;
    if (polar_model_random(&a, argc > 4 ? strtoull(argv[4], NULL, 10) : 7, &m, &err) != POLAR_OK) {
        fprintf(stderr, "mkgguf: error: %s\n", err.msg);
        return 1;
    }
    gguf_fault kind = !strcmp(format, "q8_0")     ? GGUF_Q8_0_FILE
                      : !strcmp(format, "q5_k_m") ? GGUF_K5_FILE
                      : !strcmp(format, "q6_k")   ? GGUF_Q6_K_FILE
                      : !strcmp(format, "iq4_xs") ? GGUF_IQ4_FILE
                                                  : GGUF_K_FILE;
    int ok = gguf_write_model(m, argv[2], kind);
    polar_model_free(m);
    if (!ok) {
        fprintf(stderr, "mkgguf: error: cannot write %s\n", argv[2]);
        return 1;
    }
    return 0;
}
