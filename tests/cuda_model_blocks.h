/* test_cuda's whole-model checks of GGUF blocks on the GPU (POLAR_CUDA_BLOCKS=1):
 * the GPU against the CPU on the same kept blocks, Q8_0 files of exactly
 * representable weights against the bf16 load, the device memory the
 * weights take, the two prefill paths over blocks. Included by
 * test_cuda.c after compare_models. */
#ifndef POLAR_TEST_CUDA_MODEL_BLOCKS_H
#define POLAR_TEST_CUDA_MODEL_BLOCKS_H

/* The GPU on a GGUF's blocks: the GPU and the CPU running the same kept
 * model, logits of a prompt (7 tokens: the block GEMVs; 40: the prefill
 * GEMMs on rows dequantized to bf16) and greedy tokens. The CPU quantizes
 * activations to 8 bits (quant.h), the GPU multiplies them in f32: under
 * the emulation the two were 1.3e-2 to 2.1e-2 apart (relative L2) at 7
 * tokens, up to 3.9e-2 at 40 (an MoE router flip), while the GPU on the
 * blocks was 0.8e-2 from f32 math on the bf16 load. A matrix read with the
 * wrong type, offset or row length puts it near 1, so TOL_BLOCKS_MODEL is
 * a check of the wiring; the kernels' math is checked exactly in
 * cuda_block_checks.h and whole models exactly on q8_exact weights. Greedy
 * tokens must agree for the dense models' short prompts. */
#define TOL_BLOCKS_MODEL 5e-2
static void gpu_vs_cpu_on_blocks(const polar_model *m, const char *name, int n_prompt, int steps) {
    polar_error err;
    polar_model_info info;
    polar_model_info_get(m, &info);
    int V = info.arch.vocab, out[2][16] = {{0}}, same = 0;
    polar_program p;
    CHECK_OK(polar_program_parse("0,1-2x2,3", info.arch.n_layers, 0, &p, &err));
    polar_session *s[2] = {NULL, NULL};
    int *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (i * 7919 + 13) % V;
    float *l[2] = {malloc((size_t)n_prompt * V * 4), malloc((size_t)n_prompt * V * 4)};
    for (int i = 0; i < 2; i++) {
        polar_session_opts o = {.max_ctx = n_prompt + steps, .device = i ? POLAR_DEVICE_CPU : POLAR_DEVICE_CUDA};
        CHECK_OK(polar_session_create(m, &p, &o, &s[i], &err));
    }
    if (s[0] && s[1]) {
        polar_gen_opts go = {.max_new = steps, .ignore_eos = 1};
        for (int i = 0; i < 2; i++) {
            CHECK_OK(polar_prefill(s[i], prompt, n_prompt, l[i], &err));
            CHECK_OK(polar_generate(s[i], prompt, n_prompt, &go, out[i], NULL, NULL, NULL, &err));
        }
        while (same < steps && out[0][same] == out[1][same]) same++;
        double cosine, rel;
        float d = max_abs_diff(l[0], l[1], (size_t)n_prompt * V, &cosine, &rel);
        /* greedy tokens are reported, not required: the two sides' 1-2% logit differences (bf16 K/V on the GPU,
         * 8-bit inputs rounding apart) part this random model's near ties within a few steps */
        CHECK(rel <= TOL_BLOCKS_MODEL, "%s, %d tokens: GPU to CPU on the blocks: relative L2 %g (bound %g)", name,
              n_prompt, rel, TOL_BLOCKS_MODEL);
        printf("  %-22s %2d tok: GPU to CPU on blocks max %.2e rel %.1e (%d/%d tok)\n", name, n_prompt, d, rel, same,
               steps);
    }
    for (int i = 0; i < 2; i++) free(l[i]), polar_session_free(s[i]);
    free(prompt);
    polar_program_free(&p);
}

/* n bf16 weights (whole 32-blocks) that Q8_0 holds exactly: per block
 * integers in [-127, 127], one of them +-127, times a power of two, so the
 * writer's scale is that power and its blocks dequantize to these bits. */
static void q8_exact(const bf16 *weights, size_t n) {
    bf16 *w = (bf16 *)weights; /* the random model's own buffers */
    for (size_t b = 0; w && b + 32 <= n; b += 32) {
        float scale = ldexpf(1.0f, -11 - (int)((b / 32) % 4)); /* |w| up to 0.06, as random init at hidden 256 */
        for (int i = 0; i < 32; i++) {
            int q = i == 0 ? (frand() < 0 ? -127 : 127) : (int)lrintf(frand() * 127.0f);
            w[b + (size_t)i] = f32_to_bf16((float)q * scale);
        }
    }
}

