/* GGUF block formats kept quantized (kernels/cpu/quant.h):
 * - dequantization of Q8_0, Q4_0, Q4_1 equals the format's definition,
 *   computed here from the integers and f16 scales written into each block;
 *   every type (Q4_0 .. Q8_0, Q2_K .. Q6_K) equals gguf-py's dequantizer on
 *   the random blocks of tests/golden/quant_blocks.bin, bit for bit;
 * - each level's block dot product against the f32 dot of the dequantized
 *   weights with the unquantized activations. The only error allowed is the
 *   activations' rounding to int8 (each x off by at most half its block's
 *   step d/2, so |err| <= sum_b d_b/2 * sum_i |w_i|) plus 1e-5 relative of
 *   sum |w x| for f32 sums; and every level against the plain C one within
 *   1e-5 of sum |w x| (the integer sums are exact, the f32 sum is reordered);
 * - the threaded matmul gives, within a level, the same bits as the single
 *   row dot products whatever T and the thread count;
 * - a random Llama written as a Q8_0 GGUF, and one as the Q4_K_M mix
 *   (Q4_K + Q6_K), runs close to its bf16 load;
 *   malformed blocks are refused;
 * - the default model (Q4_1 layers, Q8_0 embedding/head) quantized against
 *   its dequantized (bf16) load: last-position logits of 3 prompts within
 *   LOGIT_TOL and the transformers fixture's 16 greedy tokens.
 * The checks that need no model are in quant_checks.h, shared with
 * test_quant_kernels (the NEON level under qemu). */
#include <stdint.h>
#include <unistd.h>

#include "../kernels/cpu/kernels.h"
#include "../loader/safetensors.h"
#include "gguf_util.h"
#include "harness.h"
#include "quant_checks.h"

/* Max |logit diff| quantized vs bf16 on the 3 prompts, below, as measured
 * on a Zen 5 for each level: generic (the plain C oracle) 1.58, avx2 1.23,
 * avx512 and avx512vnni (the same x16 matmul bits) 1.68; before the x16
 * layouts avx2 gave 1.37 and avx512 1.29. Int8 activations make the
 * quantized forward sensitive to rounding: a last-bit change flips a
 * rounding in a later quantization, so the levels spread this much. */
#define LOGIT_TOL 2.0f
#define TIE_TOL 0.5f
#define STEPS 16

static const ggml_type ggml_of[CPU_W_Q4_1 + 1] = {GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1};

static void dequantize_by_definition(void) {
    for (int t = CPU_W_Q8_0; t <= CPU_W_Q4_1; t++) {
        uint8_t b[8 * 34];
        float want[256], got[256], got2[256];
        rand_blocks((cpu_wtype)t, 8, b, want);
        cpu_dequantize_row((cpu_wtype)t, b, got, 256);
        ggml_dequantize(ggml_of[t], b, got2, 256); /* the loader's, used for the bf16 path */
        int bad = 0;
        for (int i = 0; i < 256; i++) bad += got[i] != want[i] || got2[i] != want[i];
        CHECK(!bad, "%s: %d of 256 values differ from the definition", cpu_wtype_name((cpu_wtype)t), bad);
        CHECK(cpu_wtype_row_bytes((cpu_wtype)t, 256) == 8 * ggml_block_bytes(ggml_of[t]), "%s: row bytes",
              cpu_wtype_name((cpu_wtype)t));
    }
}

/* inf / NaN activations give NaN, never a float->int conversion of them. */
static void nonfinite_activations(void) {
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = frand();
    x[3] = NAN;
    x[40] = INFINITY;
    cpu_q8_block xq[2];
    cpu_quantize_q8(xq, x, 64);
    CHECK(isnan(xq[0].d) && isnan(xq[1].d), "blocks with NaN / inf get d = NaN");
    uint8_t w[2 * 34];
    float wf[64];
    rand_blocks(CPU_W_Q8_0, 2, w, wf);
    CHECK(isnan(cpu_dot_q_generic[CPU_W_Q8_0](w, xq, 2)), "NaN out");
}

static char dir[] = "/tmp/polar-quant-XXXXXX";

/* How a loader must keep a matrix of GGUF blocks of type t: interleaved
 * on the x86 SIMD levels for the types with an x16 layout (unless
 * POLAR_REPACK=0), else as the blocks. Decided here from the level's name,
 * not from the loader's own cpu_x16_active. */
