/* The quantized kernels alone (tests/quant_checks.h), without the model
 * tests of test_quant: built by make test-neon for aarch64 with only the
 * CPU kernels and the GGUF block code, and run under qemu-user, so the
 * NEON dot products and matmul are checked on an x86 machine. */
#include "quant_checks.h"

int main(void) {
    if (!load_fixture()) printf("FAIL quant fixture: %s/quant_blocks.bin missing or malformed\n", GOLDEN_DIR);
    printf("active kernels: %s\n", cpu_kernels_active()->name);
    RUN(gguf_py_blocks);
    RUN(levels);
    TEST_EXIT();
}
