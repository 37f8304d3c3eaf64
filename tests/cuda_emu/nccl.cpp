// CUDA emulation: NCCL's communicators and collectives between host
// threads, each rank a thread with its own emulated device (a process of a
// multi-node job is a thread here too: ncclCommInitRank with a shared
// unique id). A collective is work on the rank's stream like any other: it
// runs when the stream reaches it (or when a captured graph replays it) and
// waits there until every rank of the communicator has reached its
// collective of the same number; the last to arrive computes the result for
// all of them, in rank order (rank 0's buffer, plus rank 1's, ...), so runs
// are deterministic and every rank gets the same bits, as NCCL's do.
//
// What it checks, as NCCL would refuse it or a GPU would punish it:
//  - the ranks' n-th collectives must agree (kind, count, type, operation),
//    else it aborts naming both ranks' calls (NCCL would hang or
//    corrupt memory);
//  - a rank that waits more than POLAR_CUDA_EMU_NCCL_TIMEOUT seconds (300
//    unless set) for the others aborts, naming who never came (a deadlock:
//    ranks issuing collectives in different orders, or a rank that stopped);
//  - buffers must lie inside device allocations of the communicator's device,
//    and the stream must be that device's (ncclInvalidArgument);
//  - two ranks of one communicator on one device: ncclInvalidUsage, as
//    NCCL's "Duplicate GPU detected" (a single-GPU machine cannot run two
//    ranks);
//  - collectives grouped (ncclGroupStart/End) by one thread for ranks of
//    several devices run at the group's end, all arriving before any waits;
//    such a group cannot be captured into graphs here (one thread replays one
//    graph at a time), and is refused while a stream captures.
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace {

enum kind { ALL_REDUCE, ALL_GATHER };
const char *kind_name(kind k) { return k == ALL_REDUCE ? "ncclAllReduce" : "ncclAllGather"; }

// One rank's side of a collective.
struct call {
    kind k;
    const void *send;
    void *recv;
    size_t count; // elements sent by each rank
    ncclDataType_t type;
    ncclRedOp_t op;
};

// The ranks that share a unique id.
struct clique {
    int nranks;
    std::vector<int> devices;              // [nranks] -1: not joined
    int joined = 0, alive = 0;
    std::vector<std::deque<call>> queued;  // [nranks] collectives a rank reached that have not run
    std::vector<unsigned long long> done;  // [nranks] collectives of each rank that ran
};

std::mutex lock;
std::condition_variable changed;
std::map<std::string, clique *> cliques; // by unique id
unsigned long long ids_made;

} // namespace

struct ncclComm {
    clique *c;
    std::string key;
    int rank, device;
    unsigned long long issued; // collectives it reached (its next one's number)
};

namespace {

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

template <typename T> void sum_typed(char *acc, const char *x, size_t n) {
    for (size_t i = 0; i < n; i++) ((T *)acc)[i] += ((const T *)x)[i];
}

// acc += x, n elements of t (a type collective() accepted for a sum).
void sum(char *acc, const char *x, size_t n, ncclDataType_t t) {
    switch (t) {
    case ncclInt8: sum_typed<signed char>(acc, x, n); break;
    case ncclUint8: sum_typed<unsigned char>(acc, x, n); break;
    case ncclInt32: sum_typed<int>(acc, x, n); break;
    case ncclUint32: sum_typed<unsigned>(acc, x, n); break;
    case ncclInt64: sum_typed<long long>(acc, x, n); break;
    case ncclUint64: sum_typed<unsigned long long>(acc, x, n); break;
    case ncclFloat32: sum_typed<float>(acc, x, n); break;
    case ncclFloat64: sum_typed<double>(acc, x, n); break;
    default: break;
    }
}

double timeout_s() {
    static double t = [] {
        const char *e = getenv("POLAR_CUDA_EMU_NCCL_TIMEOUT");
        return e && atof(e) > 0 ? atof(e) : 300.0;
    }();
    return t;
}

// Waits (lock held) until done() holds; aborts after the timeout, saying
// what rank `rank` of c waited for.
template <typename F> void wait_or_die(std::unique_lock<std::mutex> &hold, clique *c, int rank, F done,
                                       const char *what) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
    while (!done()) {
        if (changed.wait_until(hold, deadline) == std::cv_status::timeout && !done()) {
            fprintf(stderr, "cuda-emu: nccl: rank %d of %d waited %.0f s for %s; ranks that never came:", rank,
                    c->nranks, timeout_s(), what);
            for (int r = 0; r < c->nranks; r++)
                if (c->devices[r] < 0 || (c->queued[r].empty() && r != rank)) fprintf(stderr, " %d", r);
            fprintf(stderr, " (a deadlock: collectives issued in different orders, or a rank that stopped)\n");
            fflush(stderr);
            abort();
        }
    }
}