static cpu_wtype kept_as(cpu_wtype t) {
    const char *level = cpu_kernels_active()->name, *repack = getenv("POLAR_REPACK");
    int x86_simd = !strncmp(level, "avx", 3); /* every x86 SIMD level */
    int off = repack && !strcmp(repack, "0");
    return x86_simd && !off && cpu_x16_of(t) != CPU_W_BF16 ? cpu_x16_of(t) : t;
}

/* A random Llama with Q8_0 matrices: kept quantized (the q/k rows
 * un-permuted as blocks), close to the same file loaded as bf16. */
static void q8_0_gguf_model(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *q = NULL, *b = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    CHECK_OK(polar_model_random(&a, 5, &m, &err));
    char path[128];
    snprintf(path, sizeof path, "%s/q8.gguf", dir);
    CHECK(m && gguf_write_model(m, path, GGUF_Q8_0_FILE), "write %s", path);
    CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
    if (q && b) {
        cpu_wtype kept = kept_as(CPU_W_Q8_0);
        CHECK(q->quantized && q->layers[0].t_wq == kept && q->layers[0].t_down == kept, "kept as %s",
              cpu_wtype_name(kept));
        CHECK(!b->quantized && b->layers[0].t_wq == CPU_W_BF16, "POLAR_GGUF_BF16=1 loads bf16");
        /* q rows un-permuted: dequantized row r of the kept blocks is row r of the bf16 load */
        int H = a.hidden, bad = 0;
        float *row = malloc((size_t)H * 4);
        for (int r = 0; r < a.n_heads * a.head_dim; r++) {
            cpu_dequantize_matrix_row(q->layers[1].t_wq, q->layers[1].wq, (size_t)H, r, row);
            for (int j = 0; j < H; j++) bad += f32_to_bf16(row[j]) != b->layers[1].wq[(size_t)r * H + j];
        }
        free(row);
        CHECK(!bad, "%d q weights differ from the bf16 load", bad);
        float *lq = malloc((size_t)a.vocab * 4), *lb = malloc((size_t)a.vocab * 4), d = 0, mx = 0;
        prompt_logits(q, "0-1,2-3", lq);
        prompt_logits(b, "0-1,2-3", lb);
        for (int v = 0; v < a.vocab; v++) d = nan_max(d, fabsf(lq[v] - lb[v])), mx = fmaxf(mx, fabsf(lb[v]));
        /* int8 activations: about 1% of a logit's scale through 4 layers */
        CHECK(d <= 0.05f * mx, "quantized logits differ by %g (max |logit| %g)", d, mx);
        printf("  random llama, Q8_0: max |logit diff| %.3g of max |logit| %.3g\n", d, mx);
        char save[160];
        snprintf(save, sizeof save, "%s/saved", dir);
        CHECK(polar_model_save(q, save, &err) == POLAR_ERR_UNSUPPORTED, "saving quantized weights refused");
        free(lq);
        free(lb);
    }
    polar_model_free(m);
    polar_model_free(q);
    polar_model_free(b);
}

/* A random Llama written as llama.cpp's Q4_K_M mix (Q6_K attn_v / ffn_down
 * / embedding, Q4_K the rest) and as its Q5_K_M mix (Q5_K in place of
 * Q4_K), with rows of whole 256-blocks, and with a hidden size of 288, whose
 * rows take llama.cpp's fallbacks (Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for
 * Q6_K; ffn_down's rows of 512 stay Q6_K), and as all Q6_K (mkgguf's q6_k,
 * Q8_0 at hidden 288): kept as blocks, each matrix
 * dequantizing to its bf16 load, and the logits close to it. */
