/* Predictor training: every op's backward and the whole network's gradient
 * against central finite differences, dropout repeatable from its seed,
 * the AVX2 products equal to the plain C ones, the training forward equal
 * to the inference forward, the loss, gradients
 * and 20 AdamW steps against PyTorch (tests/golden/train), AdamW and the
 * learning-rate schedule, save -> load, bad batches, the fit measure.
 *
 * Finite differences run in f32 (the code under test is f32): step 1e-2 for
 * single ops, 1e-3 for the network. An entry passes when
 * |numeric - analytic| <= 2e-3 * max(1, max |analytic| of that tensor) for
 * the ops; the network passes per tensor when ||numeric - analytic|| <=
 * 1e-2 ||analytic|| + 1e-4 (a step may cross a ReLU kink, so single entries
 * are not held to a bound). */
#include <unistd.h>

#include "../loader/safetensors.h"
#include "../predictor/train.h"
#include "harness.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define OP_TOL 2e-3

/* pred_batch_grad with a workspace of its own (a workspace fits one
 * predictor's shapes). */
static polar_status batch_grad(const polar_predictor *p, const polar_train_example *ex, int n, float dropout,
                               uint64_t seed, uint64_t step, float *grad, double *loss, polar_error *err) {
    pred_batch_ws ws = {0};
    polar_status st = pred_batch_grad(p, ex, n, dropout, seed, step, grad, loss, &ws, err);
    pred_batch_ws_free(&ws);
    return st;
}

static float urand(polar_rng *r) { return (float)(2.0 * polar_rng_uniform(r) - 1.0); }
static void fill(float *x, size_t n, float scale, polar_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = scale * urand(r);
}
static double dotd(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Compare analytic gradient an[n] with central differences of f over x[n]. */
typedef double (*scalar_fn)(void *ctx);
static double fd_max_err(scalar_fn f, void *ctx, float *x, const float *an, size_t n, float h) {
    double worst = 0, amax = 1;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(an[i]));
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double up = f(ctx);
        x[i] = keep - h;
        double dn = f(ctx);
        x[i] = keep;
        worst = fmax(worst, fabs((up - dn) / (2.0 * h) - an[i]) / amax);
    }
    return worst;
}

/* ------------------------------------------------------------------ ops */

/* The AVX2 products against the plain C ones, on shapes with partial blocks
 * (tokens not a multiple of 3 or 6, rows not of 4, columns not of 8 or 16)
 * and in both loop orders of nn (dx = dy W, dW = dy^T x). */
static void gemm_levels(void) {
#if defined(__x86_64__)
    if (tr_gemm_active() != &tr_gemm_avx2) {
        printf("  the CPU kernels are %s: AVX2 products not run\n", polar_cpu_kernels());
        return;
    }
    static const int shapes[][3] = {{7, 13, 37}, {30, 20, 64}, {5, 6, 16}, {128, 24, 40}, {1, 1, 1}};
    polar_rng r;
    polar_rng_seed(&r, 3);
    double worst = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int n = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2];
        size_t nx = (size_t)n * cols, nw = (size_t)rows * cols, ny = (size_t)n * rows;
        float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w), *b = malloc(rows * sizeof *b);
        float *y[2], *dx[2], *dw[2];
        fill(x, nx, 1, &r), fill(w, nw, 1, &r), fill(b, rows, 1, &r);
        for (int k = 0; k < 2; k++) {
            const tr_gemm *g = k ? &tr_gemm_avx2 : &tr_gemm_generic;
            y[k] = malloc(ny * sizeof *y[k]), dx[k] = malloc(nx * sizeof *dx[k]), dw[k] = malloc(nw * sizeof *dw[k]);
            g->nt(y[k], x, w, s % 2 ? b : NULL, n, rows, cols);
            memcpy(dx[k], x, nx * sizeof *x); /* accumulate onto something */
            memcpy(dw[k], w, nw * sizeof *w);
            g->nn(dx[k], cols, y[0], rows, 1, w, cols, n, rows, cols);
            g->nn(dw[k], cols, y[0], 1, rows, x, cols, rows, n, cols);
        }
        double e = 0, scale = 1;
        for (size_t i = 0; i < ny; i++) scale = fmax(scale, fabs(y[0][i])), e = fmax(e, fabs(y[0][i] - y[1][i]));
        for (size_t i = 0; i < nx; i++) scale = fmax(scale, fabs(dx[0][i])), e = fmax(e, fabs(dx[0][i] - dx[1][i]));
        for (size_t i = 0; i < nw; i++) scale = fmax(scale, fabs(dw[0][i])), e = fmax(e, fabs(dw[0][i] - dw[1][i]));
        CHECK(e <= 1e-5 * scale, "%d x %d x %d: avx2 %g from plain C (scale %g)", n, rows, cols, e, scale);
        worst = fmax(worst, e / scale);
        for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]);
        free(x), free(w), free(b);
    }
    printf("  avx2 against plain C: %.1e relative\n", worst);
#endif
}

typedef struct {
    int n, rows, cols;
    float *x, *w, *b, *y, *R;
} lin_ctx;
static double lin_loss(void *c) {
    lin_ctx *k = c;
    tr_linear_fwd(k->y, k->x, k->w, k->b, k->n, k->rows, k->cols);
    return dotd(k->y, k->R, (size_t)k->n * k->rows);
}

