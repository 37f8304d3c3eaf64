/* libFuzzer target: the predictor loader (shapes from the header, the
 * nheads metadata, every tensor checked before storage is allocated) on a
 * whole file image, through the public entry point. */
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
        if (polar_predictor_layers(p) < 1 || polar_predictor_input_dim(p) < 1) abort();
        polar_predictor_free(p);
    }
    return 0;
}