static void q8_exact_model(polar_model *m) {
    const polar_arch *a = &m->arch;
    size_t H = (size_t)a->hidden, q = (size_t)a->n_heads * a->head_dim, kv = (size_t)a->n_kv_heads * a->head_dim;
    size_t F = (size_t)a->ffn, E = (size_t)a->n_experts, MF = (size_t)a->moe_ffn, S = (size_t)a->shared_ffn;
    q8_exact(m->embed, (size_t)a->vocab * H);
    if (!a->tied_embeddings) q8_exact(m->lm_head, (size_t)a->vocab * H);
    for (int l = 0; l < a->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        q8_exact(w->wq, q * H), q8_exact(w->wk, kv * H), q8_exact(w->wv, kv * H), q8_exact(w->wo, H * q);
        q8_exact(w->w_gate, F * H), q8_exact(w->w_up, F * H), q8_exact(w->w_down, H * F);
        q8_exact(w->exp_gate_up, E * 2 * MF * H), q8_exact(w->exp_down, E * H * MF);
        q8_exact(w->sh_gate, S * H), q8_exact(w->sh_up, S * H), q8_exact(w->sh_down, H * S);
    }
}

/* GGUF blocks on the GPU: a random Llama and Qwen2-MoE written as Q8_0,
 * as llama.cpp's Q4_K_M mix and as IQ4_XS (projections, embedding, expert
 * stacks, shared expert), loaded kept in their blocks. With
 * POLAR_CUDA_BLOCKS=1 the upload keeps them as blocks (the routed experts
 * as the file's three stacks), and the GPU agrees with the CPU on the same
 * blocks (gpu_vs_cpu_on_blocks). The Q8_0 files hold q8_exact weights, so the
 * GPU on their blocks and the CPU on their bf16 load run the same weights:
 * the golden models' bounds and greedy tokens (compare_models) hold there,
 * the check of every matrix's wiring (k-quant and IQ4 kernels are checked
 * exactly in cuda_block_checks.h). POLAR_CUDA_BLOCKS=0 uploads bf16 instead, the
 * bf16 load's weights: the GPU then gives the bf16 load's logits bit for
 * bit. */
/* A GPU session's device memory: the weights within `bound` x the bytes
 * the model holds them in (its GGUF blocks), a KV pool and workspaces. */
static void device_weights_near_stored(const polar_model *q, const polar_program *p, double bound, const char *name) {
    polar_error err;
    polar_session *s = NULL;
    polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
    polar_device_memory dm;
    polar_model_info info;
    polar_model_info_get(q, &info);
    CHECK_OK(polar_session_create((polar_model *)q, p, &o, &s, &err));
    if (s && polar_session_device_memory(s, &dm, &err) == POLAR_OK)
        CHECK(dm.weights >= info.stored_bytes && dm.weights <= bound * info.stored_bytes && dm.kv > 0 &&
                  dm.workspaces > 0 && 10 * info.stored_bytes < 6 * info.weight_bytes,
              "%s: device weights %zu bytes, the model's %zu (bf16 %zu), KV %zu, workspaces %zu", name, dm.weights,
              info.stored_bytes, info.weight_bytes, dm.kv, dm.workspaces);
    else
        CHECK(0, "%s: no device memory figure: %s", name, err.msg);
    polar_session_free(s);
}

/* A prefill over blocks by the fused kernel (the default) and by
 * POLAR_CUDA_BLOCKS_GEMM=chunked (rows dequantized to bf16 for cuBLASLt,
 * the 2026-11-27 H200 run's path): the same rounded weights and inputs, so
 * logits within f32 summation order; an unknown value fails the session
 * with the variable named. */
static void blocks_gemm_paths(polar_model *q, const char *name) {
    polar_error err;
    polar_program p;
    CHECK_OK(polar_program_base(q->arch.n_layers, &p, &err));
    polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
    int toks[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5}, V = q->arch.vocab;
    float *out[2] = {malloc((size_t)9 * V * 4), malloc((size_t)9 * V * 4)};
    static const char *paths[2] = {"fused", "chunked"};
    polar_device_memory dm[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        setenv("POLAR_CUDA_BLOCKS_GEMM", paths[i], 1);
        polar_session *s = NULL;
        CHECK_OK(polar_session_create(q, &p, &o, &s, &err));
        if (s) CHECK_OK(polar_prefill(s, toks, 9, out[i], &err));
        if (s) CHECK_OK(polar_session_device_memory(s, &dm[i], &err));
        polar_session_free(s);
    }
    double cosine, rel;
    float d = max_abs_diff(out[1], out[0], (size_t)9 * V, &cosine, &rel);
    /* the emulation sums a WMMA tile and a cuBLASLt product alike (f32, k ascending): the same bits there */
    CHECK(rel < 1e-5, "%s: the fused blocks GEMM against the chunked one: relative L2 %g, max %g", name, rel, d);
    CHECK(dm[1].workspaces > dm[0].workspaces, "%s: chunked: no dequantization workspace (%zu bytes, fused %zu)", name,
          dm[1].workspaces, dm[0].workspaces);
    unsetenv("POLAR_CUDA_BLOCKS_GEMM");
    env_refused(q, "POLAR_CUDA_BLOCKS_GEMM", "tiled");
    free(out[0]), free(out[1]);
    polar_program_free(&p);
}

