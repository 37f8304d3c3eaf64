/* Tokenizers against independent implementations (ids made by
 * tests/golden/make_tokenizer_golden.py): transformers' GGUF tokenizer,
 * tiktoken over the Llama-3 and Qwen rank files, and Hugging Face
 * tokenizers over tokenizer.json files transformers wrote (both merges
 * forms). Every string must give the same ids, and decode(encode(s)) == s
 * (NFC(s) for the Qwen family, whose tokenizer normalises first).
 * POLAR_DEPS and POLAR_FIXTURES point at the data (set by make test). */
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "../loader/json.h"
#include "../tokenizer/unicode.h"
#include "harness.h"

static char path_buf[1024];

static const char *data_path(const char *env, const char *rel) {
    const char *base = getenv(env);
    snprintf(path_buf, sizeof path_buf, "%s/%s", base ? base : "", rel);
    return path_buf;
}

static void check_source(const char *name, const char *tokenizer_path) {
    polar_error err;
    polar_tokenizer *t = NULL;
    json_doc *doc = NULL;
    char fixture[256];
    snprintf(fixture, sizeof fixture, GOLDEN_DIR "/tokenizer/%s.json", name);
    CHECK_OK(polar_tokenizer_load(tokenizer_path, &t, &err));
    CHECK_OK(json_parse_file(fixture, &doc, &err));
    if (!t || !doc) return;
    const json_value *cases = json_get(json_root(doc), "cases");
    int bad_ids = 0, bad_text = 0, total = 0;
    for (size_t c = 0; cases && c < cases->len; c++) {
        const json_value *text = json_get(cases->items[c], "text"), *want = json_get(cases->items[c], "ids");
        const json_value *nfc = json_get(cases->items[c], "nfc");
        int *ids = NULL, n = 0;
        CHECK_OK(polar_tokenize(t, text->str, text->len, 1, 0, &ids, &n, &err));
        int same = n == (int)want->len;
        for (int i = 0; same && i < n; i++) same = ids[i] == (int)want->items[i]->number;
        if (!same && ++bad_ids <= 3) {
            printf("  %s: ids differ for \"%.60s\":", name, text->str);
            for (int i = 0; i < n && i < 16; i++) printf(" %d", ids[i]);
            printf(" | want");
            for (size_t i = 0; i < want->len && i < 16; i++) printf(" %d", (int)want->items[i]->number);
            printf("\n");
        }
        char *back = NULL;
        size_t len = 0;
        CHECK_OK(polar_detokenize(t, ids, n, &back, &len, &err));
        const json_value *expect = nfc ? nfc : text;
        if (!back || len != expect->len || memcmp(back, expect->str, len) != 0) {
            if (++bad_text <= 3) printf("  %s: decode(encode(s)) != s for \"%.60s\"\n", name, text->str);
        }
        polar_free(back);
        polar_free(ids);
        total++;
    }
    CHECK(total >= 300, "%s: %d strings (300 expected)", name, total);
    CHECK(bad_ids == 0, "%s: ids differ for %d of %d strings", name, bad_ids, total);
    CHECK(bad_text == 0, "%s: round trip fails for %d of %d strings", name, bad_text, total);
    printf("  %-16s %d strings: %d id mismatches, %d round-trip failures\n", name, total, bad_ids, bad_text);
    json_free(doc);
    polar_tokenizer_free(t);
}

static void tokenizer_smollm2_gguf(void) { check_source("smollm2-gguf", getenv("POLAR_DEFAULT_MODEL")); }
static void tokenizer_smollm2_json(void) {
    check_source("smollm2-json", data_path("POLAR_FIXTURES", "smollm2.tokenizer.json"));
}
/* StarCoder's pre-tokenizer: digits split off before the GPT-2 regex. */
static void tokenizer_smollm2_digits(void) {
    check_source("smollm2-digits", data_path("POLAR_FIXTURES", "smollm2-digits.tokenizer.json"));
}
static void tokenizer_llama3_tiktoken(void) {
    check_source("llama3-tiktoken", data_path("POLAR_DEPS", "llama_models/llama3/tokenizer.model"));
}
static void tokenizer_llama3_json(void) {
    check_source("llama3-json", data_path("POLAR_FIXTURES", "llama3.tokenizer.json"));
}
static void tokenizer_qwen_tiktoken(void) {
    check_source("qwen-tiktoken", data_path("POLAR_DEPS", "dashscope/resources/qwen.tiktoken"));
}
static void tokenizer_qwen_json(void) { check_source("qwen-json", data_path("POLAR_FIXTURES", "qwen.tokenizer.json")); }