static void op_linear(void) {
    polar_rng r;
    polar_rng_seed(&r, 1);
    lin_ctx k = {3, 5, 7, NULL, NULL, NULL, NULL, NULL};
    float x[21], w[35], b[5], y[15], R[15], dx[21] = {0}, dw[35] = {0}, db[5] = {0};
    k.x = x, k.w = w, k.b = b, k.y = y, k.R = R;
    fill(x, 21, 1, &r), fill(w, 35, 1, &r), fill(b, 5, 1, &r), fill(R, 15, 1, &r);
    tr_linear_bwd(dx, dw, db, R, x, w, 3, 5, 7);
    double e = fmax(fd_max_err(lin_loss, &k, x, dx, 21, 1e-2f),
                    fmax(fd_max_err(lin_loss, &k, w, dw, 35, 1e-2f), fd_max_err(lin_loss, &k, b, db, 5, 1e-2f)));
    CHECK(e <= OP_TOL, "linear: max relative error %g", e);
    printf("  linear: %.1e\n", e);
}

typedef struct {
    int n, d;
    float *x, *w, *b, *y, *mean, *rstd, *R;
} ln_ctx;
static double ln_loss(void *c) {
    ln_ctx *k = c;
    tr_layernorm_fwd(k->y, k->mean, k->rstd, k->x, k->w, k->b, k->n, k->d);
    return dotd(k->y, k->R, (size_t)k->n * k->d);
}

static void op_layernorm(void) {
    polar_rng r;
    polar_rng_seed(&r, 2);
    float x[24], w[8], b[8], y[24], R[24], mean[3], rstd[3], dx[24] = {0}, dw[8] = {0}, db[8] = {0};
    ln_ctx k = {3, 8, x, w, b, y, mean, rstd, R};
    fill(x, 24, 2, &r), fill(w, 8, 1, &r), fill(b, 8, 1, &r), fill(R, 24, 1, &r);
    ln_loss(&k);
    tr_layernorm_bwd(dx, dw, db, R, x, mean, rstd, w, 3, 8);
    double e = fmax(fd_max_err(ln_loss, &k, x, dx, 24, 1e-2f),
                    fmax(fd_max_err(ln_loss, &k, w, dw, 8, 1e-2f), fd_max_err(ln_loss, &k, b, db, 8, 1e-2f)));
    CHECK(e <= OP_TOL, "layernorm: max relative error %g", e);
    printf("  layernorm: %.1e\n", e);
}

/* ReLU then dropout (a fixed mask from a fixed seed): inputs kept away from 0. */
typedef struct {
    float *x, *y, *z, *R;
    unsigned char *keep;
    float p;
} rd_ctx;
static double rd_loss(void *c) {
    rd_ctx *k = c;
    polar_rng r;
    polar_rng_seed(&r, 99);
    memcpy(k->y, k->x, 16 * sizeof(float));
    tr_relu_fwd(k->y, 16);
    tr_dropout_fwd(k->z, k->keep, k->y, 16, k->p, &r);
    return dotd(k->z, k->R, 16);
}

static void op_relu_dropout(void) {
    polar_rng r;
    polar_rng_seed(&r, 3);
    float x[16], y[16], z[16], R[16], dx[16] = {0};
    unsigned char keep[16];
    for (int i = 0; i < 16; i++) x[i] = (i % 2 ? 1 : -1) * (0.2f + 0.05f * i);
    fill(R, 16, 1, &r);
    rd_ctx k = {x, y, z, R, keep, 0.25f};
    rd_loss(&k);
    int dropped = 0;
    for (int i = 0; i < 16; i++) dropped += !keep[i];
    tr_dropout_bwd(dx, R, keep, 16, k.p);
    tr_relu_bwd(dx, y, 16);
    double e = fd_max_err(rd_loss, &k, x, dx, 16, 1e-2f);
    CHECK(e <= OP_TOL && dropped > 0 && dropped < 16, "relu+dropout: error %g, %d of 16 dropped", e, dropped);
    printf("  relu + dropout (%d of 16 dropped): %.1e\n", dropped, e);
}

/* Cross-shaped attention (nq 3, nk 5, d 8, 2 heads), dropout 0 and 0.3. */
typedef struct {
    float *Q, *K, *V, *ctx, *P, *Pd, *R, p;
} at_ctx;
static double at_loss(void *c) {
    at_ctx *k = c;
    polar_rng r;
    polar_rng_seed(&r, 7);
    tr_attn_fwd(k->ctx, k->P, k->Pd, k->Q, k->K, k->V, 3, 5, 8, 2, k->p, &r);
    return dotd(k->ctx, k->R, 24);
}

static void op_attention(void) {
    for (int drop = 0; drop < 2; drop++) {
        polar_rng r;
        polar_rng_seed(&r, 4);
        float Q[24], K[40], V[40], ctx[24], P[30], Pd[30], R[24], dQ[24] = {0}, dK[40] = {0}, dV[40] = {0}, s[5];
        fill(Q, 24, 1.5f, &r), fill(K, 40, 1.5f, &r), fill(V, 40, 1, &r), fill(R, 24, 1, &r);
        at_ctx k = {Q, K, V, ctx, P, drop ? Pd : P, R, drop ? 0.3f : 0.0f};
        at_loss(&k);
        tr_attn_bwd(dQ, dK, dV, R, P, k.Pd, Q, K, V, 3, 5, 8, 2, k.p, s);
        double e = fmax(fd_max_err(at_loss, &k, Q, dQ, 24, 1e-2f),
                        fmax(fd_max_err(at_loss, &k, K, dK, 40, 1e-2f), fd_max_err(at_loss, &k, V, dV, 40, 1e-2f)));
        CHECK(e <= OP_TOL, "attention (dropout %g): max relative error %g", k.p, e);
        printf("  attention, dropout %.1f: %.1e\n", k.p, e);
    }
}

typedef struct {
    float *seg, *op;
    unsigned char *st;
    int *ops;
} loss_ctx;
static double loss_fn(void *c) {
    loss_ctx *k = c;
    return tr_example_loss(k->seg, k->op, k->st, k->ops, 6, NULL, NULL, 1);
}