void die_mismatch(const call &a, int ra, const call &b, int rb, unsigned long long n) {
    fprintf(stderr, "cuda-emu: nccl: collective #%llu differs between ranks: rank %d called %s(count %zu, type %d, "
            "op %d), rank %d %s(count %zu, type %d, op %d)\n", n, ra, kind_name(a.k), a.count, (int)a.type,
            (int)a.op, rb, kind_name(b.k), b.count, (int)b.type, (int)b.op);
    fflush(stderr);
    abort();
}

// Runs the collective at the front of every rank's queue (lock held): the
// inputs read whole before any output is written (in place is allowed).
void perform(clique *c) {
    int n = c->nranks;
    const call &f = c->queued[0].front();
    for (int r = 1; r < n; r++) {
        const call &g = c->queued[r].front();
        if (g.k != f.k || g.count != f.count || g.type != f.type || (f.k == ALL_REDUCE && g.op != f.op))
            die_mismatch(f, 0, g, r, c->done[0]);
    }
    size_t bytes = f.count * type_size(f.type);
    std::vector<char> out(f.k == ALL_GATHER ? bytes * n : bytes);
    if (f.k == ALL_REDUCE) {
        memcpy(out.data(), f.send, bytes);
        for (int r = 1; r < n; r++) sum(out.data(), (const char *)c->queued[r].front().send, f.count, f.type);
    } else {
        for (int r = 0; r < n; r++) memcpy(out.data() + r * bytes, c->queued[r].front().send, bytes);
    }
    for (int r = 0; r < n; r++) {
        memmove(c->queued[r].front().recv, out.data(), out.size());
        c->queued[r].pop_front();
        c->done[r]++;
    }
    changed.notify_all();
}

// comm's rank reaches its next collective; its number.
unsigned long long arrive(ncclComm_t comm, const call &x) {
    std::lock_guard<std::mutex> hold(lock);
    clique *c = comm->c;
    unsigned long long n = comm->issued++;
    c->queued[comm->rank].push_back(x);
    for (;;) {
        for (int r = 0; r < c->nranks; r++)
            if (c->queued[r].empty()) return n;
        perform(c);
    }
}

// Until comm's collective number n has run.
void await_done(ncclComm_t comm, unsigned long long n, kind k) {
    std::unique_lock<std::mutex> hold(lock);
    clique *c = comm->c;
    char what[96];
    snprintf(what, sizeof what, "its collective #%llu (%s)", n, kind_name(k));
    wait_or_die(hold, c, comm->rank, [&] { return c->done[comm->rank] > n; }, what);
}

// A collective or an init deferred to the end of the thread's group.
struct grouped_call {
    ncclComm_t comm;
    call x;
    cudaStream_t stream;
};
thread_local int group_depth;
thread_local std::vector<grouped_call> grouped;
thread_local std::vector<ncclComm_t> grouped_inits;

bool known(ncclComm_t comm) {
    if (!comm) return false;
    std::lock_guard<std::mutex> hold(lock);
    for (auto &kv : cliques)
        if (kv.second == comm->c) return true;
    return false;
}

ncclResult_t refuse(ncclResult_t r, const char *fmt, const char *api, const char *detail = "") {
    EMU_NOTE(fmt, api, detail);
    return r;
}

// [p, p + bytes) inside a device allocation of `device`.
bool on_device(const void *p, size_t bytes, int device, const char *api, const char *what) {
    if (emu::check_device_range(p, bytes, api, what) != cudaSuccess) return false;
    if (bytes && emu::device_of(p) != device) {
        EMU_NOTE("cuda-emu: %s: the %s buffer is memory of device %d, the communicator's is %d\n", api, what,
                 emu::device_of(p), device);
        return false;
    }
    return true;
}