static void k_quant_gguf_model(void) {
    static const struct {
        gguf_fault kind;
        cpu_wtype main, six; /* most matrices', attn_v's and the embedding's */
        int hidden;
        const char *name;
    } mixes[] = {{GGUF_K_FILE, CPU_W_Q4_K, CPU_W_Q6_K, 256, "Q4_K_M"},
                 {GGUF_K5_FILE, CPU_W_Q5_K, CPU_W_Q6_K, 256, "Q5_K_M"},
                 {GGUF_K_FILE, CPU_W_Q5_0, CPU_W_Q8_0, 288, "Q4_K_M, hidden 288"},
                 {GGUF_K5_FILE, CPU_W_Q5_1, CPU_W_Q8_0, 288, "Q5_K_M, hidden 288"},
                 {GGUF_Q6_K_FILE, CPU_W_Q6_K, CPU_W_Q6_K, 256, "Q6_K"},
                 {GGUF_Q6_K_FILE, CPU_W_Q8_0, CPU_W_Q8_0, 288, "Q6_K, hidden 288"}};
    for (int f = 0; f < (int)(sizeof mixes / sizeof mixes[0]); f++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL, *q = NULL, *b = NULL;
        CHECK_OK(polar_arch_default("llama", &a, &err));
        a.hidden = mixes[f].hidden, a.ffn = 512, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 64, a.vocab = 512;
        CHECK_OK(polar_model_random(&a, 11, &m, &err));
        char path[128];
        snprintf(path, sizeof path, "%s/k%d.gguf", dir, f);
        CHECK(m && gguf_write_model(m, path, mixes[f].kind), "write %s", path);
        CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
        if (q && b) {
            const layer_weights *lq = &q->layers[1], *lb = &b->layers[1];
            cpu_wtype main = kept_as(mixes[f].main), six = kept_as(mixes[f].six), q6_k = kept_as(CPU_W_Q6_K);
            CHECK(lq->t_wq == main && lq->t_wv == six && lq->t_down == q6_k && lq->t_gate == main && q->t_embed == six,
                  "kept as the %s mix (wq %s, wv %s)", mixes[f].name, cpu_wtype_name(lq->t_wq), cpu_wtype_name(lq->t_wv));
            struct {
                const void *w;
                cpu_wtype t;
                const bf16 *ref;
                int rows, cols;
            } mats[] = {{lq->wq, lq->t_wq, lb->wq, a.n_heads * a.head_dim, a.hidden},
                        {lq->wv, lq->t_wv, lb->wv, a.n_kv_heads * a.head_dim, a.hidden},
                        {lq->w_down, lq->t_down, lb->w_down, a.hidden, a.ffn}};
            float *row = malloc((size_t)a.ffn * 4);
            for (int i = 0; i < 3; i++) {
                int bad = 0;
                for (int r = 0; r < mats[i].rows; r++) {
                    cpu_dequantize_matrix_row(mats[i].t, mats[i].w, (size_t)mats[i].cols, r, row);
                    for (int j = 0; j < mats[i].cols; j++) bad += f32_to_bf16(row[j]) != mats[i].ref[(size_t)r * mats[i].cols + j];
                }
                CHECK(!bad, "%s matrix %d: %d weights differ from the bf16 load", mixes[f].name, i, bad);
            }
            free(row);
            float *lgq = malloc((size_t)a.vocab * 4), *lgb = malloc((size_t)a.vocab * 4), d = 0, mx = 0;
            prompt_logits(q, "0-3,1", lgq);
            prompt_logits(b, "0-3,1", lgb);
            for (int v = 0; v < a.vocab; v++) d = nan_max(d, fabsf(lgq[v] - lgb[v])), mx = fmaxf(mx, fabsf(lgb[v]));
            CHECK(d <= 0.05f * mx, "%s: quantized logits differ by %g (max |logit| %g)", mixes[f].name, d, mx);
            printf("  random llama, %s: max |logit diff| %.3g of max |logit| %.3g\n", mixes[f].name, d, mx);
            free(lgq);
            free(lgb);
        }
        polar_model_free(m);
        polar_model_free(q);
        polar_model_free(b);
    }
}

/* Rows of a matrix as a loader keeps them (blocks, x16 or bf16) against
 * the GGUF tensor it came from: each weight the block's value (by
 * ggml_dequantize, checked against gguf-py above; rounded to bf16 for a
 * bf16 matrix), rows in the model's order (a Llama q/k file row 2i + j of
 * a head is row j * hd/2 + i: llama.cpp's permutation undone). Returns the
 * mismatches. */
