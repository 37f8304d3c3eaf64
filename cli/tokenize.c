/* polar tokenize: text -> ids and pieces, for checking against other tools. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"

/* A piece as JSON string content: printable ASCII as is, other bytes escaped
 * (\u00XX for single bytes keeps invalid UTF-8 visible and the JSON valid). */
static void print_piece_json(const char *p, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c >= 0x20 && c < 0x7F) putchar(c);
        else printf("\\u%04x", c);
    }
    putchar('"');
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model = NULL, *text = NULL, *file = NULL;
    int json = 0, no_special = 0, bos = 0;
    cli_opt opts[] = {
        {"--model", OPT_STR, &model, 0},          {"--text", OPT_STR, &text, 0},
        {"--json", OPT_FLAG, &json, 0},           {"--no-special", OPT_FLAG, &no_special, 0},
        {"--bos", OPT_FLAG, &bos, 0},             {"-f", OPT_STR, &file, 0},
    };
    if (!parse_opts(cmd, argc, argv, opts, sizeof opts / sizeof opts[0])) return EXIT_USAGE;
    if (!text == !file) return fail_usage(cmd, "one of --text TEXT and -f FILE is required");
    size_t text_len = text ? strlen(text) : 0;
    char *contents = file ? read_text_file(cmd, file, &text_len) : NULL;
    if (file && !contents) return 1;
    if (file) text = contents;
    char *model_file = find_model(cmd, model);
    if (!(model = model_file)) {
        free(contents);
        return 1;
    }
    polar_error err;
    polar_tokenizer *t;
    int *ids = NULL, n = 0, rc = 1;
    if (polar_tokenizer_load(model, &t, &err) != POLAR_OK) {
        polar_free(model_file);
        free(contents);
        return fail_status(cmd, &err);
    }
    if (polar_tokenize(t, text, text_len, !no_special, bos, &ids, &n, &err) != POLAR_OK) {
        rc = fail_status(cmd, &err);
    } else {
        if (json) printf("{\"ids\":[");
        for (int i = 0; i < n; i++) printf(json ? "%s%d" : "%s%d", i ? (json ? "," : " ") : "", ids[i]);
        printf(json ? "],\"pieces\":[" : "\n");
        for (int i = 0; i < n; i++) {
            const char *p;
            size_t len;
            polar_token_piece(t, ids[i], &p, &len);
            if (json) {
                if (i) putchar(',');
                print_piece_json(p, len);
            } else {
                printf("%6d  ", ids[i]);
                print_piece_json(p, len);
                putchar('\n');
            }
        }
        if (json) printf("]}\n");
        rc = 0;
    }
    polar_free(ids);
    polar_tokenizer_free(t);
    polar_free(model_file);
    free(contents);
    return rc;
}
