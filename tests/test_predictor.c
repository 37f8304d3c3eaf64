/* The PoLar predictor against a PyTorch module built as the reference
 * describes it (tests/golden/make_predictor_golden.py): seg/op logits within
 * 1e-4 and the same top-5 programs in the same order, at D = 28 (T = 7) and
 * D = 36 (T = 300). The weights come from an integer hash both sides compute;
 * here they are written to a safetensors file under the PyTorch names and
 * loaded back. Plus the segment codec: round trips, tie-breaks, rejections. */
#include <omp.h>
#include <unistd.h>

#include "../loader/json.h"
#include "harness.h"
#include "pred_util.h"

#define DQ 1024
#define LOGIT_TOL 1e-4f

static void predictor_matches_pytorch(void) {
    static const int cases[][2] = {{28, 7}, {36, 300}};
    for (int c = 0; c < 2; c++) {
        int D = cases[c][0], T = cases[c][1];
        char path[128], fixture[128];
        snprintf(path, sizeof path, "/tmp/polar-pred-%d-%d.safetensors", D, (int)getpid());
        snprintf(fixture, sizeof fixture, GOLDEN_DIR "/predictor/D%d_T%d.safetensors", D, T);
        CHECK(write_predictor(path, D, DQ, NULL, NULL) == POLAR_OK, "write");
        polar_error err;
        polar_predictor *p = NULL;
        st_file exp;
        CHECK_OK(polar_predictor_load(path, &p, &err));
        CHECK_OK(st_open(fixture, &exp, &err));
        unlink(path);
        if (!p || !exp.tensors) continue;
        CHECK(polar_predictor_layers(p) == D && polar_predictor_input_dim(p) == DQ, "shape from the weights");
        float *h = malloc((size_t)T * DQ * sizeof *h), seg[64], op[192];
        weight_value("H", (size_t)T * DQ, 1.0, 0.0, h);
        CHECK_OK(polar_predict_logits(p, h, T, seg, op, &err));
        const float *ws = st_find(&exp, "seg")->data, *wo = st_find(&exp, "op")->data;
        float d = 0;
        for (int i = 0; i < D; i++) d = nan_max(d, fabsf(seg[i] - ws[i]));
        for (int i = 0; i < 3 * D; i++) d = nan_max(d, fabsf(op[i] - wo[i]));
        CHECK(d <= LOGIT_TOL, "D %d T %d: max |logit diff| %g", D, T, d);
        /* The same programs, in the same order, from the same logits. */
        const unsigned char *b = exp.map;
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
        json_doc *hdr, *progs;
        CHECK_OK(json_parse((const char *)b + 8, (size_t)hlen, fixture, &hdr, &err));
        const json_value *meta = json_get(json_root(hdr), "__metadata__");
        const json_value *ptext = json_get(meta, "programs");
        CHECK_OK(json_parse(ptext->str, ptext->len, "programs", &progs, &err));
        const json_value *want = json_root(progs);
        polar_candidate cand[8];
        int n = 0;
        polar_decode_opts o = polar_decode_defaults();
        CHECK_OK(polar_decode_programs(ws, wo, D, &o, cand, 8, &n, &err));
        CHECK(n == (int)want->len, "D %d: %d programs, want %zu", D, n, want->len);
        for (int k = 0; k < n && k < (int)want->len; k++) {
            const json_value *w = want->items[k];
            int same = cand[k].program.n == (int)w->len;
            for (int i = 0; same && i < cand[k].program.n; i++) same = cand[k].program.layers[i] == (int)w->items[i]->number;
            CHECK(same, "D %d: program %d differs from the reference decoder's", D, k);
        }
        char text[256];
        polar_program_format(&cand[0].program, text, sizeof text);
        printf("  D %d T %3d: max |logit diff| %.2e, top program %s (%d layers, score %.3f), %d programs agree\n", D, T,
               d, text, cand[0].program.n, cand[0].score, n);
        for (int k = 0; k < n; k++) polar_program_free(&cand[k].program);
        json_free(progs);
        json_free(hdr);
        st_close(&exp);
        free(h);
        polar_predictor_free(p);
    }
}

/* The CPU forward splits each product's inputs across the threads: 1, 2
 * and 3 threads give the same logits bit for bit, on shapes off the tiles
 * of the products (d 120, ff 200, dq 1000; 40 heads of 3). */