static int kept_as_blocks(const gguf_tensor *t, cpu_wtype kept, const void *w, int rows, int cols, int permuted_hd) {
    float *vals = malloc((size_t)rows * cols * 4), *row = malloc((size_t)cols * 4);
    ggml_dequantize(t->type, t->data, vals, (size_t)rows * cols);
    int bad = 0;
    for (int r = 0; r < rows; r++) {
        int in_head = r % (permuted_hd ? permuted_hd : 1), to = r;
        if (permuted_hd) to = r - in_head + (in_head % 2) * (permuted_hd / 2) + in_head / 2;
        if (kept == CPU_W_BF16)
            for (int c = 0; c < cols; c++) row[c] = bf16_to_f32(((const bf16 *)w)[(size_t)to * cols + c]);
        else
            cpu_dequantize_matrix_row(kept, w, (size_t)cols, to, row);
        for (int c = 0; c < cols; c++) {
            float want = vals[(size_t)r * cols + c];
            bad += kept == CPU_W_BF16 ? f32_to_bf16(want) != f32_to_bf16(row[c]) : want != row[c];
        }
    }
    free(vals);
    free(row);
    return bad;
}

/* A random Llama as IQ4_XS (IQ4_NL for the rows of 96 weights, which 256
 * does not divide): kept as blocks (interleaved on the x86 SIMD levels),
 * every weight its block's value in the model's row order; the logits close
 * to the same file loaded as bf16 (the int8 activations' error) and near
 * the unquantized model's (4-bit weights, about 7% relative error each
 * here, move these random models' logits by about a third of their scale). */
static void iq4_gguf_model(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *q = NULL, *b = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    a.hidden = 256, a.ffn = 96, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 64, a.vocab = 512;
    CHECK_OK(polar_model_random(&a, 13, &m, &err));
    char path[128];
    snprintf(path, sizeof path, "%s/iq4.gguf", dir);
    CHECK(m && gguf_write_model(m, path, GGUF_IQ4_FILE), "write %s", path);
    CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
    gguf_file g = {0};
    CHECK_OK(gguf_open(path, &g, &err));
    if (q && b && m && g.tensors) {
        const gguf_tensor *wq = gguf_find_tensor(&g, "blk.1.attn_q.weight"), *down = gguf_find_tensor(&g, "blk.1.ffn_down.weight");
        const gguf_tensor *embd = gguf_find_tensor(&g, "token_embd.weight");
        CHECK(wq && wq->type == GGML_IQ4_XS && down && down->type == GGML_IQ4_NL && embd && embd->type == GGML_IQ4_XS,
              "written as IQ4_XS and IQ4_NL");
        const layer_weights *l = &q->layers[1], *lb = &b->layers[1];
        cpu_wtype xs = kept_as(CPU_W_IQ4_XS), nl = kept_as(CPU_W_IQ4_NL);
        CHECK(q->quantized && l->t_wq == xs && l->t_down == nl && q->t_embed == xs,
              "kept as %s / %s (wq %s, down %s)", cpu_wtype_name(xs), cpu_wtype_name(nl), cpu_wtype_name(l->t_wq),
              cpu_wtype_name(l->t_down));
        int QD = a.n_heads * a.head_dim;
        if (wq && down && embd) {
            CHECK(!kept_as_blocks(wq, l->t_wq, l->wq, QD, a.hidden, a.head_dim), "attn_q: not its IQ4_XS values");
            CHECK(!kept_as_blocks(down, l->t_down, l->w_down, a.hidden, a.ffn, 0), "ffn_down: not its IQ4_NL values");
            CHECK(!kept_as_blocks(embd, q->t_embed, q->embed, a.vocab, a.hidden, 0), "token_embd: not its values");
            CHECK(!kept_as_blocks(wq, CPU_W_BF16, lb->wq, QD, a.hidden, a.head_dim), "bf16 load of attn_q");
        }
        float *lq = malloc((size_t)a.vocab * 4), *lb16 = malloc((size_t)a.vocab * 4), *lm = malloc((size_t)a.vocab * 4);
        prompt_logits(q, "0-3,1", lq);
        prompt_logits(b, "0-3,1", lb16);
        prompt_logits(m, "0-3,1", lm);
        float d = 0, mx = 0;
        double num = 0, den = 0;
        for (int v = 0; v < a.vocab; v++) {
            d = nan_max(d, fabsf(lq[v] - lb16[v])), mx = fmaxf(mx, fabsf(lb16[v]));
            num += (lb16[v] - lm[v]) * (lb16[v] - lm[v]), den += (double)lm[v] * lm[v];
        }
        CHECK(d <= 0.05f * mx, "IQ4 blocks' logits differ from the bf16 load's by %g (max |logit| %g)", d, mx);
        CHECK(sqrt(num / den) < 0.6, "IQ4 logits %.3g (relative L2) from the unquantized model's", sqrt(num / den));
        printf("  random llama, IQ4_XS + IQ4_NL: max |logit diff| %.3g of %.3g from the bf16 load; %.3g (relative L2) "
               "from the unquantized model\n", d, mx, sqrt(num / den));
        free(lq);
        free(lb16);
        free(lm);
    }
    if (g.tensors) gguf_close(&g);
    polar_model_free(m);
    polar_model_free(q);
    polar_model_free(b);
}

