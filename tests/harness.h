/* A minimal test harness: RUN(fn) runs one test case and prints
 * "PASS name" or "FAIL name"; CHECK records a failure with its location.
 * tests/run.sh counts these lines across every test program. */
#ifndef POLAR_TEST_HARNESS_H
#define POLAR_TEST_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "polar.h"

/* The larger of a running maximum and a new difference, NaN if either is:
 * fmaxf drops a NaN, so a result gone NaN would pass a bound. */
static inline float nan_max(float a, float b) { return isnan(a) || isnan(b) ? NAN : fmaxf(a, b); }

static int h_failures; /* failures in the current case */
static int h_failed_cases;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            h_failures++;                                                  \
            printf("  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
        }                                                                  \
    } while (0)

/* A polar call that must succeed; needs a `polar_error err` in scope. */
#define CHECK_OK(call)                                                     \
    do {                                                                   \
        polar_status s_ = (call);                                          \
        CHECK(s_ == POLAR_OK, "%s: %s", polar_status_name(s_), err.msg);   \
    } while (0)

#define RUN(fn)                                                            \
    do {                                                                   \
        h_failures = 0;                                                    \
        fn();                                                              \
        printf("%s %s\n", h_failures ? "FAIL" : "PASS", #fn);              \
        fflush(stdout);                                                    \
        if (h_failures) h_failed_cases++;                                  \
    } while (0)

#define TEST_EXIT() return h_failed_cases ? 1 : 0

/* The cases a test program was asked for by name (none: all of them). */
static char **h_only;
static int h_n_only;

static inline int h_wanted(const char *name) {
    for (int i = 0; i < h_n_only; i++)
        if (!strcmp(h_only[i], name)) return 1;
    return h_n_only == 0;
}

#define RUN_IF(fn)                                                         \
    do {                                                                   \
        if (h_wanted(#fn)) RUN(fn);                                        \
    } while (0)

/* Last-position logits (vocab floats) of a fixed prompt under a program:
 * the behaviour two copies of a model are compared by. */
static inline void prompt_logits(const polar_model *m, const char *program, float *out) {
    polar_error err;
    polar_model_info info;
    polar_program p;
    polar_session *s = NULL;
    polar_model_info_get(m, &info);
    CHECK_OK(polar_program_parse(program, info.arch.n_layers, 0, &p, &err));
    polar_session_opts so = {.max_ctx = 8, .n_threads = 2};
    CHECK_OK(polar_session_create(m, &p, &so, &s, &err));
    int toks[6] = {3, 1, 4, 1, 5, 9};
    if (s) CHECK_OK(polar_prefill(s, toks, 6, NULL, &err));
    if (s) memcpy(out, polar_logits(s), (size_t)info.arch.vocab * sizeof(float));
    polar_session_free(s);
    polar_program_free(&p);
}

/* Directory of the committed fixtures; tests run from the repo root. */
#define GOLDEN_DIR "tests/golden"

/* The golden fixture model of arch (GOLDEN_DIR/arch), its info into *info
 * when info is not NULL; NULL after a failed check. */
static inline polar_model *golden_model(const char *arch, polar_model_info *info) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, arch);
    polar_error err;
    polar_model *m = NULL;
    CHECK_OK(polar_model_load(dir, &m, &err));
    if (m && info) polar_model_info_get(m, info);
    return m;
}

#endif
