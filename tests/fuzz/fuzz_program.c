/* libFuzzer target: the program parser; what it accepts must be in range,
 * within the limit, and survive a format -> parse round trip. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "polar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int D = 1 + data[0] % 40;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    polar_program p, q;
    polar_error err;
    if (polar_program_parse(text, D, 0, &p, &err) == POLAR_OK) {
        if (p.n < 1 || p.n > 4 * D) abort();
        for (int i = 0; i < p.n; i++)
            if (p.layers[i] < 0 || p.layers[i] >= D) abort();
        int n = polar_program_format(&p, NULL, 0);
        char *buf = malloc((size_t)n + 1);
        polar_program_format(&p, buf, (size_t)n + 1);
        if (polar_program_parse(buf, D, 0, &q, &err) != POLAR_OK || q.n != p.n ||
            memcmp(q.layers, p.layers, (size_t)p.n * sizeof(int)) != 0)
            abort();
        polar_program_free(&q);
        free(buf);
        polar_program_free(&p);
    }
    free(text);
    return 0;
}
