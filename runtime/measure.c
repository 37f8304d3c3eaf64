/* Measuring helpers for `polar bench`: a clock, the memory-read and copy
 * bandwidths that decode speed is judged against, and the bytes a decode
 * step reads. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "error.h"
#include "model.h"

double polar_time_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

polar_status polar_copy_bandwidth(polar_device device, size_t bytes, int n_threads, double *gbps, polar_error *err) {
    if (!gbps || bytes < 4096) return polar_fail(err, POLAR_ERR_ARG, "copy bandwidth: at least 4096 bytes");
    if (device == POLAR_DEVICE_CUDA) return cuda_copy_bandwidth(bytes, gbps, err);
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return polar_fail(err, POLAR_ERR_NOMEM, "copy bandwidth: cannot allocate 2 x %zu bytes", bytes);
    }
    /* Touch both buffers with the same threads that copy, so pages are
     * mapped before timing. */
#pragma omp parallel num_threads(n_threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = bytes / (size_t)nt * (size_t)t, hi = t == nt - 1 ? bytes : bytes / (size_t)nt * (size_t)(t + 1);
        memset(src + lo, t + 1, hi - lo);
        memset(dst + lo, 0, hi - lo);
    }
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = polar_time_ms();
#pragma omp parallel num_threads(n_threads)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = bytes / (size_t)nt * (size_t)t, hi = t == nt - 1 ? bytes : bytes / (size_t)nt * (size_t)(t + 1);
            memcpy(dst + lo, src + lo, hi - lo);
        }
        double ms = polar_time_ms() - t0;
        double g = 2.0 * (double)bytes / (ms * 1e6);
        if (g > best) best = g;
    }
    /* Keep the copy observable so it cannot be optimised away. */
    volatile char sink = dst[bytes / 2];
    (void)sink;
    free(src);
    free(dst);
    *gbps = best;
    return POLAR_OK;
}

/* One thread's sum of its slice, eight 64-bit lanes at a time (so the
 * compiler's vector loads, not a chain of adds, set the pace). */
static uint64_t sum_words(const uint64_t *w, size_t n) {
    uint64_t s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += w[i + j];
    for (; i < n; i++) s[0] += w[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

polar_status polar_read_bandwidth(polar_device device, size_t bytes, int n_threads, double *gbps, polar_error *err) {
    if (!gbps || bytes < 4096) return polar_fail(err, POLAR_ERR_ARG, "read bandwidth: at least 4096 bytes");
    if (device == POLAR_DEVICE_CUDA) return cuda_read_bandwidth(bytes, gbps, err);
    if (n_threads <= 0) n_threads = omp_get_max_threads();
    size_t words = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(words * sizeof *buf);
    if (!buf) return polar_fail(err, POLAR_ERR_NOMEM, "read bandwidth: cannot allocate %zu bytes", bytes);
    /* Each thread first touches the slice it will read: its pages, mapped
     * near it. */
#pragma omp parallel num_threads(n_threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = words / (size_t)nt * (size_t)t, hi = t == nt - 1 ? words : words / (size_t)nt * (size_t)(t + 1);
        for (size_t i = lo; i < hi; i++) buf[i] = i;
    }
    double best = 0;
    uint64_t total = 0;
    for (int rep = 0; rep < 6; rep++) { /* the first is a warm-up */
        double t0 = polar_time_ms();
#pragma omp parallel num_threads(n_threads) reduction(+ : total)
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t lo = words / (size_t)nt * (size_t)t, hi = t == nt - 1 ? words : words / (size_t)nt * (size_t)(t + 1);
            total += sum_words(buf + lo, hi - lo);
        }
        double ms = polar_time_ms() - t0, g = (double)(words * sizeof *buf) / (ms * 1e6);
        if (rep > 0 && g > best) best = g;
    }
    /* Keep the sums observable so the reads cannot be optimised away. */
    volatile uint64_t sink = total;
    (void)sink;
    free(buf);
    *gbps = best;
    return POLAR_OK;
}

double polar_decode_bytes(const polar_model *m, const polar_program *p, int ctx, polar_device device, int kv_bf16) {
    if (!p) return 0;
    const polar_arch *a = &m->arch;
    /* Bytes of each layer's weights, from the model's own tensor table; an
     * MoE layer reads its router, top_k of its experts and the shared one. */
    tensor_ref *refs;
    int n = model_tensor_refs((polar_model *)m, LAYOUT_PER_EXPERT, &refs);
    double *layer = calloc((size_t)a->n_layers, sizeof *layer);
    if (n < 0 || !layer) {
        if (n >= 0) free(refs);
        free(layer);
        return 0;
    }
    /* What the device reads: the blocks as they are (on CUDA only with
     * POLAR_CUDA_BLOCKS=1: bf16 by default, routed experts included). */
    int cpu = device != POLAR_DEVICE_CUDA, blocks = cpu || cuda_keeps_blocks();
    for (int i = 0; i < n; i++)
        if (refs[i].layer >= 0)
            layer[refs[i].layer] += blocks && refs[i].wtype ? (double)refs[i].rows *
                                                                (double)cpu_wtype_row_bytes(*refs[i].wtype, (size_t)refs[i].cols)
                                                          : (double)ref_elems(&refs[i]) * sizeof(bf16);
    free(refs);
    /* the refs count every expert in bf16: an MoE layer reads top_k of them,
     * in the blocks a GGUF kept them in where the device keeps blocks */
    for (int l = 0; l < a->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        if (!polar_arch_layer_is_moe(a, l)) continue;
        size_t H = (size_t)a->hidden, F = (size_t)a->moe_ffn;
        int kept = cpu || cuda_keeps_expert_blocks(a, w);
        cpu_wtype tg = kept ? w->t_exp_gate : CPU_W_BF16, tu = kept ? w->t_exp_up : CPU_W_BF16,
                  td = kept ? w->t_exp_down : CPU_W_BF16;
        double one = (double)F * (double)(cpu_wtype_row_bytes(tg, H) + cpu_wtype_row_bytes(tu, H)) +
                     (double)H * (double)cpu_wtype_row_bytes(td, F);
        layer[l] += a->top_k * one - a->n_experts * 3.0 * (double)F * (double)H * sizeof(bf16);
    }
    double kv_row = 2.0 * a->n_kv_heads * a->head_dim * (!cpu || kv_bf16 ? sizeof(bf16) : sizeof(float));
    cpu_wtype th = blocks ? cpu_row_type(m->t_lm_head) : CPU_W_BF16, te = blocks ? cpu_row_type(m->t_embed) : CPU_W_BF16;
    double head = (double)a->hidden * sizeof(bf16) + (double)a->vocab * (double)cpu_wtype_row_bytes(th, (size_t)a->hidden);
    double total = (double)cpu_wtype_row_bytes(te, (size_t)a->hidden) + head; /* one embedding row, final norm, lm_head */
    for (int k = 0; k < p->n; k++)
        total += layer[p->layers[k]] + kv_row * ctx;
    free(layer);
    return total;
}
