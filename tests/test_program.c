/* Program text: the grammar of DESIGN.md section 2, its errors with
 * character positions, and the compact format. */
#include "harness.h"

static void expect(const char *text, int D, const int *want, int n) {
    polar_error err;
    polar_program p = {0};
    CHECK_OK(polar_program_parse(text, D, 0, &p, &err));
    CHECK(p.n == n, "'%s': %d layers, want %d", text, p.n, n);
    for (int i = 0; i < n && i < p.n; i++) CHECK(p.layers[i] == want[i], "'%s'[%d] = %d, want %d", text, i, p.layers[i], want[i]);
    polar_program_free(&p);
}

static void program_grammar(void) {
    int base[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    expect("base", 8, base, 8);
    expect("  base ", 8, base, 8);
    expect("0-7", 8, base, 8);
    int design[] = {0, 1, 2, 3, 4, 5, 6, 7, 6, 7, 9, 10, 11};
    expect("0-5,6-7x2,9-11", 12, design, 13);
    expect(" 0 - 5 , 6-7 x 2 ,\n9-11 ", 12, design, 13);
    int single[] = {3};
    expect("3", 8, single, 1);
    int rep[] = {2, 2, 2};
    expect("2x3", 8, rep, 3);
    int reorder[] = {0, 2, 1, 3};
    expect("0,2,1,3", 4, reorder, 4);
    expect("[0, 2,1 ,3]", 4, reorder, 4);
    expect("0-3x1", 4, base, 4);
}

static void expect_error(const char *text, int D, int max_len, const char *why, int column) {
    polar_error err = {0};
    polar_program p = {0};
    polar_status st = polar_program_parse(text, D, max_len, &p, &err);
    CHECK(st == POLAR_ERR_PROGRAM, "'%s' must fail (status %d)", text, (int)st);
    CHECK(strstr(err.msg, why), "'%s': message '%s' lacks '%s'", text, err.msg, why);
    if (column) {
        char col[32];
        snprintf(col, sizeof col, "column %d", column);
        CHECK(strstr(err.msg, col), "'%s': message '%s' lacks '%s'", text, err.msg, col);
    }
    CHECK(p.layers == NULL && p.n == 0, "no program on error");
}

static void program_errors(void) {
    expect_error("", 4, 0, "empty program", 0);
    expect_error("   ", 4, 0, "empty program", 0);
    expect_error("[]", 4, 0, "empty program", 2);
    expect_error("0,4", 4, 0, "layer 4 out of range", 3);
    expect_error("0-9", 4, 0, "out of range", 3);
    expect_error("3-1", 4, 0, "runs backwards", 1);
    expect_error("0-1x0", 4, 0, "x0", 5);
    expect_error("0,,1", 4, 0, "layer index expected", 3);
    expect_error("0,", 4, 0, "found the end", 3);
    expect_error("a", 4, 0, "layer index expected", 1);
    expect_error("0;1", 4, 0, "',' expected", 2);
    expect_error("-1", 4, 0, "layer index expected", 1);
    expect_error("0-", 4, 0, "range end expected", 3);
    expect_error("1x", 4, 0, "repeat count expected", 3);
    expect_error("base,1", 4, 0, "after 'base'", 5);
    expect_error("[0,1", 4, 0, "found the end", 5);
    expect_error("[0,1] 2", 4, 0, "after ']'", 7);
    expect_error("99999999999", 4, 0, "too large", 1);
    expect_error("0-3x5", 4, 0, "longer than the limit of 16", 1);
    expect_error("0-3x2", 4, 6, "longer than the limit of 6", 1);
    expect_error("0-3x1000000000", 4, 0, "longer than the limit", 1);
}

static void program_format(void) {
    static const char *texts[] = {"0-5,6-7x2,9-11", "3", "2x3", "0,2,1,3", "0-3", "5-7x2,0"};
    static const char *want[] = {"0-5,6-7x2,9-11", "3", "2x3", "0,2,1,3", "0-3", "5-7x2,0"};
    polar_error err;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        polar_program p, q;
        char buf[128];
        CHECK_OK(polar_program_parse(texts[i], 12, 0, &p, &err));
        int n = polar_program_format(&p, buf, sizeof buf);
        CHECK(n == (int)strlen(buf) && strcmp(buf, want[i]) == 0, "format '%s' -> '%s'", texts[i], buf);
        CHECK_OK(polar_program_parse(buf, 12, 0, &q, &err));
        CHECK(q.n == p.n && memcmp(q.layers, p.layers, (size_t)p.n * sizeof(int)) == 0, "round trip '%s'", buf);
        char tiny[4];
        CHECK(polar_program_format(&p, tiny, sizeof tiny) == n && strlen(tiny) < 4, "truncated format");
        polar_program_free(&p);
        polar_program_free(&q);
    }
}

int main(void) {
    RUN(program_grammar);
    RUN(program_errors);
    RUN(program_format);
    TEST_EXIT();
}
