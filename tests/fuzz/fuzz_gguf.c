/* libFuzzer target: the GGUF parser on a whole file image, then what reads
 * its metadata (model architecture, tokenizer), then dequantisation of every
 * tensor it accepted: nothing may read outside the buffer. */
#include <stdint.h>
#include <stdlib.h>

#include "../../loader/gguf.h"
#include "../../tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file f;
    polar_error err;
    if (gguf_parse("fuzz", data, size, &f, &err) != POLAR_OK) return 0;
    polar_arch a;
    gguf_model_arch(&f, &a, &err);
    polar_tokenizer *t = calloc(1, sizeof *t);
    if (tok_load_gguf(t, &f, &err) == POLAR_OK) {
        int *ids, n;
        polar_tokenize(t, "Hello <|im_end|> 123", 20, 1, 1, &ids, &n, &err);
        polar_free(ids);
    }
    polar_tokenizer_free(t);
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        size_t n = f.tensors[i].n_elements < 4096 ? (size_t)f.tensors[i].n_elements : 0;
        float *out = malloc((n ? n : 1) * sizeof *out);
        if (n % ggml_block_elems(f.tensors[i].type) == 0) ggml_dequantize(f.tensors[i].type, f.tensors[i].data, out, n);
        free(out);
    }
    gguf_close(&f);
    return 0;
}
