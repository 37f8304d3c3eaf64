/* libFuzzer target: the predictor loader (shapes from the header, the
 * nheads metadata, every tensor checked before storage is allocated, the
 * catalogue's programs in the metadata) on a whole file image, through the
 * public entry point; a catalogue read is ranked once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "polar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/polar-fuzz-predictor-%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    polar_error err;
    polar_predictor *p;
    if (polar_predictor_load(path, &p, &err) == POLAR_OK) {
        int D = polar_predictor_layers(p);
        if (D < 1 || polar_predictor_input_dim(p) < 1) abort();
        const polar_catalogue *c = polar_predictor_catalogue(p);
        float *logits = c ? calloc((size_t)D * 4, sizeof *logits) : NULL;
        if (logits) {
            polar_candidate out[4];
            int n = 0;
            if (polar_catalogue_rank(c, logits, logits + D, NULL, out, 4, &n, &err) == POLAR_OK)
                while (n) polar_program_free(&out[--n].program);
            free(logits);
        }
        polar_predictor_free(p);
    }
    return 0;
}
