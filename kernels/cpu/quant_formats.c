/* The GGUF block formats by definition (ggml's layouts): each 32 weights
 * of a row unpack to integers q and per-16 scale / offset pairs,
 *   w[i] = a[i / 16] * q[i] - m[i / 16],
 * and the dequantization and the plain C dot products (the oracle every
 * SIMD level is tested against) both follow from that one unpacking. */
#include <assert.h>
#include <string.h>

#include "quant.h"

static const struct {
    const char *name;
    int block_bytes, block_elems, kept; /* kept: has dot products, stays quantized */
} formats[CPU_W_N] = {
    [CPU_W_BF16] = {"bf16", 2, 1, 0},     [CPU_W_Q8_0] = {"q8_0", 34, 32, 1},   [CPU_W_Q4_0] = {"q4_0", 18, 32, 1},
    [CPU_W_Q4_1] = {"q4_1", 20, 32, 1},   [CPU_W_Q5_0] = {"q5_0", 22, 32, 1},   [CPU_W_Q5_1] = {"q5_1", 24, 32, 1},
    [CPU_W_Q4_K] = {"q4_k", 144, 256, 1}, [CPU_W_Q5_K] = {"q5_k", 176, 256, 1}, [CPU_W_Q6_K] = {"q6_k", 210, 256, 1},
    [CPU_W_Q2_K] = {"q2_k", 84, 256, 0},  [CPU_W_Q3_K] = {"q3_k", 110, 256, 0},
    [CPU_W_IQ4_NL] = {"iq4_nl", 18, 32, 1}, [CPU_W_IQ4_XS] = {"iq4_xs", 136, 256, 1},
    /* the x16 layouts: the row-major blocks' bytes per row (quant_x16.c) */
    [CPU_W_Q8_0_X16] = {"q8_0x16", 34, 32, 0}, [CPU_W_Q4_0_X16] = {"q4_0x16", 18, 32, 0},
    [CPU_W_Q4_1_X16] = {"q4_1x16", 20, 32, 0}, [CPU_W_Q4_K_X16] = {"q4_kx16", 144, 256, 0},
    [CPU_W_Q5_K_X16] = {"q5_kx16", 176, 256, 0},
    [CPU_W_Q6_K_X16] = {"q6_kx16", 210, 256, 0},
    [CPU_W_IQ4_NL_X16] = {"iq4_nlx16", 18, 32, 0}, [CPU_W_IQ4_XS_X16] = {"iq4_xsx16", 136, 256, 0},
    [CPU_W_Q5_0_X16] = {"q5_0x16", 22, 32, 0},     [CPU_W_Q5_1_X16] = {"q5_1x16", 24, 32, 0},
};

size_t cpu_wtype_block_bytes(cpu_wtype t) { return (unsigned)t < CPU_W_N ? (size_t)formats[t].block_bytes : 0; }
int cpu_wtype_block_elems(cpu_wtype t) { return (unsigned)t < CPU_W_N ? formats[t].block_elems : 0; }
int cpu_wtype_kept(cpu_wtype t) { return (unsigned)t < CPU_W_N && formats[t].kept; }
const char *cpu_wtype_name(cpu_wtype t) { return (unsigned)t < CPU_W_N ? formats[t].name : "unknown"; }

size_t cpu_wtype_row_bytes(cpu_wtype t, size_t cols) {
    if ((unsigned)t >= CPU_W_N) return 0;
    return cols / (size_t)formats[t].block_elems * (size_t)formats[t].block_bytes;
}

/* Block scales are little-endian f16 at any byte offset. */
static float load_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* IQ4: 16 bytes of codes, element i in the low nibble of byte i, i + 16 in the high. */
static void iq4_codes(const uint8_t *qs, int8_t q[32]) {
    for (int i = 0; i < 16; i++) q[i] = cpu_iq4_levels[qs[i] & 0xF], q[i + 16] = cpu_iq4_levels[qs[i] >> 4];
}

/* Q3_K: the 16 6-bit scales (minus 32) from 12 bytes. */
static void q3k_scales(const uint8_t *s, int out[16]) {
    for (int i = 0; i < 16; i++) {
        int low = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
        int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (low | high << 4) - 32;
    }
}