/* POLAR_CUDA_BLOCKS_STAGE=1 (the block GEMVs' rows staged in shared
 * memory, kernel_blocks_staged) against 0: a prompt and decode steps give
 * the same logits bit for bit; another value fails the session, named. */
static void blocks_stage_same(polar_model *q, const char *name) {
    polar_error err;
    polar_program p;
    CHECK_OK(polar_program_base(q->arch.n_layers, &p, &err));
    polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
    enum { STEPS = 4 };
    int toks[3] = {3, 1, 4}, V = q->arch.vocab;
    float *out[2] = {malloc((size_t)(STEPS + 1) * V * 4), malloc((size_t)(STEPS + 1) * V * 4)};
    for (int i = 0; i < 2; i++) {
        setenv("POLAR_CUDA_BLOCKS_STAGE", i ? "1" : "0", 1);
        polar_session *s = NULL;
        CHECK_OK(polar_session_create(q, &p, &o, &s, &err));
        if (s && polar_prefill(s, toks, 3, NULL, &err) == POLAR_OK) {
            memcpy(out[i], polar_logits(s), (size_t)V * 4);
            for (int k = 1; k <= STEPS; k++) {
                CHECK_OK(polar_decode_step(s, polar_argmax(polar_logits(s), V), &err));
                memcpy(out[i] + (size_t)k * V, polar_logits(s), (size_t)V * 4);
            }
        } else {
            CHECK(0, "%s: stage %d: %s", name, i, err.msg);
        }
        polar_session_free(s);
    }
    CHECK(!memcmp(out[0], out[1], (size_t)(STEPS + 1) * V * 4), "%s: staged rows changed the logits", name);
    unsetenv("POLAR_CUDA_BLOCKS_STAGE");
    env_refused(q, "POLAR_CUDA_BLOCKS_STAGE", "yes");
    free(out[0]), free(out[1]);
    polar_program_free(&p);
}

