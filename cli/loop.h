/* What polar eval and polar search share: the generated text gathered token
 * by token (stopping once a \boxed{} answer is complete), the prompt of a
 * question in a style, results files that resume, and a progress line. */
#ifndef POLAR_CLI_LOOP_H
#define POLAR_CLI_LOOP_H

#include <stdio.h>

#include "args.h"

typedef struct {
    const polar_tokenizer *tok;
    int stop_at_box;  /* stop generating once a \boxed{...} has closed */
    int stop_id;      /* end of turn, or -1 */
    const polar_arch *arch; /* its eos ids end the text without joining it (NULL: none) */
    char *text;       /* the bytes so far, NUL-terminated */
    size_t len, cap;
    int out_of_memory;
} text_acc;

void text_acc_reset(text_acc *a);

/* A batch sequence's tokens from *fed on into a, until they run out or the
 * text stops (returns 1). */
int text_acc_feed(text_acc *a, const polar_seq_info *info, int *fed);
void text_acc_free(text_acc *a);

typedef enum { STYLE_BOXED, STYLE_CHAT, STYLE_MC } prompt_style;

/* "boxed" | "chat" | "mc"; prints a usage error and returns 0 otherwise. */
int parse_style(const char *cmd, const char *text, prompt_style *out);

/* The prompt ids of question q (with shots) in a style: boxed and mc raw
 * (BOS when the tokenizer wants it), chat through the model's template.
 * *text gets the prompt's text (release both with polar_free). */
polar_status question_prompt(const polar_tokenizer *tok, prompt_style style, const polar_question *q,
                             const polar_question *const *shots, int n_shots, char **text, int **ids, int *n,
                             polar_error *err);

/* Tokens in the longest prompt of questions first..first+count-1 not marked
 * done (the context a run over them needs). */
polar_status longest_prompt(const polar_tokenizer *tok, prompt_style style, const polar_dataset *data, int first,
                            int count, const unsigned char *done, const polar_question *const *shots, int n_shots,
                            int *longest, polar_error *err);

/* At most this many worked examples before a question (--shots). */
#define MAX_SHOTS 64

/* --shots N --shots-from FILE: the first n questions of FILE (with their
 * worked solutions) into shots[MAX_SHOTS]; *shot_data owns them (free with
 * polar_dataset_free; NULL when n is 0). Returns an exit status, having
 * printed any error. */
int load_shots(const char *cmd, int n, const char *from, polar_dataset **shot_data,
               const polar_question *shots[MAX_SHOTS]);

/* The data set of --data with --format / --question-field / --answer-field,
 * and the slice [start, start + limit) of it (limit 0: to the end). Returns
 * an exit status, having printed any error. */
int open_dataset(const char *cmd, const char *path, const char *format, const char *qfield, const char *afield,
                 int start, int limit, polar_dataset **out, int *first, int *count);

/* -o names a results file that a later run resumes (reads back): refused
 * with a usage error (its exit status) when it exists and is not a regular
 * file (a device or a pipe reads back without end). */
int check_results_path(const char *cmd, const char *path);

/* Open a results file for appending after marking done[i] for the complete
 * lines of questions first..first+count-1 already in it; a torn last line
 * (a run killed mid-write) is cut off. A line that is not one of ours stops
 * with an error rather than append to someone else's file. NULL after
 * printing the error. */
FILE *resume_results(const char *cmd, const char *path, int first, int count, unsigned char *done, int *n_done);

/* The programs of a file, one per line in SPEC form (blank lines and lines
 * starting with # skipped), for a model of D layers: at most max into out
 * (free each with polar_program_free). Returns an exit status, having
 * printed any error (file and line). */
int read_programs(const char *cmd, const char *path, int D, polar_program *out, int max, int *n);

/* Progress of a long run over questions, on stderr: on a terminal one line
 * rewritten after each question ("\rpolar CMD: 12/300 questions, 0.80/s,
 * ETA 6m 05s"); elsewhere (a log of a background run) the same as a whole
 * line, at most one a minute and the last, stamped with the UTC time. */
typedef struct {
    const char *cmd;
    int total, done_before; /* questions in the run; those already in the output when it began */
    int tty;
    double t_start_ms, last_ms; /* the run's start; the last line printed (not on a terminal) */
} cli_progress;

void progress_start(cli_progress *p, const char *cmd, int total, int done_before);
void progress_update(cli_progress *p, int done);

#endif
