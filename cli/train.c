/* polar train: the PoLar predictor trained on polar search labels with the
 * reference's recipe. The encoder is frozen, so each question's token states
 * are computed once, up front (or read from --features-cache), and every
 * epoch reuses them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "auto.h"

/* --labels takes every following argument up to the next option, into
 * files (room for argc entries: no limit on how many). */
static void take_labels(int *argc, char **argv, const char **files, int *n_files) {
    int out = 0;
    *n_files = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--labels")) {
            argv[out++] = argv[i];
            continue;
        }
        while (i + 1 < *argc && strncmp(argv[i + 1], "--", 2) && strcmp(argv[i + 1], "-o"))
            files[(*n_files)++] = argv[++i];
    }
    *argc = out;
}

static void show_progress(int done, int total, void *ctx) {
    if (isatty(2)) fprintf(stderr, "\rencoding questions: %d of %d%s", done, total, done == total ? "\n" : "");
}

/* Token states of every question through the encoder PATH[@PROGRAM], or from the cache. */
static int encode_all(const char *cmd, const char *spec, const char *default_program, const char *cache,
                      const polar_train_labels *l, polar_train_features *f) {
    char path[4096];
    snprintf(path, sizeof path, "%s", spec);
    char *at = strrchr(path, '@');
    const char *prog_text = default_program ? default_program : "base";
    if (at) *at = 0, prog_text = at + 1;
    polar_error err;
    double t0 = polar_time_ms();
    if (polar_train_features_make(path, prog_text, l, cache, show_progress, NULL, f, &err) != POLAR_OK)
        return fail_status(cmd, &err);
    double secs = (polar_time_ms() - t0) / 1e3;
    if (f->cache == POLAR_FEATURES_REUSED)
        fprintf(stderr, "features of %d questions read from %s (made with %s@%s)\n", l->n, cache, path, prog_text);
    else
        fprintf(stderr, "encoded %d questions with %s@%s in %.1f s%s%s%s\n", l->n, path, prog_text, secs,
                f->cache == POLAR_FEATURES_REPLACED ? "; the features cache was made from another encoder or other "
                                                      "questions, replaced: " : "",
                f->cache == POLAR_FEATURES_WRITTEN ? "; features cached in " : "",
                f->cache == POLAR_FEATURES_COMPUTED ? "" : cache);
    return 0;
}

/* Examples of questions [q0, q1) in file order. */
static polar_train_example *examples_of(const polar_train_labels *l, const polar_train_features *f, int q0, int q1,
                                         int *n) {
    int total = 0, D = l->n_layers;
    for (int i = q0; i < q1; i++) total += l->q[i].n;
    polar_train_example *ex = malloc((size_t)(total ? total : 1) * sizeof *ex);
    *n = 0;
    for (int i = q0; ex && i < q1; i++)
        for (int k = 0; k < l->q[i].n; k++)
            ex[(*n)++] = (polar_train_example){f->h[i], f->T[i], l->q[i].seg_start + (size_t)k * D,
                                               l->q[i].ops + (size_t)k * D, l->q[i].weight[k]};
    return ex;
}

/* The reference's validation loss: the mean of the batch losses. */
static int val_loss(const char *cmd, const polar_predictor *p, const polar_train_example *ex, int n, int batch,
                    double *out) {
    double sum = 0;
    int nb = 0;
    for (int i = 0; i < n; i += batch, nb++) {
        double l;
        polar_error err;
        if (polar_train_loss(p, ex + i, n - i < batch ? n - i : batch, &l, &err) != POLAR_OK) return fail_status(cmd, &err);
        sum += l;
    }
    *out = nb ? sum / nb : 0;
    return 0;
}

/* What the fit of each epoch is measured on: the labelled questions, the
 * first q_tr of them the training ones, and the commonest training program. */
typedef struct {
    const polar_train_labels *l;
    const polar_train_features *f;
    int q_tr;
    const polar_program *constant;
} fit_sets;

#define FIT_K 5 /* the paper's pass@5: the top 5 programs */

/* The fit of the training [0] and validation [1] questions, by the beam [.][0] and by the catalogue decoder [.][1]. */
typedef struct {
    polar_train_fit set[2][2];
} epoch_fit;

static int measure_fit(const char *cmd, const polar_predictor *p, const fit_sets *s, epoch_fit *out) {
    polar_error err;
    polar_decode_opts dec[2] = {polar_decode_defaults(), polar_decode_defaults()};
    dec[1].catalogue = 1;
    int q[3] = {0, s->q_tr, s->l->n};
    for (int i = 0; i < 2; i++)
        if (polar_train_fit_measure(p, s->l, s->f, q[i], q[i + 1], FIT_K, dec, 2, s->constant, out->set[i], &err) !=
            POLAR_OK)
            return fail_status(cmd, &err);
    return 0;
}

