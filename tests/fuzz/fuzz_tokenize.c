/* libFuzzer target: the pre-tokenizers and BPE on arbitrary bytes, with the
 * real Llama-3 (every byte has a token) and Qwen (NFC first) tokenizers:
 * encoding must not fail or crash, and Llama-3's decode(encode(s)) == s.
 * POLAR_DEPS names the folder `make deps` fills. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "polar.h"

static polar_tokenizer *llama, *qwen;

static polar_tokenizer *load(const char *rel) {
    char path[1024];
    const char *deps = getenv("POLAR_DEPS");
    snprintf(path, sizeof path, "%s/%s", deps ? deps : ".deps/python", rel);
    polar_tokenizer *t = NULL;
    polar_error err;
    if (polar_tokenizer_load(path, &t, &err) != POLAR_OK) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err.msg);
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!llama) llama = load("llama_models/llama3/tokenizer.model");
    if (!qwen) qwen = load("dashscope/resources/qwen.tiktoken");
    polar_error err;
    int *ids, n;
    char *back;
    size_t len;
    if (polar_tokenize(llama, (const char *)data, size, size % 2, 0, &ids, &n, &err) != POLAR_OK) abort();
    if (polar_detokenize(llama, ids, n, &back, &len, &err) != POLAR_OK) abort();
    if (len != size || memcmp(back, data, size) != 0) abort(); /* every byte comes back */
    polar_free(back);
    polar_free(ids);
    if (polar_tokenize(qwen, (const char *)data, size, 1, 0, &ids, &n, &err) != POLAR_OK) abort();
    polar_free(ids);
    return 0;
}
