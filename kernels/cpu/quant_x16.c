/* The interleaved ("x16") layouts of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q5_K, Q6_K, IQ4_NL and IQ4_XS (quant.h): the repacking from row-major
 * blocks and back, one row's unit (a 32-block, or a 256-block of the
 * k-quants and IQ4_XS) at a time. The values do not change, only where
 * they lie. */
#include <string.h>

#include "quant.h"

static cpu_wtype row_type_of(cpu_wtype x) {
    switch (x) {
    case CPU_W_Q8_0_X16: return CPU_W_Q8_0;
    case CPU_W_Q4_0_X16: return CPU_W_Q4_0;
    case CPU_W_Q4_1_X16: return CPU_W_Q4_1;
    case CPU_W_Q4_K_X16: return CPU_W_Q4_K;
    case CPU_W_Q5_K_X16: return CPU_W_Q5_K;
    case CPU_W_Q6_K_X16: return CPU_W_Q6_K;
    case CPU_W_IQ4_NL_X16: return CPU_W_IQ4_NL;
    case CPU_W_IQ4_XS_X16: return CPU_W_IQ4_XS;
    case CPU_W_Q5_0_X16: return CPU_W_Q5_0;
    case CPU_W_Q5_1_X16: return CPU_W_Q5_1;
    default: return CPU_W_BF16;
    }
}

int cpu_wtype_is_x16(cpu_wtype t) { return row_type_of(t) != CPU_W_BF16; }

cpu_wtype cpu_x16_of(cpu_wtype t) {
    switch (t) {
    case CPU_W_Q8_0: return CPU_W_Q8_0_X16;
    case CPU_W_Q4_0: return CPU_W_Q4_0_X16;
    case CPU_W_Q4_1: return CPU_W_Q4_1_X16;
    case CPU_W_Q4_K: return CPU_W_Q4_K_X16;
    case CPU_W_Q5_K: return CPU_W_Q5_K_X16;
    case CPU_W_Q6_K: return CPU_W_Q6_K_X16;
    case CPU_W_IQ4_NL: return CPU_W_IQ4_NL_X16;
    case CPU_W_IQ4_XS: return CPU_W_IQ4_XS_X16;
    case CPU_W_Q5_0: return CPU_W_Q5_0_X16;
    case CPU_W_Q5_1: return CPU_W_Q5_1_X16;
    default: return CPU_W_BF16;
    }
}

size_t cpu_x16_bytes(cpu_wtype x, int rows, size_t cols) {
    return (size_t)((rows + 15) / 16 * 16) * cpu_wtype_row_bytes(x, cols);
}

/* Where row r's unit u lives in an x16 matrix of `units` units a row. */
static uint8_t *x16_unit(cpu_wtype t, const void *w, int units, int r, int u) {
    size_t ub = cpu_wtype_block_bytes(t);
    return (uint8_t *)w + ((size_t)(r / 16) * (size_t)units + (size_t)u) * 16 * ub;
}

/* n bytes between a row's unit and an x16 unit (to_x16 says which way). */
static void move(uint8_t *row, uint8_t *x16, size_t n, int to_x16) {
    if (to_x16) memcpy(x16, row, n);
    else memcpy(row, x16, n);
}

/* Q8_0, Q4_0, Q4_1, IQ4_NL: f16 scale, [f16 offset,] quants (codes). */
static void move_legacy(cpu_wtype t, uint8_t *row, uint8_t *x16, int lane, int to_x16) {
    int nq = t == CPU_W_Q8_0 ? 32 : 16, off = t == CPU_W_Q4_1;
    move(row, x16 + 16 * nq + 2 * lane, 2, to_x16);
    if (off) move(row + 2, x16 + 16 * nq + 32 + 2 * lane, 2, to_x16);
    for (int j = 0; j < nq / 4; j++) move(row + 2 + 2 * off + 4 * j, x16 + 64 * j + 4 * lane, 4, to_x16);
}

/* Q4_K: d, dmin, 12 scale bytes, qs 128 (four 32-byte chunks); Q5_K: the
 * same with qh 32 before qs, which goes after the scales in x16. */
static void move_q45_k(uint8_t *row, uint8_t *x16, int lane, int to_x16, int five) {
    const uint8_t *qs = row + (five ? 48 : 16);
    for (int p = 0; p < 4; p++)
        for (int v = 0; v < 8; v++) move((uint8_t *)qs + 32 * p + 4 * v, x16 + 512 * p + 64 * v + 4 * lane, 4, to_x16);
    for (int v = 0; v < 8 && five; v++) move(row + 16 + 4 * v, x16 + 2304 + 64 * v + 4 * lane, 4, to_x16);
    move(row, x16 + 2048 + 2 * lane, 2, to_x16);
    move(row + 2, x16 + 2080 + 2 * lane, 2, to_x16);
    for (int i = 0; i < 3; i++) move(row + 4 + 4 * i, x16 + 2112 + 64 * i + 4 * lane, 4, to_x16);
}

/* Q6_K: ql 128, qh 64, 16 int8 scales, d. Block j (h = j / 4, part = j %
 * 4) takes its low 4 bits from ql[64h + 32 (part & 1) + i] (the high
 * nibble when part >= 2) and its high 2 bits from bits 2 part of
 * qh[32h + i]. */
