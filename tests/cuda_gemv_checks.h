/* test_cuda's checks of the decode variants that are off until a GPU times
 * them: the tensor-core GEMV for 3-8 tokens (POLAR_CUDA_MMA_GEMV) against
 * the f64 reference; the q/k/v GEMV with RoPE and the K/V store in its
 * epilogue (POLAR_CUDA_FUSED_ROPE) and the one-block MLP norm, router, top-k
 * and grouping with the shared expert inside the experts' launches
 * (POLAR_CUDA_FUSED_ROUTE) against the launches they replace, bit for bit. Included by test_cuda.c after cuda_kernel_checks.h (to_dev,
 * rand_weights, the paged tables). */
#ifndef POLAR_TEST_CUDA_GEMV_CHECKS_H
#define POLAR_TEST_CUDA_GEMV_CHECKS_H

/* The tensor-core GEMV (cuda_matmul_mma, POLAR_CUDA_MMA_GEMV=1) against the
 * f64 dot of the bf16-rounded inputs and the weights, within 1e-5 of the
 * row's sum |w x| (f32 sums in the warps' order), T 1-16, bias, an output
 * wider than the rows (those past them left alone), accumulated once more;
 * shapes it does not take are refused with nothing written. */
static void kernel_mma_gemv(void) {
    static const int shapes[][2] = {{48, 128}, {2048, 512}, {80, 64}, {512, 2048}, {16, 576}};
    static const int tokens[] = {3, 8, 1, 5, 16};
    int n_shapes = quick ? 2 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int sidx = 0; sidx < n_shapes; sidx++) {
        int rows = shapes[sidx][0], cols = shapes[sidx][1], ld = rows + 5;
        for (int k = 0; k < (quick ? 2 : 5); k++) {
            int T = tokens[k];
            bf16 *w = rand_weights((size_t)rows * cols, cols), *b = k % 2 ? rand_weights(rows, 100) : NULL;
            float *x = rand_floats((size_t)T * cols, 1), *y = malloc((size_t)T * ld * 4);
            double *want = malloc((size_t)T * rows * 8), *scale = malloc((size_t)T * rows * 8);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double s = b ? bf16_to_f32(b[r]) : 0.0, a = fabs(s);
                    for (int c = 0; c < cols; c++) {
                        double p = (double)bf16_to_f32(w[(size_t)r * cols + c]) *
                                   bf16_to_f32(f32_to_bf16(x[(size_t)t * cols + c]));
                        s += p, a += fabs(p);
                    }
                    want[(size_t)t * rows + r] = s, scale[(size_t)t * rows + r] = a + 1e-30;
                }
            for (size_t i = 0; i < (size_t)T * ld; i++) y[i] = -3.0f;
            bf16 *dw = to_dev(w, (size_t)rows * cols * 2), *db = b ? to_dev(b, (size_t)rows * 2) : NULL;
            float *dx = to_dev(x, (size_t)T * cols * 4), *dy = to_dev(y, (size_t)T * ld * 4);
            for (int pass = 0; pass < 2; pass++) { /* y = x W^T + b, then y += the same: twice it */
                CHECK(cuda_matmul_mma(dy, ld, dx, dw, db, T, rows, cols, pass, NULL), "%dx%d T=%d refused", rows, cols,
                      T);
                float *got = from_dev(dy, (size_t)T * ld);
                double worst = 0.0;
                for (int t = 0; t < T; t++) {
                    for (int r = 0; r < rows; r++) {
                        size_t i = (size_t)t * rows + r;
                        double e = fabs(got[(size_t)t * ld + r] - (pass + 1) * want[i]) / ((pass + 1) * scale[i]);
                        if (!(e <= worst)) worst = e;
                    }
                    for (int r = rows; r < ld; r++)
                        CHECK(got[(size_t)t * ld + r] == -3.0f, "%dx%d T=%d: a column past the rows written", rows,
                              cols, T);
                }
                CHECK(worst < 1e-5, "mma %dx%d T=%d%s pass %d: error %g of sum |w x|", rows, cols, T,
                      b ? " bias" : "", pass, worst);
                free(got);
            }
            cudaFree(dw), cudaFree(db), cudaFree(dx), cudaFree(dy);
            free(w), free(b), free(x), free(y), free(want), free(scale);
        }
    }
    static const int bad[][3] = {{40, 128, 4}, {48, 96, 4}, {48, 128, 17}, {48, 128, 0}}; /* rows, cols, T */
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)bad[i][0] * bad[i][1];
        bf16 *w = rand_weights(n, bad[i][1]), *dw = to_dev(w, n * 2);
        float *dx = dev_floats((size_t)17 * bad[i][1]), *dy = dev_floats((size_t)17 * bad[i][0]);
        CHECK(!cuda_matmul_mma(dy, bad[i][0], dx, dw, NULL, bad[i][2], bad[i][0], bad[i][1], 0, NULL),
              "%dx%d T=%d: taken", bad[i][0], bad[i][1], bad[i][2]);
        free(w), cudaFree(dw), cudaFree(dx), cudaFree(dy);
    }
}