static void op_loss(void) {
    polar_rng r;
    polar_rng_seed(&r, 5);
    float seg[6], op[18], dseg[6], dop[18];
    unsigned char st[6] = {1, 0, 1, 1, 0, 0};
    int ops[6] = {1, -1, 0, 2, -1, -1};
    fill(seg, 6, 3, &r), fill(op, 18, 3, &r);
    loss_ctx k = {seg, op, st, ops};
    double l = tr_example_loss(seg, op, st, ops, 6, dseg, dop, 1);
    CHECK(dseg[0] == 0 && dop[3] == 0 && dop[4] == 0, "no gradient at position 0's seg or unlabeled ops");
    double e = fmax(fd_max_err(loss_fn, &k, seg, dseg, 6, 1e-2f), fd_max_err(loss_fn, &k, op, dop, 18, 1e-2f));
    CHECK(e <= OP_TOL, "loss: max relative error %g", e);
    /* by hand: all-zero logits give log 2 + log 3 */
    float z[18] = {0};
    double l0 = tr_example_loss(z, z, st, ops, 6, NULL, NULL, 1);
    CHECK(fabs(l0 - (log(2.0) + log(3.0))) < 1e-9, "zero logits: %g", l0);
    printf("  loss %.4f: %.1e\n", l, e);
}

/* -------------------------------------------------------------- network */

#define TD 6
#define TDQ 8

typedef struct {
    polar_predictor *p;
    polar_train_example ex[3];
    float h[3][7 * TDQ];
    unsigned char st[3][TD];
    int ops[3][TD];
} batch;

static polar_predictor *tiny(uint64_t seed) {
    polar_predictor_shape s = {TD, 16, 2, 32, TDQ};
    polar_predictor *p = NULL;
    polar_error err;
    CHECK_OK(polar_predictor_create(&s, seed, &p, &err));
    /* non-trivial norms and biases so their gradients are exercised */
    polar_rng r;
    polar_rng_seed(&r, seed + 1);
    for (size_t i = 0; p && i < p->storage_floats; i++) p->storage[i] += 0.05f * urand(&r);
    return p;
}

static void make_batch(batch *b, polar_predictor *p) {
    static const char *progs[3] = {"0-5", "0-1,3-5x2", "0,2-3x2"};
    static const int Ts[3] = {5, 3, 7};
    static const float w[3] = {0.3f, 1.0f, 1.0f};
    polar_rng r;
    polar_rng_seed(&r, 11);
    b->p = p;
    for (int i = 0; i < 3; i++) {
        polar_error err;
        polar_program pr;
        CHECK_OK(polar_program_parse(progs[i], TD, 0, &pr, &err));
        CHECK_OK(polar_program_to_segments(&pr, TD, 4, b->st[i], b->ops[i], &err));
        polar_program_free(&pr);
        fill(b->h[i], (size_t)Ts[i] * TDQ, 1, &r);
        b->ex[i] = (polar_train_example){b->h[i], Ts[i], b->st[i], b->ops[i], w[i]};
    }
}

typedef struct {
    batch *b;
    float drop;
} net_ctx;
static double net_loss(void *c) {
    net_ctx *k = c;
    double l = 0;
    polar_error err;
    CHECK_OK(batch_grad(k->b->p, k->b->ex, 3, k->drop, 5, 3, NULL, &l, &err));
    return l;
}

#define NET_SAMPLES 32 /* entries checked per tensor */

static double central(scalar_fn f, void *ctx, float *x, float h) {
    float keep = *x;
    *x = keep + h;
    double up = f(ctx);
    *x = keep - h;
    double dn = f(ctx);
    *x = keep;
    return (up - dn) / (2.0 * h);
}

static void network_gradient(void) {
    for (int drop = 0; drop < 2; drop++) {
        batch b;
        polar_predictor *p = tiny(21);
        if (!p) return;
        make_batch(&b, p);
        net_ctx k = {&b, drop ? 0.1f : 0.0f};
        float *g = malloc(p->storage_floats * sizeof *g);
        double l;
        polar_error err;
        CHECK_OK(batch_grad(p, b.ex, 3, k.drop, 5, 3, g, &l, &err));
        CHECK(fabs(l - net_loss(&k)) == 0, "the loss with and without the gradient");
        pred_ref refs[PRED_TENSORS];
        polar_predictor q = *p;
        int n = pred_tensor_refs(&q, refs);
        double worst = 0;
        const char *worst_name = "";
        int checked = 0, kinks = 0;
        for (int t = 0; t < n; t++) {
            size_t off = (size_t)(*refs[t].dst - p->storage), cnt = (size_t)refs[t].rows * (refs[t].cols ? refs[t].cols : 1);
            size_t stride = cnt > NET_SAMPLES ? cnt / NET_SAMPLES : 1;
            double num2 = 0, den2 = 0;
            for (size_t i = (size_t)t % stride; i < cnt; i += stride) {
                float *x = p->storage + off + i;
                double fd1 = central(net_loss, &k, x, 1e-3f), fd2 = central(net_loss, &k, x, 2e-3f), an = g[off + i];
                /* a ReLU kink within the step: the two differences disagree beyond f32 noise */
                if (fabs(fd1 - fd2) > 1e-4 + 0.02 * fabs(fd1)) {
                    kinks++;
                    continue;
                }
                num2 += (fd1 - an) * (fd1 - an);
                den2 += an * an;
                checked++;
            }
            double rel = sqrt(num2) / (sqrt(den2) + 1e-2);
            CHECK(sqrt(num2) <= 1e-2 * sqrt(den2) + 1e-4, "%s (dropout %g): |fd - grad| %g, |grad| %g", refs[t].name,
                  k.drop, sqrt(num2), sqrt(den2));
            if (rel > worst) worst = rel, worst_name = refs[t].name;
        }
        CHECK(kinks < checked / 20, "%d entries skipped as kinks, %d checked", kinks, checked);
        printf("  dropout %.1f: loss %.5f, %d tensors, %d entries (%d at kinks skipped), worst %s at %.1e relative\n",
               k.drop, l, n, checked, kinks, worst_name, worst);
        free(g);
        polar_predictor_free(p);
    }
}

