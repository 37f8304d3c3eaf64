/* Loading a tokenizer from tokenizer.json, a tiktoken rank file, or GGUF
 * metadata, into the byte-level representation of tokenizer.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../loader/gguf.h"
#include "../loader/json.h"
#include "../runtime/error.h"
#include "tokenizer.h"
#include "unicode.h"

/* GPT-2's byte <-> printable code point table: printable Latin-1 bytes stand
 * for themselves, the other 68 bytes for U+0100.. in byte order. */
static int printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

uint32_t bytelevel_char(unsigned char b) {
    if (printable_byte(b)) return b;
    uint32_t n = 0;
    for (int k = 0; k < b; k++) n += !printable_byte(k);
    return 256 + n;
}

int bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable_byte((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t n = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!printable_byte(b) && n-- == 0) return b;
    return -1;
}

size_t bytelevel_decode(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int valid, len = utf8_decode((const unsigned char *)s + i, n - i, &cp, &valid);
        int b = valid ? bytelevel_byte(cp) : -1;
        if (b >= 0) {
            out[k++] = (char)b;
        } else {
            memcpy(out + k, s + i, (size_t)len);
            k += (size_t)len;
        }
        i += (size_t)len;
    }
    return k;
}

static polar_status set_bytelevel_piece(polar_tokenizer *t, int id, const char *s, size_t n, polar_error *err) {
    char stack[512], *buf = n <= sizeof stack ? stack : malloc(n);
    if (!buf) return polar_fail(err, POLAR_ERR_NOMEM, "tokenizer: out of memory");
    polar_status st = tok_set_piece(t, id, buf, bytelevel_decode(s, n, buf), err);
    if (buf != stack) free(buf);
    return st;
}

/* A merge written "a b" (or as the list ["a", "b"]) in byte-level text. */
static polar_status add_bytelevel_merge(polar_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                                        uint32_t rank, const char *what, polar_error *err) {
    char sa[512], sb[512];
    if (na > sizeof sa || nb > sizeof sb) return POLAR_OK; /* longer than any token: cannot merge */
    int left = tok_find(t, sa, bytelevel_decode(a, na, sa)), right = tok_find(t, sb, bytelevel_decode(b, nb, sb));
    if (left < 0 || right < 0)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: merge %u names a token not in the vocabulary", what, rank);
    polar_status st;
    tok_add_merge(t, left, right, rank, err, &st);
    return st;
}

/* ------------------------------------------------------- tokenizer.json */

static const char LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int bool_field(const json_value *o, const char *k) {
    const json_value *v = json_get(o, k);
    return v && v->type == JSON_BOOL && v->number != 0;
}

