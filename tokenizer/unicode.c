#include "unicode.h"

#include "polar.h"

#include <stdlib.h>
#include <string.h>

static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid - 1;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

int uc_is_letter(uint32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return in_ranges(uc_letter, uc_letter_count, cp);
}

int uc_is_number(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return in_ranges(uc_number, uc_number_count, cp);
}

int uc_is_space(uint32_t cp) { return in_ranges(uc_space, uc_space_count, cp); }

int uc_combining_class(uint32_t cp) {
    int lo = 0, hi = uc_ccc_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < uc_ccc[mid][0]) hi = mid - 1;
        else if (cp > uc_ccc[mid][1]) lo = mid + 1;
        else return (int)uc_ccc[mid][2];
    }
    return 0;
}

int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp, int *valid) {
    *valid = 0;
    *cp = 0xFFFD;
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        *valid = 1;
        return 1;
    }
    int len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 1;
    if ((size_t)len > n) return 1;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 1;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    *valid = 1;
    return len;
}

int utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Hangul syllables compose and decompose algorithmically. */
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_N = 19, V_N = 21, T_N = 28 };

static int decompose(uint32_t cp, uint32_t *out) {
    if (cp >= S_BASE && cp < S_BASE + L_N * V_N * T_N) {
        uint32_t s = cp - S_BASE;
        out[0] = L_BASE + s / (V_N * T_N);
        out[1] = V_BASE + (s % (V_N * T_N)) / T_N;
        if (s % T_N == 0) return 2;
        out[2] = T_BASE + s % T_N;
        return 3;
    }
    int lo = 0, hi = uc_decomp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < uc_decomp[mid][0]) hi = mid - 1;
        else if (cp > uc_decomp[mid][0]) lo = mid + 1;
        else {
            memcpy(out, uc_decomp_pool + uc_decomp[mid][1], uc_decomp[mid][2] * sizeof *out);
            return (int)uc_decomp[mid][2];
        }
    }
    out[0] = cp;
    return 1;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_N && b >= V_BASE && b < V_BASE + V_N)
        return S_BASE + ((a - L_BASE) * V_N + (b - V_BASE)) * T_N;
    if (a >= S_BASE && a < S_BASE + L_N * V_N * T_N && (a - S_BASE) % T_N == 0 && b > T_BASE && b < T_BASE + T_N)
        return a + (b - T_BASE);
    int lo = 0, hi = uc_compose_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (a < uc_compose[mid][0] || (a == uc_compose[mid][0] && b < uc_compose[mid][1])) hi = mid - 1;
        else if (a > uc_compose[mid][0] || b > uc_compose[mid][1]) lo = mid + 1;
        else return uc_compose[mid][2];
    }
    return 0;
}

/* A code point, or a raw invalid byte kept as is (marked by RAW). */
#define RAW 0x80000000u

int uc_nfc(const char *text, size_t n, char **out, size_t *out_len) {
    /* Decomposition can grow a code point into at most 18 (the UCD's
     * longest full canonical decomposition is shorter). */
    uint32_t *cps = malloc((n * 18 + 1) * sizeof *cps);
    char *o = malloc(n * 4 + 4);
    if (!cps || !o) {
        free(cps);
        free(o);
        return 0;
    }
    size_t k = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int valid, len = utf8_decode(s + i, n - i, &cp, &valid);
        if (!valid) {
            cps[k++] = RAW | s[i];
            i++;
            continue;
        }
        k += (size_t)decompose(cp, cps + k);
        i += (size_t)len;
    }
    /* Canonical order: stable insertion sort of each run of non-starters. */
    for (size_t i = 1; i < k; i++) {
        uint32_t c = cps[i];
        int cc = c & RAW ? 0 : uc_combining_class(c);
        if (!cc) continue;
        size_t j = i;
        while (j > 0 && !(cps[j - 1] & RAW) && uc_combining_class(cps[j - 1]) > cc) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = c;
    }
    /* Canonical composition. */
    size_t w = 0;
    long starter = -1;
    int last_cc = -1;
    for (size_t i = 0; i < k; i++) {
        uint32_t c = cps[i];
        int cc = c & RAW ? 0 : uc_combining_class(c);
        /* c may join the last starter unless something between them blocks
         * it: a character of combining class 0 or >= c's (the run between is
         * in canonical order, so the last one written decides). */
        int adjacent = starter >= 0 && w == (size_t)starter + 1;
        if (starter >= 0 && !(c & RAW) && (adjacent || (last_cc > 0 && last_cc < cc))) {
            uint32_t p = compose(cps[starter], c);
            if (p) {
                cps[starter] = p;
                continue;
            }
        }
        if (cc == 0) {
            starter = c & RAW ? -1 : (long)w;
            last_cc = 0;
        } else {
            last_cc = cc;
        }
        cps[w++] = c;
    }
    size_t len = 0;
    for (size_t i = 0; i < w; i++) {
        if (cps[i] & RAW) o[len++] = (char)(cps[i] & 0xFF);
        else len += (size_t)utf8_encode(cps[i], o + len);
    }
    free(cps);
    *out = o;
    *out_len = len;
    return 1;
}

size_t polar_utf8_complete(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}