/* The batch loss (weights normalised per batch, per-thread buffers) equals
 * the example losses of polar_predict_logits' outputs. On the CPU inference
 * is the training forward itself, so this checks the batch bookkeeping; the
 * forward's math is checked against PyTorch (test_predictor, make_train_golden). */
static void train_forward_matches_inference(void) {
    batch b;
    polar_predictor *p = tiny(31);
    if (!p) return;
    make_batch(&b, p);
    polar_error err;
    double want = 0, wsum = 0, got;
    for (int i = 0; i < 3; i++) wsum += b.ex[i].weight;
    for (int i = 0; i < 3; i++) {
        float seg[TD], op[3 * TD];
        CHECK_OK(polar_predict_logits(p, b.ex[i].h, b.ex[i].T, seg, op, &err));
        want += b.ex[i].weight / (wsum / 3 + 1e-8) * tr_example_loss(seg, op, b.st[i], b.ops[i], TD, NULL, NULL, 1);
    }
    want /= 3;
    CHECK_OK(polar_train_loss(p, b.ex, 3, &got, &err));
    CHECK(fabs(got - want) <= 1e-5 * fabs(want), "eval loss %.7f, from the inference forward %.7f", got, want);
    polar_predictor_free(p);
}

static void dropout_repeats(void) {
    batch b;
    polar_predictor *p = tiny(41);
    if (!p) return;
    make_batch(&b, p);
    polar_error err;
    double l1, l2, l3, l0;
    float *g1 = malloc(p->storage_floats * sizeof *g1), *g2 = malloc(p->storage_floats * sizeof *g2);
    CHECK_OK(batch_grad(p, b.ex, 3, 0.1f, 77, 0, g1, &l1, &err));
    CHECK_OK(batch_grad(p, b.ex, 3, 0.1f, 77, 0, g2, &l2, &err));
    CHECK_OK(batch_grad(p, b.ex, 3, 0.1f, 78, 0, NULL, &l3, &err));
    CHECK_OK(polar_train_loss(p, b.ex, 3, &l0, &err));
    CHECK(l1 == l2 && !memcmp(g1, g2, p->storage_floats * sizeof *g1), "same seed: %.9f vs %.9f", l1, l2);
    CHECK(l1 != l3 && l1 != l0, "another seed or no dropout differ: %g %g %g", l1, l3, l0);
#ifdef _OPENMP
    /* the same masks (seeded per example) and the sums made in fixed chunks: 1, 2 and 3 threads give the
     * same bits, on a batch of 3 (a chunk an example) and of 20 (chunks of one or two examples) */
    polar_train_example many[20];
    for (int i = 0; i < 20; i++) many[i] = b.ex[i % 3];
    int nt = omp_get_max_threads();
    for (int n = 3; n <= 20; n += 17) {
        omp_set_num_threads(1);
        CHECK_OK(batch_grad(p, many, n, 0.1f, 77, 0, g1, &l1, &err));
        for (int t = 2; t <= 3; t++) {
            omp_set_num_threads(t);
            CHECK_OK(batch_grad(p, many, n, 0.1f, 77, 0, g2, &l2, &err));
            CHECK(l1 == l2 && !memcmp(g1, g2, p->storage_floats * sizeof *g1), "batch of %d, 1 vs %d threads: %.17g %.17g",
                  n, t, l1, l2);
        }
    }
    omp_set_num_threads(nt);
#endif
    free(g1);
    free(g2);
    polar_predictor_free(p);
}

static void schedule_and_adamw(void) {
    polar_predictor *p = tiny(51);
    if (!p) return;
    polar_error err;
    polar_train_opts o = polar_train_defaults(100);
    o.lr = 1e-2; /* a tiny network overfitting one batch */
    polar_trainer *t = NULL;
    CHECK_OK(polar_trainer_create(p, &o, &t, &err));
    if (!t) return;
    batch b;
    make_batch(&b, p);
    /* LambdaLR (in units of lr): 0 at the first step, 1 at the end of warm-up, half way down the cosine at 55, 0 at 100 */
    double want[][2] = {{0, 0}, {5, 0.5}, {10, 1}, {55, 0.5}, {100, 0}};
    double first = 0, last = 0;
    for (int s = 0, k = 0; s <= 100; s++) {
        if (k < 5 && s == (int)want[k][0]) {
            CHECK(fabs(polar_trainer_lr(t) - o.lr * want[k][1]) < 1e-12, "lr at step %d: %g, want %g", s,
                  polar_trainer_lr(t), o.lr * want[k][1]);
            k++;
        }
        if (s == 100) break;
        double l;
        CHECK_OK(polar_train_step(t, b.ex, 3, &l, &err));
        if (s == 0) first = l;
        last = l;
    }
    CHECK(polar_trainer_steps(t) == 100, "steps %d", polar_trainer_steps(t));
    double ev;
    CHECK_OK(polar_train_loss(p, b.ex, 3, &ev, &err));
    CHECK(ev < 0.3 * first, "100 steps on one batch: loss %.4f -> %.4f (eval %.4f)", first, last, ev);
    printf("  100 AdamW steps on one batch: %.4f -> %.4f (eval %.4f)\n", first, last, ev);
    polar_trainer_free(t);
    polar_predictor_free(p);
}