/* cuda_matmul_qkv_rope against cuda_matmul_qkv then cuda_qk_rope_store:
 * q and the whole K/V pools the same bits, for T 1, 2, 5 and 11 (two passes),
 * a session's run and two sequences' tokens interleaved over the paged
 * tables, with and without the norm on the fly and biases, RoPE scaled
 * (YaRN) or not, GQA 4:2 at head_dim 64 and 2:1 at 128. */
static void kernel_qkv_rope(void) {
    static const int shapes[][3] = {{4, 2, 64}, {2, 1, 128}}; /* heads, kv heads, head_dim */
    static const int tokens[] = {1, 2, 5, 11};
    const int cols = 256, pos0 = 9;
    const float eps = 1e-5f;
    for (int sh = 0; sh < 2; sh++) {
        int nh = shapes[sh][0], nkv = shapes[sh][1], hd = shapes[sh][2], qd = nh * hd, kvd = nkv * hd;
        bf16 *w[3] = {rand_weights((size_t)qd * cols, cols), rand_weights((size_t)kvd * cols, cols),
                      rand_weights((size_t)kvd * cols, cols)};
        bf16 *b[3] = {rand_weights(qd, 100), rand_weights(kvd, 100), rand_weights(kvd, 100)};
        bf16 *nw = rand_weights(cols, 1), *dw[3], *db[3], *dnw = to_dev(nw, (size_t)cols * 2);
        int rows[3] = {qd, kvd, kvd};
        for (int i = 0; i < 3; i++) dw[i] = to_dev(w[i], (size_t)rows[i] * cols * 2), db[i] = to_dev(b[i], (size_t)rows[i] * 2);
        float inv_freq[64];
        for (int i = 0; i < hd / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / hd);
        float *dfreq = to_dev(inv_freq, sizeof inv_freq);
        for (int k = 0; k < (quick ? 2 : 4); k++) {
            int T = tokens[k], pos[11], table[11];
            two_tables tt = two_tables_make(pos0 + T, 3 * T + 5, 1);
            size_t pool = (size_t)tt.n_blocks * CUDA_KV_BLOCK * kvd;
            float *x = rand_floats((size_t)T * cols, 2), *dx = to_dev(x, (size_t)T * cols * 4);
            for (int c = 0; c < 4; c++) { /* run or per token; norm and biases, YaRN scale, or neither */
                int per_token = c % 2, fancy = c / 2;
                float scale = fancy ? 1.25f : 1.0f;
                two_tables_tokens(&tt, per_token, T, pos0, pos, table);
                map_dev md;
                cuda_kv_map map = map_upload(&md, &tt, per_token, T, pos0, pos, table);
                float *out_q[2];
                bf16 *out_k[2], *out_v[2];
                for (int fused = 0; fused < 2; fused++) {
                    float *dq = dev_floats((size_t)T * qd), *dk = dev_floats((size_t)T * kvd), *dv = dev_floats((size_t)T * kvd);
                    bf16_bits *dkc = NULL, *dvc = NULL;
                    cudaMalloc((void **)&dkc, pool * 2), cudaMalloc((void **)&dvc, pool * 2);
                    cudaMemset(dkc, 0, pool * 2), cudaMemset(dvc, 0, pool * 2);
                    const bf16 *bq = fancy ? db[0] : NULL, *bk = fancy ? db[1] : NULL, *bv = fancy ? db[2] : NULL;
                    if (fused) {
                        cuda_matmul_qkv_rope(dq, dx, dw[0], dw[1], dw[2], bq, bk, bv, fancy ? dnw : NULL, eps, dfreq,
                                             scale, dkc, dvc, map, T, nh, nkv, hd, cols, NULL);
                    } else {
                        cuda_matmul_qkv(dq, dk, dv, dx, dw[0], dw[1], dw[2], bq, bk, bv, fancy ? dnw : NULL, eps, T, qd,
                                        kvd, cols, NULL);
                        cuda_qk_rope_store(dq, dk, dv, NULL, NULL, dfreq, scale, dkc, dvc, map, T, nh, nkv, hd, eps, NULL);
                    }
                    out_q[fused] = from_dev(dq, (size_t)T * qd);
                    out_k[fused] = malloc(pool * 2), out_v[fused] = malloc(pool * 2);
                    cudaMemcpy(out_k[fused], dkc, pool * 2, cudaMemcpyDeviceToHost);
                    cudaMemcpy(out_v[fused], dvc, pool * 2, cudaMemcpyDeviceToHost);
                    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dkc), cudaFree(dvc);
                }
                int rows_set = 0;
                for (size_t r = 0; r < pool / kvd; r++) {
                    int set = 0;
                    for (int i = 0; i < kvd; i++) set |= out_k[1][r * kvd + i] != 0 || out_v[1][r * kvd + i] != 0;
                    rows_set += set;
                }
                CHECK(!memcmp(out_q[0], out_q[1], (size_t)T * qd * 4) && !memcmp(out_k[0], out_k[1], pool * 2) &&
                          !memcmp(out_v[0], out_v[1], pool * 2) && rows_set == T,
                      "%d heads, %d kv, hd %d, T=%d, %s%s: fused q/k/v + RoPE not the two launches' bits (%d rows set)",
                      nh, nkv, hd, T, per_token ? "per token" : "run", fancy ? ", norm, biases, yarn" : "", rows_set);
                for (int f = 0; f < 2; f++) free(out_q[f]), free(out_k[f]), free(out_v[f]);
                map_free(&md);
            }
            free(x), cudaFree(dx), free(tt.tables);
        }
        for (int i = 0; i < 3; i++) free(w[i]), free(b[i]), cudaFree(dw[i]), cudaFree(db[i]);
        free(nw), cudaFree(dnw), cudaFree(dfreq);
    }
}

