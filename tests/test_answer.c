/* The eval answer checker: \boxed extraction, the last number, choice
 * letters, the normal form and answer equality, table by table. Many rows
 * are answers that must NOT match: a checker that says yes too often
 * inflates every accuracy it reports. */
#include "harness.h"

static int n_cases;

typedef struct {
    const char *text;
    int found;
    const char *want;
} extract_case;

static void answer_boxed(void) {
    static const extract_case t[] = {
        {"The answer is \\boxed{42}.", 1, "42"},
        {"\\boxed{\\frac{1}{2}}", 1, "\\frac{1}{2}"},
        {"\\boxed{\\frac{\\sqrt{3}}{2}} done", 1, "\\frac{\\sqrt{3}}{2}"},
        {"first \\boxed{1} then \\boxed{2}", 1, "2"},
        {"\\boxed{1}\\boxed{2}\\boxed{3}", 1, "3"},
        {"\\fbox{7}", 1, "7"},
        {"\\boxed{5} and \\fbox{6}", 1, "6"},
        {"\\fbox{6} and \\boxed{5}", 1, "5"},
        {"$\\boxed{x^{2}+1}$", 1, "x^{2}+1"},
        {"\\boxed{ 12 }", 1, " 12 "},
        {"\\boxed{}", 1, ""},
        {"\\boxed {9}", 1, "9"},
        {"\\boxed 9$", 1, "9"},
        {"\\boxed{\\{1,2\\}}", 1, "\\{1,2\\}"},
        {"\\boxed{\\text{B}}", 1, "\\text{B}"},
        {"\\boxed{\\boxed{4}}", 1, "4"},
        {"no box here: 42", 0, ""},
        {"", 0, ""},
        {"\\boxed{12", 0, ""},
        {"\\boxed{\\frac{1}{2}", 0, ""},
        {"\\boxed{1} then \\boxed{2", 0, ""},
        {"\\boxed", 0, ""},
        {"\\boxedx{3}", 0, ""},
        {"boxed{3}", 0, ""},
        {"\\box{3}", 0, ""},
    };
    char out[64];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        int f = polar_answer_boxed(t[i].text, out, sizeof out);
        CHECK(f == t[i].found && strcmp(out, t[i].want) == 0, "boxed('%s') = %d '%s', want %d '%s'", t[i].text, f, out,
              t[i].found, t[i].want);
    }
    /* Truncated to the buffer, NUL-terminated; NULL text and a zero cap are safe. */
    char small[4] = "zzz";
    CHECK(polar_answer_boxed("\\boxed{123456}", small, sizeof small) == 1 && strcmp(small, "123") == 0, "'%s'",
          small);
    CHECK(polar_answer_boxed(NULL, out, sizeof out) == 0 && out[0] == '\0', "NULL text");
    CHECK(polar_answer_boxed("\\boxed{1}", NULL, 0) == 1, "no buffer");
    n_cases += 3;
}

static void answer_last_number(void) {
    static const extract_case t[] = {
        {"The answer is 42.", 1, "42"},
        {"It costs $1,234.50 in total", 1, "1,234.50"},
        {"1, 2, 3", 1, "3"},
        {"x = -3", 1, "-3"},
        {"5-3", 1, "3"},
        {"(-7)", 1, "-7"},
        {"about 3/4 of them", 1, "3/4"},
        {"only .5 left", 1, ".5"},
        {"18 eggs, then 9 eggs, so 27", 1, "27"},
        {"1,000,000 people", 1, "1,000,000"},
        {"3.14159", 1, "3.14159"},
        {"Janet makes 9 * 2 = $18 every day.", 1, "18"},
        {"Call 555-1234", 1, "1234"},
        {"no digits at all", 0, ""},
        {"", 0, ""},
        {"a - b", 0, ""},
    };
    char out[64];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        int f = polar_answer_last_number(t[i].text, out, sizeof out);
        CHECK(f == t[i].found && strcmp(out, t[i].want) == 0, "last_number('%s') = %d '%s', want %d '%s'", t[i].text,
              f, out, t[i].found, t[i].want);
    }
    CHECK(polar_answer_last_number(NULL, out, sizeof out) == 0, "NULL text");
    n_cases++;
}

