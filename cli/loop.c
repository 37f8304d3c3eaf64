#include "loop.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* 1 once text holds a \boxed{ whose braces have closed. */
static int boxed_closed(const char *text) {
    const char *b = NULL;
    for (const char *p = strstr(text, "\\boxed{"); p; p = strstr(p + 1, "\\boxed{")) b = p;
    if (!b) return 0;
    int depth = 0;
    for (const char *p = b + 6; *p; p++) {
        if (*p == '{') depth++;
        else if (*p == '}' && --depth == 0) return 1;
    }
    return 0;
}

/* Append the token's bytes; non-zero to stop. */
static int text_acc_token(int token, void *user) {
    text_acc *a = user;
    const char *p;
    size_t n;
    if (token == a->stop_id || !polar_token_piece(a->tok, token, &p, &n)) return 0;
    for (int i = 0; a->arch && i < a->arch->n_eos; i++)
        if (token == a->arch->eos[i]) return 0;
    if (a->len + n + 1 > a->cap) {
        size_t cap = (a->len + n + 1) * 2;
        char *t = realloc(a->text, cap);
        if (!t) {
            a->out_of_memory = 1;
            return 1;
        }
        a->text = t, a->cap = cap;
    }
    memcpy(a->text + a->len, p, n);
    a->len += n;
    a->text[a->len] = 0;
    return a->stop_at_box && boxed_closed(a->text);
}

int text_acc_feed(text_acc *a, const polar_seq_info *info, int *fed) {
    while (*fed < info->n_generated)
        if (text_acc_token(info->tokens[(*fed)++], a)) return 1;
    return 0;
}

void text_acc_reset(text_acc *a) {
    a->len = 0, a->out_of_memory = 0;
    if (a->text) a->text[0] = 0;
}

void text_acc_free(text_acc *a) {
    free(a->text);
    a->text = NULL, a->len = a->cap = 0;
}

int parse_style(const char *cmd, const char *text, prompt_style *out) {
    if (!strcmp(text, "boxed")) *out = STYLE_BOXED;
    else if (!strcmp(text, "chat")) *out = STYLE_CHAT;
    else if (!strcmp(text, "mc")) *out = STYLE_MC;
    else {
        fail_usage(cmd, "--style must be boxed, chat or mc, got '%s'", text);
        return 0;
    }
    return 1;
}

polar_status question_prompt(const polar_tokenizer *tok, prompt_style style, const polar_question *q,
                             const polar_question *const *shots, int n_shots, char **text, int **ids, int *n,
                             polar_error *err) {
    char *user = NULL, *chat = NULL;
    *text = NULL;
    polar_status st = polar_prompt_format(style == STYLE_MC ? POLAR_PROMPT_MC : POLAR_PROMPT_BOXED, q, shots, n_shots,
                                          &user, err);
    if (st == POLAR_OK && style == STYLE_CHAT) st = polar_chat_prompt(tok, NULL, user, &chat, err);
    if (st == POLAR_OK) {
        const char *src = chat ? chat : user;
        st = polar_tokenize(tok, src, strlen(src), chat != NULL, chat == NULL, ids, n, err);
    }
    if (st == POLAR_OK && chat) *text = chat, chat = NULL;
    else if (st == POLAR_OK) *text = user, user = NULL;
    polar_free(user);
    polar_free(chat);
    return st;
}

int open_dataset(const char *cmd, const char *path, const char *format, const char *qfield, const char *afield,
                 int start, int limit, polar_dataset **out, int *first, int *count) {
    polar_dataset_opts o = {.format = POLAR_DATA_AUTO, .question_field = qfield, .answer_field = afield};
    if (format) {
        static const polar_data_format all[] = {POLAR_DATA_AUTO,  POLAR_DATA_GSM8K, POLAR_DATA_ASDIV,
                                                POLAR_DATA_MAWPS, POLAR_DATA_MMLU,  POLAR_DATA_JSONL};
        int found = 0;
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (!strcmp(format, polar_data_format_name(all[i]))) o.format = all[i], found = 1;
        if (!found) return fail_usage(cmd, "--format must be auto, gsm8k, asdiv, mawps, mmlu or jsonl, got '%s'", format);
    }
    polar_error err;
    if (polar_dataset_load(path, &o, out, &err) != POLAR_OK) return fail_status(cmd, &err);
    int size = polar_dataset_size(*out);
    if (start >= size) {
        polar_dataset_free(*out);
        *out = NULL;
        return fail_usage(cmd, "--start %d is past the %d questions of %s", start, size, path);
    }
    *first = start;
    *count = limit && limit < size - start ? limit : size - start;
    return 0;
}

int load_shots(const char *cmd, int n, const char *from, polar_dataset **shot_data,
               const polar_question *shots[MAX_SHOTS]) {
    *shot_data = NULL;
    if ((n > 0) != (from != NULL)) return fail_usage(cmd, "--shots N and --shots-from FILE go together");
    if (n == 0) return 0;
    if (n < 0 || n > MAX_SHOTS) return fail_usage(cmd, "--shots must be 1 to %d", MAX_SHOTS);
    int first, count, rc = open_dataset(cmd, from, NULL, NULL, NULL, 0, n, shot_data, &first, &count);
    if (rc) return rc;
    if (count < n) {
        polar_dataset_free(*shot_data);
        *shot_data = NULL;
        return fail_usage(cmd, "%s has %d questions, fewer than --shots %d", from, count, n);
    }
    for (int i = 0; i < n; i++) shots[i] = polar_dataset_get(*shot_data, i);
    return 0;
}

