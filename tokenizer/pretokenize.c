/* Pre-tokenizers: each family's splitting regex, matched by hand.
 *
 * GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *          | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * Qwen2:   the Llama-3 expression with \p{N} (single digits).
 * Alternatives are tried in order, as a backtracking regex engine does.
 * Bytes that are not valid UTF-8 count as one "other" character each. */
#include "tokenizer.h"
#include "unicode.h"

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER, C_END };

typedef struct {
    const unsigned char *s;
    size_t n;
} text;

/* Class and length of the character at i. */
static int cls(const text *t, size_t i, size_t *len) {
    if (i >= t->n) {
        *len = 0;
        return C_END;
    }
    uint32_t cp;
    int valid;
    *len = (size_t)utf8_decode(t->s + i, t->n - i, &cp, &valid);
    if (!valid) return C_OTHER;
    if (uc_is_letter(cp)) return C_LETTER;
    if (uc_is_number(cp)) return C_NUMBER;
    if (uc_is_space(cp)) return C_SPACE;
    return C_OTHER;
}

static int is_newline(const text *t, size_t i) { return i < t->n && (t->s[i] == '\r' || t->s[i] == '\n'); }

/* End of the run of characters of class c starting at i (at most max of them). */
static size_t run(const text *t, size_t i, int c, int max) {
    size_t len;
    for (int k = 0; k < max && cls(t, i, &len) == c; k++) i += len;
    return i;
}

/* 's 't 're 've 'm 'll 'd after an apostrophe at i; 0 if none. */
static size_t contraction(const text *t, size_t i, int any_case) {
    if (t->s[i] != '\'' || i + 1 >= t->n) return 0;
    unsigned char a = t->s[i + 1], b = i + 2 < t->n ? t->s[i + 2] : 0;
    if (any_case) {
        a = (unsigned char)(a | 0x20);
        b = (unsigned char)(b >= 'A' && b <= 'Z' ? b | 0x20 : b);
        /* (?i) folds U+017F LATIN SMALL LETTER LONG S to s. */
        if (a == (0xC5 | 0x20) && b == 0xBF && t->s[i + 1] == 0xC5) return 3;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S) then \s+, for a whitespace run starting at i. */
static size_t space_run(const text *t, size_t i) {
    size_t end = i, last = i, len;
    while (cls(t, end, &len) == C_SPACE) {
        last = end;
        end += len;
    }
    if (end >= t->n || last == i) return end; /* at the end, or a single space before a non-space */
    return last;                              /* leave the last space to start the next word */
}

static size_t gpt2(const text *t, size_t i) {
    size_t len, c_len;
    size_t k = contraction(t, i, 0);
    if (k) return i + k;
    size_t j = t->s[i] == ' ' ? i + 1 : i;
    int c = cls(t, j, &len);
    if (c == C_LETTER || c == C_NUMBER || c == C_OTHER) return run(t, j, c, 1 << 30);
    (void)c_len;
    return space_run(t, i);
}

static size_t llama_like(const text *t, size_t i, int max_digits) {
    size_t len, len2;
    size_t k = contraction(t, i, 1);
    if (k) return i + k;
    int c = cls(t, i, &len);
    if (c == C_LETTER) return run(t, i, C_LETTER, 1 << 30);
    if (c != C_NUMBER && !is_newline(t, i) && cls(t, i + len, &len2) == C_LETTER)
        return run(t, i + len, C_LETTER, 1 << 30);
    if (c == C_NUMBER) return run(t, i, C_NUMBER, max_digits);
    size_t j = t->s[i] == ' ' ? i + 1 : i;
    if (cls(t, j, &len2) == C_OTHER) {
        size_t end = run(t, j, C_OTHER, 1 << 30);
        while (is_newline(t, end)) end++;
        return end;
    }
    /* \s*[\r\n]+ : through the last newline of the whitespace run. */
    size_t end = i, after_nl = 0;
    while (cls(t, end, &len) == C_SPACE) {
        if (is_newline(t, end)) after_nl = end + 1;
        end += len;
    }
    if (after_nl) return after_nl;
    return space_run(t, i);
}

size_t pretok_next(pretok_style style, const unsigned char *s, size_t n, size_t i) {
    text t = {s, n};
    size_t end;
    switch (style) {
    case PRETOK_GPT2: end = gpt2(&t, i); break;
    case PRETOK_LLAMA3: end = llama_like(&t, i, 3); break;
    default: end = llama_like(&t, i, 1); break;
    }
    if (end <= i) { /* cannot happen for these expressions; never loop forever */
        size_t len;
        cls(&t, i, &len);
        end = i + (len ? len : 1);
    }
    return end;
}
