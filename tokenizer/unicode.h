/* Unicode properties the pre-tokenizers need (letters, numbers, white
 * space), UTF-8 decoding, and NFC normalisation. Tables are generated. */
#ifndef POLAR_UNICODE_H
#define POLAR_UNICODE_H

#include <stddef.h>
#include <stdint.h>

extern const uint32_t uc_letter[][2], uc_number[][2], uc_space[][2], uc_ccc[][3];
extern const int uc_letter_count, uc_number_count, uc_space_count, uc_ccc_count;
extern const uint32_t uc_decomp_pool[], uc_decomp[][3], uc_compose[][3];
extern const int uc_decomp_count, uc_compose_count;

int uc_is_letter(uint32_t cp);
int uc_is_number(uint32_t cp);
int uc_is_space(uint32_t cp);
int uc_combining_class(uint32_t cp);

/* Decode one UTF-8 sequence at s[0..n). Returns its length (1..4); an
 * invalid or truncated sequence counts as one byte with *cp = 0xFFFD... but
 * *valid = 0, so callers can keep the raw byte. */
int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp, int *valid);
int utf8_encode(uint32_t cp, char *out);

/* NFC of text[0..n) into a malloc'd buffer (*out, *out_len). Invalid UTF-8
 * bytes pass through unchanged. Returns 0 when out of memory. */
int uc_nfc(const char *text, size_t n, char **out, size_t *out_len);

#endif