static void save_and_load(void) {
    polar_predictor *p = tiny(61), *q = NULL;
    if (!p) return;
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-train-%d.safetensors", (int)getpid());
    polar_error err;
    CHECK_OK(polar_predictor_save(p, path, &err));
    CHECK_OK(polar_predictor_load(path, &q, &err));
    unlink(path);
    if (!q) return;
    CHECK(q->heads == 2 && q->D == TD && q->d == 16 && q->ff == 32 && q->dq == TDQ, "shape back");
    CHECK(q->storage_floats == p->storage_floats &&
              !memcmp(q->storage, p->storage, p->storage_floats * sizeof(float)),
          "weights back bit for bit");
    polar_predictor_free(q);
    polar_predictor_free(p);
    /* a fresh default-shape predictor: blocks start equal, norms 1, biases 0 */
    polar_predictor_shape s = polar_predictor_default_shape(28, 64);
    CHECK_OK(polar_predictor_create(&s, 1, &p, &err));
    if (!p) return;
    size_t blk = (size_t)(p->blocks[1].attn.in_w - p->blocks[0].attn.in_w);
    CHECK(!memcmp(p->blocks[0].attn.in_w, p->blocks[1].attn.in_w, blk * sizeof(float)), "block 1 copies block 0");
    CHECK(p->blocks[0].norm1_w[5] == 1 && p->blocks[0].norm2_b[3] == 0 && p->cross.in_b[7] == 0, "init constants");
    float m = 0;
    for (int i = 0; i < 256 * 64; i++) m = fmaxf(m, fabsf(p->q_proj_w[i]));
    CHECK(m <= 1.0f / 8.0f && m > 0.12f, "q_proj in +-1/sqrt(64): max %g", m);
    polar_predictor_free(p);
}

static void bad_batches(void) {
    batch b;
    polar_predictor *p = tiny(71);
    if (!p) return;
    make_batch(&b, p);
    polar_error err;
    double l;
    polar_train_example e = b.ex[0];
    int ops[TD] = {1, -1, 3, -1, -1, -1};
    struct {
        polar_train_example ex;
        const char *why;
    } bad[] = {
        {{e.h, 0, e.seg_start, e.ops, 1}, "token states"},
        {{e.h, 513, e.seg_start, e.ops, 1}, "token states"},
        {{NULL, 5, e.seg_start, e.ops, 1}, "is empty"},
        {{e.h, 5, e.seg_start, ops, 1}, "op 3 at layer 2"},
        {{e.h, 5, e.seg_start, e.ops, NAN}, "weight"},
        {{e.h, 5, e.seg_start, e.ops, -1}, "weight"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        polar_status st = polar_train_loss(p, &bad[i].ex, 1, &l, &err);
        CHECK(st == POLAR_ERR_ARG && strstr(err.msg, bad[i].why), "case %zu: %s", i, err.msg);
    }
    CHECK(polar_train_loss(p, b.ex, 0, &l, &err) == POLAR_ERR_ARG, "empty batch");
    polar_train_opts o = polar_train_defaults(0);
    polar_trainer *t = NULL;
    CHECK(polar_trainer_create(p, &o, &t, &err) == POLAR_ERR_ARG && !t, "zero steps: %s", err.msg);
    polar_predictor_shape s = {TD, 15, 2, 32, TDQ};
    polar_predictor *q = NULL;
    CHECK(polar_predictor_create(&s, 1, &q, &err) == POLAR_ERR_ARG && !q, "d not divisible by heads: %s", err.msg);
    polar_predictor_free(p);
}

/* Labels -> examples: the base program weighted 0.3 only beside a shorter
 * valid program, at most max_paths per question, rejects counted, questions
 * without examples and a torn last line left out; the lines of one question
 * in two files pooled, each program once. */
static void labels_to_examples(void) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-labels-%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("{\"question\":\"a\",\"final_valid_transitions\":[[0,1,2,3,4,5],[0,1,2,4,5]]}\n", f);
    fputs("{\"question\":\"b\",\"final_valid_transitions\":[[0,1,2,3,4,5],[0,1,2,2,3,4,5]]}\n", f);
    fputs("{\"question\":\"c\",\"final_valid_transitions\":[]}\n", f);
    fputs("{\"question\":\"d\",\"final_valid_transitions\":[[0,2,1,3,4,5],[1,2],[2,3],[3,4],[4,5],[0,5]]}\n", f);
    fputs("{\"question\":\"e\",\"final_valid_transitions\":[[0,1]", f);
    fclose(f);
    const char *files[1] = {path};
    polar_train_labels l;
    polar_error err;
    CHECK_OK(polar_train_labels_load(files, 1, 6, 3, 0.3f, 1, &l, &err));
    CHECK(l.lines == 4 && l.n == 3 && l.no_examples == 1, "%d lines, %d questions, %d without examples", l.lines, l.n,
          l.no_examples);
    if (l.n == 3) {
        CHECK(!strcmp(l.q[0].question, "a") && l.q[0].n == 2, "question a");
        CHECK(l.q[0].weight[0] == 0.3f && l.q[0].weight[1] == 1.0f, "base beside a shorter program: 0.3");
        CHECK(l.q[1].n == 2 && l.q[1].weight[0] == 1.0f, "base beside a longer program only: 1");
        CHECK(l.q[1].seg_start[6 + 2] == 1 && l.q[1].ops[6 + 2] == 2, "layer 2 repeated: a repeat segment");
        CHECK(l.q[2].n + l.rejected == 3 && l.capped == 3, "d: 3 of 6 taken, %d rejected", l.rejected);
    }
    CHECK(l.programs == 7, "programs taken %d", l.programs);
    polar_train_labels l2;
    CHECK_OK(polar_train_labels_load(files, 1, 6, 3, 0.3f, 1, &l2, &err));
    CHECK(l.n == 3 && l2.n == 3 && l2.q[2].n == l.q[2].n && !memcmp(l2.q[2].ops, l.q[2].ops, 6 * l.q[2].n * sizeof(int)),
          "the same seed, the same choice");
    polar_train_labels_free(&l2);
    polar_train_labels_free(&l);
    /* a second file asking a and c again: pooled into the first file's
     * questions, a's base program found again taken once, c now with one */
    char path2[160];
    snprintf(path2, sizeof path2, "%s.2", path);
    if ((f = fopen(path2, "w"))) {
        fputs("{\"question\":\"c\",\"final_valid_transitions\":[[0,1,2,3,5]]}\n", f);
        fputs("{\"question\":\"a\",\"final_valid_transitions\":[[0,1,2,3,4,5],[0,0,1,2,3,4,5]]}\n", f);
        fputs("{\"question\":\"f\",\"final_valid_transitions\":[[0,1,2,3,4,5]]}\n", f);
        fclose(f);
        const char *both[2] = {path, path2};
        CHECK_OK(polar_train_labels_load(both, 2, 6, 3, 0.3f, 1, &l, &err));
        CHECK(l.lines == 7 && l.merged == 2 && l.duplicates == 1 && l.n == 5 && l.no_examples == 0,
              "two files: %d lines, %d merged, %d duplicates, %d questions, %d without examples", l.lines, l.merged,
              l.duplicates, l.n, l.no_examples);
        if (l.n == 5) {
            CHECK(!strcmp(l.q[0].question, "a") && l.q[0].n == 3, "a pooled: %d examples, not 3", l.q[0].n);
            CHECK(l.q[0].weight[0] == 0.3f && l.q[0].weight[2] == 1.0f, "a: base 0.3 (shorter program), repeat 1");
            CHECK(!strcmp(l.q[2].question, "c") && l.q[2].n == 1, "c: the second file's program, in c's place");
            CHECK(!strcmp(l.q[4].question, "f") && l.q[4].weight[0] == 1.0f, "f last, its base program weight 1");
        }
        polar_train_labels_free(&l);
        unlink(path2);
    }
    f = fopen(path, "w");
    fputs("{\"question\":\"a\",\"final_valid_transitions\":[[0,1,9]]}\n", f);
    fclose(f);
    CHECK(polar_train_labels_load(files, 1, 6, 3, 0.3f, 1, &l, &err) == POLAR_ERR_FORMAT && strstr(err.msg, ":1:"),
          "a layer past D: %s", err.msg);
    unlink(path);
    /* a device reads one endless line: refused at the line cap, not read until memory runs out */
    const char *zero[1] = {"/dev/zero"};
    CHECK(polar_train_labels_load(zero, 1, 6, 3, 0.3f, 1, &l, &err) == POLAR_ERR_FORMAT &&
              strstr(err.msg, "/dev/zero:1: a line over 64 MiB"),
          "/dev/zero: %s", err.msg);
}

