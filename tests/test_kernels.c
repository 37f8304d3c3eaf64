/* The CPU reference kernels against straightforward double-precision
 * formulas, on shapes that exercise the vector tails and token groups. */
#include "../kernels/cpu/ops.h"
#include "../runtime/model.h"
#include "harness.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0) - 1.0);
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * frand();
}
static void fill_bf16(bf16 *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16(scale * frand());
}

static void kernel_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t bits = (uint16_t)h;
        _Float16 ref;
        memcpy(&ref, &bits, 2);
        float a = f16_to_f32(bits), b = (float)ref;
        if (!(a == b || (isnan(a) && isnan(b))) || signbit(a) != signbit(b)) bad++;
    }
    CHECK(bad == 0, "%d of 65536 f16 patterns convert wrongly", bad);
    /* f32 -> bf16 rounds to nearest, ties to even. */
    CHECK(f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "tie to even (down)");
    CHECK(f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82, "tie to even (up)");
    CHECK(f32_to_bf16(1.0f + 1.5f / 256) == 0x3f81, "above the tie rounds up");
    CHECK(f32_to_bf16(-INFINITY) == 0xff80 && isnan(bf16_to_f32(f32_to_bf16(NAN))), "inf and nan");
    for (int i = 0; i < 10000; i++) {
        float x = frand() * 100;
        float r = bf16_to_f32(f32_to_bf16(x));
        CHECK(fabsf(r - x) <= fabsf(x) / 256, "bf16(%g) = %g", x, r);
        if (fabsf(r - x) > fabsf(x) / 256) break;
    }
}

static void kernel_matmul(void) {
    static const int shapes[][3] = {{1, 7, 5}, {1, 33, 64}, {3, 17, 100}, {4, 8, 16}, {9, 31, 129}, {32, 5, 48}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int T = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
        float *x = malloc((size_t)T * cols * 4), *y = malloc((size_t)T * rows * 4), *y0 = malloc((size_t)T * rows * 4);
        bf16 *w = malloc((size_t)rows * cols * 2), *b = malloc((size_t)rows * 2);
        fill(x, (size_t)T * cols, 1);
        fill(y0, (size_t)T * rows, 1);
        fill_bf16(w, (size_t)rows * cols, 0.5f);
        fill_bf16(b, (size_t)rows, 0.5f);
        for (int acc = 0; acc < 2; acc++) {
            memcpy(y, y0, (size_t)T * rows * 4);
            cpu_matmul(y, x, w, acc ? NULL : b, T, rows, cols, acc, 2);
            double worst = 0;
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double ref = acc ? y0[t * rows + r] : bf16_to_f32(b[r]);
                    for (int c = 0; c < cols; c++) ref += (double)bf16_to_f32(w[r * cols + c]) * x[t * cols + c];
                    worst = fmax(worst, fabs(ref - y[t * rows + r]));
                }
            CHECK(worst < 1e-5 * cols, "matmul T=%d %dx%d acc=%d: max error %g", T, rows, cols, acc, worst);
        }
        free(x);
        free(y);
        free(y0);
        free(w);
        free(b);
    }
}

static void kernel_rmsnorm_swiglu(void) {
    int n = 77;
    float x[77], out[77], g[77], u[77], g0[77];
    bf16 w[77];
    fill(x, n, 3);
    fill_bf16(w, n, 1);
    cpu_rmsnorm(out, x, w, n, 1e-6f);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double inv = 1 / sqrt(ss / n + 1e-6);
    for (int i = 0; i < n; i++) CHECK(fabs(out[i] - bf16_to_f32(w[i]) * x[i] * inv) < 1e-5, "rmsnorm[%d]", i);
    cpu_rmsnorm(x, x, w, n, 1e-6f); /* in place */
    CHECK(memcmp(x, out, sizeof out) == 0, "rmsnorm in place");
    fill(g, n, 8);
    fill(u, n, 2);
    memcpy(g0, g, sizeof g);
    cpu_swiglu(g, u, n);
    for (int i = 0; i < n; i++) CHECK(fabs(g[i] - g0[i] / (1 + exp(-g0[i])) * u[i]) < 1e-5, "swiglu[%d]", i);
}