static void move_q6_k(uint8_t *row, uint8_t *x16, int lane, int to_x16) {
    uint8_t *ql = row, *qh = row + 128;
    if (!to_x16) memset(row, 0, 192); /* the bits are or-ed back in below */
    for (int j = 0; j < 8; j++) {
        int h = j / 4, part = j % 4;
        uint8_t *n = x16 + 384 * j, *hb = n + 256;
        for (int i = 0; i < 32; i++) {
            uint8_t *l = &ql[64 * h + 32 * (part & 1) + i], *hi = &qh[32 * h + i];
            /* x16: nibble byte (i % 16) of vector (i % 16) / 4; high 2 bits in vector i / 16 */
            uint8_t *nb = &n[64 * ((i % 16) / 4) + 4 * lane + i % 4];
            uint8_t *hbb = &hb[64 * (i / 16) + 4 * lane + i % 4];
            int nshift = i < 16 ? 0 : 4, hshift = 2 * ((i % 16) / 4);
            if (to_x16) {
                int low = (part < 2 ? *l : *l >> 4) & 0xF, high = (*hi >> (2 * part)) & 3;
                *nb = (uint8_t)((*nb & ~(0xF << nshift)) | low << nshift);
                *hbb = (uint8_t)((*hbb & ~(3 << hshift)) | high << hshift);
            } else {
                int low = (*nb >> nshift) & 0xF, high = (*hbb >> hshift) & 3;
                *l |= (uint8_t)(low << (part < 2 ? 0 : 4));
                *hi |= (uint8_t)(high << (2 * part));
            }
        }
    }
    for (int i = 0; i < 4; i++) move(row + 192 + 4 * i, x16 + 3072 + 64 * i + 4 * lane, 4, to_x16);
    move(row + 208, x16 + 3328 + 2 * lane, 2, to_x16);
}

/* Q5_0: d, qh (4 bytes), qs 16; Q5_1: d, m, qh, qs. */
static void move_q5(uint8_t *row, uint8_t *x16, int lane, int to_x16, int one) {
    const uint8_t *qh = row + (one ? 4 : 2);
    for (int j = 0; j < 4; j++) move((uint8_t *)qh + 4 + 4 * j, x16 + 64 * j + 4 * lane, 4, to_x16);
    move((uint8_t *)qh, x16 + 256 + 4 * lane, 4, to_x16);
    move(row, x16 + 320 + 2 * lane, 2, to_x16);
    if (one) move(row + 2, x16 + 352 + 2 * lane, 2, to_x16);
}

/* IQ4_XS: d, scales_h (2 bytes), scales_l (4), 8 x 16 code bytes. */
static void move_iq4_xs(uint8_t *row, uint8_t *x16, int lane, int to_x16) {
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++) move(row + 8 + 16 * j + 4 * q, x16 + 256 * j + 64 * q + 4 * lane, 4, to_x16);
    move(row, x16 + 2048 + 2 * lane, 2, to_x16);
    move(row + 2, x16 + 2080 + 2 * lane, 2, to_x16);
    move(row + 4, x16 + 2112 + 4 * lane, 4, to_x16);
}

/* Row-major unit (row type t) <-> lane `lane` of an x16 unit. */
static void move_unit(cpu_wtype t, uint8_t *row, uint8_t *x16, int lane, int to_x16) {
    if (t == CPU_W_Q4_K || t == CPU_W_Q5_K) move_q45_k(row, x16, lane, to_x16, t == CPU_W_Q5_K);
    else if (t == CPU_W_Q6_K) move_q6_k(row, x16, lane, to_x16);
    else if (t == CPU_W_IQ4_XS) move_iq4_xs(row, x16, lane, to_x16);
    else if (t == CPU_W_Q5_0 || t == CPU_W_Q5_1) move_q5(row, x16, lane, to_x16, t == CPU_W_Q5_1);
    else move_legacy(t, row, x16, lane, to_x16);
}

void cpu_repack_x16(cpu_wtype t, const void *w, int rows, size_t cols, void *out) {
    cpu_wtype x = cpu_x16_of(t);
    int units = (int)(cols / (size_t)cpu_wtype_block_elems(t));
    size_t ub = cpu_wtype_block_bytes(t), row_bytes = cpu_wtype_row_bytes(t, cols);
    memset(out, 0, cpu_x16_bytes(x, rows, cols)); /* padding rows: zero units (scale 0) */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < units; u++)
            move_unit(t, (uint8_t *)w + (size_t)r * row_bytes + (size_t)u * ub, x16_unit(x, out, units, r, u), r % 16, 1);
}

cpu_wtype cpu_row_type(cpu_wtype t) { return cpu_wtype_is_x16(t) ? row_type_of(t) : t; }

void cpu_matrix_row_blocks(cpu_wtype t, const void *w, size_t cols, int r, void *out) {
    cpu_wtype rt = cpu_row_type(t);
    size_t row_bytes = cpu_wtype_row_bytes(rt, cols);
    if (rt == t) {
        memcpy(out, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes);
        return;
    }
    int units = (int)(cols / (size_t)cpu_wtype_block_elems(rt));
    size_t ub = cpu_wtype_block_bytes(rt);
    for (int u = 0; u < units; u++) move_unit(rt, (uint8_t *)out + (size_t)u * ub, x16_unit(t, w, units, r, u), r % 16, 0);
}

void cpu_dequantize_matrix_row(cpu_wtype t, const void *w, size_t cols, int r, float *out) {
    if (!cpu_wtype_is_x16(t)) {
        cpu_dequantize_row(t, (const uint8_t *)w + (size_t)r * cpu_wtype_row_bytes(t, cols), out, (int)cols);
        return;
    }
    cpu_wtype rt = row_type_of(t);
    int elems = cpu_wtype_block_elems(rt), units = (int)(cols / (size_t)elems);
    for (int u = 0; u < units; u++) {
        uint8_t unit[210]; /* the largest unit, Q6_K's */
        move_unit(rt, unit, x16_unit(t, w, units, r, u), r % 16, 0);
        cpu_dequantize_row(rt, unit, out + (size_t)elems * u, elems);
    }
}
