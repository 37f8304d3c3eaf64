/* The catalogue decoder: ranking by the training loss (against the loss
 * computed here from its definition), distinct programs in first-seen
 * order, ties kept in order, layer bounds, the catalogue saved in the
 * predictor file and read back, bad metadata refused, the catalogue of
 * labelled questions polar train stores, and the fit under both decoders. */
#include <unistd.h>

#include "harness.h"

#define D 8

static polar_program parsed(const char *text) {
    polar_program p = {0};
    polar_error err;
    CHECK_OK(polar_program_parse(text, D, 0, &p, &err));
    return p;
}

/* The reference's loss, from its definition: BCE-with-logits of the segment
 * starts over positions 1..D-1 (mean) + cross entropy of the ops at the
 * segment starts (mean). */
static double loss_of(const float *seg, const float *op, const polar_program *p) {
    unsigned char start[D];
    int ops[D];
    polar_error err;
    CHECK_OK(polar_program_to_segments(p, D, 4, start, ops, &err));
    double bce = 0, ce = 0;
    int n_ops = 0;
    for (int i = 1; i < D; i++) {
        double s = seg[i], prob = 1 / (1 + exp(-s));
        bce -= start[i] ? log(prob) : log(1 - prob);
    }
    for (int i = 0; i < D; i++) {
        if (ops[i] < 0) continue;
        double z = exp(op[3 * i]) + exp(op[3 * i + 1]) + exp(op[3 * i + 2]);
        ce -= op[3 * i + ops[i]] - log(z);
        n_ops++;
    }
    return bce / (D - 1) + ce / n_ops;
}

static const char *const programs[] = {"0-7", "0-3,2-7", "0-1,4-7", "0-7,6-7", "0-2,2-7", "1-7", "0-5"};
#define N_PROGRAMS (int)(sizeof programs / sizeof programs[0])

static void rank_by_training_loss(void) {
    polar_program p[N_PROGRAMS + 1];
    for (int i = 0; i < N_PROGRAMS; i++) p[i] = parsed(programs[i]);
    p[N_PROGRAMS] = parsed(programs[2]); /* a repeat: kept once */
    polar_catalogue *c;
    polar_error err;
    CHECK_OK(polar_catalogue_create(p, N_PROGRAMS + 1, D, 4, &c, &err));
    CHECK(polar_catalogue_size(c) == N_PROGRAMS, "distinct programs: %d", polar_catalogue_size(c));
    for (int i = 0; i < N_PROGRAMS; i++) {
        const polar_program *q = polar_catalogue_program(c, i);
        CHECK(q && q->n == p[i].n && !memcmp(q->layers, p[i].layers, (size_t)q->n * sizeof *q->layers),
              "program %d in first-seen order", i);
    }
    CHECK(!polar_catalogue_program(c, N_PROGRAMS) && !polar_catalogue_program(c, -1), "outside the catalogue");
    uint32_t h = 12345;
    for (int trial = 0; trial < 20; trial++) {
        float seg[D], op[3 * D];
        for (int i = 0; i < 4 * D; i++) {
            h = h * 1664525u + 1013904223u;
            float v = (float)((h >> 8) % 2001) / 250.0f - 4.0f;
            if (i < D) seg[i] = v;
            else op[i - D] = v;
        }
        polar_candidate out[N_PROGRAMS];
        int n;
        CHECK_OK(polar_catalogue_rank(c, seg, op, NULL, out, N_PROGRAMS, &n, &err));
        CHECK(n == N_PROGRAMS, "every program ranked: %d", n);
        for (int k = 0; k < n; k++) {
            double want = -loss_of(seg, op, &out[k].program);
            CHECK(fabs(out[k].score - want) < 1e-9, "trial %d rank %d: score %.12f, the loss says %.12f", trial, k,
                  out[k].score, want);
            if (k) CHECK(out[k].score <= out[k - 1].score, "trial %d: best first", trial);
            polar_program_free(&out[k].program);
        }
    }
    /* bounds and max_out cut */
    float seg0[D] = {0}, op0[3 * D] = {0};
    polar_candidate out[N_PROGRAMS];
    int n;
    CHECK_OK(polar_catalogue_rank(c, seg0, op0, NULL, out, 3, &n, &err));
    CHECK(n == 3, "max_out: %d", n);
    for (int k = 0; k < n; k++) polar_program_free(&out[k].program);
    polar_decode_opts o = polar_decode_defaults();
    o.min_layers = 8, o.max_layers = 9;
    CHECK_OK(polar_catalogue_rank(c, seg0, op0, &o, out, N_PROGRAMS, &n, &err));
    CHECK(n == 2, "8 to 9 layers: 0-7 and 0-2,2-7, got %d", n);
    for (int k = 0; k < n; k++) {
        CHECK(out[k].program.n >= 8 && out[k].program.n <= 9, "bounds: %d layers", out[k].program.n);
        polar_program_free(&out[k].program);
    }
    CHECK(polar_catalogue_rank(c, seg0, op0, NULL, out, 0, &n, &err) == POLAR_ERR_ARG, "max_out 0");
    polar_catalogue_free(c);
    /* equal scores keep the catalogue's order: the same two segments, other ops */
    static const char *const same_form[] = {"0-3,4-7,4-7", "4-7", "0-7", "0-3,0-3,4-7"};
    polar_program t[4];
    for (int i = 0; i < 4; i++) t[i] = parsed(same_form[i]);
    CHECK_OK(polar_catalogue_create(t, 4, D, 4, &c, &err));
    CHECK_OK(polar_catalogue_rank(c, seg0, op0, NULL, out, 4, &n, &err));
    CHECK(n == 4, "ties: %d", n);
    for (int k = 0; k < n; k++) {
        CHECK(out[k].program.n == t[k].n && !memcmp(out[k].program.layers, t[k].layers, (size_t)t[k].n * sizeof(int)) &&
                  out[k].score == out[0].score,
              "tie %d keeps the catalogue's order", k);
        polar_program_free(&out[k].program);
    }
    for (int i = 0; i < 4; i++) polar_program_free(&t[i]);
    polar_catalogue_free(c);
    /* a program with no segment form is refused */
    polar_program three = parsed("0-1,1,1,2-7");
    CHECK(polar_catalogue_create(&three, 1, D, 4, &c, &err) == POLAR_ERR_PROGRAM && !c, "a layer three times: %s",
          err.msg);
    polar_program_free(&three);
    for (int i = 0; i <= N_PROGRAMS; i++) polar_program_free(&p[i]);
}

