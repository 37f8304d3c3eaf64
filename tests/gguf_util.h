/* Test helper: write a model as a GGUF file the way llama.cpp's converter
 * lays it out (F32 tensors, Llama q/k rows permuted per head for
 * adjacent-pair RoPE, llama3 scaling as rope_freqs.weight), with optional
 * corruptions for the bad-input tests. GGUF_Q8_0_FILE writes the matrices
 * that may stay quantized as Q8_0 blocks (d = max|x|/127 as f16);
 * GGUF_K_FILE as llama.cpp's Q4_K_M mix (GGUF_K5_FILE: Q5_K_M, Q5_K in
 * place of Q4_K; simplified: attn_v and ffn_down Q6_K in every layer): Q6_K
 * for attn_v, ffn_down and the embedding, Q4_K for the rest, where rows are
 * whole 256-blocks; llama.cpp's fallbacks where they are whole 32-blocks
 * only (Q8_0 for Q6_K, Q5_0 for Q4_K, Q5_1 for Q5_K); GGUF_IQ4_FILE as
 * IQ4_XS (IQ4_NL where 256 does not divide a row); GGUF_Q4_0_FILE as Q4_0;
 * GGUF_Q6_K_FILE as Q6_K (Q8_0 where 256 does not divide a row, llama.cpp's
 * fallback). */
#ifndef POLAR_TEST_GGUF_UTIL_H
#define POLAR_TEST_GGUF_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../loader/gguf.h"
#include "../runtime/model.h"

typedef enum {
    GGUF_OK_FILE, GGUF_BAD_MAGIC, GGUF_BAD_VERSION, GGUF_HUGE_COUNT, GGUF_HUGE_STRING, GGUF_UNKNOWN_TYPE,
    GGUF_OFFSET_PAST_END, GGUF_MISALIGNED, GGUF_TRUNCATED, GGUF_BAD_VALUE_TYPE, GGUF_NO_TENSOR,
    GGUF_Q8_0_FILE,   /* a valid file with Q8_0 matrices */
    GGUF_Q8_0_BAD_ROW, /* ... whose first tensor (Q8_0 embedding) claims a row of cols + 1 (not whole blocks) */
    GGUF_K_FILE,       /* a valid file with Q4_K and Q6_K matrices (Q5_0 and Q8_0 where 256 does not divide) */
    GGUF_K5_FILE,      /* ... with Q5_K and Q6_K (llama.cpp's Q5_K_M mix; Q5_1 and Q8_0 likewise) */
    GGUF_IQ4_FILE,     /* ... with IQ4_XS matrices (IQ4_NL where rows are not whole 256-blocks) */
    GGUF_Q4_0_FILE,    /* ... with Q4_0 matrices */
    GGUF_Q6_K_FILE     /* ... with Q6_K matrices (Q8_0 where rows are not whole 256-blocks) */
} gguf_fault;

/* f32 -> IEEE half, nearest (ties away); subnormal halves kept (a Q6_K
 * scale of small weights is one), smaller values flush to zero. */
static uint16_t gw_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    uint32_t man = u & 0x7FFFFFu;
    if (e < -10) return sign;
    if (e <= 0) {
        uint32_t m = man | 0x800000u;
        int shift = 14 - e;
        return (uint16_t)(sign | ((m >> shift) + ((m >> (shift - 1)) & 1u)));
    }
    if (e >= 31) return sign | 0x7C00u;
    uint32_t h = ((uint32_t)e << 10 | man >> 13) + ((man >> 12) & 1u);
    return (uint16_t)(sign | h);
}