/* cuda_route_group against cuda_route then cuda_moe_group: the same
 * logits, picks, weights and groups bit for bit, for 1, 3 and 8 tokens, 60
 * experts top 4 (renormalised or not) and 128 top 8, every expert or a
 * rank's share (e0 > 0: slots of other experts left out); with the MLP
 * norm too, against cuda_rmsnorm before them (the normed rows bit for bit
 * as well); more than 8 tokens refused with nothing written. */
static void kernel_route_group(void) {
    static const int shapes[][4] = {{60, 4, 256, 0}, {60, 4, 256, 1}, {128, 8, 128, 0}}; /* E, k, H, norm */
    static const int tokens[] = {1, 3, 8};
    rng = 0x5DEECE66D2545F49ull; /* the same inputs whatever ran before */
    for (int sh = 0; sh < 3; sh++) {
        int E = shapes[sh][0], k = shapes[sh][1], H = shapes[sh][2], norm = shapes[sh][3];
        bf16 *router = rand_weights((size_t)E * H, H), *drouter = to_dev(router, (size_t)E * H * 2);
        bf16 *mlp_norm = rand_weights((size_t)H, 1), *dnorm = to_dev(mlp_norm, (size_t)H * 2);
        for (int ti = 0; ti < 3; ti++) {
            int T = tokens[ti];
            float *x = rand_floats((size_t)T * H, 1), *dx = to_dev(x, (size_t)T * H * 4);
            for (int part = 0; part < 4; part++) { /* every expert; experts E/3 .. E/3 + E/2 (a rank's); each with the norm */
                int e0 = part % 2 ? E / 3 : 0, El = part % 2 ? E / 2 : E, normed = part >= 2;
                size_t ng = cuda_moe_group_ints(T, k, El);
                int *gi[2], *gg[2];
                float *gw[2], *gl[2], *gx[2];
                for (int fused = 0; fused < 2; fused++) {
                    int *didx = NULL, *dgroups = NULL;
                    float *dw = dev_floats((size_t)T * k), *dl = dev_floats((size_t)T * E), *dxn = dx;
                    cudaMalloc((void **)&didx, (size_t)T * k * sizeof(int));
                    cudaMalloc((void **)&dgroups, ng * sizeof(int));
                    cudaMemset(dgroups, 0xff, ng * sizeof(int)); /* unwritten ints read as -1 on both sides */
                    if (normed) dxn = dev_floats((size_t)T * H);
                    if (fused) {
                        CHECK(cuda_route_group(dgroups, didx, dw, dl, dxn, dx, normed ? dnorm : NULL, 1e-5f, drouter, T,
                                               E, H, k, norm, e0, El, NULL),
                              "T %d refused", T);
                    } else {
                        if (normed) cuda_rmsnorm(dxn, dx, dnorm, T, H, 1e-5f, NULL);
                        cuda_route(didx, dw, dl, dxn, drouter, T, E, H, k, norm, NULL);
                        cuda_moe_group(dgroups, didx, T, k, e0, El, NULL);
                    }
                    gi[fused] = malloc((size_t)T * k * sizeof(int)), gg[fused] = malloc(ng * sizeof(int));
                    cudaMemcpy(gi[fused], didx, (size_t)T * k * sizeof(int), cudaMemcpyDeviceToHost);
                    cudaMemcpy(gg[fused], dgroups, ng * sizeof(int), cudaMemcpyDeviceToHost);
                    gw[fused] = from_dev(dw, (size_t)T * k), gl[fused] = from_dev(dl, (size_t)T * E);
                    gx[fused] = from_dev(dxn, (size_t)T * H);
                    cudaFree(didx), cudaFree(dgroups), cudaFree(dw), cudaFree(dl);
                    if (normed) cudaFree(dxn);
                }
                CHECK(!memcmp(gl[0], gl[1], (size_t)T * E * 4) && !memcmp(gi[0], gi[1], (size_t)T * k * sizeof(int)) &&
                          !memcmp(gw[0], gw[1], (size_t)T * k * 4) && !memcmp(gg[0], gg[1], ng * sizeof(int)) &&
                          !memcmp(gx[0], gx[1], (size_t)T * H * 4),
                      "E %d k %d T %d experts %d..%d%s: the fused router's normed rows, logits, picks, weights or "
                      "groups differ",
                      E, k, T, e0, e0 + El - 1, normed ? ", MLP norm" : "");
                /* a rank's share may hold none of a token's picks */
                CHECK(gg[1][0] >= (El == E) && gg[1][0] <= El, "E %d T %d: %d experts chosen", E, T, gg[1][0]);
                for (int f = 0; f < 2; f++) free(gi[f]), free(gg[f]), free(gw[f]), free(gl[f]), free(gx[f]);
            }
            free(x), cudaFree(dx);
        }
        int *dg = NULL;
        cudaMalloc((void **)&dg, 64);
        CHECK(!cuda_route_group(dg, dg, NULL, NULL, NULL, NULL, NULL, 0.0f, drouter, 9, E, H, k, norm, 0, E, NULL),
              "T 9 taken");
        cudaFree(dg);
        free(router), cudaFree(drouter), free(mlp_norm), cudaFree(dnorm);
    }
}