/* Which epoch is saved: the lowest validation loss (the paper's recipe), or
 * the most validation questions with a valid program in the top FIT_K of the
 * beam or of the catalogue decoder (ties to the lower loss). */
typedef enum { SELECT_LOSS, SELECT_BEAM, SELECT_CATALOGUE } epoch_select;

static const char *const select_names[] = {"loss", "beam", "catalogue"};

/* Whether this epoch (loss vl, fit) beats the best so far; the first always does. */
static int epoch_better(epoch_select sel, int first, double vl, const epoch_fit *fit, double best_vl,
                        const epoch_fit *best) {
    if (first) return 1;
    if (sel != SELECT_LOSS) {
        int k = fit->set[1][sel == SELECT_CATALOGUE].topk, best_k = best->set[1][sel == SELECT_CATALOGUE].topk;
        if (k != best_k) return k > best_k;
    }
    return vl < best_vl;
}

static void log_fit(FILE *log, const char *set, const polar_train_fit *f) {
    fprintf(log, "\"%s_top1_valid\":%d,\"%s_top%d_valid\":%d,\"%s_distinct_top\":%d,", set, f->top1, set, FIT_K,
            f->topk, set, f->distinct_top);
}

static void print_fit(const char *what, const polar_train_fit *tr, const polar_train_fit *va) {
    fprintf(stderr, "%s: top program valid for %d of %d training questions (the commonest program: %d), %d of %d "
            "validation (%d); one of the top %d for %d and %d; %d and %d distinct top programs\n", what, tr->top1,
            tr->questions, tr->constant, va->top1, va->questions, va->constant, FIT_K, tr->topk, va->topk,
            tr->distinct_top, va->distinct_top);
}

static int train_epochs(const char *cmd, polar_predictor *p, polar_trainer *t, polar_train_example *tr, int n_tr,
                        const polar_train_example *va, int n_va, int epochs, int batch, uint64_t seed, const char *out,
                        const fit_sets *sets, epoch_select sel, FILE *log) {
    int *order = malloc((size_t)n_tr * sizeof *order);
    polar_train_example *b = malloc((size_t)batch * sizeof *b);
    if (!order || !b) {
        free(order), free(b);
        return fail_usage(cmd, "out of memory for %d examples", n_tr);
    }
    polar_rng rng;
    polar_rng_seed(&rng, seed ^ 0x5eed5eedull);
    double best = 0;
    epoch_fit best_fit = {0};
    int best_epoch = 0, rc = 0, steps_per_epoch = (n_tr + batch - 1) / batch;
    for (int e = 0; e < epochs && rc == 0; e++) {
        for (int i = 0; i < n_tr; i++) order[i] = i;
        for (int i = n_tr - 1; i > 0; i--) { /* Fisher-Yates */
            int j = (int)(polar_rng_uniform(&rng) * (i + 1)), x = order[i];
            order[i] = order[j], order[j] = x;
        }
        double sum = 0, t0 = polar_time_ms();
        for (int s = 0; s < steps_per_epoch && rc == 0; s++) {
            int n = n_tr - s * batch < batch ? n_tr - s * batch : batch;
            for (int k = 0; k < n; k++) b[k] = tr[order[s * batch + k]];
            double l, lr = polar_trainer_lr(t);
            polar_error err;
            if (polar_train_step(t, b, n, &l, &err) != POLAR_OK) {
                rc = fail_status(cmd, &err);
                break;
            }
            sum += l;
            if (isatty(2))
                fprintf(stderr, "\repoch %d/%d step %d/%d loss %.4f lr %.2e %.1f ex/s ", e + 1, epochs, s + 1,
                        steps_per_epoch, l, lr, (double)(s * batch + n) / ((polar_time_ms() - t0) / 1e3));
        }
        if (rc) break;
        double secs = (polar_time_ms() - t0) / 1e3, vl = 0;
        if (isatty(2)) fprintf(stderr, "\n");
        if (n_va && (rc = val_loss(cmd, p, va, n_va, batch, &vl))) break;
        epoch_fit fit;
        if ((rc = measure_fit(cmd, p, sets, &fit))) break;
        /* a loss that is not finite never wins: the predictor has diverged */
        int better = !n_va || (isfinite(vl) && epoch_better(sel, !best_epoch, vl, &fit, best, &best_fit));
        polar_error err;
        if (better && polar_predictor_save(p, out, &err) != POLAR_OK) {
            rc = fail_status(cmd, &err);
            break;
        }
        if (better) best_epoch = e + 1, best_fit = fit, best = vl;
        fprintf(log, "{\"epoch\":%d,\"train_loss\":%.6f,", e + 1, sum / steps_per_epoch);
        if (n_va) fprintf(log, "\"val_loss\":%.6f,\"best\":%s,", vl, better ? "true" : "false");
        log_fit(log, "train", &fit.set[0][0]);
        if (n_va) log_fit(log, "val", &fit.set[1][0]);
        log_fit(log, "catalogue_train", &fit.set[0][1]);
        if (n_va) log_fit(log, "catalogue_val", &fit.set[1][1]);
        fprintf(log, "\"steps\":%d,\"lr\":%.6g,\"seconds\":%.2f,\"examples_per_s\":%.1f}\n", polar_trainer_steps(t),
                polar_trainer_lr(t), secs, n_tr / secs);
        fflush(log);
    }
    if (rc == 0 && best_epoch == 0) {
        fprintf(stderr, "polar %s: error: %s: nothing saved: the validation loss was not finite in any epoch\n", cmd, out);
        rc = 1;
    } else if (rc == 0) {
        char saved[160];
        if (!n_va) snprintf(saved, sizeof saved, "saved epoch %d (the last: no validation questions)", best_epoch);
        else if (sel == SELECT_LOSS) snprintf(saved, sizeof saved, "saved epoch %d (lowest validation loss)", best_epoch);
        else
            snprintf(saved, sizeof saved, "saved epoch %d (most validation questions with a valid program in the %s's top %d)",
                     best_epoch, select_names[sel], FIT_K);
        print_fit(saved, &best_fit.set[0][0], &best_fit.set[1][0]);
        print_fit("decoding its catalogue instead", &best_fit.set[0][1], &best_fit.set[1][1]);
    }
    free(order);
    free(b);
    return rc;
}