/* n f32 (n % 32 == 0) -> Q8_0 blocks into out (n / 32 * 34 bytes). */
static void gw_q8_0(const float *x, size_t n, unsigned char *out) {
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 34) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        uint16_t h = gw_f16(amax / 127.0f);
        float d = f16_to_f32(h);
        out[0] = (unsigned char)(h & 0xFF), out[1] = (unsigned char)(h >> 8);
        for (int i = 0; i < 32; i++) {
            float q = d > 0 ? roundf(x[i] / d) : 0;
            out[2 + i] = (unsigned char)(signed char)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

/* Round to nearest and clamp to [lo, hi]. */
static int gw_clamp(float v, int lo, int hi) {
    int q = (int)lroundf(v);
    return q < lo ? lo : q > hi ? hi : q;
}

/* n f32 (n % 32 == 0) -> Q5_0 blocks (22 bytes: d, qh, 16 nibble bytes; x
 * ~= d * (q - 16)) or, with one, Q5_1 (24: d, m, qh, nibbles; x ~= d * q +
 * m); q's fifth bit is bit i of qh, its low bits the nibbles as Q4_0's. */
static void gw_q5(const float *x, size_t n, unsigned char *out, int one) {
    size_t bb = one ? 24 : 22;
    for (size_t b = 0; b < n / 32; b++, x += 32, out += bb) {
        float lo = x[0], hi = x[0], amax = 0;
        for (int i = 0; i < 32; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]), amax = fmaxf(amax, fabsf(x[i]));
        uint16_t hd = gw_f16(one ? (hi - lo) / 31.0f : amax / 15.0f), hm = gw_f16(lo);
        float d = f16_to_f32(hd), m = f16_to_f32(hm);
        unsigned char *qh = out + (one ? 4 : 2), *qs = qh + 4;
        out[0] = (unsigned char)hd, out[1] = (unsigned char)(hd >> 8);
        if (one) out[2] = (unsigned char)hm, out[3] = (unsigned char)(hm >> 8);
        uint32_t high = 0;
        memset(qs, 0, 16);
        for (int i = 0; i < 32; i++) {
            int q = d > 0 ? gw_clamp(one ? (x[i] - m) / d : x[i] / d + 16, 0, 31) : one ? 0 : 16;
            high |= (uint32_t)(q >> 4) << i;
            qs[i % 16] |= (unsigned char)((q & 15) << (i < 16 ? 0 : 4));
        }
        for (int k = 0; k < 4; k++) qh[k] = (unsigned char)(high >> (8 * k));
    }
}

/* n f32 (n % 32 == 0) -> Q4_0 blocks (18 bytes: d, 16 nibble bytes; x ~=
 * d * (q - 8), q of element i in the low nibble of byte i for i < 16, the
 * high nibble of byte i - 16 after). */
static void gw_q4_0(const float *x, size_t n, unsigned char *out) {
    for (size_t b = 0; b < n / 32; b++, x += 32, out += 18) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        uint16_t hd = gw_f16(amax / 7.0f);
        float d = f16_to_f32(hd);
        out[0] = (unsigned char)hd, out[1] = (unsigned char)(hd >> 8);
        memset(out + 2, 0, 16);
        for (int i = 0; i < 32; i++) {
            int q = d > 0 ? gw_clamp(x[i] / d + 8, 0, 15) : 8;
            out[2 + i % 16] |= (unsigned char)(q << (i < 16 ? 0 : 4));
        }
    }
}

/* n f32 (n % 256 == 0) -> Q4_K blocks (144 bytes; bits 4: per 32
 * weights an unsigned 4-bit q with a 6-bit scale and min, x ~= d*sc*q -
 * dmin*m) or Q5_K blocks (176 bytes; bits 5: the fifth bit of element i of
 * sub-block j is bit j of qh[i], 32 bytes before the nibbles). */