/* The shared expert inside the experts' launches (POLAR_CUDA_FUSED_ROUTE=1
 * with a bf16 shared expert) against its own GEMVs (cuda_matmul_swiglu,
 * cuda_matmul), bit for bit on random weights whose sums round, and the
 * routed experts' outputs unchanged by the extra blocks: Qwen1.5-MoE's
 * shape reduced (60 experts top 4, the shared expert 4 experts wide), a
 * tensor-parallel rank's narrower share (S < F, S not a multiple of a
 * block's 8 rows), T 1, 2 and 8. */
static void kernel_shared_in_experts(void) {
    static const int shapes[][5] = {{60, 4, 256, 96, 384}, {60, 4, 256, 96, 37}}; /* E, k, H, F, S */
    static const int tokens[] = {1, 2, 8};
    rng = 0x2545F4914F6CDD1Dull; /* the same inputs whatever ran before */
    for (int si = 0; si < 2; si++) {
        int E = shapes[si][0], k = shapes[si][1], H = shapes[si][2], F = shapes[si][3], S = shapes[si][4];
        bf16 *router = rand_weights((size_t)E * H, H), *gu = rand_weights((size_t)E * 2 * F * H, H),
             *down = rand_weights((size_t)E * H * F, F), *sg = rand_weights((size_t)S * H, H),
             *su = rand_weights((size_t)S * H, H), *sd = rand_weights((size_t)H * S, S);
        bf16 *drouter = to_dev(router, (size_t)E * H * 2), *dgu = to_dev(gu, (size_t)E * 2 * F * H * 2),
             *ddown = to_dev(down, (size_t)E * H * F * 2), *dsg = to_dev(sg, (size_t)S * H * 2),
             *dsu = to_dev(su, (size_t)S * H * 2), *dsd = to_dev(sd, (size_t)H * S * 2);
        for (int ti = 0; ti < 3; ti++) {
            int T = tokens[ti];
            float *x = rand_floats((size_t)T * H, 1), *dx = to_dev(x, (size_t)T * H * 4);
            float *dw = dev_floats((size_t)T * k), *dl = dev_floats((size_t)T * E);
            int *didx = NULL, *dgroups = NULL;
            cudaMalloc((void **)&didx, (size_t)T * k * sizeof(int));
            cudaMalloc((void **)&dgroups, cuda_moe_group_ints(T, k, E) * sizeof(int));
            cuda_route(didx, dw, dl, dx, drouter, T, E, H, k, 0, NULL);
            cuda_moe_group(dgroups, didx, T, k, 0, E, NULL);
            float *act[2], *out[2], *sact[2], *sout[2]; /* [0]: apart, [1]: inside */
            for (int in = 0; in < 2; in++) {
                float *dact = dev_floats((size_t)T * k * F), *dy = dev_floats((size_t)T * k * H);
                float *dsact = dev_floats((size_t)T * S), *dsout = dev_floats((size_t)T * H);
                cuda_shared_gemv a = {dsg, dsu, dx, dsact, S, H}, b = {dsd, NULL, dsact, dsout, H, S};
                cuda_expert_matmul(dact, dx, dgu, dgroups, T, k, E, 2 * F, H, 0, 1, in ? &a : NULL, NULL);
                if (!in) cuda_matmul_swiglu(dsact, dx, NULL, 0.0f, dsg, dsu, T, S, H, NULL);
                cuda_expert_matmul(dy, dact, ddown, dgroups, T, k, E, H, F, 1, 0, in ? &b : NULL, NULL);
                if (!in) cuda_matmul(dsout, dsact, dsd, NULL, T, H, S, 0, NULL);
                act[in] = from_dev(dact, (size_t)T * k * F), out[in] = from_dev(dy, (size_t)T * k * H);
                sact[in] = from_dev(dsact, (size_t)T * S), sout[in] = from_dev(dsout, (size_t)T * H);
                cudaFree(dact), cudaFree(dy), cudaFree(dsact), cudaFree(dsout);
            }
            int nonzero = 0;
            for (size_t i = 0; i < (size_t)T * H; i++) nonzero += sout[0][i] != 0.0f;
            CHECK(!memcmp(act[0], act[1], (size_t)T * k * F * 4) && !memcmp(out[0], out[1], (size_t)T * k * H * 4),
                  "S %d T %d: the routed experts' outputs changed with the shared expert inside", S, T);
            CHECK(!memcmp(sact[0], sact[1], (size_t)T * S * 4) && !memcmp(sout[0], sout[1], (size_t)T * H * 4),
                  "S %d T %d: the shared expert inside the experts' launches is not its GEMVs' bits", S, T);
            CHECK(nonzero > T * H / 2, "S %d T %d: %d of the shared expert's %d outputs nonzero", S, T, nonzero, T * H);
            for (int in = 0; in < 2; in++) free(act[in]), free(out[in]), free(sact[in]), free(sout[in]);
            free(x), cudaFree(dx), cudaFree(dw), cudaFree(dl), cudaFree(didx), cudaFree(dgroups);
        }
        free(router), free(gu), free(down), free(sg), free(su), free(sd);
        cudaFree(drouter), cudaFree(dgu), cudaFree(ddown), cudaFree(dsg), cudaFree(dsu), cudaFree(dsd);
    }
}

#endif