typedef struct {
    const char *text;
    int n;
    int want;
} choice_case;

static void answer_choice(void) {
    static const choice_case t[] = {
        {"\\boxed{B}", 4, 1},
        {"\\boxed{\\text{C}}", 4, 2},
        {"\\boxed{(D)}", 4, 3},
        {"\\boxed{b}", 4, 1},
        {"The answer is C.", 4, 2},
        {"the answer is (A)", 4, 0},
        {"Answer: D", 4, 3},
        {"answer is: B because", 4, 1},
        {"(B)", 4, 1},
        {"B)", 4, 1},
        {"B. 42 apples", 4, 1},
        {"C", 4, 2},
        {"  D  ", 4, 3},
        {"I think (C) is right", 4, 2},
        {"Between A and C, C", 4, 2},
        {"\\boxed{E}", 4, -1},
        {"E", 4, -1},
        {"The answer is E", 4, -1},
        {"\\boxed{E}", 5, 4},
        {"J", 10, 9},
        {"A cell divides", 4, -1},
        {"no letter here", 4, -1},
        {"", 4, -1},
        {"\\boxed{42}", 4, -1},
        {"B", 0, -1},
        {"B", 27, -1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        int k = polar_answer_choice(t[i].text, t[i].n);
        CHECK(k == t[i].want, "choice('%s', %d) = %d, want %d", t[i].text, t[i].n, k, t[i].want);
    }
    CHECK(polar_answer_choice(NULL, 4) == -1, "NULL text");
    n_cases++;
}

typedef struct {
    const char *in, *want;
} norm_case;

static void answer_normalize(void) {
    static const norm_case t[] = {
        {"42", "42"},
        {"$42$", "42"},
        {"\\$42", "42"},
        {"  42  ", "42"},
        {"42.", "42"},
        {"+42", "42"},
        {"42.0", "42"},
        {"42.00", "42"},
        {"2.50", "2.5"},
        {".5", "0.5"},
        {"-.5", "-0.5"},
        {"1,234", "1234"},
        {"1,234,567.89", "1234567.89"},
        {"1{,}234", "1234"},
        {"1\\,000", "1000"},
        {"50\\%", "50"},
        {"50%", "50"},
        {"90^\\circ", "90"},
        {"90^{\\circ}", "90"},
        {"90\xc2\xb0", "90"},
        {"\\dfrac{1}{2}", "\\frac{1}{2}"},
        {"\\tfrac{3}{4}", "\\frac{3}{4}"},
        {"\\frac12", "\\frac{1}{2}"},
        {"\\frac 12", "\\frac{1}{2}"},
        {"\\frac{1}2", "\\frac{1}{2}"},
        {"\\frac ab", "\\frac{a}{b}"},
        {"\\sqrt2", "\\sqrt{2}"},
        {"1/2", "\\frac{1}{2}"},
        {"-3/4", "-\\frac{3}{4}"},
        {"\\left( 1, 2 \\right)", "(1,2)"},
        {"\\leftarrow", "\\leftarrow"},
        {"x = 5", "5"},
        {"x=5", "5"},
        {"y = 2x + 1", "2x+1"},
        {"a = b = c", "a=b=c"},
        {"5 apples", "5"},
        {"12 dollars", "12"},
        {"5 sq ft", "5"},
        {"5 sq. ft.", "5"},
        {"\\frac{1}{2} cup", "\\frac{1}{2}"},
        {"(3) dogs", "(3)"},
        {"five apples", "fiveapples"},
        {"12 \\text{ cm}", "12"},
        {"12\\text{ cm}^2", "12"},
        {"5\\mbox{ inches}", "5"},
        {"15 (balls)", "15(balls)"},
        {"3:30 p.m.", "3:30"},
        {"\\text{Yes}", "Yes"},
        {"Mrs. Hilt", "Mrs.Hilt"},
        {"\\boxed{7}", "7"},
        {"The answer is \\boxed{\\dfrac{1}{3}}", "\\frac{1}{3}"},
        {"\\displaystyle 3", "3"},
        {"2\\!\\cdot\\!3", "2\\cdot3"},
        {"\xe2\x88\x92" "4", "-4"},
        {"", ""},
    };
    char out[128];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        polar_answer_normalize(t[i].in, out, sizeof out);
        CHECK(strcmp(out, t[i].want) == 0, "normalize('%s') = '%s', want '%s'", t[i].in, out, t[i].want);
    }
    polar_answer_normalize(NULL, out, sizeof out);
    CHECK(out[0] == '\0', "NULL input");
    char small[3];
    polar_answer_normalize("12345", small, sizeof small);
    CHECK(strcmp(small, "12") == 0, "truncated: '%s'", small);
    n_cases += 2;
}