static const char *str_field(const json_value *o, const char *k) {
    const json_value *v = json_get(o, k);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

/* One pre-tokenizer node: sets style/digits; returns 0 if not understood. */
static int pretok_node(polar_tokenizer *t, const json_value *p, int *have_regex) {
    const char *type = str_field(p, "type");
    if (!type) return 0;
    if (strcmp(type, "ByteLevel") == 0) {
        if (bool_field(p, "add_prefix_space")) return 0;
        const json_value *ur = json_get(p, "use_regex");
        if (!ur || (ur->type == JSON_BOOL && ur->number)) {
            t->style = PRETOK_GPT2;
            (*have_regex)++;
        }
        return 1;
    }
    if (strcmp(type, "Digits") == 0) {
        t->digits_split = bool_field(p, "individual_digits");
        return 1;
    }
    if (strcmp(type, "Split") == 0) {
        const char *re = str_field(json_get(p, "pattern"), "Regex");
        const char *behavior = str_field(p, "behavior");
        if (!re || !behavior || strcmp(behavior, "Isolated") != 0 || bool_field(p, "invert")) return 0;
        if (strcmp(re, LLAMA3_PATTERN) == 0) t->style = PRETOK_LLAMA3;
        else if (strcmp(re, QWEN2_PATTERN) == 0) t->style = PRETOK_QWEN2;
        else return 0;
        (*have_regex)++;
        return 1;
    }
    return 0;
}

static polar_status json_pretokenizer(polar_tokenizer *t, const json_value *root, const char *path, polar_error *err) {
    const json_value *p = json_get(root, "pre_tokenizer");
    int have_regex = 0, ok = p && p->type == JSON_OBJECT;
    if (ok && str_field(p, "type") && strcmp(str_field(p, "type"), "Sequence") == 0) {
        const json_value *list = json_get(p, "pretokenizers");
        ok = list && list->type == JSON_ARRAY;
        for (size_t i = 0; ok && i < list->len; i++) ok = pretok_node(t, list->items[i], &have_regex);
    } else if (ok) {
        ok = pretok_node(t, p, &have_regex);
    }
    if (!ok || have_regex != 1)
        return polar_fail(err, POLAR_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer is not one polar knows (GPT-2 ByteLevel, or the Llama-3 / Qwen2 split "
                          "followed by ByteLevel)", path);
    const json_value *norm = json_get(root, "normalizer");
    if (norm && norm->type != JSON_NULL) {
        const char *nt = str_field(norm, "type");
        if (!nt || strcmp(nt, "NFC") != 0)
            return polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (NFC is)", path,
                              nt ? nt : "?");
        t->nfc = 1;
    }
    return POLAR_OK;
}

/* A TemplateProcessing post-processor (alone or in a Sequence): the special
 * tokens its single-text template puts before and after the text. */
static void json_template(polar_tokenizer *t, const json_value *pp) {
    const char *type = str_field(pp, "type");
    if (!type) return;
    if (strcmp(type, "Sequence") == 0) {
        const json_value *list = json_get(pp, "processors");
        for (size_t i = 0; list && list->type == JSON_ARRAY && i < list->len; i++) json_template(t, list->items[i]);
        return;
    }
    const json_value *single = json_get(pp, "single");
    if (strcmp(type, "TemplateProcessing") != 0 || !single || single->type != JSON_ARRAY) return;
    int after = 0;
    for (size_t i = 0; i < single->len; i++) {
        if (json_get(single->items[i], "Sequence")) {
            after = 1;
            continue;
        }
        const char *name = str_field(json_get(single->items[i], "SpecialToken"), "id");
        int id = name ? tok_find(t, name, strlen(name)) : -1;
        if (id < 0) continue;
        if (!after && t->n_prefix < 4) t->prefix[t->n_prefix++] = id;
        if (after && t->n_suffix < 4) t->suffix[t->n_suffix++] = id;
    }
}

polar_status tok_load_json(polar_tokenizer *t, const char *path, polar_error *err) {
    char *text;
    size_t len;
    polar_status st = json_read_file(path, (size_t)256 << 20, &text, &len, err);
    if (st != POLAR_OK) return st;
    st = tok_load_json_text(t, text, len, path, err);
    free(text);
    return st;
}

polar_status tok_load_json_text(polar_tokenizer *t, const char *text, size_t len, const char *path, polar_error *err) {
    json_doc *doc;
    polar_status st = json_parse(text, len, path, &doc, err);
    if (st != POLAR_OK) return st;
    const json_value *root = json_root(doc), *model = json_get(root, "model");
    const json_value *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    const json_value *added = json_get(root, "added_tokens");
    const char *type = str_field(model, "type");
    if (!type || strcmp(type, "BPE") != 0 || !vocab || vocab->type != JSON_OBJECT || !merges ||
        merges->type != JSON_ARRAY) {
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: not a BPE tokenizer (model.type, model.vocab, model.merges)", path);
        goto done;
    }
    if (bool_field(model, "byte_fallback")) {
        st = polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: byte_fallback BPE (SentencePiece style) is not supported", path);
        goto done;
    }
    /* Ids: the vocabulary and the added tokens; the size is the largest + 1. */
    int n_vocab = 0;
    if (added && added->type != JSON_ARRAY) {
        st = polar_fail(err, POLAR_ERR_FORMAT, "%s: added_tokens is not a list", path);
        goto done;
    }
    for (int pass = 0; pass < 2; pass++) {
        const json_value *list = pass ? added : vocab;
        for (size_t i = 0; list && i < list->len; i++) {
            const json_value *idv = pass ? json_get(list->items[i], "id") : list->items[i];
            if (!idv || idv->type != JSON_NUMBER || !idv->is_integer || idv->number < 0 || idv->number >= (1 << 24)) {
                st = polar_fail(err, POLAR_ERR_FORMAT, "%s: %s entry %zu has no valid id", path,
                                pass ? "added_tokens" : "vocab", i);
                goto done;
            }
            if ((int)idv->number + 1 > n_vocab) n_vocab = (int)idv->number + 1;
        }
    }
    if ((st = tok_init(t, n_vocab, err)) != POLAR_OK) goto done;
    for (size_t i = 0; i < vocab->len && st == POLAR_OK; i++)
        st = set_bytelevel_piece(t, (int)vocab->items[i]->number, vocab->keys[i], strlen(vocab->keys[i]), err);
    for (size_t i = 0; added && i < added->len && st == POLAR_OK; i++) {
        const json_value *a = added->items[i];
        const json_value *content = json_get(a, "content");
        int id = (int)json_get(a, "id")->number;
        if (!content || content->type != JSON_STRING || content->len == 0) {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: added_tokens entry %zu has no content", path, i);
            break;
        }
        /* An added token may repeat a vocabulary entry (same id, same text). */
        if (!t->piece[id]) st = tok_set_piece(t, id, content->str, content->len, err);
        if (st == POLAR_OK) st = tok_add_special(t, id, err);
    }
    for (size_t i = 0; i < merges->len && st == POLAR_OK; i++) {
        const json_value *m = merges->items[i];
        if (m->type == JSON_STRING) {
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || sp == m->str) {
                st = polar_fail(err, POLAR_ERR_FORMAT, "%s: merge %zu is not \"a b\"", path, i);
                break;
            }
            st = add_bytelevel_merge(t, m->str, (size_t)(sp - m->str), sp + 1, m->len - (size_t)(sp - m->str) - 1,
                                     (uint32_t)i, path, err);
        } else if (m->type == JSON_ARRAY && m->len == 2 && m->items[0]->type == JSON_STRING &&
                   m->items[1]->type == JSON_STRING) {
            st = add_bytelevel_merge(t, m->items[0]->str, m->items[0]->len, m->items[1]->str, m->items[1]->len,
                                     (uint32_t)i, path, err);
        } else {
            st = polar_fail(err, POLAR_ERR_FORMAT, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
    }
    if (st == POLAR_OK) {
        t->ignore_merges = bool_field(model, "ignore_merges");
        st = json_pretokenizer(t, root, path, err);
        json_template(t, json_get(root, "post_processor"));
    }
    if (st == POLAR_OK) st = tok_finish(t, path, err);
done:
    json_free(doc);
    return st;
}

/* ------------------------------------------------------------- tiktoken */

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 (with or without padding) -> bytes; -1 when malformed. */
static long b64_decode(const char *s, size_t n, char *out) {
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    long k = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[k++] = (char)(acc >> 16);
            out[k++] = (char)(acc >> 8);
            out[k++] = (char)acc;
            acc = 0;
        }
    }
    if (n % 4 == 2) out[k++] = (char)(acc >> 4);
    if (n % 4 == 3) {
        out[k++] = (char)(acc >> 10);
        out[k++] = (char)(acc >> 2);
    }
    return k;
}