// The collective's work on its stream: arrive, then wait for the others.
ncclResult_t enqueue(ncclComm_t comm, const call &x, cudaStream_t stream, bool arrive_part, bool wait_part,
                     std::shared_ptr<unsigned long long> ticket) {
    cudaError_t e = emu::run_on_stream(stream, kind_name(x.k), [=]() {
        if (arrive_part) *ticket = arrive(comm, x);
        if (wait_part) await_done(comm, *ticket, x.k);
    });
    return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

ncclResult_t collective(const call &x, ncclComm_t comm, cudaStream_t stream) {
    const char *api = kind_name(x.k);
    if (!known(comm)) return refuse(ncclInvalidArgument, "cuda-emu: %s: not a communicator%s\n", api);
    size_t size = type_size(x.type);
    if (!size) return refuse(ncclInvalidArgument, "cuda-emu: %s: a type it does not know%s\n", api);
    if (x.k == ALL_REDUCE && (x.op != ncclSum || x.type == ncclFloat16 || x.type == ncclBfloat16))
        return refuse(ncclInvalidArgument, "cuda-emu: %s: %s is not emulated (polar sums f32)\n", api,
                      x.op != ncclSum ? "a reduction other than ncclSum" : "a 16-bit reduction");
    size_t in = x.count * size, out = x.k == ALL_GATHER ? in * comm->c->nranks : in;
    if (!on_device(x.send, in, comm->device, api, "send") ||
        !on_device(x.recv, out, comm->device, api, "receive"))
        return ncclInvalidArgument;
    if (emu::stream_device(stream) != comm->device) {
        EMU_NOTE("cuda-emu: %s: a stream of device %d, the communicator's device is %d\n", api,
                 emu::stream_device(stream), comm->device);
        return ncclInvalidArgument;
    }
    if (group_depth) {
        grouped.push_back({comm, x, stream});
        return ncclSuccess;
    }
    return enqueue(comm, x, stream, true, true, std::make_shared<unsigned long long>(0));
}

// A rank joins (lock held): false when the rank is taken or the sizes differ.
ncclComm_t join(clique *c, const std::string &key, int rank, int device) {
    if (c->devices[rank] >= 0) return nullptr;
    ncclComm_t comm = new ncclComm{c, key, rank, device, 0};
    c->devices[rank] = device;
    c->joined++, c->alive++;
    changed.notify_all();
    return comm;
}

clique *new_clique(int nranks) {
    clique *c = new clique();
    c->nranks = nranks;
    c->devices.assign(nranks, -1);
    c->queued.resize(nranks);
    c->done.assign(nranks, 0);
    return c;
}

// A rank leaves (lock held); the last one frees the clique.
void leave(ncclComm_t comm) {
    clique *c = comm->c;
    if (--c->alive == 0) {
        cliques.erase(comm->key);
        delete c;
    }
    delete comm;
}

// Two ranks on one device: NCCL's "Duplicate GPU detected".
bool duplicate_device(const clique *c, int *a, int *b) {
    for (*a = 0; *a < c->nranks; (*a)++)
        for (*b = *a + 1; *b < c->nranks; (*b)++)
            if (c->devices[*a] == c->devices[*b]) return true;
    return false;
}

// After the rank joined: wait for the others, then refuse a device two
// ranks share (the communicator is then the caller's to destroy).
ncclResult_t finish_init(ncclComm_t comm) {
    std::unique_lock<std::mutex> hold(lock);
    clique *c = comm->c;
    wait_or_die(hold, c, comm->rank, [&] { return c->joined == c->nranks; }, "the other ranks to join");
    int a, b;
    if (duplicate_device(c, &a, &b)) {
        EMU_NOTE("cuda-emu: ncclCommInitRank: Duplicate GPU detected: rank %d and rank %d both on CUDA device %d\n", a,
                 b, c->devices[a]);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    std::lock_guard<std::mutex> hold(lock);
    snprintf(id->internal, sizeof id->internal, "cuda-emu nccl id %ld.%llu", (long)getpid(), ++ids_made);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out || nranks < 1 || rank < 0 || rank >= nranks)
        return refuse(ncclInvalidArgument, "cuda-emu: %s: a rank outside 0..nranks-1%s\n", "ncclCommInitRank");
    *out = nullptr;
    ncclComm_t comm;
    {
        std::lock_guard<std::mutex> hold(lock);
        std::string key(id.internal, sizeof id.internal);
        clique *&c = cliques[key];
        if (!c) c = new_clique(nranks);
        if (c->nranks != nranks || !(comm = join(c, key, rank, emu::current())))
            return refuse(ncclInvalidArgument, "cuda-emu: %s: %s\n", "ncclCommInitRank",
                          c->nranks != nranks ? "ranks of one id disagree on their number" : "a rank joined twice");
    }
    if (group_depth) {
        grouped_inits.push_back(comm);
        *out = comm;
        return ncclSuccess;
    }
    ncclResult_t r = finish_init(comm);
    if (r == ncclSuccess) *out = comm;
    else ncclCommDestroy(comm);
    return r;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    int count = 0;
    if (!comms || ndev < 1 || cudaGetDeviceCount(&count) != cudaSuccess)
        return refuse(ncclInvalidArgument, "cuda-emu: %s: no devices%s\n", "ncclCommInitAll");
    std::vector<int> devs(ndev);
    for (int i = 0; i < ndev; i++) {
        devs[i] = devlist ? devlist[i] : i;
        if (devs[i] < 0 || devs[i] >= count)
            return refuse(ncclInvalidArgument, "cuda-emu: %s: a device that does not exist%s\n", "ncclCommInitAll");
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                EMU_NOTE("cuda-emu: ncclCommInitAll: Duplicate GPU detected: rank %d and rank %d both on CUDA device "
                         "%d\n", j, i, devs[i]);
                return ncclInvalidUsage;
            }
    }
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    std::lock_guard<std::mutex> hold(lock);
    std::string key(id.internal, sizeof id.internal);
    clique *c = cliques[key] = new_clique(ndev);
    for (int i = 0; i < ndev; i++) comms[i] = join(c, key, i, devs[i]);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (!known(comm)) return ncclInvalidArgument;
    std::lock_guard<std::mutex> hold(lock);
    leave(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return collective(call{ALL_REDUCE, send, recv, count, type, op}, comm, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
    return collective(call{ALL_GATHER, send, recv, count, type, ncclSum}, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

// The group's inits wait for their peers; its collectives all arrive, then
// all wait, so one thread may drive every rank's side.
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return refuse(ncclInvalidUsage, "cuda-emu: %s without ncclGroupStart%s\n", "ncclGroupEnd");
    if (--group_depth) return ncclSuccess;
    std::vector<ncclComm_t> inits;
    std::vector<grouped_call> calls;
    inits.swap(grouped_inits);
    calls.swap(grouped);
    ncclResult_t r = ncclSuccess;
    for (ncclComm_t comm : inits) {
        ncclResult_t ri = finish_init(comm);
        if (r == ncclSuccess) r = ri;
    }
    bool capturing = false, several = false;
    for (const grouped_call &g : calls) {
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (g.stream) cudaStreamIsCapturing(g.stream, &st);
        capturing |= st != cudaStreamCaptureStatusNone;
        several |= g.comm->c != calls[0].comm->c || g.comm != calls[0].comm;
    }
    if (capturing && several)
        return refuse(ncclInvalidUsage, "cuda-emu: %s: collectives of several ranks grouped while a stream "
                      "captures: the emulation replays one graph at a time%s\n", "ncclGroupEnd");
    std::vector<std::shared_ptr<unsigned long long>> tickets;
    for (const grouped_call &g : calls) {
        tickets.push_back(std::make_shared<unsigned long long>(0));
        ncclResult_t rc = enqueue(g.comm, g.x, g.stream, true, false, tickets.back());
        if (r == ncclSuccess) r = rc;
    }
    for (size_t i = 0; i < calls.size(); i++) {
        ncclResult_t rc = enqueue(calls[i].comm, calls[i].x, calls[i].stream, false, true, tickets[i]);
        if (r == ncclSuccess) r = rc;
    }
    return r;
}

} // extern "C"