/* Bytes that are not UTF-8, split characters, and very long words survive a
 * round trip through every tokenizer style, and quickly. */
static void tokenizer_bytes_round_trip(void) {
    const char *paths[] = {getenv("POLAR_DEFAULT_MODEL"), data_path("POLAR_DEPS", "llama_models/llama3/tokenizer.model")};
    static const char bad[] = "ok \xff\xfe caf\xc3 \xe4\xb8 \xf0\x9f\x98 \x80\x80 end\xc0\xaf \xed\xa0\x80";
    for (int p = 0; p < 2; p++) {
        polar_error err;
        polar_tokenizer *t = NULL;
        CHECK_OK(polar_tokenizer_load(paths[p], &t, &err));
        if (!t) continue;
        int has_byte[256], missing = 0;
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            int *ids = NULL, n = 0;
            CHECK_OK(polar_tokenize(t, &c, 1, 0, 0, &ids, &n, &err));
            has_byte[b] = n == 1;
            missing += n == 0;
            polar_free(ids);
        }
        CHECK(p == 0 || missing == 0, "the Llama-3 vocabulary has every byte (%d missing)", missing);
        size_t big = 200000;
        char *text = malloc(big + sizeof bad);
        memset(text, ' ', big / 2);
        memset(text + big / 2, 'a', big / 2);
        memcpy(text + big, bad, sizeof bad);
        size_t lens[2] = {sizeof bad - 1, big + sizeof bad - 1};
        const char *texts[2] = {bad, text};
        for (int k = 0; k < 2; k++) {
            int *ids = NULL, n = 0;
            char *back = NULL;
            size_t len = 0;
            double t0 = polar_time_ms();
            CHECK_OK(polar_tokenize(t, texts[k], lens[k], 0, 0, &ids, &n, &err));
            double ms = polar_time_ms() - t0;
            CHECK_OK(polar_detokenize(t, ids, n, &back, &len, &err));
            /* Bytes the vocabulary has no token for are dropped (SmolLM2 lacks
             * some that never occur in UTF-8); every other byte comes back. */
            char *want = malloc(lens[k]);
            size_t wn = 0;
            for (size_t i = 0; i < lens[k]; i++)
                if (has_byte[(unsigned char)texts[k][i]]) want[wn++] = texts[k][i];
            CHECK(back && len == wn && memcmp(back, want, wn) == 0, "tokenizer %d: bytes round trip %d", p, k);
            free(want);
            CHECK(ms < 5000, "tokenizer %d: %zu bytes took %.0f ms", p, lens[k], ms);
            polar_free(ids);
            polar_free(back);
        }
        /* Without parse_special a special token's text is ordinary text. */
        int *ids = NULL, n = 0;
        const char *sp = p ? "<|eot_id|>" : "<|im_end|>";
        CHECK_OK(polar_tokenize(t, sp, strlen(sp), 0, 0, &ids, &n, &err));
        CHECK(n > 1, "special text not parsed as special: %d ids", n);
        polar_free(ids);
        CHECK_OK(polar_tokenize(t, sp, strlen(sp), 1, 0, &ids, &n, &err));
        CHECK(n == 1 && ids[0] == polar_token_id(t, sp), "special text parsed as one token");
        polar_free(ids);
        free(text);
        polar_tokenizer_free(t);
    }
}

/* NFC against Python's unicodedata on every canonically decomposable code
 * point (NFD and NFC forms), reordered combining marks, Hangul and random
 * mixes (tests/golden/make_nfc_golden.py). */
static void tokenizer_nfc(void) {
    polar_error err;
    json_doc *doc = NULL;
    CHECK_OK(json_parse_file(GOLDEN_DIR "/nfc.json", &doc, &err));
    if (!doc) return;
    const json_value *cases = json_get(json_root(doc), "cases");
    int bad = 0;
    for (size_t i = 0; cases && i < cases->len; i++) {
        const json_value *in = cases->items[i]->items[0], *want = cases->items[i]->items[1];
        char *out = NULL;
        size_t n = 0;
        CHECK(uc_nfc(in->str, in->len, &out, &n), "out of memory");
        if (!out || n != want->len || memcmp(out, want->str, n) != 0) {
            if (++bad <= 3) {
                printf("  NFC differs for");
                for (size_t k = 0; k < in->len; k++) printf(" %02x", (unsigned char)in->str[k]);
                printf("\n");
            }
        }
        free(out);
    }
    CHECK(cases && cases->len > 5000 && bad == 0, "NFC wrong for %d of %zu cases", bad, cases ? cases->len : 0);
    printf("  NFC: %zu cases agree with Python's unicodedata\n", cases ? cases->len : 0);
    json_free(doc);
}

