/* A tensor-parallel group (docs/cuda.md): this process's ranks,
 * each a GPU with its NCCL communicator, and a thread per rank beyond the
 * first to drive it (the first is the caller's thread). A batch's step runs
 * on every rank at once (tp_run): each issues the same calls on its own
 * device, and the collectives in them meet across ranks (and processes).
 * One thread per rank, rather than one thread issuing for all, lets each
 * rank replay its own captured graph while the others run theirs, and is
 * what NCCL's emulation (tests/cuda_emu/nccl.cpp) needs to run the ranks
 * side by side. Built with POLAR_CUDA. */
#ifndef POLAR_CUDA_TP_H
#define POLAR_CUDA_TP_H

#include <nccl.h>

#include "polar.h"

typedef struct tp_group tp_group;

/* Ranks rank0 .. rank0 + n - 1 of world, on devices[0..n) (NULL: 0..n-1).
 * world == n: one process holds them all (ncclCommInitAll); else the
 * processes join with ncclCommInitRank under unique_id (NCCL_UNIQUE_ID_BYTES,
 * the same in every process). */
typedef struct {
    int n, world, rank0;
    const int *devices;
    const void *unique_id;
} tp_config;

polar_status tp_group_create(const tp_config *cfg, tp_group **out, polar_error *err);
void tp_group_free(tp_group *g);

int tp_rank(const tp_group *g, int local);   /* local rank i's rank in the world */
ncclComm_t tp_comm(const tp_group *g, int local);

/* fn(arg, i) for every local rank i at once, each on its rank's thread with
 * its device current (rank 0 on the caller's thread, whose current device is
 * restored after); returns when all have returned. */
void tp_run(tp_group *g, void (*fn)(void *arg, int local), void *arg);

/* An NCCL error in words. */
polar_status tp_nccl_error(polar_error *err, ncclResult_t r, const char *what);

#endif