typedef struct {
    const char *pred, *gold;
    int want;
} equal_case;

static void answer_equal(void) {
    static const equal_case t[] = {
        /* the same answer written differently */
        {"42", "42", 1},
        {"42.0", "42", 1},
        {"42.00", "42", 1},
        {"+42", "42", 1},
        {"$42", "42", 1},
        {"\\$42.00", "42", 1},
        {"42.", "42", 1},
        {"1,234", "1234", 1},
        {"1234", "1,234", 1},
        {"1,234.5", "1234.5", 1},
        {"50\\%", "50", 1},
        {"50%", "50", 1},
        {"\\frac{1}{2}", "0.5", 1},
        {"\\dfrac{1}{2}", "1/2", 1},
        {"\\frac12", "0.5", 1},
        {"1/2", ".5", 1},
        {"\\tfrac{3}{4}", "0.75", 1},
        {"-\\frac{1}{4}", "-0.25", 1},
        {"\\frac{-1}{4}", "-0.25", 1},
        {"2/3", "0.6666666667", 1},
        {"0.6667", "2/3", 1},
        {"3.33333", "10/3", 1},
        {"90^\\circ", "90", 1},
        {"90\xc2\xb0", "90", 1},
        {"x = 5", "5", 1},
        {"x=5", "5", 1},
        {"5 apples", "5", 1},
        {"12 dollars", "12", 1},
        {"12\\text{ cm}", "12", 1},
        {"\\boxed{18}", "18", 1},
        {"\\text{18}", "18", 1},
        {"18.", "18", 1},
        {"100000.00001", "100000", 1},
        {"0", "0.00001", 1},
        {"-3", "-3.0", 1},
        {"Yes", "yes", 1},
        {"\\text{Mrs. Hilt}", "Mrs. Hilt", 1},
        {"3:30 p.m.", "3:30", 1},
        {"(1, 2)", "(1,2)", 1},
        {"\\left(1,2\\right)", "(1,2)", 1},
        {"x^2+1", "x^{2}+1", 0}, /* no symbolic algebra: brace forms differ */
        {"\\sqrt2", "\\sqrt{2}", 1},
        /* different answers */
        {"5", "50", 0},
        {"50", "5", 0},
        {"1/2", "2", 0},
        {"2", "1/2", 0},
        {"\\frac{1}{2}", "\\frac{2}{1}", 0},
        {"3.1", "3.14", 0},
        {"3.14", "3.1416", 0},
        {"0.33", "1/3", 0},
        {"42", "-42", 0},
        {"-5", "5", 0},
        {"1,234", "1.234", 0},
        {"12", "1,2", 0},
        {"50%", "0.5", 0}, /* percent compares as the number before the sign */
        {"100", "100.1", 0},
        {"1000", "1001", 0},
        {"18", "180", 0},
        {"0.1", "0.01", 0},
        {"0.001", "0.0025", 0},
        {"1e5", "100000", 0}, /* exponents are not read as numbers */
        {"7", "", 0},
        {"", "7", 0},
        {"", "", 0},
        {"\\boxed{}", "", 0},
        {"\\boxed{12", "12", 0}, /* an unclosed box is not unwrapped */
        {"B", "C", 0},
        {"A", "a1", 0},
        {"Yes", "No", 0},
        {"x = 5", "6", 0},
        {"5 apples", "6", 0},
        {"\\frac{1}{0}", "0", 0},
        {"1/0", "1/0", 1}, /* not numbers, but the same text */
        {"inf", "inf", 1},
        {"inf", "1e999", 0},
        {"nan", "nan", 1},
        {"0x10", "16", 0},
        {"2.5", "5/2", 1},
        {"-1/3", "-(1/3)", 1},
        {"(5)", "5", 1},
        {"-(-2)", "2", 1},
        {"((5))", "5", 0}, /* one level of parentheses only */
        {"(1,2)", "12", 0},
        {"5/2", "2.4999", 1},
        {"5/2", "2.49", 0},
        {"123456789", "123456780", 1}, /* within relative 1e-4 */
        {"123456789", "123400000", 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        int e = polar_answer_equal(t[i].pred, t[i].gold);
        CHECK(e == t[i].want, "equal('%s', '%s') = %d, want %d", t[i].pred, t[i].gold, e, t[i].want);
        int r = polar_answer_equal(t[i].gold, t[i].pred);
        CHECK(r == e, "equal is not symmetric for '%s', '%s'", t[i].pred, t[i].gold);
    }
    CHECK(polar_answer_equal(NULL, "1") == 0 && polar_answer_equal("1", NULL) == 0, "NULL");
    n_cases++;
}

/* Bad input never crashes: long, unbalanced and odd text through every call. */
static void answer_hostile(void) {
    static const char *const t[] = {"\\boxed{{{{{{{{", "}}}}}}}\\boxed{", "\\text{\\text{\\text{", "\\frac", "\\frac{",
                                    "\\sqrt", "$$$$", "=====", "1/", "/1", ".", "-", "--5", "\\", "\\left", "\xff\xfe\x80",
                                    "\\fbox{\\}", "1,", ",123", "((((B", "\r(", "(", "A", "A "};
    char out[32];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++, n_cases++) {
        polar_answer_boxed(t[i], out, sizeof out);
        polar_answer_last_number(t[i], out, sizeof out);
        polar_answer_choice(t[i], 4);
        polar_answer_normalize(t[i], out, sizeof out);
        polar_answer_equal(t[i], t[i]);
    }
    /* Long text takes linear time: no scan restarts per box or per word. */
    static const char *const unit[] = {"\\boxed{1,234<<>>(A) ", "5 a a a a a a a a a ", "\\fbox\\boxed{{{{{{{{"};
    size_t n = 200000;
    char *big = malloc(n + 1);
    for (size_t u = 0; u < sizeof unit / sizeof unit[0]; u++, n_cases++) {
        size_t k = strlen(unit[u]);
        for (size_t i = 0; i < n; i++) big[i] = unit[u][i % k];
        big[n] = '\0';
        double t0 = polar_time_ms();
        polar_answer_boxed(big, out, sizeof out);
        polar_answer_last_number(big, out, sizeof out);
        polar_answer_choice(big, 4);
        polar_answer_equal(big, big);
        double ms = polar_time_ms() - t0;
        CHECK(ms < 1000, "200 kB of '%s' took %.0f ms", unit[u], ms);
    }
    free(big);
}

int main(void) {
    RUN(answer_boxed);
    RUN(answer_last_number);
    RUN(answer_choice);
    RUN(answer_normalize);
    RUN(answer_equal);
    RUN(answer_hostile);
    printf("%d cases\n", n_cases);
    TEST_EXIT();
}