/* The families' special tokens, appended after the ranks as their
 * reference tokenizers do (llama-models' Llama-3, Qwen's qwen.tiktoken). */
static const char *const llama3_specials[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>", "<|python_tag|>", "<|image|>"};
#define LLAMA3_N_SPECIAL 256
#define QWEN_N_RANKS 151643
#define QWEN_N_EXTRA 205

static polar_status add_named_special(polar_tokenizer *t, int id, const char *text, polar_error *err) {
    polar_status st = tok_set_piece(t, id, text, strlen(text), err);
    return st == POLAR_OK ? tok_add_special(t, id, err) : st;
}

polar_status tok_load_tiktoken(polar_tokenizer *t, const char *path, polar_error *err) {
    char *text;
    size_t len;
    polar_status st = json_read_file(path, (size_t)64 << 20, &text, &len, err);
    if (st != POLAR_OK) return st;
    /* First pass: count lines and the largest rank. */
    int n_ranks = 0, max_rank = -1;
    for (size_t i = 0; i < len;) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        size_t ll = nl ? (size_t)(nl - line) : len - i;
        i += ll + 1;
        if (ll && line[ll - 1] == '\r') ll--;
        if (ll == 0) continue;
        const char *sp = memchr(line, ' ', ll);
        char *end;
        long rank = sp ? strtol(sp + 1, &end, 10) : -1;
        if (!sp || rank < 0 || rank >= (1 << 24) || end != line + ll) {
            free(text);
            return polar_fail(err, POLAR_ERR_FORMAT, "%s: line %d is not \"base64 rank\"", path, n_ranks + 1);
        }
        if (rank > max_rank) max_rank = (int)rank;
        n_ranks++;
    }
    int qwen = n_ranks == QWEN_N_RANKS;
    int n_special = qwen ? 3 + QWEN_N_EXTRA : LLAMA3_N_SPECIAL;
    if ((st = tok_init(t, max_rank + 1 + n_special, err)) != POLAR_OK) {
        free(text);
        return st;
    }
    char bytes[1024];
    for (size_t i = 0, line_no = 1; i < len && st == POLAR_OK; line_no++) {
        const char *line = text + i, *nl = memchr(line, '\n', len - i);
        size_t ll = nl ? (size_t)(nl - line) : len - i;
        i += ll + 1;
        if (ll == 0) continue;
        const char *sp = memchr(line, ' ', ll);
        long n = (size_t)(sp - line) <= sizeof bytes ? b64_decode(line, (size_t)(sp - line), bytes) : -1;
        if (n <= 0) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: line %zu: bad base64 token", path, line_no);
        else st = tok_set_piece(t, (int)strtol(sp + 1, NULL, 10), bytes, (size_t)n, err);
    }
    free(text);
    /* tiktoken merges the adjacent pair whose concatenation has the lowest
     * rank: every split of a token into two tokens is such a pair. */
    for (int id = 0; id <= max_rank && st == POLAR_OK; id++) {
        if (!t->piece[id]) continue;
        for (uint32_t s = 1; s < t->piece_len[id] && st == POLAR_OK; s++) {
            int left = tok_find(t, t->piece[id], s), right = tok_find(t, t->piece[id] + s, t->piece_len[id] - s);
            if (left >= 0 && right >= 0) tok_add_merge(t, left, right, (uint32_t)id, err, &st);
        }
    }
    int base = max_rank + 1;
    if (qwen) {
        t->style = PRETOK_QWEN2;
        t->nfc = 1;
        t->chat = CHAT_CHATML;
        static const char *const named[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
        for (int k = 0; k < 3 && st == POLAR_OK; k++) st = add_named_special(t, base + k, named[k], err);
        for (int k = 0; k < QWEN_N_EXTRA && st == POLAR_OK; k++) {
            char name[32];
            snprintf(name, sizeof name, "<|extra_%d|>", k);
            st = add_named_special(t, base + 3 + k, name, err);
        }
    } else {
        t->style = PRETOK_LLAMA3;
        t->chat = CHAT_LLAMA3;
        t->prefix[t->n_prefix++] = base; /* <|begin_of_text|> */
        int named = (int)(sizeof llama3_specials / sizeof llama3_specials[0]);
        for (int k = 0; k < LLAMA3_N_SPECIAL && st == POLAR_OK; k++) {
            char name[48];
            if (k < named) snprintf(name, sizeof name, "%s", llama3_specials[k]);
            else snprintf(name, sizeof name, "<|reserved_special_token_%d|>", 2 + k - named);
            st = add_named_special(t, base + k, name, err);
        }
    }
    return st == POLAR_OK ? tok_finish(t, path, err) : st;
}

/* ----------------------------------------------------------------- GGUF */

static chat_style chat_from_template(const char *s, size_t n) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf - 1 ? n : sizeof buf - 1), s);
    if (strstr(buf, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (strstr(buf, "<think>")) return CHAT_QWEN3;
    if (strstr(buf, "SmolLM")) return CHAT_SMOLLM2;
    if (strstr(buf, "<|im_start|>")) return CHAT_CHATML;
    return CHAT_NONE;
}

polar_status tok_load_gguf(polar_tokenizer *t, const void *file, polar_error *err) {
    const gguf_file *g = file;
    const gguf_kv *model = gguf_find_kv(g, "tokenizer.ggml.model"), *tokens = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_kv *merges = gguf_find_kv(g, "tokenizer.ggml.merges"), *types = gguf_find_kv(g, "tokenizer.ggml.token_type");
    const gguf_kv *pre = gguf_find_kv(g, "tokenizer.ggml.pre");
    if (!model || model->type != GGUF_STRING || !tokens || tokens->type != GGUF_ARRAY || tokens->arr_type != GGUF_STRING)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: no tokenizer (tokenizer.ggml.model and .tokens)", g->path);
    if (!gguf_str_eq(model->str, "gpt2"))
        return polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: tokenizer model '%.*s' is not supported (gpt2 byte-level BPE is)",
                          g->path, (int)(model->str.len > 40 ? 40 : model->str.len), model->str.s);
    if (!merges || merges->type != GGUF_ARRAY || merges->arr_type != GGUF_STRING)
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing", g->path);
    if (types && (types->type != GGUF_ARRAY || types->arr_type != GGUF_I32 || types->arr_n != tokens->arr_n))
        return polar_fail(err, POLAR_ERR_FORMAT, "%s: tokenizer.ggml.token_type does not match the tokens", g->path);
    polar_status st = tok_init(t, (int)(tokens->arr_n < (1u << 24) ? tokens->arr_n : 1u << 24), err);
    for (uint64_t i = 0; i < tokens->arr_n && st == POLAR_OK; i++) {
        gguf_str s = tokens->arr_strs[i];
        int32_t type = 1;
        if (types) memcpy(&type, types->arr_data + 4 * i, 4);
        /* Control (3) and user-defined (4) tokens are literal text, matched
         * in prompts; the rest are byte-level. */
        if (type == 3 || type == 4) {
            st = tok_set_piece(t, (int)i, s.s, (size_t)s.len, err);
            if (st == POLAR_OK) st = tok_add_special(t, (int)i, err);
        } else {
            st = set_bytelevel_piece(t, (int)i, s.s, (size_t)s.len, err);
        }
    }
    for (uint64_t i = 0; i < merges->arr_n && st == POLAR_OK; i++) {
        gguf_str m = merges->arr_strs[i];
        const char *sp = memchr(m.s, ' ', (size_t)m.len);
        if (!sp || sp == m.s) st = polar_fail(err, POLAR_ERR_FORMAT, "%s: merge %llu is not \"a b\"", g->path, (unsigned long long)i);
        else st = add_bytelevel_merge(t, m.s, (size_t)(sp - m.s), sp + 1, (size_t)m.len - (size_t)(sp - m.s) - 1, (uint32_t)i,
                                      g->path, err);
    }
    if (st != POLAR_OK) return st;
    t->style = PRETOK_GPT2;
    if (pre && pre->type == GGUF_STRING) {
        if (gguf_str_eq(pre->str, "llama-bpe") || gguf_str_eq(pre->str, "llama3")) {
            t->style = PRETOK_LLAMA3;
            const gguf_kv *bos = gguf_find_kv(g, "tokenizer.ggml.bos_token_id"), *add = gguf_find_kv(g, "tokenizer.ggml.add_bos_token");
            if (bos && bos->u < (uint64_t)t->n_vocab && (!add || add->u != 0)) t->prefix[t->n_prefix++] = (int)bos->u;
        } else if (gguf_str_eq(pre->str, "qwen2")) {
            t->style = PRETOK_QWEN2;
            t->nfc = 1;
        } else if (!gguf_str_eq(pre->str, "gpt2") && !gguf_str_eq(pre->str, "smollm") && !gguf_str_eq(pre->str, "default")) {
            return polar_fail(err, POLAR_ERR_UNSUPPORTED, "%s: pre-tokenizer '%.*s' is not supported (gpt2, smollm, llama-bpe, qwen2)",
                              g->path, (int)(pre->str.len > 40 ? 40 : pre->str.len), pre->str.s);
        }
    }
    const gguf_kv *tmpl = gguf_find_kv(g, "tokenizer.chat_template");
    if (tmpl && tmpl->type == GGUF_STRING) t->chat = chat_from_template(tmpl->str.s, (size_t)tmpl->str.len);
    return tok_finish(t, g->path, err);
}

