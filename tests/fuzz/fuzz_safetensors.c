/* libFuzzer target: safetensors header validation on a whole file image;
 * every tensor it accepts must lie inside the buffer. */
#include <stdint.h>
#include <stdlib.h>

#include "../../loader/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file f;
    polar_error err;
    if (st_parse("fuzz", data, size, &f, &err) == POLAR_OK) {
        for (size_t i = 0; i < f.n; i++) {
            const uint8_t *p = f.tensors[i].data;
            if (p < data || p + f.tensors[i].nbytes > data + size) abort();
            volatile uint8_t sink = f.tensors[i].nbytes ? p[f.tensors[i].nbytes - 1] : 0;
            (void)sink;
        }
        st_close(&f);
    }
    return 0;
}