/* RoPE pairs element i with i + d/2 (rotate-half), angle pos * inv_freq. */
static void kernel_rope(void) {
    int hd = 16, half = 8, heads = 3, pos = 37;
    float inv[8], cs[8], sn[8], x[48], x0[48];
    for (int i = 0; i < half; i++) inv[i] = powf(10000.0f, -(float)(2 * i) / hd);
    cpu_rope_angles(cs, sn, inv, 1.0f, half, pos);
    fill(x, 48, 1);
    memcpy(x0, x, sizeof x);
    cpu_rope(x, cs, sn, heads, hd);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos * inv[i], p = x0[h * hd + i], q = x0[h * hd + i + half];
            CHECK(fabs(x[h * hd + i] - (p * cos(a) - q * sin(a))) < 1e-5, "rope first half");
            CHECK(fabs(x[h * hd + i + half] - (q * cos(a) + p * sin(a))) < 1e-5, "rope second half");
        }
}

/* llama3 scaling: wavelengths above original/low are divided by factor,
 * below original/high untouched, in between a smooth blend. */
static void kernel_rope_llama3(void) {
    polar_error err;
    polar_model m = {0};
    CHECK_OK(polar_arch_preset("llama-3.2-1b", &m.arch, &err));
    CHECK(model_init_rope(&m), "rope init");
    int half = m.arch.head_dim / 2, low = 0, mid = 0, high = 0;
    for (int i = 0; i < half; i++) {
        double base = 1.0 / pow(500000.0, 2.0 * i / m.arch.head_dim), wl = 2 * M_PI / base, want;
        if (wl < 8192.0 / 4) {
            want = base;
            high++;
        } else if (wl > 8192.0) {
            want = base / 32;
            low++;
        } else {
            double smooth = (8192.0 / wl - 1) / (4 - 1);
            want = (1 - smooth) * base / 32 + smooth * base;
            mid++;
        }
        CHECK(fabs(m.rope_inv_freq[i] - want) <= 1e-6 * want, "inv_freq[%d] = %g, want %g", i, m.rope_inv_freq[i], want);
    }
    CHECK(low && mid && high, "all three bands present (%d/%d/%d)", low, mid, high);
    for (int i = 0; i < m.n_owned; i++) free(m.owned[i]);
    free(m.owned);
}

/* Causal GQA attention over a paged cache (positions 16..19 in the pool's
 * first block, 0..15 in its second) vs softmax in double. */
static void kernel_attention(void) {
    int heads = 6, kv = 2, hd = 20, ctx = 2 * CPU_KV_BLOCK, pos = 19, kvd = kv * hd;
    const int blocks[2] = {1, 0};
    float q[120], out[120], kc[32 * 40], vc[32 * 40], scores[32];
    fill(q, 120, 2);
    fill(kc, (size_t)ctx * kvd, 2);
    fill(vc, (size_t)ctx * kvd, 1);
    for (int h = 0; h < heads; h++) {
        cpu_attention_head(out, q, kc, vc, blocks, pos, h, heads, kv, hd, scores);
        int g = h / (heads / kv);
        double s[32], mx = -1e300, sum = 0;
        for (int j = 0; j <= pos; j++) {
            s[j] = 0;
            for (int i = 0; i < hd; i++) s[j] += (double)q[h * hd + i] * kc[cpu_kv_row(blocks, j) * kvd + g * hd + i];
            s[j] /= sqrt(hd);
            mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= pos; j++) sum += (s[j] = exp(s[j] - mx));
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int j = 0; j <= pos; j++) o += s[j] / sum * vc[cpu_kv_row(blocks, j) * kvd + g * hd + i];
            CHECK(fabs(o - out[h * hd + i]) < 1e-5, "head %d dim %d: %g vs %g", h, i, out[h * hd + i], o);
        }
    }
}

static void kernel_argmax(void) {
    float x[6] = {1, 5, 2, 5, -1, 5};
    CHECK(polar_argmax(x, 6) == 1, "ties go to the lowest index");
    float y[3] = {-3, -2, -2};
    CHECK(polar_argmax(y, 3) == 1, "negative values");
}

int main(void) {
    RUN(kernel_conversions);
    RUN(kernel_matmul);
    RUN(kernel_rmsnorm_swiglu);
    RUN(kernel_rope);
    RUN(kernel_rope_llama3);
    RUN(kernel_attention);
    RUN(kernel_argmax);
    TEST_EXIT();
}
