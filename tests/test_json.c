/* The JSON parser: values, escapes, numbers, and a clear error with line and
 * column for every malformed input. */
#include "../loader/json.h"
#include "harness.h"

static const json_value *parse_ok(const char *text, json_doc **doc) {
    polar_error err;
    CHECK_OK(json_parse(text, strlen(text), "t.json", doc, &err));
    return *doc ? json_root(*doc) : NULL;
}

static void json_values(void) {
    json_doc *doc = NULL;
    const json_value *r =
        parse_ok(" {\"a\": [1, -2.5e2, 0, true, false, null], \"b\": {\"c\": \"x\"}, \"a\": 7 } ", &doc);
    if (!r) return;
    CHECK(r->type == JSON_OBJECT && r->len == 3, "object of 3 members");
    const json_value *a = json_get(r, "a");
    CHECK(a && a->type == JSON_NUMBER && a->number == 7, "repeated key: the last wins");
    const json_value *arr = r->items[0];
    CHECK(arr->type == JSON_ARRAY && arr->len == 6, "array of 6");
    CHECK(arr->items[0]->is_integer && arr->items[0]->number == 1, "1 is an integer");
    CHECK(!arr->items[1]->is_integer && arr->items[1]->number == -250, "-2.5e2");
    CHECK(arr->items[3]->type == JSON_BOOL && arr->items[3]->number == 1, "true");
    CHECK(arr->items[5]->type == JSON_NULL, "null");
    const json_value *c = json_get(json_get(r, "b"), "c");
    CHECK(c && c->type == JSON_STRING && strcmp(c->str, "x") == 0, "nested string");
    CHECK(json_get(r, "zz") == NULL && json_get(arr, "a") == NULL, "missing member, non-object");
    json_free(doc);
}

static void json_strings(void) {
    json_doc *doc = NULL;
    const json_value *r = parse_ok("[\"a\\\"b\\\\c\\/\\n\\t\", \"\\u00e9\\u4e2d\", \"\\ud83d\\ude00\", \"x\\u0000y\"]", &doc);
    if (!r) return;
    CHECK(strcmp(r->items[0]->str, "a\"b\\c/\n\t") == 0, "simple escapes");
    CHECK(strcmp(r->items[1]->str, "\xc3\xa9\xe4\xb8\xad") == 0, "BMP \\u escapes to UTF-8");
    CHECK(strcmp(r->items[2]->str, "\xf0\x9f\x98\x80") == 0, "surrogate pair to 4-byte UTF-8");
    CHECK(r->items[3]->len == 3 && r->items[3]->str[1] == 0, "embedded NUL kept with its length");
    json_free(doc);
    char buf[64];
    json_escape("q\"\\\n", buf, sizeof buf);
    CHECK(strcmp(buf, "\"q\\\"\\\\\\u000a\"") == 0, "escape: %s", buf);
}

static void json_errors(void) {
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"", "end of input"},
        {"{", "member name"},
        {"{\"a\" 1}", "':' expected"},
        {"{\"a\":1,}", "member name"},
        {"[1,]", "unexpected character"},
        {"[1 2]", "',' or ']'"},
        {"\"abc", "unterminated"},
        {"\"a\\x\"", "unknown escape"},
        {"\"\\u12g4\"", "\\u escape"},
        {"\"\\udc00\"", "lone low surrogate"},
        {"\"\\ud800x\"", "high surrogate"},
        {"\"a\tb\"", "control character"},
        {"01", "trailing"},
        {"-", "bad number"},
        {"1.", "digit expected"},
        {"1e", "digit expected"},
        {"tru", "unexpected word"},
        {"NaN", "unexpected character"},
        {"[1] x", "trailing"},
        {"{\"a\":1}\n\n  }", "line 3 column 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_doc *doc = NULL;
        polar_error err = {0};
        polar_status st = json_parse(bad[i].text, strlen(bad[i].text), "t.json", &doc, &err);
        CHECK(st == POLAR_ERR_FORMAT && doc == NULL, "'%s' must fail", bad[i].text);
        CHECK(strstr(err.msg, bad[i].why) && strstr(err.msg, "t.json"), "'%s': message '%s' lacks '%s'", bad[i].text,
              err.msg, bad[i].why);
    }
}

static void json_depth_limit(void) {
    char deep[400];
    memset(deep, '[', 300);
    deep[300] = 0;
    json_doc *doc = NULL;
    polar_error err;
    CHECK(json_parse(deep, 300, "t.json", &doc, &err) == POLAR_ERR_FORMAT && strstr(err.msg, "too deep"),
          "deep nesting: %s", err.msg);
    /* Not NUL-terminated: the parser must respect len. */
    const char text[3] = {'[', '1', ']'};
    CHECK_OK(json_parse(text, 3, "t.json", &doc, &err));
    json_free(doc);
}

int main(void) {
    RUN(json_values);
    RUN(json_strings);
    RUN(json_errors);
    RUN(json_depth_limit);
    TEST_EXIT();
}
