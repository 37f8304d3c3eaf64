/* libFuzzer target: the polar search labels reader behind polar train, on
 * the bytes as one labels file and as two (the file twice: every question
 * asked again, so each line is pooled into its first asking). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "polar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz-labels-%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    const char *files[2] = {path, path};
    for (int n = 1; n <= 2; n++) {
        polar_train_labels l;
        polar_error err;
        /* D 6 (short programs reach the codec's limits), at most 3 paths */
        if (polar_train_labels_load(files, n, 6, 3, 0.3f, 1, &l, &err) == POLAR_OK) polar_train_labels_free(&l);
    }
    unlink(path);
    return 0;
}