static void malformed_blocks(void) {
    polar_error err;
    polar_arch a;
    polar_model *m = NULL, *q = NULL;
    CHECK_OK(polar_arch_default("llama", &a, &err));
    CHECK_OK(polar_model_random(&a, 5, &m, &err));
    char path[128];
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    CHECK(m && gguf_write_model(m, path, GGUF_Q8_0_BAD_ROW), "write %s", path);
    polar_status st = polar_model_load(path, &q, &err);
    CHECK(st == POLAR_ERR_FORMAT && strstr(err.msg, "not a multiple of the Q8_0 block"), "%s: %s",
          polar_status_name(st), err.msg);
    polar_model_free(q);
    polar_model_free(m);
}

/* The type a stack of experts of `rows` rows each, written as t, must be
 * kept as: interleaved only when each expert starts a group of 16 rows. */
static cpu_wtype stack_kept_as(cpu_wtype t, int rows) { return rows % 16 ? t : kept_as(t); }

/* Rows r = 0, step, 2 step ... of a kept matrix (n_rows x cols) read back
 * to the bf16 load's: the number of weights that differ. */
static int rows_differ(const void *w, cpu_wtype t, const bf16 *ref, int n_rows, int cols, int step) {
    float *row = malloc((size_t)cols * 4);
    int bad = 0;
    for (int r = 0; r < n_rows; r += step) {
        cpu_dequantize_matrix_row(t, w, (size_t)cols, r, row);
        for (int j = 0; j < cols; j++) bad += f32_to_bf16(row[j]) != ref[(size_t)r * cols + j];
    }
    free(row);
    return bad;
}

/* A random Qwen2-MoE (router, 8 experts, a shared expert) written as Q8_0,
 * as the Q4_K_M mix, and as Q8_0 with experts of 40 rows (row-major: 40 is
 * not a multiple of 16; their down stacks F32, as 40 columns are not whole
 * blocks): its expert stacks and shared expert stay in their blocks, read
 * back to the bf16 load's values, the logits stay close to it (programs
 * through dense and MoE layers), and the bf16 load saves as a checkpoint
 * that loads back to the same logits. */