static void predictor_threads_bitwise(void) {
    static const pred_shape shapes[] = {{36, DQ, D_MODEL, 4 * D_MODEL, 0, NULL}, {13, 1000, 120, 200, 40, NULL}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const pred_shape *sh = &shapes[c];
        int T = 77;
        char path[128];
        snprintf(path, sizeof path, "/tmp/polar-pred-thr-%d.safetensors", (int)getpid());
        CHECK(write_predictor_shape(path, sh, NULL, NULL) == POLAR_OK, "write");
        polar_error err;
        polar_predictor *p = NULL;
        CHECK_OK(polar_predictor_load(path, &p, &err));
        unlink(path);
        if (!p) continue;
        float *h = malloc((size_t)T * sh->dq * sizeof *h), seg[3][64], op[3][192];
        weight_value("H", (size_t)T * sh->dq, 1.0, 0.0, h);
        int threads = omp_get_max_threads();
        for (int k = 0; k < 3; k++) {
            omp_set_num_threads(k + 1);
            CHECK_OK(polar_predict_logits(p, h, T, seg[k], op[k], &err));
        }
        omp_set_num_threads(threads);
        for (int k = 1; k < 3; k++)
            CHECK(!memcmp(seg[0], seg[k], (size_t)sh->D * sizeof(float)) &&
                      !memcmp(op[0], op[k], (size_t)sh->D * 3 * sizeof(float)),
                  "d %d: %d threads differ from 1", sh->d, k + 1);
        free(h);
        polar_predictor_free(p);
    }
}

static void predictor_bad_weights(void) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-pred-bad-%d.safetensors", (int)getpid());
    polar_error err;
    polar_predictor *p = NULL;
    write_predictor(path, 12, DQ, "op_head.bias", NULL);
    CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "'op_head.bias' is missing"),
          "missing tensor: %s", err.msg);
    write_predictor(path, 12, DQ, NULL, "cross_attn.out_proj.weight");
    CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "does not fit D 12, d 256"),
          "mismatched tensor: %s", err.msg);
    /* ff is read from layer 0's linear1: the other tensors then disagree */
    write_predictor(path, 12, DQ, NULL, "layer_encoder.layers.0.linear1.weight");
    CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_FORMAT &&
              strstr(err.msg, "'layer_encoder.layers.0.linear1.bias' does not fit D 12, d 256, d_q 1024, ff 1025"),
          "ff from a widened tensor: %s", err.msg);
    write_predictor(path, 12, DQ, "layer_embedding.weight", NULL);
    CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "layer_embedding.weight"),
          "no layer embedding: %s", err.msg);
    /* the head count in the metadata: not a number, too large for an int, zero, not dividing d */
    static const struct {
        const char *nheads, *why;
    } heads[] = {{"four", "nheads \"four\" is not a head count"},
                 {"99999999999999", "nheads \"99999999999999\" is not a head count"},
                 {"0", "nheads \"0\" is not a head count"},
                 {"4x", "nheads \"4x\" is not a head count"},
                 {"3", "not divisible by 3 heads"}};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        pred_shape sh = {12, DQ, D_MODEL, 4 * D_MODEL, 0, heads[i].nheads};
        write_predictor_shape(path, &sh, NULL, NULL);
        CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_FORMAT && strstr(err.msg, heads[i].why),
              "nheads %s: %s", heads[i].nheads, err.msg);
    }
    unlink(path);
    CHECK(polar_predictor_load(path, &p, &err) == POLAR_ERR_IO, "no file: %s", err.msg);
}

/* ---------------------------------------------------------------- codec */

static void expect_parse(const char *text, int D, const char *starts, const char *ops) {
    polar_error err;
    polar_program p;
    unsigned char seg[64];
    int op[64];
    CHECK_OK(polar_program_parse(text, D, 0, &p, &err));
    CHECK_OK(polar_program_to_segments(&p, D, 4, seg, op, &err));
    char got_s[65] = "", got_o[65] = "";
    for (int i = 0; i < D; i++) {
        got_s[i] = (char)('0' + seg[i]);
        got_o[i] = op[i] < 0 ? '.' : "skr"[op[i]];
    }
    CHECK(!strcmp(got_s, starts) && !strcmp(got_o, ops), "%s: starts %s ops %s, want %s %s", text, got_s, got_o, starts,
          ops);
    polar_program_free(&p);
}

/* Tie-breaks: fewest segments, then fewest skips, then most repeats, then
 * larger segments earlier (s = skip, k = keep, r = repeat). */
static void codec_tie_breaks(void) {
    expect_parse("0-3", 4, "1000", "k...");
    expect_parse("0-4", 5, "10001", "k...k");              /* [4,1] over [1,4], [2,3], [3,2] */
    expect_parse("0-7", 8, "10001000", "k...k...");
    expect_parse("0-1x2", 2, "10", "r.");                   /* one repeated segment */
    expect_parse("0-3", 6, "100010", "k...s.");            /* fewest segments: skip 4-5 as one */
    expect_parse("0,1x2,2", 3, "111", "krk");
    expect_parse("0-1,3-5x2", 6, "101100", "k.sr..");     /* keep 0-1, skip 2, repeat 3-5 */
    expect_parse("0-2,2-5", 6, "101100", "k.rk..");       /* layer 2 twice: its own repeat segment */
    expect_parse("2-3", 6, "101010", "s.k.s.");           /* skip 0-1, keep 2-3, skip 4-5 */
    expect_parse("0,2-3", 4, "1110", "ksk.");             /* 3 segments either way: [1,1,2] */
}