static void gw_k_quant(const float *x, size_t n, unsigned char *out, int bits) {
    size_t block_bytes = bits == 5 ? 176 : 144;
    int top = (1 << bits) - 1;
    for (size_t b = 0; b < n / 256; b++, x += 256, out += block_bytes) {
        float scale[8], mn[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            float lo = 0, hi = 0;
            for (int i = 0; i < 32; i++) lo = fminf(lo, x[32 * j + i]), hi = fmaxf(hi, x[32 * j + i]);
            mn[j] = -lo, scale[j] = (hi - lo) / (float)top;
            smax = fmaxf(smax, scale[j]), mmax = fmaxf(mmax, mn[j]);
        }
        uint16_t dh = gw_f16(smax / 63), mh = gw_f16(mmax / 63);
        float d = f16_to_f32(dh), dmin = f16_to_f32(mh);
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) sc[j] = d > 0 ? gw_clamp(scale[j] / d, 0, 63) : 0, m[j] = dmin > 0 ? gw_clamp(mn[j] / dmin, 0, 63) : 0;
        out[0] = (unsigned char)dh, out[1] = (unsigned char)(dh >> 8), out[2] = (unsigned char)mh, out[3] = (unsigned char)(mh >> 8);
        unsigned char *s = out + 4, *qh = out + 16, *qs = out + (bits == 5 ? 48 : 16);
        for (int j = 0; j < 4; j++) {
            s[j] = (unsigned char)(sc[j] | (sc[j + 4] >> 4) << 6);
            s[j + 4] = (unsigned char)(m[j] | (m[j + 4] >> 4) << 6);
            s[j + 8] = (unsigned char)((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
        }
        memset(out + 16, 0, block_bytes - 16);
        for (int j = 0; j < 8; j++) {
            float step = d * (float)sc[j], off = dmin * (float)m[j];
            for (int i = 0; i < 32; i++) {
                int q = step > 0 ? gw_clamp((x[32 * j + i] + off) / step, 0, top) : 0;
                qs[32 * (j / 2) + i] |= (unsigned char)(j % 2 ? (q & 0xF) << 4 : q & 0xF);
                if (bits == 5) qh[i] |= (unsigned char)((q >> 4) << j);
            }
        }
    }
}

/* n f32 (n % 256 == 0) -> Q6_K blocks (210 bytes): per 16 weights a signed
 * 6-bit q with an int8 scale, x ~= d*sc*(q - 32). */
static void gw_q6_k(const float *x, size_t n, unsigned char *out) {
    for (size_t b = 0; b < n / 256; b++, x += 256, out += 210) {
        float scale[16], smax = 0;
        for (int g = 0; g < 16; g++) {
            float amax = 0;
            for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[16 * g + i]));
            scale[g] = amax / 31;
            smax = fmaxf(smax, scale[g]);
        }
        uint16_t dh = gw_f16(smax / 127);
        float d = f16_to_f32(dh);
        unsigned char *ql = out, *qh = out + 128;
        signed char *sc = (signed char *)(out + 192);
        memset(out, 0, 192);
        for (int g = 0; g < 16; g++) sc[g] = (signed char)(d > 0 ? gw_clamp(scale[g] / d, 0, 127) : 0);
        for (int e = 0; e < 256; e++) {
            float step = d * (float)sc[e / 16];
            int q = (step > 0 ? gw_clamp(x[e] / step, -32, 31) : 0) + 32;
            int h = e / 128, part = (e % 128) / 32, l = e % 32;
            ql[64 * h + (part & 1) * 32 + l] |= (unsigned char)(part < 2 ? q & 0xF : (q & 0xF) << 4);
            qh[32 * h + l] |= (unsigned char)((q >> 4) << (2 * part));
        }
        out[208] = (unsigned char)dh, out[209] = (unsigned char)(dh >> 8);
    }
}

/* IQ4's 16 levels, and the nearest of them to v. */
static const int gw_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static int gw_iq4_code(float v) {
    int best = 0;
    for (int c = 1; c < 16; c++)
        if (fabsf(v - (float)gw_iq4_levels[c]) < fabsf(v - (float)gw_iq4_levels[best])) best = c;
    return best;
}

/* 32 weights at step d -> 16 bytes of IQ4 codes (element i low nibble of byte i, i + 16 high). */
static void gw_iq4_codes(const float *x, float d, unsigned char *qs) {
    for (int i = 0; i < 16; i++)
        qs[i] = (unsigned char)(gw_iq4_code(d > 0 ? x[i] / d : 0) | gw_iq4_code(d > 0 ? x[i + 16] / d : 0) << 4);
}

/* n f32 -> IQ4_NL (n % 32 == 0; 18 bytes: f16 d, codes) or IQ4_XS blocks
 * (n % 256 == 0; 136 bytes: f16 d, per 32 weights a 6-bit scale minus 32
 * (high bits in 2 bytes, low nibbles in 4), codes): step max|x| / 127. */