/* ----------------------------------------------------------- dispatcher */

static int is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* tokenizer_config.json's chat_template picks the chat style of a folder. */
static void folder_chat_style(polar_tokenizer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_doc *doc;
    if (!is_file(path) || json_parse_file(path, &doc, NULL) != POLAR_OK) return;
    const char *tmpl = str_field(json_root(doc), "chat_template");
    if (tmpl) t->chat = chat_from_template(tmpl, strlen(tmpl));
    json_free(doc);
}

polar_status polar_tokenizer_load(const char *path, polar_tokenizer **out, polar_error *err) {
    *out = NULL;
    if (!path) return polar_fail(err, POLAR_ERR_ARG, "no tokenizer path given");
    polar_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    char file[4096];
    polar_status st;
    if (ends_with(path, ".gguf") && is_file(path)) {
        gguf_file g;
        st = gguf_open(path, &g, err);
        if (st == POLAR_OK) {
            st = tok_load_gguf(t, &g, err);
            gguf_close(&g);
        }
    } else if (is_file(path) && ends_with(path, ".json")) {
        st = tok_load_json(t, path, err);
    } else if (is_file(path)) {
        st = tok_load_tiktoken(t, path, err);
    } else if (snprintf(file, sizeof file, "%s/tokenizer.json", path) > 0 && is_file(file)) {
        st = tok_load_json(t, file, err);
        if (st == POLAR_OK) folder_chat_style(t, path);
    } else if ((snprintf(file, sizeof file, "%s/tokenizer.model", path) > 0 && is_file(file)) ||
               (snprintf(file, sizeof file, "%s/qwen.tiktoken", path) > 0 && is_file(file))) {
        st = tok_load_tiktoken(t, file, err);
    } else {
        st = polar_fail(err, POLAR_ERR_IO, "%s: no tokenizer (tokenizer.json, tokenizer.model, qwen.tiktoken or a .gguf file)",
                        path);
    }
    if (st != POLAR_OK) {
        polar_tokenizer_free(t);
        return st;
    }
    *out = t;
    return POLAR_OK;
}
