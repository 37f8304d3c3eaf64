/* polar run/bench's tensor-parallel options (tp.h). */
#include "tp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --devices (or 0..tp-1) into out. */
static int parse_devices(const char *cmd, const cli_tp_args *a, cli_tp *out) {
    out->tp = a->tp;
    for (int i = 0; i < a->tp; i++) out->devices[i] = i;
    if (!a->devices) return 0;
    int *devices = NULL, n = 0;
    if (!parse_int_list(cmd, "--devices", a->devices, &devices, &n)) return EXIT_USAGE;
    int rc = 0;
    if (n > CLI_MAX_TP) rc = fail_usage(cmd, "--devices lists %d GPUs, at most %d", n, CLI_MAX_TP);
    else if (a->tp && n != a->tp) rc = fail_usage(cmd, "--devices lists %d GPU%s but --tp is %d", n, n == 1 ? "" : "s", a->tp);
    else out->tp = n, memcpy(out->devices, devices, (size_t)n * sizeof *devices);
    free(devices);
    return rc;
}

/* An option's value, else the launcher's variable's (-1: neither). */
static int from_env(const char *cmd, int given, const char *var, int *out) {
    *out = given;
    const char *e = getenv(var);
    if (given >= 0 || !e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    if (end == e || *end || v < 0 || v > 1 << 20) return fail_usage(cmd, "%s=%s is not a rank count or number", var, e);
    *out = (int)v;
    return 0;
}

/* Rank 0: a new id into the file, which must not exist (written whole under
 * another name, then renamed, so the others never read part of it). */
static int publish_id(const char *cmd, const char *path, cli_tp *out) {
    polar_error err;
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "polar %s: error: --nccl-id %s exists already (an earlier job's? remove it or give a new "
                "path)\n", cmd, path);
        return 1;
    }
    if (polar_nccl_id(out->id, &err) != POLAR_OK) return fail_status(cmd, &err);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(out->id, 1, sizeof out->id, f) == sizeof out->id;
    ok = (f && fclose(f) == 0) && ok && rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "polar %s: error: --nccl-id %s: cannot write it: %s\n", cmd, path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

/* The other ranks: the id once the file is there. */
static int read_id(const char *cmd, const char *path, cli_tp *out) {
    for (int waited = 0; waited < 3000; waited++) { /* 100 ms each: 5 minutes */
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t n = fread(out->id, 1, sizeof out->id, f);
            int extra = fgetc(f) != EOF;
            fclose(f);
            if (n != sizeof out->id || extra) {
                fprintf(stderr, "polar %s: error: --nccl-id %s: not an NCCL id (%s bytes)\n", cmd, path,
                        extra ? "more than 128" : "fewer than 128");
                return 1;
            }
            return 0;
        }
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    fprintf(stderr, "polar %s: error: --nccl-id %s: not written by rank 0 within 5 minutes\n", cmd, path);
    return 1;
}

int cli_tp_setup(const char *cmd, const cli_tp_args *a, cli_tp *out) {
    memset(out, 0, sizeof *out);
    if (a->tp < 0 || a->tp > CLI_MAX_TP) return fail_usage(cmd, "--tp must be 0 to %d, got %d", CLI_MAX_TP, a->tp);
    int rc = parse_devices(cmd, a, out), rank, world;
    if (rc || (rc = from_env(cmd, a->rank, "RANK", &rank)) || (rc = from_env(cmd, a->world, "WORLD_SIZE", &world)))
        return rc;
    if (!a->nccl_id) {
        if (a->rank >= 0 || a->world >= 0) return fail_usage(cmd, "--rank and --world go with --nccl-id FILE");
        return 0;
    }
    if (world < 1 || rank < 0 || rank >= world)
        return fail_usage(cmd, "--nccl-id wants --rank R and --world W (or RANK and WORLD_SIZE), 0 <= R < W");
    if (!out->tp) out->tp = 1, out->devices[0] = 0;
    out->world = world * out->tp, out->rank = rank * out->tp;
    rc = rank == 0 ? publish_id(cmd, a->nccl_id, out) : read_id(cmd, a->nccl_id, out);
    if (!rc) out->nccl_id = out->id;
    return rc;
}
