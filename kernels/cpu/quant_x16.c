/* The interleaved ("x16") layouts of Q8_0, Q4_0 and Q4_1 (quant.h): the
 * repacking from row-major blocks and back, one row at a time. A block's
 * fields move, their bytes do not change. */
#include <string.h>

#include "quant.h"

/* The parts of a 32-weight block of a row-major type with an x16 layout:
 * bytes of quants, and whether an f16 offset follows the f16 scale. */
static int quant_bytes(cpu_wtype t) { return t == CPU_W_Q8_0 ? 32 : 16; }
static int has_offset(cpu_wtype t) { return t == CPU_W_Q4_1; }

static cpu_wtype row_type_of(cpu_wtype x) {
    switch (x) {
    case CPU_W_Q8_0_X16: return CPU_W_Q8_0;
    case CPU_W_Q4_0_X16: return CPU_W_Q4_0;
    case CPU_W_Q4_1_X16: return CPU_W_Q4_1;
    default: return CPU_W_BF16;
    }
}

int cpu_wtype_is_x16(cpu_wtype t) { return row_type_of(t) != CPU_W_BF16; }

cpu_wtype cpu_x16_of(cpu_wtype t) {
    switch (t) {
    case CPU_W_Q8_0: return CPU_W_Q8_0_X16;
    case CPU_W_Q4_0: return CPU_W_Q4_0_X16;
    case CPU_W_Q4_1: return CPU_W_Q4_1_X16;
    default: return CPU_W_BF16;
    }
}

size_t cpu_x16_bytes(cpu_wtype x, int rows, size_t cols) {
    return (size_t)((rows + 15) / 16 * 16) * cpu_wtype_row_bytes(x, cols);
}

/* Where row r's block k lives in an x16 matrix of nb blocks a row: the
 * group's block (16 rows) and the row's lane in it. */
static uint8_t *x16_block(cpu_wtype t, const void *w, int nb, int r, int k) {
    size_t bb = cpu_wtype_block_bytes(t);
    return (uint8_t *)w + ((size_t)(r / 16) * (size_t)nb + (size_t)k) * 16 * bb;
}

/* One row-major block (bb bytes: f16 d, [f16 m,] quants) <-> lane `lane`
 * of an x16 block; to_x16 says which way. */
static void move_block(cpu_wtype t, uint8_t *row_block, uint8_t *x16, int lane, int to_x16) {
    int nq = quant_bytes(t), off = has_offset(t);
    uint8_t *scale = x16 + 16 * nq + 2 * lane, *m = x16 + 16 * nq + 32 + 2 * lane;
    if (to_x16) {
        memcpy(scale, row_block, 2);
        if (off) memcpy(m, row_block + 2, 2);
    } else {
        memcpy(row_block, scale, 2);
        if (off) memcpy(row_block + 2, m, 2);
    }
    uint8_t *q = row_block + 2 + 2 * off;
    for (int j = 0; j < nq / 4; j++) {
        uint8_t *lane_bytes = x16 + 64 * j + 4 * lane;
        if (to_x16) memcpy(lane_bytes, q + 4 * j, 4);
        else memcpy(q + 4 * j, lane_bytes, 4);
    }
}

void cpu_repack_x16(cpu_wtype t, const void *w, int rows, size_t cols, void *out) {
    cpu_wtype x = cpu_x16_of(t);
    int nb = (int)(cols / CPU_QK);
    size_t bb = cpu_wtype_block_bytes(t), row_bytes = cpu_wtype_row_bytes(t, cols);
    memset(out, 0, cpu_x16_bytes(x, rows, cols)); /* padding rows: zero blocks (scale 0) */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < nb; k++)
            move_block(t, (uint8_t *)w + (size_t)r * row_bytes + (size_t)k * bb, x16_block(x, out, nb, r, k), r % 16, 1);
}

void cpu_dequantize_matrix_row(cpu_wtype t, const void *w, size_t cols, int r, float *out) {
    if (!cpu_wtype_is_x16(t)) {
        cpu_dequantize_row(t, (const uint8_t *)w + (size_t)r * cpu_wtype_row_bytes(t, cols), out, (int)cols);
        return;
    }
    cpu_wtype rt = row_type_of(t);
    int nb = (int)(cols / CPU_QK);
    for (int k = 0; k < nb; k++) {
        uint8_t block[34];
        move_block(rt, block, x16_block(t, w, nb, r, k), r % 16, 0);
        cpu_dequantize_row(rt, block, out + (size_t)CPU_QK * k, CPU_QK);
    }
}