static void codec_rejections(void) {
    static const struct {
        const char *text;
        int D;
        const char *why;
    } bad[] = {
        {"0x3", 2, "runs three times"},
        {"0,2,1,3", 4, "layer 1 runs after layer 2"},
        {"0-4x2", 5, "at most 4 consecutive layers"},
        {"0,2,0,2", 3, "non-contiguous repeat"},
        {"0-2,1,3", 4, "edit inside a repeated block"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        polar_error err = {0};
        polar_program p;
        unsigned char seg[8];
        int op[8];
        CHECK_OK(polar_program_parse(bad[i].text, bad[i].D, 0, &p, &err));
        polar_status st = polar_program_to_segments(&p, bad[i].D, 4, seg, op, &err);
        CHECK(st == POLAR_ERR_PROGRAM && strstr(err.msg, bad[i].why), "%s: %s", bad[i].text, err.msg);
        polar_program_free(&p);
    }
}

/* Every program the decoder can emit for D = 7 (segments of 1..4, any ops)
 * round-trips: program -> segments -> program is the identity, and parsing
 * is canonical (a second trip gives the same segments). */
static void codec_round_trip_all(void) {
    const int D = 7;
    int total = 0, bad = 0;
    for (int mask = 0; mask < 1 << (D - 1); mask++) {
        unsigned char seg[7] = {1};
        int starts[7], n_seg = 0, ok = 1;
        for (int i = 1; i < D; i++) seg[i] = (unsigned char)((mask >> (i - 1)) & 1);
        for (int i = 0; i < D; i++)
            if (seg[i]) starts[n_seg++] = i;
        for (int s = 0; s < n_seg; s++) ok &= (s + 1 < n_seg ? starts[s + 1] : D) - starts[s] <= 4;
        if (!ok) continue;
        int combos = 1;
        for (int s = 0; s < n_seg; s++) combos *= 3;
        for (int c = 0; c < combos; c++) {
            int ops[7], x = c;
            for (int i = 0; i < D; i++) ops[i] = -1;
            for (int s = 0; s < n_seg; s++, x /= 3) ops[starts[s]] = x % 3;
            polar_program p, q;
            polar_error err;
            if (polar_segments_to_program(seg, ops, D, &p, &err) != POLAR_OK) continue; /* all skipped */
            unsigned char seg2[7], seg3[7];
            int ops2[7], ops3[7];
            int fine = polar_program_to_segments(&p, D, 4, seg2, ops2, &err) == POLAR_OK &&
                       polar_segments_to_program(seg2, ops2, D, &q, &err) == POLAR_OK;
            if (fine) {
                fine = q.n == p.n && !memcmp(q.layers, p.layers, (size_t)p.n * sizeof(int)) &&
                       polar_program_to_segments(&q, D, 4, seg3, ops3, &err) == POLAR_OK && !memcmp(seg2, seg3, 7) &&
                       !memcmp(ops2, ops3, sizeof ops2);
                polar_program_free(&q);
            }
            bad += !fine;
            total++;
            polar_program_free(&p);
        }
    }
    CHECK(bad == 0 && total > 1000, "%d of %d decoder programs fail the round trip", bad, total);
    printf("  %d decoder-emittable programs of D = 7 round-trip\n", total);
}

static void decode_bounds_and_empty(void) {
    /* All ops prefer skip: the all-skip program is dropped; bounds filter. */
    float seg[8], op[24];
    for (int i = 0; i < 8; i++) {
        seg[i] = i % 2 ? 5.0f : -5.0f; /* starts at 1, 3, 5, 7 -> segments [0,1) [1,3) [3,5) [5,7) [7,8) */
        op[3 * i] = 2.0f, op[3 * i + 1] = 1.0f, op[3 * i + 2] = 0.5f;
    }
    polar_candidate c[8];
    int n;
    polar_error err;
    polar_decode_opts o = polar_decode_defaults();
    CHECK_OK(polar_decode_programs(seg, op, 8, &o, c, 8, &n, &err));
    CHECK(n == 4, "the all-skip beam is dropped: %d programs", n);
    for (int k = 0; k < n; k++) CHECK(c[k].program.n > 0 && c[k].score < 0, "program %d", k);
    for (int k = 1; k < n; k++) CHECK(c[k].score <= c[k - 1].score, "ranked by score");
    for (int k = 0; k < n; k++) polar_program_free(&c[k].program);
    o.min_layers = 2;
    CHECK_OK(polar_decode_programs(seg, op, 8, &o, c, 8, &n, &err));
    for (int k = 0; k < n; k++) {
        CHECK(c[k].program.n >= 2, "min layers");
        polar_program_free(&c[k].program);
    }
}

int main(void) {
    RUN(predictor_matches_pytorch);
    RUN(predictor_threads_bitwise);
    RUN(predictor_bad_weights);
    RUN(codec_tie_breaks);
    RUN(codec_rejections);
    RUN(codec_round_trip_all);
    RUN(decode_bounds_and_empty);
    TEST_EXIT();
}
