/* The tensor-parallel options of polar run and bench (docs/cuda.md):
 * --tp N and --devices LIST (this process's GPUs), and for several
 * processes (one per node) --nccl-id FILE --rank R --world W (or the RANK and
 * WORLD_SIZE variables launchers set). */
#ifndef POLAR_CLI_TP_H
#define POLAR_CLI_TP_H

#include "args.h"

#define CLI_MAX_TP 64

/* What the options ask for, as the options table fills it. */
typedef struct {
    int tp;              /* --tp (0: one GPU without NCCL) */
    const char *devices; /* --devices */
    const char *nccl_id; /* --nccl-id */
    int rank, world;     /* --rank, --world: processes (-1: not given) */
} cli_tp_args;

/* The options' entries for a command's table (their fields in a). */
#define CLI_TP_OPTS(a)                                                                               \
    {"--tp", OPT_INT, &(a).tp, 0}, {"--devices", OPT_STR, &(a).devices, 0},                          \
        {"--nccl-id", OPT_STR, &(a).nccl_id, 0}, {"--rank", OPT_INT, &(a).rank, 0},                  \
        {"--world", OPT_INT, &(a).world, 0}
#define CLI_TP_ARGS_INIT {.rank = -1, .world = -1}

/* The polar_batch_opts / polar_session_opts fields they make. */
typedef struct {
    int tp;
    int devices[CLI_MAX_TP]; /* [tp] */
    int world, rank;         /* ranks in all and this process's first (0, 0: this process alone) */
    unsigned char id[POLAR_NCCL_ID_BYTES];
    const void *nccl_id;     /* id, or NULL: this process alone */
} cli_tp;

/* Check the options and, for several processes, share the NCCL id through
 * the --nccl-id file: the process of rank 0 makes it and writes the file
 * (which must not exist yet: a path of this job's own), the others wait for
 * it (up to 5 minutes). Every process holds --tp GPUs (1 unless given):
 * ranks rank * tp .. rank * tp + tp - 1 of world * tp. Returns an exit
 * status (0: go on), having printed any error. */
int cli_tp_setup(const char *cmd, const cli_tp_args *a, cli_tp *out);

#endif