static void moe_gguf_model(void) {
    static const struct {
        gguf_fault kind;
        int hidden, moe_ffn, shared, vocab;
        cpu_wtype gate, down, sh_down;
    } files[] = {{GGUF_Q8_0_FILE, 64, 64, 96, 256, CPU_W_Q8_0, CPU_W_Q8_0, CPU_W_Q8_0},
                 {GGUF_K_FILE, 256, 256, 256, 256, CPU_W_Q4_K, CPU_W_Q6_K, CPU_W_Q6_K},
                 {GGUF_Q8_0_FILE, 64, 40, 96, 256, CPU_W_Q8_0, CPU_W_BF16, CPU_W_Q8_0}};
    for (int f = 0; f < 3; f++) {
        polar_error err;
        polar_arch a;
        polar_model *m = NULL, *q = NULL, *b = NULL;
        CHECK_OK(polar_arch_default("qwen2_moe", &a, &err));
        a.hidden = files[f].hidden, a.moe_ffn = files[f].moe_ffn, a.shared_ffn = files[f].shared;
        a.ffn = files[f].moe_ffn, a.vocab = files[f].vocab;
        CHECK_OK(polar_model_random(&a, 13, &m, &err));
        char path[128];
        snprintf(path, sizeof path, "%s/moe%d.gguf", dir, f);
        CHECK(m && gguf_write_model(m, path, files[f].kind), "write %s", path);
        CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
        if (!q || !b) {
            polar_model_free(m), polar_model_free(q), polar_model_free(b);
            continue;
        }
        const layer_weights *lq = &q->layers[1], *lb = &b->layers[1]; /* an MoE layer */
        int H = a.hidden, F = a.moe_ffn, E = a.n_experts, S = a.shared_ffn;
        cpu_wtype gate = stack_kept_as(files[f].gate, F), down = stack_kept_as(files[f].down, H);
        CHECK(!lq->exp_gate_up && lq->t_exp_gate == gate && lq->t_exp_up == gate && lq->t_exp_down == down &&
                  lq->t_sh_gate == kept_as(files[f].gate) && lq->t_sh_up == kept_as(files[f].gate) &&
                  lq->t_sh_down == kept_as(files[f].sh_down),
              "file %d: experts kept as %s / %s (got %s, %s)", f, cpu_wtype_name(gate), cpu_wtype_name(down),
              cpu_wtype_name(lq->t_exp_gate), cpu_wtype_name(lq->t_exp_down));
        CHECK(!b->quantized && lb->t_exp_gate == CPU_W_BF16, "POLAR_GGUF_BF16=1 loads the experts as bf16");
        /* every expert's stacks, sampled rows, and the shared expert */
        int bad = rows_differ(lq->exp_gate, lq->t_exp_gate, lb->exp_gate, E * F, H, 7) +
                  rows_differ(lq->exp_up, lq->t_exp_up, lb->exp_up, E * F, H, 5) +
                  rows_differ(lq->exp_down, lq->t_exp_down, lb->exp_down, E * H, F, 3) +
                  rows_differ(lq->sh_gate, lq->t_sh_gate, lb->sh_gate, S, H, 1) +
                  rows_differ(lq->sh_up, lq->t_sh_up, lb->sh_up, S, H, 1) +
                  rows_differ(lq->sh_down, lq->t_sh_down, lb->sh_down, H, S, 1);
        CHECK(!bad, "file %d: %d expert weights differ from the bf16 load", f, bad);
        static const char *programs[] = {"base", "0-1,1-5", "0,2-5"};
        float *lgq = malloc((size_t)a.vocab * 4), *lgb = malloc((size_t)a.vocab * 4);
        for (int p = 0; p < 3; p++) {
            float d = 0, mx = 0;
            prompt_logits(q, programs[p], lgq);
            prompt_logits(b, programs[p], lgb);
            for (int v = 0; v < a.vocab; v++) d = nan_max(d, fabsf(lgq[v] - lgb[v])), mx = fmaxf(mx, fabsf(lgb[v]));
            CHECK(d <= 0.05f * mx, "file %d %s: quantized logits differ by %g (max |logit| %g)", f, programs[p], d, mx);
            printf("  random qwen2_moe, %s experts of %d rows, %-8s max |logit diff| %.3g of max |logit| %.3g\n",
                   cpu_wtype_name(files[f].gate), F, programs[p], d, mx);
        }
        /* the bf16 load saves (its experts as a GGUF holds them, in two stacks) and loads back the same */
        char save[160];
        snprintf(save, sizeof save, "%s/moe-saved%d", dir, f);
        polar_model *s = NULL;
        CHECK_OK(polar_model_save(b, save, &err));
        CHECK_OK(polar_model_load(save, &s, &err));
        if (s) {
            prompt_logits(b, "0-1,1-5", lgb);
            prompt_logits(s, "0-1,1-5", lgq);
            CHECK(!memcmp(lgb, lgq, (size_t)a.vocab * 4), "file %d: the saved checkpoint's logits differ", f);
        }
        polar_model_free(s);
        free(lgq);
        free(lgb);
        polar_model_free(m);
        polar_model_free(q);
        polar_model_free(b);
    }
}

/* Fixture prompt ids through both loads, then 16 greedy steps, both fed
 * the bf16 path's token (teacher forcing, so one near-tie does not send the
 * two down different texts): at every step the logits within LOGIT_TOL;
 * where the argmaxes differ, the bf16 logits of the two tokens are within
 * TIE_TOL of each other (a near tie that int8 activations may flip). */