static void saved_with_the_predictor(void) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-catalogue-%d.safetensors", (int)getpid());
    polar_predictor_shape sh = polar_predictor_default_shape(D, 32);
    polar_predictor *pr = NULL, *back = NULL;
    polar_error err;
    CHECK_OK(polar_predictor_create(&sh, 1, &pr, &err));
    polar_program p[N_PROGRAMS];
    for (int i = 0; i < N_PROGRAMS; i++) p[i] = parsed(programs[i]);
    polar_catalogue *c = NULL, *wrong = NULL;
    CHECK_OK(polar_catalogue_create(p, N_PROGRAMS, D, 4, &c, &err));
    CHECK_OK(polar_catalogue_create(NULL, 0, D + 1, 4, &wrong, &err));
    CHECK(polar_predictor_set_catalogue(pr, wrong, &err) == POLAR_ERR_ARG, "another D: %s", err.msg);
    polar_catalogue_free(wrong);
    CHECK(!polar_predictor_catalogue(pr), "a fresh predictor has none");
    CHECK_OK(polar_predictor_set_catalogue(pr, c, &err));
    CHECK_OK(polar_predictor_save(pr, path, &err));
    CHECK_OK(polar_predictor_load(path, &back, &err));
    const polar_catalogue *got = polar_predictor_catalogue(back);
    CHECK(polar_catalogue_size(got) == N_PROGRAMS, "read back: %d programs", polar_catalogue_size(got));
    for (int i = 0; i < polar_catalogue_size(got); i++) {
        const polar_program *q = polar_catalogue_program(got, i);
        CHECK(q->n == p[i].n && !memcmp(q->layers, p[i].layers, (size_t)q->n * sizeof(int)), "program %d", i);
    }
    polar_predictor_free(back);
    /* a program in the metadata the loader cannot parse: a format error naming it */
    FILE *f = fopen(path, "r+b");
    char head[4096] = {0};
    size_t got_bytes = f ? fread(head, 1, sizeof head - 1, f) : 0;
    char *at = got_bytes ? strstr(head + 8, "0-3,2-7") : NULL;
    CHECK(at != NULL, "the programs are in the header");
    if (f && at) {
        fseek(f, (long)(at - head), SEEK_SET);
        fputc('z', f);
    }
    if (f) fclose(f);
    CHECK(polar_predictor_load(path, &back, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "metadata programs") &&
              strstr(err.msg, "catalogue program 2"),
          "bad catalogue: %s", err.msg);
    unlink(path);
    polar_predictor_free(pr);
    for (int i = 0; i < N_PROGRAMS; i++) polar_program_free(&p[i]);
}