/* The fit counts each question as its beam ranks its valid programs: labels
 * made from a tiny predictor's own rankings. Question 0 holds its top
 * program, 1 its second only, 2 none of its top 5; 3 has 0's features (the
 * same top program: distinct tops < questions) and holds 0's top only.
 * 0, 1 and 2 hold X, a program none of them ranks high enough to count, so
 * X is the commonest (3 questions, 0's top 2). */
#define FIT_Q 4
#define FIT_T 4
static int in_candidates(const polar_candidate *c, int n, const polar_program *p) {
    for (int i = 0; i < n; i++)
        if (c[i].program.n == p->n && !memcmp(c[i].program.layers, p->layers, (size_t)p->n * sizeof(int))) return 1;
    return 0;
}

static void json_program(FILE *f, const polar_program *p) {
    fputc('[', f);
    for (int i = 0; i < p->n; i++) fprintf(f, "%s%d", i ? "," : "", p->layers[i]);
    fputc(']', f);
}

/* One labels line per question: the programs held[q][0..n[q]). */
static int write_labels(const char *path, const polar_program *held[][2], const int *n, int nq) {
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    for (int q = 0; q < nq; q++) {
        fprintf(f, "{\"question\":\"q%d\",\"final_valid_transitions\":[", q);
        for (int i = 0; i < n[q]; i++) {
            if (i) fputc(',', f);
            json_program(f, held[q][i]);
        }
        fputs("]}\n", f);
    }
    return fclose(f) == 0;
}

static polar_status fit_labels(const char *path, polar_train_labels *l, polar_error *err) {
    const char *files[1] = {path};
    polar_status st = polar_train_labels_load(files, 1, TD, 50, 0.3f, 1, l, err);
    unlink(path);
    return st;
}

