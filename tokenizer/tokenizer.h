/* Byte-level BPE tokenizers (GPT-2 / Llama-3 / Qwen2 families), loaded from
 * Hugging Face tokenizer.json, tiktoken rank files or GGUF metadata. Every
 * token is held as the raw bytes it stands for, so one BPE serves all three
 * sources. */
#ifndef POLAR_TOKENIZER_H
#define POLAR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "polar.h"

/* How text is split into words before BPE (each a hand-written matcher of
 * the regular expression its family's tokenizer uses). */
typedef enum { PRETOK_GPT2, PRETOK_LLAMA3, PRETOK_QWEN2 } pretok_style;

/* The chat template family, chosen from the model's metadata. */
typedef enum { CHAT_NONE, CHAT_LLAMA3, CHAT_CHATML, CHAT_QWEN3, CHAT_SMOLLM2 } chat_style;

typedef struct {
    int id;
    const char *text; /* bytes of the token */
    size_t len;
} special_token;

struct polar_tokenizer {
    int n_vocab;
    char **piece;          /* [n_vocab] bytes of each token (NULL: unused id) */
    uint32_t *piece_len;   /* [n_vocab] */
    uint32_t *map;         /* bytes -> id + 1, open addressing; 0 = empty */
    size_t map_cap;
    uint64_t *pair_key;    /* (left id, right id) -> merge, open addressing */
    uint32_t *pair_rank, *pair_out;
    size_t pair_cap, n_pairs;
    int byte_id[256];      /* token of each single byte */
    int ignore_merges;     /* a word that is itself a token is emitted whole */
    pretok_style style;
    int digits_split;      /* split every digit apart before the regex (Digits pre-tokenizer) */
    int nfc;               /* NFC-normalise text before splitting */
    special_token *specials; /* matched in text, longest first */
    int n_specials;
    int prefix[4], n_prefix; /* special tokens the tokenizer adds around a text (BOS, */
    int suffix[4], n_suffix; /* a trailing <|endoftext|>) when asked to */
    chat_style chat;
};

/* Building: allocate for n_vocab ids, set pieces, add merges, finish. */
polar_status tok_init(polar_tokenizer *t, int n_vocab, polar_error *err);
polar_status tok_set_piece(polar_tokenizer *t, int id, const char *bytes, size_t len, polar_error *err);
int tok_find(const polar_tokenizer *t, const char *bytes, size_t len); /* id or -1 */
/* Merge left+right -> the token of their concatenated bytes at this rank.
 * Returns 0 (and merges nothing) when the concatenation is no token. */
int tok_add_merge(polar_tokenizer *t, int left, int right, uint32_t rank, polar_error *err, polar_status *st);
polar_status tok_add_special(polar_tokenizer *t, int id, polar_error *err);
/* Check every byte has a token; sort specials; build the pair table. */
polar_status tok_finish(polar_tokenizer *t, const char *what, polar_error *err);

/* Byte-level BPE's printable stand-ins: byte -> code point and back. */
uint32_t bytelevel_char(unsigned char b);
int bytelevel_byte(uint32_t cp); /* -1 if cp stands for no byte */
/* Decode a byte-level string (UTF-8 of stand-ins) to raw bytes; chars that
 * stand for no byte are kept as their UTF-8. Returns the length written. */
size_t bytelevel_decode(const char *s, size_t n, char *out);

/* End of the word that starts at s[i] (i < n), per the style. */
size_t pretok_next(pretok_style style, const unsigned char *s, size_t n, size_t i);

/* Loaders, by source. */
polar_status tok_load_json(polar_tokenizer *t, const char *path, polar_error *err);
polar_status tok_load_json_text(polar_tokenizer *t, const char *text, size_t len, const char *what, polar_error *err);
polar_status tok_load_tiktoken(polar_tokenizer *t, const char *path, polar_error *err);
polar_status tok_load_gguf(polar_tokenizer *t, const void *gguf, polar_error *err);

#endif