/* Each built-in template, checked against the model family's own format
 * (SmolLM2's as transformers renders the GGUF's template). */
static void expect_chat(const char *tok_path, const char *config, const char *name, const char *system,
                        const char *want, const char *end_of_turn) {
    polar_error err;
    polar_tokenizer *t = NULL;
    char dir[] = "/tmp/polar-chat-XXXXXX", path[128];
    if (config) { /* a folder: tokenizer.json + tokenizer_config.json naming the template */
        CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "w");
        fputs(config, f);
        fclose(f);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        CHECK(symlink(tok_path, path) == 0, "symlink");
        tok_path = dir;
    }
    CHECK_OK(polar_tokenizer_load(tok_path, &t, &err));
    char *out = NULL;
    if (t) CHECK_OK(polar_chat_prompt(t, system, "Hi there", &out, &err));
    CHECK(t && strcmp(polar_chat_template_name(t), name) == 0, "template %s, want %s", polar_chat_template_name(t), name);
    CHECK(out && strcmp(out, want) == 0, "%s prompt:\n%s", name, out ? out : "(none)");
    CHECK(polar_tokenizer_end_of_turn(t) == polar_token_id(t, end_of_turn) && polar_token_id(t, end_of_turn) >= 0,
          "%s: end of turn is %s", name, end_of_turn);
    polar_free(out);
    polar_tokenizer_free(t);
    if (config) {
        unlink(path);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        unlink(path);
        rmdir(dir);
    }
}

static void tokenizer_chat_templates(void) {
    expect_chat(getenv("POLAR_DEFAULT_MODEL"), NULL, "smollm2", NULL,
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
                "<|im_end|>");
    expect_chat(getenv("POLAR_DEFAULT_MODEL"), NULL, "smollm2", "Be brief.",
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
                "<|im_end|>");
    char llama[1024];
    snprintf(llama, sizeof llama, "%s", data_path("POLAR_DEPS", "llama_models/llama3/tokenizer.model"));
    expect_chat(llama, NULL, "llama3", "Be brief.",
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
                "<|eot_id|>");
    char qwen[1024];
    snprintf(qwen, sizeof qwen, "%s", data_path("POLAR_DEPS", "dashscope/resources/qwen.tiktoken"));
    expect_chat(qwen, NULL, "chatml", NULL,
                "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
                "<|im_end|>");
    char *qjson = realpath(data_path("POLAR_FIXTURES", "qwen.tokenizer.json"), NULL); /* symlinks want it absolute */
    CHECK(qjson != NULL, "qwen tokenizer.json fixture");
    if (!qjson) return;
    expect_chat(qjson, "{\"chat_template\": \"{%- if enable_thinking is defined -%}<think>{%- endif -%}<|im_start|>\"}",
                "qwen3", NULL,
                "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>");
    free(qjson);
}

/* A conversation: earlier turns in the same frame (SmolLM2's template, as
 * transformers renders it), an unknown role refused. */
static void tokenizer_chat_turns(void) {
    polar_error err;
    polar_tokenizer *t = NULL;
    CHECK_OK(polar_tokenizer_load(getenv("POLAR_DEFAULT_MODEL"), &t, &err));
    if (!t) return;
    polar_chat_message turns[] = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};
    char *out = NULL;
    CHECK_OK(polar_chat_format(t, turns, 3, &out, &err));
    const char *want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                       "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                       "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
    CHECK(out && strcmp(out, want) == 0, "conversation:\n%s", out ? out : "(none)");
    polar_free(out);
    polar_chat_message bad[] = {{"system", "Be brief."}, {"tool", "{}"}};
    CHECK(polar_chat_format(t, bad, 2, &out, &err) == POLAR_ERR_ARG && strstr(err.msg, "turn 2"), "%s", err.msg);
    polar_tokenizer_free(t);
}