static void gw_iq4(const float *x, size_t n, unsigned char *out, int xs) {
    for (size_t b = 0; b < n / (xs ? 256 : 32); b++) {
        float step[8], smax = 0;
        for (int j = 0; j < (xs ? 8 : 1); j++) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * j + i]));
            step[j] = amax / 127, smax = fmaxf(smax, step[j]);
        }
        if (!xs) {
            uint16_t h = gw_f16(step[0]);
            out[0] = (unsigned char)h, out[1] = (unsigned char)(h >> 8);
            gw_iq4_codes(x, f16_to_f32(h), out + 2);
            x += 32, out += 18;
            continue;
        }
        uint16_t h = gw_f16(smax / 31), high = 0;
        float d = f16_to_f32(h);
        out[0] = (unsigned char)h, out[1] = (unsigned char)(h >> 8);
        memset(out + 4, 0, 4);
        for (int j = 0; j < 8; j++) {
            int ls = (d > 0 ? gw_clamp(step[j] / d, -32, 31) : 0) + 32;
            out[4 + j / 2] |= (unsigned char)((ls & 0xF) << (4 * (j % 2)));
            high |= (uint16_t)((ls >> 4) << (2 * j));
            gw_iq4_codes(x + 32 * j, d * (float)(ls - 32), out + 8 + 16 * j);
        }
        out[2] = (unsigned char)high, out[3] = (unsigned char)(high >> 8);
        x += 256, out += 136;
    }
}

/* The ggml type ref i goes out as (expert stacks too, as a GGUF holds
 * them: one tensor of experts * rows rows). */
static ggml_type gw_type(const tensor_ref *r, gguf_fault fault) {
    if (!r->wtype) return GGML_F32;
    if ((fault == GGUF_Q8_0_FILE || fault == GGUF_Q8_0_BAD_ROW) && r->cols % 32 == 0) return GGML_Q8_0;
    int k_mix = fault == GGUF_K_FILE || fault == GGUF_K5_FILE;
    if (k_mix && r->cols % 256 == 0)
        return strstr(r->gguf_name, "attn_v") || strstr(r->gguf_name, "ffn_down") || strstr(r->gguf_name, "token_embd")
                   ? GGML_Q6_K
               : fault == GGUF_K5_FILE ? GGML_Q5_K
                                       : GGML_Q4_K;
    /* where 256 does not divide a row, llama.cpp's fallbacks: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 */
    if (k_mix && r->cols % 32 == 0)
        return strstr(r->gguf_name, "attn_v") || strstr(r->gguf_name, "ffn_down") || strstr(r->gguf_name, "token_embd")
                   ? GGML_Q8_0
               : fault == GGUF_K5_FILE ? GGML_Q5_1
                                       : GGML_Q5_0;
    if (fault == GGUF_IQ4_FILE && r->cols % 32 == 0) return r->cols % 256 == 0 ? GGML_IQ4_XS : GGML_IQ4_NL;
    if (fault == GGUF_Q4_0_FILE && r->cols % 32 == 0) return GGML_Q4_0;
    if (fault == GGUF_Q6_K_FILE && r->cols % 32 == 0) return r->cols % 256 == 0 ? GGML_Q6_K : GGML_Q8_0;
    return GGML_F32;
}

static void gw_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void gw_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void gw_str(FILE *f, const char *s) {
    gw_u64(f, strlen(s));
    fwrite(s, 1, strlen(s), f);
}
static void kv_u32(FILE *f, const char *k, uint32_t v) {
    gw_str(f, k);
    gw_u32(f, GGUF_U32);
    gw_u32(f, v);
}
static void kv_f32(FILE *f, const char *k, float v) {
    gw_str(f, k);
    gw_u32(f, GGUF_F32);
    fwrite(&v, 4, 1, f);
}

/* {arch}.rope.scaling.* as convert_hf_to_gguf writes linear and YaRN
 * scaling (YaRN's ramp is always truncated there); the number of keys
 * written, or with f NULL the number that would be. */
static int gw_rope_scaling(FILE *f, const char *gname, const polar_arch *a) {
    if (a->rope_type != POLAR_ROPE_LINEAR && a->rope_type != POLAR_ROPE_YARN) return 0;
    int yarn = a->rope_type == POLAR_ROPE_YARN, n = yarn ? 5 + (a->rope_attention_factor > 0) : 2;
    if (!f) return n;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", gname);
    gw_str(f, key);
    gw_u32(f, GGUF_STRING);
    gw_str(f, yarn ? "yarn" : "linear");
    snprintf(key, sizeof key, "%s.rope.scaling.factor", gname);
    kv_f32(f, key, (float)a->rope_factor);
    if (!yarn) return n;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", gname);
    kv_u32(f, key, (uint32_t)a->rope_original_max_pos);
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_fast", gname);
    kv_f32(f, key, (float)a->rope_beta_fast);
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_slow", gname);
    kv_f32(f, key, (float)a->rope_beta_slow);
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_attn_factor", gname);
    if (a->rope_attention_factor > 0) kv_f32(f, key, (float)a->rope_attention_factor);
    return n;
}