static void from_the_labels(void) {
    char path[128];
    snprintf(path, sizeof path, "/tmp/polar-catalogue-labels-%d.jsonl", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "labels file");
    if (!f) return;
    /* q1: the base and a loop; q2: the loop again and a skip; q3: none valid */
    fprintf(f, "{\"question\":\"q1\",\"final_valid_transitions\":[[0,1,2,3,4,5,6,7],[0,1,2,3,2,3,4,5,6,7]]}\n");
    fprintf(f, "{\"question\":\"q2\",\"final_valid_transitions\":[[0,1,2,3,2,3,4,5,6,7],[1,2,3,4,5,6,7]]}\n");
    fprintf(f, "{\"question\":\"q3\",\"final_valid_transitions\":[]}\n");
    fclose(f);
    const char *files[] = {path};
    polar_train_labels l;
    polar_error err;
    CHECK_OK(polar_train_labels_load(files, 1, D, 50, 0.3f, 1, &l, &err));
    polar_catalogue *c = NULL;
    CHECK_OK(polar_train_catalogue(&l, 0, l.n, &c, &err));
    CHECK(polar_catalogue_size(c) == 3, "3 distinct programs over 4 examples: %d", polar_catalogue_size(c));
    polar_catalogue_free(c);
    CHECK_OK(polar_train_catalogue(&l, 1, 2, &c, &err));
    CHECK(polar_catalogue_size(c) == 2, "q2's: %d", polar_catalogue_size(c));
    polar_catalogue_free(c);
    CHECK(polar_train_catalogue(&l, 0, l.n + 1, &c, &err) == POLAR_ERR_ARG && !c, "past the questions");
    /* the fit under both decoders in one call equals each alone; ranking all 3 programs, the
     * catalogue's top 3 hold a valid program for every question */
    polar_predictor_shape sh = polar_predictor_default_shape(D, 16);
    polar_predictor *pr = NULL;
    CHECK_OK(polar_predictor_create(&sh, 7, &pr, &err));
    float h[2 * 16];
    for (int i = 0; i < 2 * 16; i++) h[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    int T[2] = {2, 2};
    float *hs[2] = {h, h + 16};
    polar_train_features feat = {2, 16, T, hs, POLAR_FEATURES_COMPUTED};
    polar_decode_opts dec[2] = {polar_decode_defaults(), polar_decode_defaults()};
    dec[1].catalogue = 1;
    polar_train_fit both[2], one;
    CHECK(polar_train_fit_measure(pr, &l, &feat, 0, l.n, 3, dec, 2, NULL, both, &err) == POLAR_ERR_CONFIG,
          "the catalogue decoder without a catalogue: %s", err.msg);
    CHECK_OK(polar_train_catalogue(&l, 0, l.n, &c, &err));
    CHECK_OK(polar_predictor_set_catalogue(pr, c, &err));
    CHECK_OK(polar_train_fit_measure(pr, &l, &feat, 0, l.n, 3, dec, 2, NULL, both, &err));
    for (int d = 0; d < 2; d++) {
        CHECK_OK(polar_train_fit_measure(pr, &l, &feat, 0, l.n, 3, &dec[d], 1, NULL, &one, &err));
        CHECK(!memcmp(&one, &both[d], sizeof one), "decoder %d alone and beside the other", d);
    }
    CHECK(both[1].questions == 2 && both[1].topk == 2, "the catalogue's top 3: %d of %d", both[1].topk,
          both[1].questions);
    CHECK(polar_train_fit_measure(pr, &l, &feat, 0, l.n, 3, NULL, 2, NULL, both, &err) == POLAR_ERR_ARG,
          "two decoders, no options");
    polar_predictor_free(pr);
    polar_train_labels_free(&l);
    unlink(path);
}

int main(void) {
    RUN(rank_by_training_loss);
    RUN(saved_with_the_predictor);
    RUN(from_the_labels);
    return h_failed_cases ? 1 : 0;
}