static void model_gguf_blocks(void) {
    static const char *archs[] = {"llama", "qwen2_moe"};
    static const struct {
        gguf_fault file;
        const char *name;
    } files[] = {{GGUF_Q8_0_FILE, "q8_0"}, {GGUF_K_FILE, "q4_k_m"}, {GGUF_IQ4_FILE, "iq4_xs"}};
    setenv("POLAR_CUDA_BLOCKS", "1", 1); /* blocks on the GPU only when asked, until they are fast */
    for (int i = 0; i < 2; i++)
        for (int f = 0; f < (quick ? 2 : 3); f++) {
            polar_error err;
            polar_arch a;
            polar_model *m = NULL, *q = NULL, *b = NULL;
            CHECK_OK(polar_arch_default(archs[i], &a, &err));
            a.hidden = 256, a.ffn = 512; /* whole 256-blocks: the k-quants and IQ4_XS, not their fallbacks */
            if (a.n_experts) a.moe_ffn = 256, a.shared_ffn = 256;
            CHECK_OK(polar_model_random(&a, 3, &m, &err));
            if (m && files[f].file == GGUF_Q8_0_FILE) q8_exact_model(m);
            char path[64], name[48];
            snprintf(path, sizeof path, "/tmp/polar-cuda-gguf-%d.gguf", (int)getpid());
            snprintf(name, sizeof name, "%s %s", archs[i], files[f].name);
            CHECK(m && gguf_write_model(m, path, files[f].file), "write %s", path);
            CHECK_OK(load_kept_and_bf16(path, &q, &b, &err));
            if (q && b) {
                tp_shard whole;
                CHECK_OK(tp_shard_of(&q->arch, 0, 1, &whole, &err));
                const cuda_weights *w = cuda_model_weights(q, &whole);
                CHECK(w && w->layers[0].t_wq == cpu_row_type(q->layers[0].t_wq) && w->layers[0].t_wq != CPU_W_BF16 &&
                          w->t_embed != CPU_W_BF16,
                      "%s: the GPU holds the blocks (wq %s, embedding %s)", name,
                      w ? cpu_wtype_name(w->layers[0].t_wq) : "-", w ? cpu_wtype_name(w->t_embed) : "-");
                for (int l = 0; w && l < a.n_layers; l++) /* the routed experts too, as the file's stacks */
                    if (polar_arch_layer_is_moe(&a, l))
                        CHECK(!w->layers[l].exp_gate_up && w->layers[l].t_exp_gate == cpu_row_type(q->layers[l].t_exp_gate) &&
                                  w->layers[l].t_exp_down == cpu_row_type(q->layers[l].t_exp_down) &&
                                  w->layers[l].t_exp_gate != CPU_W_BF16 && w->layers[l].t_exp_down != CPU_W_BF16,
                              "%s layer %d: the GPU holds the experts' blocks (gate %s, down %s)", name, l,
                              cpu_wtype_name(w->layers[l].t_exp_gate), cpu_wtype_name(w->layers[l].t_exp_down));
                gpu_vs_cpu_on_blocks(q, name, GEMV_PROMPT_TOKENS, 8); /* the prompt through the GEMVs too */
                gpu_vs_cpu_on_blocks(q, name, 7, 8);
                if (files[f].file == GGUF_K_FILE) blocks_gemm_paths(q, name), blocks_stage_same(q, name);
                if (!quick) gpu_vs_cpu_on_blocks(q, name, 40, 8);
                { /* polar bench's bytes a step reads: the blocks, as on the CPU */
                    polar_program bp;
                    CHECK_OK(polar_program_base(a.n_layers, &bp, &err));
                    double gpu = polar_decode_bytes(q, &bp, 64, POLAR_DEVICE_CUDA, 1);
                    double cpu = polar_decode_bytes(q, &bp, 64, POLAR_DEVICE_CPU, 1);
                    setenv("POLAR_CUDA_BLOCKS", "0", 1);
                    double as_bf16 = polar_decode_bytes(q, &bp, 64, POLAR_DEVICE_CUDA, 1);
                    setenv("POLAR_CUDA_BLOCKS", "1", 1);
                    CHECK(gpu == cpu && as_bf16 > 1.5 * gpu, "%s: decode bytes GPU %.0f, CPU %.0f, bf16 upload %.0f",
                          name, gpu, cpu, as_bf16);
                    device_weights_near_stored(q, &bp, 1.1, name);
                    polar_program_free(&bp);
                }
                /* Q8_0 of q8_exact weights: the bf16 load's weights exactly, so the golden models' bounds, the
                 * GEMVs unpacking to f32 (with dp4a their inputs would be 8-bit, the bf16 model's are not) */
                setenv("POLAR_CUDA_BLOCKS_Q8", "0", 1);
                if (files[f].file == GGUF_Q8_0_FILE) compare_models(q, b, "0,1-2x2,3", 7, 8, 1);
                if (files[f].file == GGUF_Q8_0_FILE && !quick) compare_models(q, b, "0,1-2x2,3", 40, 8, 1);
                unsetenv("POLAR_CUDA_BLOCKS_Q8");
            }
            if (q && b && f == 0) { /* uploaded as bf16: the bf16 load's weights, the same bits */
                polar_model *q2 = NULL;
                CHECK_OK(polar_model_load(path, &q2, &err));
                setenv("POLAR_CUDA_BLOCKS", "0", 1);
                polar_program p;
                polar_session *s[2] = {NULL, NULL};
                polar_session_opts o = {.max_ctx = 16, .device = POLAR_DEVICE_CUDA};
                CHECK_OK(polar_program_base(a.n_layers, &p, &err));
                CHECK_OK(polar_session_create(q2, &p, &o, &s[0], &err));
                CHECK_OK(polar_session_create(b, &p, &o, &s[1], &err));
                setenv("POLAR_CUDA_BLOCKS", "1", 1);
                int toks[5] = {3, 1, 4, 1, 5};
                for (int j = 0; j < 2; j++)
                    if (s[j]) CHECK_OK(polar_prefill(s[j], toks, 5, NULL, &err));
                if (s[0] && s[1])
                    CHECK(!memcmp(polar_logits(s[0]), polar_logits(s[1]), (size_t)a.vocab * sizeof(float)),
                          "%s: POLAR_CUDA_BLOCKS=0: GPU logits differ from those of the bf16 load", name);
                polar_device_memory dm;
                polar_model_info bi;
                polar_model_info_get(b, &bi);
                if (s[1] && polar_session_device_memory(s[1], &dm, &err) == POLAR_OK) /* the bf16 weights and inv_freq */
                    CHECK(dm.weights == bi.stored_bytes + (size_t)a.head_dim / 2 * sizeof(float) &&
                              bi.stored_bytes == bi.weight_bytes,
                          "%s: bf16 load: %zu device weight bytes, %zu stored, %zu bf16", name, dm.weights,
                          bi.stored_bytes, bi.weight_bytes);
                else
                    CHECK(0, "%s: no device memory figure: %s", name, err.msg);
                for (int j = 0; j < 2; j++) polar_session_free(s[j]);
                polar_program_free(&p);
                polar_model_free(q2);
            }
            unlink(path);
            polar_model_free(m);
            polar_model_free(q);
            polar_model_free(b);
        }
    unsetenv("POLAR_CUDA_BLOCKS");
}

#endif