void cpu_unpack32(cpu_wtype t, const void *row, int k, int8_t q[32], float a[2], float m[2]) {
    assert(cpu_wtype_kept(t) || t == CPU_W_Q2_K || t == CPU_W_Q3_K); /* a row of blocks, not an x16 group */
    const uint8_t *b = row;
    m[0] = m[1] = 0.0f;
    if (formats[t].block_elems == 32) {
        b += (size_t)k * (size_t)formats[t].block_bytes;
        a[0] = a[1] = load_f16(b);
        int off = t == CPU_W_Q4_0 ? 8 : t == CPU_W_Q5_0 ? 16 : 0;
        if (t == CPU_W_Q4_1 || t == CPU_W_Q5_1) m[0] = m[1] = -load_f16(b + 2);
        if (t == CPU_W_Q8_0) {
            memcpy(q, b + 2, 32);
            return;
        }
        if (t == CPU_W_IQ4_NL) { /* d, 16 bytes of codes */
            iq4_codes(b + 2, q);
            return;
        }
        const uint8_t *qs = b + (t == CPU_W_Q4_0 ? 2 : t == CPU_W_Q4_1 ? 4 : t == CPU_W_Q5_0 ? 6 : 8);
        uint32_t qh = 0;
        if (t == CPU_W_Q5_0 || t == CPU_W_Q5_1) {
            const uint8_t *h = b + (t == CPU_W_Q5_0 ? 2 : 4);
            qh = (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
        }
        for (int i = 0; i < 16; i++) { /* low nibbles are elements 0..15; bit i of qh is element i's fifth */
            q[i] = (int8_t)(((qs[i] & 0xF) | ((qh >> i) & 1) << 4) - off);
            q[i + 16] = (int8_t)(((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - off);
        }
        return;
    }
    b += (size_t)(k / 8) * (size_t)formats[t].block_bytes; /* the 256-block, then its sub-block j */
    int j = k % 8;
    switch (t) {
    case CPU_W_Q4_K:
    case CPU_W_Q5_K: { /* d, dmin, 12 scale bytes, [qh 32,] qs 128: 64-element chunks of nibbles */
        int sc, mn;
        cpu_k4_scale_min(b + 4, j, &sc, &mn);
        a[0] = a[1] = load_f16(b) * (float)sc;
        m[0] = m[1] = load_f16(b + 2) * (float)mn;
        const uint8_t *qh = b + 16, *qs = b + (t == CPU_W_Q4_K ? 16 : 48) + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
            int v = j % 2 ? qs[i] >> 4 : qs[i] & 0xF;
            if (t == CPU_W_Q5_K) v |= ((qh[i] >> j) & 1) << 4;
            q[i] = (int8_t)v;
        }
        break;
    }
    case CPU_W_Q6_K: { /* ql 128, qh 64, 16 int8 scales, d: two 128-element halves */
        int h = j / 4, part = j % 4;
        const uint8_t *ql = b + 64 * h + (part & 1) * 32, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * part;
        float d = load_f16(b + 208);
        for (int i = 0; i < 32; i++) {
            int low = part < 2 ? ql[i] & 0xF : ql[i] >> 4;
            q[i] = (int8_t)((low | ((qh[i] >> (2 * part)) & 3) << 4) - 32);
        }
        a[0] = d * (float)sc[0], a[1] = d * (float)sc[1];
        break;
    }
    case CPU_W_Q2_K: { /* 16 scale bytes (low: scale, high: min), qs 64, d, dmin */
        int h = j / 4, shift = 2 * (j % 4);
        const uint8_t *sc = b + 2 * j, *qs = b + 16 + 32 * h;
        float d = load_f16(b + 80), dmin = load_f16(b + 82);
        for (int i = 0; i < 32; i++) q[i] = (int8_t)((qs[i] >> shift) & 3);
        for (int s = 0; s < 2; s++) a[s] = d * (float)(sc[s] & 0xF), m[s] = dmin * (float)(sc[s] >> 4);
        break;
    }
    case CPU_W_Q3_K: { /* hmask 32, qs 64, 12 scale bytes, d: q = 2 bits - (hmask bit clear ? 4 : 0) */
        int h = j / 4, shift = 2 * (j % 4), scales[16];
        const uint8_t *hm = b, *qs = b + 32 + 32 * h;
        q3k_scales(b + 96, scales);
        float d = load_f16(b + 108);
        for (int i = 0; i < 32; i++) q[i] = (int8_t)(((qs[i] >> shift) & 3) - ((hm[i] >> j) & 1 ? 0 : 4));
        a[0] = d * (float)scales[2 * j], a[1] = d * (float)scales[2 * j + 1];
        break;
    }
    case CPU_W_IQ4_XS: /* d, 2 bytes of scales' high bits, 4 of their low nibbles, 8 x 16 bytes of codes */
        a[0] = a[1] = load_f16(b) * (float)cpu_iq4xs_scale(b, j);
        iq4_codes(b + 8 + 16 * j, q);
        break;
    default:
        break;
    }
}

void cpu_dequantize_row(cpu_wtype t, const void *w, float *out, int n) {
    if (t == CPU_W_BF16) {
        const uint8_t *b = w;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32((bf16)(b[2 * i] | b[2 * i + 1] << 8));
        return;
    }
    for (int k = 0; k < n / CPU_QK; k++) {
        int8_t q[32];
        float a[2], m[2];
        cpu_unpack32(t, w, k, q, a, m);
        for (int i = 0; i < 32; i++) out[32 * k + i] = a[i / 16] * (float)q[i] - m[i / 16];
    }
}

/* sum over blocks of sum_i (a q_i - m) xd xq_i, per 16-element half:
 * a xd sum(q xq) - m xd sum(xq). */
float cpu_dot_q_plain(cpu_wtype t, const void *w, const cpu_q8_block *x, int nb) {
    float sum = 0.0f;
    for (int k = 0; k < nb; k++) {
        int8_t q[32];
        float a[2], m[2];
        cpu_unpack32(t, w, k, q, a, m);
        for (int h = 0; h < 2; h++) {
            int qx = 0, xs = 0;
            for (int i = 16 * h; i < 16 * h + 16; i++) qx += q[i] * x[k].q[i], xs += x[k].q[i];
            sum += x[k].d * (a[h] * (float)qx - m[h] * (float)xs);
        }
    }
    return sum;
}