static void fit_of_own_ranking(void) {
    static const char *others[] = {"0-5", "0-4", "1-5", "0-1,3-5", "0-2,4-5", "0-3,2-5", "0,2-5", "0-3",
                                   "2-5", "0-2,1-5", "0-4,3-5", "0-3,5", "0-1,0-5"};
    polar_predictor *p = tiny(71);
    if (!p) return;
    float h[FIT_Q][FIT_T * TDQ], seg[4 * TD];
    polar_candidate cand[FIT_Q][5];
    int nc[FIT_Q] = {0};
    polar_rng r;
    polar_rng_seed(&r, 72);
    polar_decode_opts o = polar_decode_defaults();
    polar_error err;
    for (int q = 0; q < FIT_Q; q++) {
        if (q < 3) fill(h[q], FIT_T * TDQ, 1, &r);
        else memcpy(h[q], h[0], sizeof h[q]);
        CHECK_OK(polar_predict_logits(p, h[q], FIT_T, seg, seg + TD, &err));
        CHECK_OK(polar_decode_programs(seg, seg + TD, TD, &o, cand[q], 5, &nc[q], &err));
    }
    /* distinct tops: 0, 1 and 2 may share theirs by chance; 3's is 0's */
    int tops = 1 + !in_candidates(cand[0], 1, &cand[1][0].program) +
               !(in_candidates(cand[0], 1, &cand[2][0].program) || in_candidates(cand[1], 1, &cand[2][0].program));
    polar_program x = {0};
    for (size_t i = 0; i < sizeof others / sizeof *others && !x.layers; i++) {
        CHECK_OK(polar_program_parse(others[i], TD, 0, &x, &err));
        if (in_candidates(cand[0], 1, &x) || in_candidates(cand[1], 2, &x) || in_candidates(cand[2], nc[2], &x))
            polar_program_free(&x);
    }
    int ok = nc[0] >= 1 && nc[1] >= 2 && nc[2] >= 1 && nc[3] == nc[0] && x.layers;
    CHECK(ok, "candidates %d %d %d %d, a program outside the rankings: %d", nc[0], nc[1], nc[2], nc[3], x.layers != 0);
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-fit-%d.jsonl", (int)getpid());
    const polar_program *held[FIT_Q][2] = {
        {&cand[0][0].program, &x}, {&cand[1][1].program, &x}, {&x}, {&cand[0][0].program}};
    const int n_held[FIT_Q] = {2, 2, 1, 1};
    polar_train_labels l = {0};
    if (ok && write_labels(path, held, n_held, FIT_Q)) CHECK_OK(fit_labels(path, &l, &err));
    CHECK(l.n == FIT_Q && l.rejected == 0, "%d questions, %d programs rejected", l.n, l.rejected);
    int T[FIT_Q] = {FIT_T, FIT_T, FIT_T, FIT_T};
    float *hp[FIT_Q] = {h[0], h[1], h[2], h[3]};
    polar_train_features feat = {FIT_Q, TDQ, T, hp, POLAR_FEATURES_COMPUTED};
    polar_program common;
    int common_n = 0;
    polar_train_fit fit, one;
    if (l.n == FIT_Q) {
        CHECK_OK(polar_train_commonest_program(&l, 0, FIT_Q, &common, &common_n, &err));
        CHECK(common_n == 3 && common.n == x.n && !memcmp(common.layers, x.layers, x.n * sizeof(int)),
              "commonest: held by %d", common_n);
        CHECK_OK(polar_train_fit_measure(p, &l, &feat, 0, FIT_Q, 5, NULL, 1, &common, &fit, &err));
        CHECK(fit.questions == FIT_Q && fit.top1 == 2 && fit.topk == 3 && fit.constant == 3 && fit.distinct_top == tops,
              "fit: %d questions, top1 %d, top5 %d, constant %d, %d distinct tops (want %d)", fit.questions, fit.top1,
              fit.topk, fit.constant, fit.distinct_top, tops);
        CHECK_OK(polar_train_fit_measure(p, &l, &feat, 1, 3, 1, NULL, 1, &cand[0][0].program, &one, &err));
        CHECK(one.questions == 2 && one.top1 == 0 && one.topk == 0 && one.constant == 0, "questions 1-2 at k 1");
        CHECK_OK(polar_train_fit_measure(p, &l, &feat, 2, 2, 5, NULL, 1, &common, &one, &err));
        CHECK(one.questions == 0 && one.top1 == 0 && one.constant == 0 && one.distinct_top == 0, "an empty range");
        CHECK(polar_train_fit_measure(p, &l, &feat, 0, FIT_Q + 1, 5, NULL, 1, NULL, &one, &err) == POLAR_ERR_ARG,
              "a range past the labels");
        feat.dq = TDQ + 1;
        CHECK(polar_train_fit_measure(p, &l, &feat, 0, FIT_Q, 5, NULL, 1, NULL, &one, &err) == POLAR_ERR_ARG,
              "features of another width");
        polar_program_free(&common);
        /* a tie (0's top and X, one question each): the first in file order */
        const polar_program *tie[1][2] = {{&cand[0][0].program, &x}};
        const int n_tie[1] = {2};
        polar_train_labels_free(&l);
        if (write_labels(path, tie, n_tie, 1)) CHECK_OK(fit_labels(path, &l, &err));
        if (l.n == 1) CHECK_OK(polar_train_commonest_program(&l, 0, 1, &common, &common_n, &err));
        CHECK(l.n == 1 && common_n == 1 && in_candidates(cand[0], 1, &common), "a tie: the first program");
        polar_program_free(&common);
    }
    polar_train_labels_free(&l);
    polar_program_free(&x);
    for (int q = 0; q < FIT_Q; q++)
        for (int i = 0; i < nc[q]; i++) polar_program_free(&cand[q][i].program);
    polar_predictor_free(p);
}

/* Against PyTorch (tests/golden/make_train_golden.py: the reference's
 * module, loss and AdamW + LambdaLR in float64 from the same f32 weights and
 * batch, dropout off): the first loss and every gradient, then the loss
 * before each of 20 AdamW steps and after the last. */
#define GOLDEN_LR 5e-3 /* LR, WARMUP, STEPS of the script */
#define GOLDEN_WARMUP 10
#define GOLDEN_STEPS 20
#define GOLDEN_MAX_B 8

