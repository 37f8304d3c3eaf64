/* libFuzzer target: tokenizer.json loading from arbitrary text, and, when it
 * loads, encoding and decoding the input itself. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    polar_tokenizer *t = calloc(1, sizeof *t);
    polar_error err;
    if (tok_load_json_text(t, (const char *)data, size, "fuzz", &err) == POLAR_OK) {
        int *ids, n;
        if (polar_tokenize(t, (const char *)data, size, 1, 1, &ids, &n, &err) == POLAR_OK) {
            char *back;
            size_t len;
            if (polar_detokenize(t, ids, n, &back, &len, &err) == POLAR_OK) polar_free(back);
            polar_free(ids);
        }
    }
    polar_tokenizer_free(t);
    return 0;
}