static int train(int argc, char **argv, const char *const *files, int n_files) {
    const char *cmd = "train", *model_arg = NULL, *encoder = NULL, *out = NULL,
               *log_path = NULL, *cache = NULL, *lr_text = "5e-4", *ow_text = "0.3", *drop_text = "0.1",
               *select_text = "loss";
    int epochs = 10, batch = 128, warmup = 10, max_paths = 50;
    uint64_t seed = 42;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model_arg, 0},     {"--encoder", OPT_STR, &encoder, 0},
        {"-o", OPT_STR, &out, 0},                {"--log", OPT_STR, &log_path, 0},
        {"--epochs", OPT_INT, &epochs, 0},       {"--batch", OPT_INT, &batch, 0},
        {"--lr", OPT_STR, &lr_text, 0},          {"--warmup", OPT_INT, &warmup, 0},
        {"--orig-weight", OPT_STR, &ow_text, 0}, {"--max-paths", OPT_INT, &max_paths, 0},
        {"--dropout", OPT_STR, &drop_text, 0},   {"--seed", OPT_U64, &seed, 0},
        {"--features-cache", OPT_STR, &cache, 0}, {"--select", OPT_STR, &select_text, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    char *end1, *end2, *end3;
    double lr = strtod(lr_text, &end1), ow = strtod(ow_text, &end2), drop = strtod(drop_text, &end3);
    if (!n_files) return fail_usage(cmd, "--labels FILE... is required (polar search output)");
    if (!out) return fail_usage(cmd, "-o FILE is required (the predictor to write)");
    if (epochs < 1 || batch < 1 || max_paths < 1) return fail_usage(cmd, "--epochs, --batch and --max-paths must be >= 1");
    if (*end1 || !(lr > 0 && lr < 1)) return fail_usage(cmd, "--lr must be a number in (0, 1), got '%s'", lr_text);
    if (*end2 || !(ow >= 0 && ow <= 1)) return fail_usage(cmd, "--orig-weight must be in [0, 1], got '%s'", ow_text);
    if (*end3 || !(drop >= 0 && drop < 1)) return fail_usage(cmd, "--dropout must be in [0, 1), got '%s'", drop_text);
    epoch_select sel = SELECT_LOSS;
    while (sel <= SELECT_CATALOGUE && strcmp(select_text, select_names[sel])) sel++;
    if (sel > SELECT_CATALOGUE) return fail_usage(cmd, "--select must be loss, beam or catalogue, got '%s'", select_text);
    char *model_file;
    const char *model_path;
    polar_arch arch;
    int st_model = model_arch_of(cmd, model_arg, &model_path, &model_file, &arch);
    if (st_model) return st_model;
    polar_error err;
    int D = arch.n_layers, rc = 1, n_tr = 0, n_va = 0;
    /* Default encoder: the target model's first quarter of layers (a
     * Qwen3-Embedding-0.6B folder is the reference's, when one is at hand). */
    char default_program[32];
    snprintf(default_program, sizeof default_program, "0-%d", polar_default_encoder_last_layer(D));
    if (!encoder) encoder = getenv("POLAR_ENCODER");
    int own_encoder = !encoder || !*encoder;
    if (own_encoder) encoder = model_path;
    polar_train_labels l;
    polar_train_features f = {0};
    polar_train_example *tr = NULL, *va = NULL;
    polar_predictor *p = NULL;
    polar_trainer *t = NULL;
    polar_program constant = {0};
    FILE *log = stdout;
    if (polar_train_labels_load(files, n_files, D, max_paths, (float)ow, seed, &l, &err) != POLAR_OK) {
        polar_free(model_file);
        return fail_status(cmd, &err);
    }
    fprintf(stderr, "labels: %d questions (%d lines, %d of them a question asked before: pooled, %d programs found "
            "again), %d with examples; %d valid programs taken (%d over --max-paths left out), %d not expressible as "
            "segments\n", l.lines - l.merged, l.lines, l.merged, l.duplicates, l.n, l.programs, l.capped, l.rejected);
    if ((rc = encode_all(cmd, encoder, own_encoder ? default_program : NULL, cache, &l, &f))) goto done;
    /* the last sixth of the questions validate (the reference: 1250 of 1500) */
    int q_val = l.n / 6, q_tr = l.n - q_val;
    tr = examples_of(&l, &f, 0, q_tr, &n_tr);
    va = examples_of(&l, &f, q_tr, l.n, &n_va);
    polar_predictor_shape shape = polar_predictor_default_shape(D, f.dq);
    int total = epochs * ((n_tr + batch - 1) / batch);
    polar_train_opts o = polar_train_defaults(total);
    o.lr = lr, o.warmup = warmup, o.dropout = (float)drop, o.seed = seed;
    rc = 1;
    if (!tr || !va || n_tr == 0) {
        fprintf(stderr, "polar %s: error: no training examples in the first %d questions\n", cmd, q_tr);
        goto done;
    }
    if (log_path && !(log = fopen(log_path, "w"))) {
        fprintf(stderr, "polar %s: error: %s: cannot create the log\n", cmd, log_path);
        log = stdout;
        goto done;
    }
    if (polar_predictor_create(&shape, seed, &p, &err) != POLAR_OK || polar_trainer_create(p, &o, &t, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    fprintf(stderr, "training: %d examples (%d questions), validation: %d examples (%d questions); %d steps\n", n_tr, q_tr,
            n_va, q_val, total);
    int constant_questions;
    if (polar_train_commonest_program(&l, 0, q_tr, &constant, &constant_questions, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
        goto done;
    }
    char constant_text[1024];
    polar_program_format(&constant, constant_text, sizeof constant_text);
    fprintf(stderr, "the commonest valid program of the training questions: %s (%d of %d)\n", constant_text,
            constant_questions, q_tr);
    polar_catalogue *cat = NULL;
    if (polar_train_catalogue(&l, 0, q_tr, &cat, &err) != POLAR_OK ||
        polar_predictor_set_catalogue(p, cat, &err) != POLAR_OK) {
        polar_catalogue_free(cat);
        rc = fail_status(cmd, &err);
        goto done;
    }
    fprintf(stderr, "catalogue: the %d distinct valid programs of the training questions, saved with the predictor\n",
            polar_catalogue_size(cat));
    fit_sets sets = {&l, &f, q_tr, &constant};
    rc = train_epochs(cmd, p, t, tr, n_tr, va, n_va, epochs, batch, seed, out, &sets, sel, log);
done:
    if (log != stdout) fclose(log);
    polar_program_free(&constant);
    polar_trainer_free(t);
    polar_predictor_free(p);
    free(tr);
    free(va);
    polar_train_features_free(&f);
    polar_train_labels_free(&l);
    polar_free(model_file);
    return rc;
}

int cmd_train(int argc, char **argv) {
    const char **files = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *files);
    if (!files) {
        fprintf(stderr, "polar train: error: out of memory\n");
        return 1;
    }
    int n_files;
    take_labels(&argc, argv, files, &n_files);
    int rc = train(argc, argv, files, n_files);
    free(files);
    return rc;
}