int check_results_path(const char *cmd, const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return fail_usage(cmd, "-o %s: not a regular file (the results file is read back to resume a stopped run)",
                          path);
    return 0;
}

FILE *resume_results(const char *cmd, const char *path, int first, int count, unsigned char *done, int *n_done) {
    *n_done = 0;
    FILE *f = fopen(path, "r+");
    if (f) {
        char *line = NULL;
        size_t cap = 0;
        long good = 0, lineno = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, f)) > 0) {
            lineno++;
            if (line[len - 1] != '\n') break; /* torn: cut below */
            long index = polar_eval_record_index(line);
            if (index < 0) {
                fprintf(stderr, "polar %s: error: %s:%ld: not a line polar %s wrote; give another -o\n", cmd, path,
                        lineno, cmd);
                free(line);
                fclose(f);
                return NULL;
            }
            if (index >= first && index < first + count && !done[index - first]) done[index - first] = 1, (*n_done)++;
            good += len;
        }
        free(line);
        int cut = ftruncate(fileno(f), good);
        fclose(f);
        if (cut) {
            fprintf(stderr, "polar %s: error: %s: cannot cut off its torn last line\n", cmd, path);
            return NULL;
        }
    }
    f = fopen(path, "a");
    if (!f) fprintf(stderr, "polar %s: error: %s: cannot open for writing\n", cmd, path);
    return f;
}

polar_status longest_prompt(const polar_tokenizer *tok, prompt_style style, const polar_dataset *data, int first,
                            int count, const unsigned char *done, const polar_question *const *shots, int n_shots,
                            int *longest, polar_error *err) {
    *longest = 0;
    for (int i = 0; i < count; i++) {
        char *text;
        int *ids, n;
        if (done[i]) continue;
        polar_status st = question_prompt(tok, style, polar_dataset_get(data, first + i), shots, n_shots, &text, &ids,
                                          &n, err);
        if (st != POLAR_OK) return st;
        *longest = n > *longest ? n : *longest;
        polar_free(text), polar_free(ids);
    }
    return POLAR_OK;
}

void progress_start(cli_progress *p, const char *cmd, int total, int done_before) {
    *p = (cli_progress){.cmd = cmd, .total = total, .done_before = done_before, .tty = isatty(2),
                        .t_start_ms = polar_time_ms()};
    p->last_ms = p->t_start_ms;
}

void progress_update(cli_progress *p, int done) {
    double now = polar_time_ms(), s = (now - p->t_start_ms) / 1000;
    if (!p->tty && done < p->total && now - p->last_ms < 60e3) return;
    p->last_ms = now;
    double rate = s > 0 ? (done - p->done_before) / s : 0;
    long eta = rate > 0 ? (long)((p->total - done) / rate) : 0;
    char eta_text[32];
    if (eta >= 3600) snprintf(eta_text, sizeof eta_text, "%ldh %02ldm", eta / 3600, eta / 60 % 60);
    else snprintf(eta_text, sizeof eta_text, "%ldm %02lds", eta / 60, eta % 60);
    if (p->tty) {
        fprintf(stderr, "\rpolar %s: %d/%d questions, %.2f/s, ETA %s   ", p->cmd, done, p->total, rate, eta_text);
        if (done == p->total) fputc('\n', stderr);
    } else {
        char stamp[32] = "";
        time_t t = time(NULL);
        struct tm tm;
        if (gmtime_r(&t, &tm)) strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S UTC", &tm);
        fprintf(stderr, "polar %s: %s: %d/%d questions (%d this run, %.0f s), %.3f/s, ETA %s\n", p->cmd, stamp, done,
                p->total, done - p->done_before, s, rate, eta_text);
    }
    fflush(stderr);
}

int read_programs(const char *cmd, const char *path, int D, polar_program *out, int max, int *n) {
    polar_error err;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "polar %s: error: %s: cannot open the programs file\n", cmd, path);
        return 1;
    }
    char line[8192];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        /* a line that fgets cut (no newline, more to come) is too long or holds a NUL: a
         * device such as /dev/zero would otherwise be read as empty lines without end */
        if (!strchr(line, '\n') && !feof(f)) {
            fprintf(stderr, "polar %s: error: %s:%d: over %d bytes or a NUL byte: not a programs file\n", cmd, path,
                    lineno, (int)sizeof line - 2);
            rc = 1;
            break;
        }
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        if (*n == max) rc = fail_usage(cmd, "%s: more than %d programs", path, max);
        else if (polar_program_parse(line, D, 0, &out[*n], &err) != POLAR_OK) {
            fprintf(stderr, "polar %s: error: %s:%d: %s\n", cmd, path, lineno, err.msg);
            rc = 1;
        } else {
            (*n)++;
        }
    }
    fclose(f);
    if (!rc && !*n) rc = fail_usage(cmd, "%s holds no program", path);
    if (rc) {
        for (int i = 0; i < *n; i++) polar_program_free(&out[i]);
        *n = 0;
    }
    return rc;
}