/* llama.cpp's permutation: original row j*hd/2 + i goes to row 2i + j. */
static void permute_rows(float *w, int rows, int cols, int hd) {
    float *tmp = malloc((size_t)hd * cols * sizeof *tmp);
    for (int h = 0; h < rows / hd; h++) {
        float *head = w + (size_t)h * hd * cols;
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++)
                memcpy(tmp + (size_t)(2 * i + j) * cols, head + (size_t)(j * hd / 2 + i) * cols, (size_t)cols * 4);
        memcpy(head, tmp, (size_t)hd * cols * 4);
    }
    free(tmp);
}

static int gguf_write_model(polar_model *m, const char *path, gguf_fault fault) {
    const polar_arch *a = &m->arch;
    tensor_ref *refs;
    int k = model_tensor_refs(m, LAYOUT_GGUF, &refs);
    if (fault == GGUF_NO_TENSOR) { /* drop blk.0.attn_norm.weight */
        memmove(refs + 1, refs + 2, (size_t)(k - 2) * sizeof *refs);
        k--;
    }
    int half = a->head_dim / 2, n_tensors = k + (a->rope_type == POLAR_ROPE_LLAMA3 ? 1 : 0);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(fault == GGUF_BAD_MAGIC ? "GGUX" : "GGUF", 1, 4, f);
    gw_u32(f, fault == GGUF_BAD_VERSION ? 1 : 3);
    gw_u64(f, fault == GGUF_HUGE_COUNT ? (uint64_t)1 << 40 : (uint64_t)n_tensors);
    /* llama.cpp spells the MoE architectures without the underscore. */
    char gname[16];
    snprintf(gname, sizeof gname, "%s", a->arch);
    char *us = strchr(gname, '_');
    if (us) memmove(us, us + 1, strlen(us));
    int moe_keys = a->n_experts ? 3 + (a->shared_ffn > 0) : 0;
    gw_u64(f, 12 + (uint64_t)moe_keys + (uint64_t)gw_rope_scaling(NULL, gname, a));
    gw_str(f, "general.architecture");
    gw_u32(f, fault == GGUF_BAD_VALUE_TYPE ? 77 : GGUF_STRING);
    if (fault == GGUF_HUGE_STRING) gw_u64(f, (uint64_t)1 << 50);
    gw_str(f, gname);
    char key[64];
    struct {
        const char *k;
        int v;
    } moe[] = {{"expert_count", a->n_experts}, {"expert_used_count", a->top_k},
               {"expert_feed_forward_length", a->moe_ffn}, {"expert_shared_feed_forward_length", a->shared_ffn}};
    for (int i = 0; i < moe_keys; i++) {
        snprintf(key, sizeof key, "%s.%s", gname, moe[i].k);
        kv_u32(f, key, (uint32_t)moe[i].v);
    }
    struct {
        const char *k;
        int v;
    } ints[] = {{"block_count", a->n_layers},           {"embedding_length", a->hidden},
                {"feed_forward_length", a->ffn},        {"attention.head_count", a->n_heads},
                {"attention.head_count_kv", a->n_kv_heads}, {"attention.key_length", a->head_dim},
                {"context_length", a->max_pos},         {"vocab_size", a->vocab}};
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "%s.%s", gname, ints[i].k);
        kv_u32(f, key, (uint32_t)ints[i].v);
    }
    snprintf(key, sizeof key, "%s.rope.freq_base", gname);
    kv_f32(f, key, (float)a->rope_theta);
    gw_rope_scaling(f, gname, a);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", gname);
    kv_f32(f, key, (float)a->rms_eps);
    gw_str(f, "tokenizer.ggml.model"); /* no vocabulary: so llama.cpp loads the file too */
    gw_u32(f, GGUF_STRING);
    gw_str(f, "no_vocab");
    if (fault == GGUF_TRUNCATED) {
        fclose(f);
        free(refs);
        return 1;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n_tensors; i++) {
        int is_rope = i == k;
        gw_str(f, is_rope ? "rope_freqs.weight" : refs[i].gguf_name);
        int cols = is_rope ? half : refs[i].cols, rows = is_rope ? 1 : refs[i].rows, ex = is_rope ? 0 : refs[i].experts;
        ggml_type type = is_rope ? GGML_F32 : gw_type(&refs[i], fault);
        int q8 = type == GGML_Q8_0;
        gw_u32(f, (cols ? 2 : 1) + (ex ? 1 : 0));
        gw_u64(f, (uint64_t)(cols ? cols : rows) + (q8 && fault == GGUF_Q8_0_BAD_ROW && i == 0));
        if (cols) gw_u64(f, (uint64_t)rows);
        if (ex) gw_u64(f, (uint64_t)ex);
        rows *= ex ? ex : 1;
        gw_u32(f, fault == GGUF_UNKNOWN_TYPE && i == 1 ? 99 : (uint32_t)type);
        uint64_t off = offset;
        if (fault == GGUF_OFFSET_PAST_END && i == n_tensors - 1) off += (uint64_t)1 << 32;
        if (fault == GGUF_MISALIGNED && i == 1) off += 4;
        gw_u64(f, off);
        uint64_t bytes = type == GGML_F32 ? (uint64_t)rows * (cols ? cols : 1) * 4
                                          : (uint64_t)rows * cols / ggml_block_elems(type) * ggml_block_bytes(type);
        offset += (bytes + 31) / 32 * 32;
    }
    int gathered = 1;
    long pos = ftell(f);
    for (; pos % 32; pos++) fputc(0, f);
    for (int i = 0; i < n_tensors; i++) {
        size_t cnt;
        float *v;
        if (i == k) { /* rope_freqs: divisors turning plain inv_freq into the scaled one */
            cnt = (size_t)half;
            v = malloc(cnt * 4);
            for (int j = 0; j < half; j++) v[j] = powf((float)a->rope_theta, -(float)(2 * j) / a->head_dim) / m->rope_inv_freq[j];
        } else {
            cnt = ref_elems(&refs[i]);
            v = malloc(cnt * 4);
            bf16 *b = malloc(cnt * sizeof *b);
            if (!ref_gather(m, &refs[i], b)) { /* weights the model does not hold as bf16: no file */
                memset(b, 0, cnt * sizeof *b);
                gathered = 0;
            }
            for (size_t j = 0; j < cnt; j++) v[j] = bf16_to_f32(b[j]);
            free(b);
            if (refs[i].rope_permuted && !strcmp(a->arch, "llama")) permute_rows(v, refs[i].rows, refs[i].cols, a->head_dim);
        }
        size_t bytes = cnt * 4;
        ggml_type type = i < k ? gw_type(&refs[i], fault) : GGML_F32;
        if (type != GGML_F32) {
            bytes = cnt / ggml_block_elems(type) * ggml_block_bytes(type);
            unsigned char *q = malloc(bytes);
            if (type == GGML_Q8_0) gw_q8_0(v, cnt, q);
            else if (type == GGML_Q4_0) gw_q4_0(v, cnt, q);
            else if (type == GGML_Q4_K || type == GGML_Q5_K) gw_k_quant(v, cnt, q, type == GGML_Q5_K ? 5 : 4);
            else if (type == GGML_IQ4_NL || type == GGML_IQ4_XS) gw_iq4(v, cnt, q, type == GGML_IQ4_XS);
            else if (type == GGML_Q5_0 || type == GGML_Q5_1) gw_q5(v, cnt, q, type == GGML_Q5_1);
            else gw_q6_k(v, cnt, q);
            fwrite(q, 1, bytes, f);
            free(q);
        } else {
            fwrite(v, 4, cnt, f);
        }
        for (size_t pad = bytes; pad % 32; pad++) fputc(0, f);
        free(v);
    }
    fclose(f);
    free(refs);
    return gathered;
}

/* A GGUF loaded twice: its blocks kept (*kept) and dequantized to bf16 at
 * load (*as_bf16, POLAR_GGUF_BF16=1): what the quantized paths are
 * compared with. */
static inline polar_status load_kept_and_bf16(const char *path, polar_model **kept, polar_model **as_bf16, polar_error *err) {
    polar_status st = polar_model_load(path, kept, err);
    if (st != POLAR_OK) return st;
    setenv("POLAR_GGUF_BF16", "1", 1);
    st = polar_model_load(path, as_bf16, err);
    unsetenv("POLAR_GGUF_BF16");
    return st;
}

#endif
