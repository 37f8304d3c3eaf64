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

/* Directory of the committed fixtures; tests run from the repo root. */
#define GOLDEN_DIR "tests/golden"

#endif
