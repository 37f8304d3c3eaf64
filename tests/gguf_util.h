/* Test helper: write a model as a GGUF file the way llama.cpp's converter
 * lays it out (F32 tensors, Llama q/k rows permuted per head for
 * adjacent-pair RoPE, llama3 scaling as rope_freqs.weight), with optional
 * corruptions for the bad-input tests. GGUF_Q8_0_FILE writes the matrices
 * that may stay quantized as Q8_0 blocks (d = max|x|/127 as f16). */
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
    GGUF_Q8_0_BAD_ROW /* ... whose first tensor (Q8_0 embedding) claims a row of cols + 1 (not whole blocks) */
} gguf_fault;

/* f32 -> IEEE half, nearest (ties away); tiny values flush to zero. */
static uint16_t gw_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    uint32_t man = u & 0x7FFFFFu;
    if (e <= 0) return sign;
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

/* Whether ref i goes out as Q8_0. */
static int gw_is_q8(const tensor_ref *r, gguf_fault fault) {
    return (fault == GGUF_Q8_0_FILE || fault == GGUF_Q8_0_BAD_ROW) && r->wtype && r->cols % 32 == 0 && !r->experts;
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
    int half = a->head_dim / 2, n_tensors = k + (a->rope_llama3 ? 1 : 0);
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
    gw_u64(f, 11 + (uint64_t)moe_keys);
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
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", gname);
    kv_f32(f, key, (float)a->rms_eps);
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
        int q8 = !is_rope && gw_is_q8(&refs[i], fault);
        gw_u32(f, (cols ? 2 : 1) + (ex ? 1 : 0));
        gw_u64(f, (uint64_t)(cols ? cols : rows) + (q8 && fault == GGUF_Q8_0_BAD_ROW && i == 0));
        if (cols) gw_u64(f, (uint64_t)rows);
        if (ex) gw_u64(f, (uint64_t)ex);
        rows *= ex ? ex : 1;
        gw_u32(f, fault == GGUF_UNKNOWN_TYPE && i == 1 ? 12 : q8 ? GGML_Q8_0 : GGML_F32);
        uint64_t off = offset;
        if (fault == GGUF_OFFSET_PAST_END && i == n_tensors - 1) off += (uint64_t)1 << 32;
        if (fault == GGUF_MISALIGNED && i == 1) off += 4;
        gw_u64(f, off);
        uint64_t bytes = q8 ? (uint64_t)rows * cols / 32 * 34 : (uint64_t)rows * (cols ? cols : 1) * 4;
        offset += (bytes + 31) / 32 * 32;
    }
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
            ref_gather(&refs[i], b);
            for (size_t j = 0; j < cnt; j++) v[j] = bf16_to_f32(b[j]);
            free(b);
            if (refs[i].rope_permuted && !strcmp(a->arch, "llama")) permute_rows(v, refs[i].rows, refs[i].cols, a->head_dim);
        }
        size_t bytes = cnt * 4;
        if (i < k && gw_is_q8(&refs[i], fault)) {
            unsigned char *q = malloc(cnt / 32 * 34);
            gw_q8_0(v, cnt, q);
            fwrite(q, 1, bytes = cnt / 32 * 34, f);
            free(q);
        } else {
            fwrite(v, 4, cnt, f);
        }
        for (size_t pad = bytes; pad % 32; pad++) fputc(0, f);
        free(v);
    }
    fclose(f);
    free(refs);
    return 1;
}

#endif
