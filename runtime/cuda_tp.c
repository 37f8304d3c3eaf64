/* A tensor-parallel group's ranks, communicators and threads (cuda_tp.h),
 * and the NCCL id several processes join under (polar_nccl_id). Built with
 * POLAR_CUDA; without it there is no tensor parallelism. */
#include "polar.h"

#ifndef POLAR_CUDA

#include "error.h"

polar_status polar_nccl_id(unsigned char id[POLAR_NCCL_ID_BYTES], polar_error *err) {
    (void)id;
    return polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor parallel: this build has no CUDA backend (build it with make cuda)");
}

#else

#include "cuda_tp.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct tp_group {
    int n, world, rank0;
    int *devices;          /* [n] */
    ncclComm_t *comms;     /* [n] */
    pthread_t *threads;    /* [n] (0 unused: the caller's) */
    int started;           /* threads made */
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    unsigned long job;     /* jobs handed out; a thread runs each once */
    int pending;           /* threads still running the current job */
    int quit;
    void (*fn)(void *arg, int local);
    void *arg;
};

typedef struct {
    tp_group *g;
    int local;
} worker_arg;

polar_status tp_nccl_error(polar_error *err, ncclResult_t r, const char *what) {
    return polar_fail(err, POLAR_ERR_IO, "nccl: %s: %s", what, ncclGetErrorString(r));
}

_Static_assert(sizeof(ncclUniqueId) == POLAR_NCCL_ID_BYTES, "polar.h's NCCL id size is NCCL's");

polar_status polar_nccl_id(unsigned char id[POLAR_NCCL_ID_BYTES], polar_error *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return tp_nccl_error(err, r, "making the group's id (ncclGetUniqueId)");
    memcpy(id, &u, sizeof u);
    return POLAR_OK;
}

static void *worker(void *p) {
    worker_arg a = *(worker_arg *)p;
    free(p);
    tp_group *g = a.g;
    /* the rank's device for everything this thread issues (an error here
     * shows as the rank's first call failing) */
    (void)cudaSetDevice(g->devices[a.local]);
    unsigned long seen = 0;
    pthread_mutex_lock(&g->lock);
    for (;;) {
        while (g->job == seen && !g->quit) pthread_cond_wait(&g->go, &g->lock);
        if (g->quit) break;
        seen = g->job;
        void (*fn)(void *, int) = g->fn;
        void *arg = g->arg;
        pthread_mutex_unlock(&g->lock);
        fn(arg, a.local);
        pthread_mutex_lock(&g->lock);
        if (--g->pending == 0) pthread_cond_signal(&g->done);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

void tp_run(tp_group *g, void (*fn)(void *arg, int local), void *arg) {
    int previous = 0;
    (void)cudaGetDevice(&previous);
    if (g->n > 1) {
        pthread_mutex_lock(&g->lock);
        g->fn = fn, g->arg = arg, g->pending = g->n - 1, g->job++;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->lock);
    }
    (void)cudaSetDevice(g->devices[0]);
    fn(arg, 0);
    (void)cudaSetDevice(previous);
    if (g->n > 1) {
        pthread_mutex_lock(&g->lock);
        while (g->pending) pthread_cond_wait(&g->done, &g->lock);
        pthread_mutex_unlock(&g->lock);
    }
}

void tp_group_free(tp_group *g) {
    if (!g) return;
    if (g->started) {
        pthread_mutex_lock(&g->lock);
        g->quit = 1;
        pthread_cond_broadcast(&g->go);
        pthread_mutex_unlock(&g->lock);
        for (int i = 1; i < g->started; i++) pthread_join(g->threads[i], NULL);
    }
    for (int i = 0; g->comms && i < g->n; i++)
        if (g->comms[i]) ncclCommDestroy(g->comms[i]);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g->devices);
    free(g->comms);
    free(g->threads);
    free(g);
}

/* The communicators: one call for a whole single-process group; ranks
 * joining other processes' under their shared id otherwise (grouped, so
 * that one thread may init several ranks). */
static ncclResult_t init_comms(tp_group *g, const void *unique_id) {
    if (g->world == g->n) return ncclCommInitAll(g->comms, g->n, g->devices);
    ncclUniqueId id;
    memcpy(&id, unique_id, sizeof id);
    int previous = 0;
    (void)cudaGetDevice(&previous);
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; r == ncclSuccess && i < g->n; i++) {
        if (cudaSetDevice(g->devices[i]) != cudaSuccess) r = ncclUnhandledCudaError;
        else r = ncclCommInitRank(&g->comms[i], g->world, id, g->rank0 + i);
    }
    ncclResult_t end = ncclGroupEnd();
    (void)cudaSetDevice(previous);
    return r != ncclSuccess ? r : end;
}

polar_status tp_group_create(const tp_config *cfg, tp_group **out, polar_error *err) {
    *out = NULL;
    int n = cfg->n, count = 0;
    if (n < 1 || cfg->world < n || cfg->rank0 < 0 || cfg->rank0 + n > cfg->world || (cfg->world > n && !cfg->unique_id))
        return polar_fail(err, POLAR_ERR_ARG, "tensor parallel: ranks %d..%d of %d%s", cfg->rank0, cfg->rank0 + n - 1,
                          cfg->world, cfg->world > n && !cfg->unique_id ? " without the NCCL id of the job" : "");
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess) return polar_fail(err, POLAR_ERR_UNSUPPORTED, "tensor parallel: %s", cudaGetErrorString(ce));
    /* a device named twice first: wrong on any machine, so the same error on every one */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (cfg->devices && cfg->devices[j] == cfg->devices[i])
                return polar_fail(err, POLAR_ERR_ARG,
                                  "tensor parallel: device %d given twice (NCCL runs one rank per GPU: a machine with "
                                  "%d GPU%s runs at most %d ranks)", cfg->devices[i], count, count == 1 ? "" : "s",
                                  count);
    for (int i = 0; i < n; i++) {
        int d = cfg->devices ? cfg->devices[i] : i;
        if (d < 0 || d >= count)
            return polar_fail(err, POLAR_ERR_ARG, "tensor parallel: device %d does not exist (%d GPU%s here)", d, count,
                              count == 1 ? "" : "s");
    }
    tp_group *g = calloc(1, sizeof *g);
    if (!g) return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    g->n = n, g->world = cfg->world, g->rank0 = cfg->rank0;
    g->devices = malloc((size_t)n * sizeof *g->devices);
    g->comms = calloc((size_t)n, sizeof *g->comms);
    g->threads = calloc((size_t)n, sizeof *g->threads);
    if (!g->devices || !g->comms || !g->threads) {
        tp_group_free(g);
        return polar_fail(err, POLAR_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) g->devices[i] = cfg->devices ? cfg->devices[i] : i;
    ncclResult_t r = init_comms(g, cfg->unique_id);
    if (r != ncclSuccess) {
        tp_group_free(g);
        return tp_nccl_error(err, r, "joining the ranks (ncclCommInit)");
    }
    g->started = 1;
    for (int i = 1; i < n; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) *a = (worker_arg){g, i};
        if (!a || pthread_create(&g->threads[i], NULL, worker, a)) {
            free(a);
            tp_group_free(g);
            return polar_fail(err, POLAR_ERR_NOMEM, "tensor parallel: cannot start a thread for rank %d", i);
        }
        g->started = i + 1;
    }
    *out = g;
    return POLAR_OK;
}

int tp_rank(const tp_group *g, int local) { return g->rank0 + local; }
ncclComm_t tp_comm(const tp_group *g, int local) { return g->comms[local]; }

#endif
