/* libFuzzer target: the data-set reader, the eval prompts built from what it
 * read, and the answer checker on both the fields and the raw bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "polar.h"

static void check_text(const char *a, const char *b) {
    char out[64];
    polar_answer_boxed(a, out, sizeof out);
    polar_answer_last_number(a, out, sizeof out);
    polar_answer_choice(a, 4);
    polar_answer_normalize(a, out, sizeof out);
    polar_answer_equal(a, b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    polar_error err;
    polar_dataset *d;
    if (polar_dataset_parse((const char *)data, size, "fuzz", NULL, &d, &err) == POLAR_OK) {
        for (int i = 0; i < polar_dataset_size(d) && i < 16; i++) {
            const polar_question *q = polar_dataset_get(d, i);
            const polar_question *shots[1] = {q};
            char *p;
            if (polar_prompt_format(POLAR_PROMPT_BOXED, q, shots, 1, &p, &err) == POLAR_OK) free(p);
            if (polar_prompt_format(POLAR_PROMPT_MC, q, NULL, 0, &p, &err) == POLAR_OK) free(p);
            check_text(q->answer, q->question);
        }
        polar_dataset_free(d);
    }
    /* The raw bytes as model output: the whole text against its first half. */
    char *t = malloc(size + 1);
    if (!t) return 0;
    memcpy(t, data, size);
    t[size] = '\0';
    char *half = strndup(t, size / 2);
    if (half) check_text(t, half);
    free(half);
    free(t);
    return 0;
}
