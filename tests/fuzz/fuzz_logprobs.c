/* libFuzzer target: a reference's log-probabilities file (eval/logprobs.h):
 * the header and tokens checked, then every record it says it holds
 * compared against fixed logits, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../eval/logprobs.h"

#define VOCAB 40

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f) return 0;
    logprobs_header h;
    int *tokens = NULL;
    polar_error err;
    if (logprobs_read_header(f, "fuzz", VOCAB, &h, &tokens, &err) == POLAR_OK) {
        float logits[VOCAB];
        for (int i = 0; i < VOCAB; i++) logits[i] = (float)(i % 7) - 3.0f;
        size_t bytes = logprobs_record_bytes(&h);
        unsigned char *record = malloc(bytes);
        for (uint32_t c = 0; record && c < h.chunks; c++)
            for (int i = 0; i < logprobs_scored((int)h.ctx); i++) {
                if (fread(record, bytes, 1, f) != 1) goto done;
                int target = tokens[c * h.ctx + h.ctx / 2 + 1 + (uint32_t)i];
                if (target < 0 || target >= VOCAB) abort(); /* checked when read */
                (void)logprobs_compare(&h, logits, target, record);
            }
    done:
        free(record);
    }
    free(tokens);
    fclose(f);
    return 0;
}