static const void *golden_tensor(const st_file *f, const char *name, st_dtype dt, size_t count) {
    const st_tensor *t = st_find(f, name);
    CHECK(t && t->dtype == dt && t->nbytes == count * st_dtype_size(dt), "fixture tensor %s", name);
    return t && t->dtype == dt && t->nbytes == count * st_dtype_size(dt) ? t->data : NULL;
}

static void golden_against_pytorch(void) {
    const char *path = GOLDEN_DIR "/train/golden.safetensors";
    polar_predictor *p = NULL;
    polar_error err;
    st_file f;
    CHECK_OK(polar_predictor_load(path, &p, &err));
    if (!p) return;
    CHECK_OK(st_open(path, &f, &err));
    const st_tensor *ht = st_find(&f, "h");
    int B = ht && ht->ndim == 3 ? (int)ht->shape[0] : 0, Tm = B ? (int)ht->shape[1] : 0, D = p->D;
    CHECK(B > 0 && B <= GOLDEN_MAX_B && ht->shape[2] == p->dq, "fixture batch");
    const float *h = B ? golden_tensor(&f, "h", ST_F32, (size_t)B * Tm * p->dq) : NULL;
    const int32_t *T = golden_tensor(&f, "T", ST_I32, B), *seg = golden_tensor(&f, "seg", ST_I32, (size_t)B * D),
                  *ops = golden_tensor(&f, "ops", ST_I32, (size_t)B * D);
    const float *w = golden_tensor(&f, "weight", ST_F32, B);
    const double *want = golden_tensor(&f, "loss", ST_F64, GOLDEN_STEPS + 1);
    if (!h || !T || !seg || !ops || !w || !want) {
        st_close(&f);
        polar_predictor_free(p);
        return;
    }
    polar_train_example ex[GOLDEN_MAX_B];
    unsigned char starts[GOLDEN_MAX_B * 64];
    CHECK(D <= 64, "D %d", D);
    for (int b = 0; b < B; b++) {
        for (int l = 0; l < D; l++) starts[b * D + l] = (unsigned char)seg[b * D + l];
        ex[b] = (polar_train_example){h + (size_t)b * Tm * p->dq, T[b], starts + b * D, ops + b * D, w[b]};
    }
    float *g = malloc(p->storage_floats * sizeof *g);
    double loss = 0, worst = 0;
    const char *worst_name = "";
    CHECK_OK(batch_grad(p, ex, B, 0.0f, 0, 0, g, &loss, &err));
    CHECK(fabs(loss - want[0]) <= 1e-4 * fabs(want[0]), "loss %.8f, PyTorch %.8f", loss, want[0]);
    pred_ref refs[PRED_TENSORS];
    polar_predictor q = *p;
    int n = pred_tensor_refs(&q, refs);
    for (int t = 0; t < n; t++) {
        char name[80];
        size_t off = (size_t)(*refs[t].dst - p->storage), cnt = (size_t)refs[t].rows * (refs[t].cols ? refs[t].cols : 1);
        snprintf(name, sizeof name, "grad.%.63s", refs[t].name);
        const float *gt = golden_tensor(&f, name, ST_F32, cnt);
        if (!gt) continue;
        double scale = 0, diff = 0;
        for (size_t i = 0; i < cnt; i++) scale = fmax(scale, fabs(gt[i]));
        for (size_t i = 0; i < cnt; i++) diff = fmax(diff, fabs((double)g[off + i] - gt[i]));
        double rel = diff / (scale > 0 ? scale : 1);
        CHECK(rel <= 1e-4, "%s: gradient %.2e from PyTorch's (relative to its largest entry %.2e)", refs[t].name, rel,
              scale);
        if (rel > worst) worst = rel, worst_name = refs[t].name;
    }
    printf("  step 1: loss %.8f vs %.8f; gradients of %d tensors, worst %s at %.1e relative\n", loss, want[0], n,
           worst_name, worst);
    polar_train_opts o = polar_train_defaults(GOLDEN_STEPS);
    o.lr = GOLDEN_LR, o.warmup = GOLDEN_WARMUP, o.dropout = 0.0f;
    polar_trainer *tr = NULL;
    CHECK_OK(polar_trainer_create(p, &o, &tr, &err));
    double worst_step = 0;
    for (int s = 0; tr && s <= GOLDEN_STEPS; s++) {
        if (s < GOLDEN_STEPS) CHECK_OK(polar_train_step(tr, ex, B, &loss, &err));
        else CHECK_OK(polar_train_loss(p, ex, B, &loss, &err));
        double rel = fabs(loss - want[s]) / fabs(want[s]);
        CHECK(rel <= 1e-4, "loss before step %d: %.8f, PyTorch %.8f", s + 1, loss, want[s]);
        worst_step = fmax(worst_step, rel);
    }
    printf("  %d AdamW steps: loss %.6f -> %.6f (PyTorch %.6f), worst step %.1e relative\n", GOLDEN_STEPS, want[0],
           loss, want[GOLDEN_STEPS], worst_step);
    polar_trainer_free(tr);
    free(g);
    st_close(&f);
    polar_predictor_free(p);
}

int main(void) {
    RUN(gemm_levels);
    RUN(op_linear);
    RUN(op_layernorm);
    RUN(op_relu_dropout);
    RUN(op_attention);
    RUN(op_loss);
    RUN(network_gradient);
    RUN(golden_against_pytorch);
    RUN(train_forward_matches_inference);
    RUN(dropout_repeats);
    RUN(schedule_and_adamw);
    RUN(save_and_load);
    RUN(bad_batches);
    RUN(labels_to_examples);
    RUN(fit_of_own_ranking);
    TEST_EXIT();
}