static void compare_prompt(polar_model *q, polar_model *b, const st_tensor *ids, int p) {
    polar_error err;
    int n = (int)ids->shape[0], V = q->arch.vocab;
    polar_program prog;
    polar_session *sq = NULL, *sb = NULL;
    CHECK_OK(polar_program_base(q->arch.n_layers, &prog, &err));
    polar_session_opts so = {.max_ctx = n + STEPS + 1, .n_threads = 2};
    CHECK_OK(polar_session_create(q, &prog, &so, &sq, &err));
    CHECK_OK(polar_session_create(b, &prog, &so, &sb, &err));
    if (sq && sb) {
        CHECK_OK(polar_prefill(sq, ids->data, n, NULL, &err));
        CHECK_OK(polar_prefill(sb, ids->data, n, NULL, &err));
        float worst = 0, worst_margin = 0;
        int same = 0;
        for (int step = 0; step < STEPS; step++) {
            const float *lq = polar_logits(sq), *lb = polar_logits(sb);
            float d = 0;
            for (int v = 0; v < V; v++) d = nan_max(d, fabsf(lq[v] - lb[v]));
            worst = fmaxf(worst, d);
            int tq = polar_argmax(lq, V), tb = polar_argmax(lb, V);
            if (tq == tb) {
                same++;
            } else {
                float margin = lb[tb] - lb[tq];
                worst_margin = fmaxf(worst_margin, margin);
                CHECK(margin <= TIE_TOL, "prompt %d step %d: quantized picks %d, bf16 %d, %g logits ahead", p, step, tq,
                      tb, margin);
            }
            CHECK_OK(polar_decode_step(sq, tb, &err));
            CHECK_OK(polar_decode_step(sb, tb, &err));
        }
        CHECK(worst <= LOGIT_TOL, "prompt %d: max |logit diff| %g > %g", p, worst, LOGIT_TOL);
        printf("  prompt %d (%d tokens): quantized vs bf16 max |logit diff| %.3g over %d steps; greedy equal %d of %d "
               "(the others near ties: bf16 margin <= %.3g)\n",
               p, n, worst, STEPS, same, STEPS, worst_margin);
    }
    polar_session_free(sq);
    polar_session_free(sb);
    polar_program_free(&prog);
}

static void default_model_quantized(void) {
    const char *path = getenv("POLAR_DEFAULT_MODEL");
    if (!path || !*path) {
        printf("SKIP default_model_quantized: skipped: POLAR_DEFAULT_MODEL is not set (make test sets it)\n");
        return;
    }
    polar_error err;
    polar_model *q = NULL, *b = NULL;
    st_file exp = {0};
    CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
    CHECK_OK(st_open(GOLDEN_DIR "/default_model.safetensors", &exp, &err));
    if (q && b && exp.tensors) {
        cpu_wtype q4_1 = kept_as(CPU_W_Q4_1), q8_0 = kept_as(CPU_W_Q8_0);
        CHECK(q->layers[0].t_wq == q4_1 && q->t_embed == q8_0 && q->t_lm_head == q8_0,
              "Q4_1 layers, Q8_0 embedding and head kept quantized (as %s, %s)", cpu_wtype_name(q4_1),
              cpu_wtype_name(q8_0));
        for (int p = 0; p < 3; p++) {
            char name[32];
            snprintf(name, sizeof name, "p%d.ids", p);
            const st_tensor *ids = st_find(&exp, name);
            CHECK(ids, "fixture prompt %d", p);
            if (ids) compare_prompt(q, b, ids, p);
        }
    }
    st_close(&exp);
    polar_model_free(q);
    polar_model_free(b);
}

int main(void) {
    if (!load_fixture()) printf("FAIL quant fixture: %s/quant_blocks.bin missing or malformed\n", GOLDEN_DIR);
    RUN(dequantize_by_definition);
    RUN(gguf_py_blocks);
    RUN(levels);
    RUN(nonfinite_activations);
    if (!mkdtemp(dir)) return 1;
    RUN(q8_0_gguf_model);
    RUN(k_quant_gguf_model);
    RUN(moe_gguf_model);
    RUN(iq4_gguf_model);
    RUN(malformed_blocks);
    RUN(default_model_quantized);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    TEST_EXIT();
}