/* What a stream may show: never the start of a character whose bytes have
 * not all come. */
static void tokenizer_utf8_complete(void) {
    CHECK(polar_utf8_complete("", 0) == 0, "empty");
    CHECK(polar_utf8_complete("abc", 3) == 3, "ASCII");
    CHECK(polar_utf8_complete("a\xc3", 2) == 1, "a lead byte held back");
    CHECK(polar_utf8_complete("a\xc3\xa9", 3) == 3, "a whole 2-byte character");
    CHECK(polar_utf8_complete("\xe2\x82", 2) == 0, "two bytes of three");
    CHECK(polar_utf8_complete("x\xf0\x9f\x98\x80", 5) == 5, "a whole 4-byte character");
    CHECK(polar_utf8_complete("\x80\x80\x80\x80", 4) == 4, "stray continuation bytes pass");
}

/* Malformed tokenizer.json files: a clear error naming the fault. */
static void tokenizer_bad_json(void) {
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"{\"model\": {\"type\": \"WordPiece\"}}", "not a BPE tokenizer"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}", "not a BPE tokenizer"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "vocabulary of 1 tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "vocab entry 0 has no valid id"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {}, \"merges\": []}}", "byte_fallback"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": 5}", "added_tokens"},
        {"{\"model\": {\"type\": \"BPE\"", "JSON syntax error"},
    };
    char dir[] = "/tmp/polar-tokjson-XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i].text, f);
        fclose(f);
        polar_error err = {0};
        polar_tokenizer *t = NULL;
        polar_status st = polar_tokenizer_load(path, &t, &err);
        CHECK(st != POLAR_OK && !t, "case %zu must fail", i);
        CHECK(strstr(err.msg, bad[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, bad[i].why);
    }
    /* A vocabulary of all 256 bytes with faulty merges and pre-tokenizers. */
    static const char *tails[][2] = {
        {"\"merges\": [\"a\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "is not \"a b\""},
        {"\"merges\": [\"a zz\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "not in the vocabulary"},
        {"\"merges\": [3]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", "neither"},
        {"\"merges\": []}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", "pre_tokenizer is not one polar knows"},
        {"\"merges\": []}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"normalizer\": {\"type\": \"NFKC\"}}", "'NFKC'"},
    };
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {", f);
        for (int b = 0; b < 256; b++) {
            char piece[8];
            uint32_t cp = b < '!' || (b > '~' && b < 0xA1) || b == 0xAD ? 0 : (uint32_t)b;
            if (!cp) { /* GPT-2's stand-ins for unprintable bytes start at U+0100 */
                int n = 0;
                for (int k = 0; k < b; k++) n += k < '!' || (k > '~' && k < 0xA1) || k == 0xAD;
                cp = 256 + (uint32_t)n;
            }
            int len = cp < 0x80 ? 1 : 2;
            if (len == 1) piece[0] = (char)cp;
            else {
                piece[0] = (char)(0xC0 | (cp >> 6));
                piece[1] = (char)(0x80 | (cp & 0x3F));
            }
            piece[len] = 0;
            fprintf(f, "%s\"%s%s\": %d", b ? ", " : "", cp == '"' || cp == '\\' ? "\\" : "", piece, b);
        }
        fprintf(f, "}, %s", tails[i][0]);
        fclose(f);
        polar_error err = {0};
        polar_tokenizer *t = NULL;
        polar_status st = polar_tokenizer_load(path, &t, &err);
        CHECK(st != POLAR_OK && !t, "tail %zu must fail", i);
        CHECK(strstr(err.msg, tails[i][1]) != NULL, "tail %zu: '%s' lacks '%s'", i, err.msg, tails[i][1]);
    }
    unlink(path);
    rmdir(dir);
}

int main(void) {
    RUN(tokenizer_smollm2_gguf);
    RUN(tokenizer_smollm2_json);
    RUN(tokenizer_smollm2_digits);
    RUN(tokenizer_llama3_tiktoken);
    RUN(tokenizer_llama3_json);
    RUN(tokenizer_qwen_tiktoken);
    RUN(tokenizer_qwen_json);
    RUN(tokenizer_bytes_round_trip);
    RUN(tokenizer_nfc);
    RUN(tokenizer_chat_templates);
    RUN(tokenizer_chat_turns);
    RUN(tokenizer_utf8_complete);
    RUN(tokenizer_bad_json);
    TEST_EXIT();
}
