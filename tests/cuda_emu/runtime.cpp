// CUDA emulation: the runtime API subset polar uses, on the CPU. Device
// memory is host memory (one address space, as with UVA), so a device
// pointer is usable by the host, which a GPU would not allow: copies check
// their device side against the allocation table instead. Work on a stream
// runs when it is issued (the host then waits for nothing), except on a
// capturing stream, where it is recorded and replayed by cudaGraphLaunch.
// A graph lists its kernel (cuBLASLt's GEMM and NCCL's collectives one
// each), memcpy and memset nodes; an event recorded during a capture is no
// node (in CUDA it only joins streams), though its replay here records it.
//
// What it checks, as the real runtime or a GPU would refuse it:
//  - cudaMalloc'd memory starts as 0xFF bytes (NaN floats, bf16 NaN, -1
//    ints), so reading memory nobody wrote shows up in the tests' NaN
//    checks; inaccessible pages (64 KB) lie before each allocation and
//    right after its end rounded up to 256 bytes (cudaMalloc's alignment), so
//    a kernel reading or writing past either end faults and the handler names
//    the allocation and the GPU thread; the 256 bytes before the start and the
//    rounding are redzones checked when it is freed (a write there aborts
//    with the allocation's size);
//  - copies and memsets must lie inside one device allocation;
//  - during a capture (thread-local or global mode) synchronous or
//    allocating calls (cudaMalloc, cudaFree, cudaMemcpy, cudaMemset, host
//    allocations, device or stream synchronisation) fail with
//    cudaErrorStreamCaptureUnsupported and invalidate the capture; work on
//    the legacy stream while a blocking stream captures fails with
//    cudaErrorStreamCaptureImplicit;
//  - launch configurations (block size, dynamic shared memory beyond the
//    kernel's cudaFuncSetAttribute limit, a cooperative grid larger than can
//    be resident);
//  - several devices (POLAR_CUDA_EMU_DEVICES, 1 unless set): the current
//    device is the calling thread's (cudaSetDevice), allocations, streams and
//    events belong to the device current when they were made, and a kernel
//    launched or an event recorded on another device's stream is refused
//    (cudaErrorInvalidResourceHandle), as the real runtime refuses it. The
//    devices share one address space, so a kernel reading another device's
//    memory is not caught here; the emulated NCCL (nccl.cpp) checks that its
//    buffers are its communicator's device's.
#include <cxxabi.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu_internal.h"

typedef std::function<void()> stream_op;

const int NOT_A_NODE = -1; // captured work that is no node of the graph (an event record)

// Work captured from a stream: what a graph replays, and its node's kind.
struct emu_graph_node {
    int type; // a cudaGraphNodeType, or NOT_A_NODE
    stream_op op;
};

struct emu_stream {
    unsigned flags;
    int device; // the device current when it was made
    bool capturing, invalidated;
    cudaStreamCaptureMode mode;
    std::thread::id owner;
    std::vector<emu_graph_node> ops;
};
struct emu_event {
    unsigned flags;
    int device;
    bool recorded;
    double ms;
};
struct emu_graph {
    std::vector<emu_graph_node> ops;
};
struct emu_graph_exec {
    std::vector<stream_op> ops;
};

namespace {

const size_t TOTAL_BYTES = (size_t)80 << 30; // an H100's 80 GB
const size_t ALLOC_REDZONE = 256;
const unsigned char ALLOC_REDZONE_BYTE = 0xB7;
const int DEFAULT_DYNAMIC_SHARED = 48 << 10;
const int OPTIN_SHARED = 227 << 10;

// Its mapping: GUARD_BYTES PROT_NONE; redzone up to data; [data, data +
// bytes) the allocation; redzone up to the next multiple of 256; GUARD_BYTES
// PROT_NONE.
struct allocation {
    size_t bytes;
    char *map;
    size_t map_bytes;
    bool device; // false: pinned host memory
    int ordinal; // the device it was allocated on (pinned host memory: -1)
};
const size_t GUARD_BYTES = 64 << 10;

std::mutex state_lock; // the tables below
std::map<uintptr_t, allocation> allocations;
const int MAX_DEVICES = 16;
size_t device_used[MAX_DEVICES];
thread_local int current_device; // cudaSetDevice's, per host thread as in CUDA
std::set<emu_stream *> streams;
std::map<const void *, int> max_dynamic_shared;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Synchronous or allocating calls while this thread captures (or any thread
// captures in global mode) are refused, and the capture is invalidated.
cudaError_t refuse_during_capture(const char *api) {
    std::lock_guard<std::mutex> hold(state_lock);
    bool refused = false;
    for (emu_stream *s : streams)
        if (s->capturing && s->mode != cudaStreamCaptureModeRelaxed &&
            (s->owner == std::this_thread::get_id() || s->mode == cudaStreamCaptureModeGlobal)) {
            s->invalidated = true;
            refused = true;
        }
    if (refused) EMU_NOTE("cuda-emu: %s during a stream capture: cudaErrorStreamCaptureUnsupported\n", api);
    return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

// Work on the legacy stream waits for every blocking stream: one that is
// capturing cannot be waited for.
cudaError_t legacy_stream_use(const char *api) {
    std::lock_guard<std::mutex> hold(state_lock);
    bool refused = false;
    for (emu_stream *s : streams)
        if (s->capturing && !(s->flags & cudaStreamNonBlocking)) {
            s->invalidated = true;
            refused = true;
        }
    if (refused)
        EMU_NOTE("cuda-emu: %s on the legacy stream while a blocking stream captures: "
                        "cudaErrorStreamCaptureImplicit\n", api);
    return refused ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

bool known_stream(cudaStream_t s) {
    std::lock_guard<std::mutex> hold(state_lock);
    return streams.count(s) != 0;
}

// Runs op on stream s now, or records it when s captures (as a node of
// that type).
cudaError_t enqueue(cudaStream_t s, const char *api, int type, stream_op op) {
    if (!s) {
        cudaError_t e = legacy_stream_use(api);
        if (e != cudaSuccess) return e;
        op();
        return cudaSuccess;
    }
    if (!known_stream(s)) return cudaErrorInvalidResourceHandle;
    if (s->capturing) {
        if (s->invalidated) return cudaErrorStreamCaptureInvalidated;
        s->ops.push_back(emu_graph_node{type, std::move(op)});
        return cudaSuccess;
    }
    op();
    return cudaSuccess;
}

// The allocation holding [p, p + bytes), or why there is none. A copy's
// host side (a kind that says host) must not be device memory: the real
// runtime leaves that undefined; cudaMemcpyDefault (any) takes either.
enum mem_side { MEM_HOST, MEM_DEVICE, MEM_ANY };
cudaError_t check_range(const void *p, size_t bytes, mem_side want, const char *api, const char *side) {
    std::lock_guard<std::mutex> hold(state_lock);
    uintptr_t a = (uintptr_t)p;
    bool device = want == MEM_DEVICE;
    auto it = allocations.upper_bound(a);
    if (it != allocations.begin()) {
        --it;
        if (a >= it->first && a < it->first + it->second.bytes + (it->second.bytes == 0)) {
            if (want == MEM_HOST && it->second.device) {
                EMU_NOTE("cuda-emu: %s: the %s pointer %p is device memory, but the copy's kind says host\n", api, side, p);
                return cudaErrorInvalidValue;
            }
            if (a + bytes <= it->first + it->second.bytes) return cudaSuccess;
            EMU_NOTE("cuda-emu: %s: the %s range of %zu bytes at offset %zu runs past the end of a %zu-byte "
                            "allocation\n", api, side, bytes, (size_t)(a - it->first), it->second.bytes);
            return cudaErrorInvalidValue;
        }
    }
    if (!device) return cudaSuccess; // pageable host memory
    EMU_NOTE("cuda-emu: %s: the %s pointer %p is not device memory\n", api, side, p);
    return cudaErrorInvalidValue;
}

mem_side dst_side(cudaMemcpyKind kind) {
    return kind == cudaMemcpyDefault ? MEM_ANY
           : kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ? MEM_DEVICE : MEM_HOST;
}
mem_side src_side(cudaMemcpyKind kind) {
    return kind == cudaMemcpyDefault ? MEM_ANY
           : kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ? MEM_DEVICE : MEM_HOST;
}

cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *api) {
    if (bytes == 0) return cudaSuccess;
    if ((int)kind < 0 || kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    cudaError_t e = check_range(dst, bytes, dst_side(kind), api, "destination");
    return e != cudaSuccess ? e : check_range(src, bytes, src_side(kind), api, "source");
}

size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

void check_redzones(uintptr_t base, const allocation &a) {
    const char *data = (const char *)base;
    bool before = false, after = false;
    for (const char *p = a.map + GUARD_BYTES; p < data; p++) before |= (unsigned char)*p != ALLOC_REDZONE_BYTE;
    for (size_t i = a.bytes; i < round256(a.bytes); i++) after |= (unsigned char)data[i] != ALLOC_REDZONE_BYTE;
    if (before || after) {
        fprintf(stderr, "cuda-emu: the %zu-byte %s allocation at %p was written %s (a kernel or copy out of "
                        "bounds)\n", a.bytes, a.device ? "device" : "pinned host", (void *)base,
                before ? "before its start" : "past its end");
        abort();
    }
}

struct sigaction previous_segv, previous_bus;

// A fault in an allocation's guard pages: say whose, then die. Any other
// SIGSEGV or SIGBUS goes to the handler there was before.
void on_fault(int sig, siginfo_t *si, void *) {
    uintptr_t at = (uintptr_t)si->si_addr;
    if (si->si_code > 0 && state_lock.try_lock()) { // a fault, not a signal sent; the lock held: not a kernel's
        auto it = allocations.upper_bound(at);
        uintptr_t base = 0;
        long offset = 0; // from the start; negative: before it
        if (it != allocations.end() && at >= (uintptr_t)it->second.map &&
            at < (uintptr_t)it->second.map + GUARD_BYTES)
            base = it->first, offset = -(long)(it->first - at);
        else if (it != allocations.begin()) {
            --it;
            uintptr_t end = (uintptr_t)it->second.map + it->second.map_bytes;
            if (at >= end - GUARD_BYTES && at < end) base = it->first, offset = (long)(at - it->first);
        }
        if (base) {
            const allocation &a = it->second;
            char head[256];
            emu::describe(head, sizeof head);
            if (offset < 0)
                fprintf(stderr, "%s: an access %ld bytes before the start of the %zu-byte %s allocation at %p\n",
                        head, -offset, a.bytes, a.device ? "device" : "pinned host", (void *)base);
            else
                fprintf(stderr, "%s: an access at byte %ld of the %zu-byte %s allocation at %p, past its end\n",
                        head, offset, a.bytes, a.device ? "device" : "pinned host", (void *)base);
            fflush(stderr);
            abort();
        }
        state_lock.unlock();
    }
    sigaction(sig, sig == SIGBUS ? &previous_bus : &previous_segv, nullptr);
    if (si->si_code <= 0) raise(sig); // a faulting access faults again, now under the previous handler
}

cudaError_t allocate(void **ptr, size_t bytes, bool device) {
    if (!ptr) return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    cudaError_t e = refuse_during_capture(device ? "cudaMalloc" : "cudaHostAlloc");
    if (e != cudaSuccess) return record(e);
    {
        std::lock_guard<std::mutex> hold(state_lock);
        if (bytes > TOTAL_BYTES || (device && bytes > TOTAL_BYTES - device_used[current_device]))
            return record(cudaErrorMemoryAllocation);
    }
    static std::once_flag handler;
    std::call_once(handler, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, &previous_segv);
        sigaction(SIGBUS, &sa, &previous_bus);
    });
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), span = round256(bytes);
    const size_t body = (ALLOC_REDZONE + span + page - 1) / page * page, map_bytes = GUARD_BYTES + body + GUARD_BYTES;
    void *mapped = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) return record(cudaErrorMemoryAllocation);
    char *map = (char *)mapped, *rw = map + GUARD_BYTES, *data = rw + body - span;
    if (mprotect(rw, body, PROT_READ | PROT_WRITE)) {
        munmap(map, map_bytes);
        return record(cudaErrorMemoryAllocation);
    }
    memset(rw, ALLOC_REDZONE_BYTE, (size_t)(data - rw));
    memset(data, 0xff, bytes); // never written: NaN
    memset(data + bytes, ALLOC_REDZONE_BYTE, span - bytes);
    std::lock_guard<std::mutex> hold(state_lock);
    allocations[(uintptr_t)data] = allocation{bytes, map, map_bytes, device, device ? current_device : -1};
    if (device) device_used[current_device] += bytes;
    *ptr = data;
    return cudaSuccess;
}

cudaError_t release(void *ptr, bool device) {
    if (!ptr) return cudaSuccess;
    cudaError_t e = refuse_during_capture(device ? "cudaFree" : "cudaFreeHost");
    if (e != cudaSuccess) return record(e);
    allocation a;
    {
        std::lock_guard<std::mutex> hold(state_lock);
        auto it = allocations.find((uintptr_t)ptr);
        if (it == allocations.end() || it->second.device != device) {
            EMU_NOTE("cuda-emu: %s(%p): not a pointer it allocated\n", device ? "cudaFree" : "cudaFreeHost", ptr);
            return record(cudaErrorInvalidValue);
        }
        a = it->second;
        allocations.erase(it);
        if (device) device_used[a.ordinal] -= a.bytes;
    }
    check_redzones((uintptr_t)ptr, a);
    munmap(a.map, a.map_bytes);
    return cudaSuccess;
}

} // namespace

// ------------------------------------------------------------- launches

namespace emu {

// A kernel's name from its symbol (the test programs are linked with
// -rdynamic), demangled; kept for the life of the process, as records and
// graphs hold it.
static const char *kernel_name(const void *func) {
    static std::map<const void *, std::string> names;
    std::lock_guard<std::mutex> hold(state_lock);
    auto it = names.find(func);
    if (it != names.end()) return it->second.c_str();
    Dl_info info;
    std::string name = "(a kernel without a symbol)";
    if (dladdr(func, &info) && info.dli_sname) {
        int status = 0;
        char *d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        name = status == 0 && d ? d : info.dli_sname;
        free(d);
    }
    return names.emplace(func, name).first->second.c_str();
}

cudaError_t submit(const void *func, const char *name, const launch_config &cfg, std::function<void()> body,
                   bool cooperative, bool overlap) {
    if (!name) name = kernel_name(func);
    const dim3 &g = cfg.grid, &b = cfg.block;
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    const char *bad = nullptr;
    cudaError_t e = cudaSuccess;
    int dyn_limit = DEFAULT_DYNAMIC_SHARED;
    {
        std::lock_guard<std::mutex> hold(state_lock);
        auto it = max_dynamic_shared.find(func);
        if (it != max_dynamic_shared.end()) dyn_limit = it->second;
    }
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z || g.y > 65535 || g.z > 65535 || b.x > 1024 || b.y > 1024 ||
        b.z > 64 || threads > 1024)
        bad = "grid or block dimensions out of range", e = cudaErrorInvalidConfiguration;
    else if (cfg.smem > (size_t)dyn_limit)
        bad = "more dynamic shared memory than the kernel's limit (cudaFuncSetAttribute)", e = cudaErrorInvalidValue;
    else if (cooperative && (unsigned long long)g.x * g.y * g.z > (unsigned long long)sms() * EMU_BLOCKS_PER_SM)
        bad = "a cooperative grid larger than can be resident", e = cudaErrorCooperativeLaunchTooLarge;
    else if (cfg.stream && known_stream(cfg.stream) && cfg.stream->device != current_device)
        bad = "the stream belongs to another device than the current one (cudaSetDevice)",
        e = cudaErrorInvalidResourceHandle;
    if (bad) {
        EMU_NOTE("cuda-emu: launch of %s <<<(%u,%u,%u), (%u,%u,%u), %zu>>> refused: %s\n", name, g.x, g.y, g.z,
                b.x, b.y, b.z, cfg.smem, bad);
        if (cfg.stream && known_stream(cfg.stream) && cfg.stream->capturing) cfg.stream->invalidated = true;
        return record(e);
    }
    // POLAR_CUDA_EMU_BREAK_CAPTURE=overlap: a capture that records a launch
    // made to overlap fails, as on a driver without programmatic edges in
    // graphs (tests of the fallback without overlap)
    const char *brk = getenv("POLAR_CUDA_EMU_BREAK_CAPTURE");
    if (overlap && brk && !strcmp(brk, "overlap") && cfg.stream && known_stream(cfg.stream) && cfg.stream->capturing)
        cfg.stream->invalidated = true;
    launch_record rec{func, name, cfg, std::move(body), cooperative, overlap};
    return record(enqueue(cfg.stream, name, cudaGraphNodeTypeKernel, [rec]() { execute(rec); }));
}

bool quiet() {
    static bool q = [] {
        const char *e = getenv("POLAR_CUDA_EMU_QUIET");
        return e && !strcmp(e, "1");
    }();
    return q;
}

int sms() {
    static int n = [] {
        const char *e = getenv("POLAR_CUDA_EMU_SMS");
#ifdef POLAR_CUDA_EMU_RACE
        // gcc 12's ThreadSanitizer stops at 8128 threads, and every fiber is
        // one: a cooperative grid of 132 x 2 blocks would pass that
        const int fallback = 4;
#else
        const int fallback = 132;
#endif
        int v = e ? atoi(e) : fallback;
        if (v < 1 || v > 1024) {
            fprintf(stderr, "cuda-emu: POLAR_CUDA_EMU_SMS=%s: expected 1..1024\n", e);
            abort();
        }
        return v;
    }();
    return n;
}

cudaError_t run_on_stream(cudaStream_t s, const char *api, std::function<void()> op) {
    return record(enqueue(s, api, cudaGraphNodeTypeKernel, std::move(op)));
}

cudaError_t check_device_range(const void *p, size_t bytes, const char *api, const char *what) {
    return bytes ? check_range(p, bytes, MEM_DEVICE, api, what) : cudaSuccess;
}

int device_of(const void *p) {
    std::lock_guard<std::mutex> hold(state_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin()) return -1;
    --it;
    return a < it->first + it->second.bytes + (it->second.bytes == 0) ? it->second.ordinal : -1;
}

int stream_device(cudaStream_t s) { return s && known_stream(s) ? s->device : s ? -1 : current_device; }

int current() { return current_device; }

cudaError_t occupancy(int *blocks, const void *func, int block_size, size_t smem) {
    (void)func;
    if (!blocks || block_size < 1 || block_size > 1024) return record(cudaErrorInvalidValue);
    *blocks = smem <= (size_t)OPTIN_SHARED ? EMU_BLOCKS_PER_SM : 0;
    return cudaSuccess;
}

} // namespace emu

// ---------------------------------------------------------------- errors

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define NAME(x) \
    case x: return #x;
        NAME(cudaSuccess) NAME(cudaErrorInvalidValue) NAME(cudaErrorMemoryAllocation)
        NAME(cudaErrorInitializationError) NAME(cudaErrorInvalidConfiguration) NAME(cudaErrorInvalidDevicePointer)
        NAME(cudaErrorInvalidMemcpyDirection) NAME(cudaErrorNoDevice) NAME(cudaErrorInvalidDevice) NAME(cudaErrorInvalidResourceHandle)
        NAME(cudaErrorIllegalState) NAME(cudaErrorNotReady) NAME(cudaErrorIllegalAddress)
        NAME(cudaErrorLaunchOutOfResources) NAME(cudaErrorLaunchFailure) NAME(cudaErrorCooperativeLaunchTooLarge)
        NAME(cudaErrorStreamCaptureUnsupported) NAME(cudaErrorStreamCaptureInvalidated)
        NAME(cudaErrorStreamCaptureUnmatched) NAME(cudaErrorStreamCaptureImplicit) NAME(cudaErrorUnknown)
#undef NAME
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorCooperativeLaunchTooLarge: return "too many blocks in cooperative launch";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

// ---------------------------------------------------------------- device

// POLAR_CUDA_EMU_DEVICES=N: N devices (0: pretend there is no GPU; 1 unless set).
static int device_count() {
    const char *e = getenv("POLAR_CUDA_EMU_DEVICES");
    if (!e) return 1;
    char *end;
    long n = strtol(e, &end, 10);
    if (end == e || *end || n < 0 || n > MAX_DEVICES) {
        fprintf(stderr, "cuda-emu: POLAR_CUDA_EMU_DEVICES=%s: expected 0..%d\n", e, MAX_DEVICES);
        abort();
    }
    return (int)n;
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = device_count();
    return *count ? cudaSuccess : record(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

// An H100 SXM's attributes, every device alike.
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (!value) return record(cudaErrorInvalidValue);
    if (device < 0 || device >= device_count()) return record(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMultiProcessorCount: *value = emu::sms(); break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 228 << 10; break;
    case cudaDevAttrCooperativeLaunch: *value = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = OPTIN_SHARED; break;
    default: return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return record(refuse_during_capture("cudaDeviceSynchronize")); }

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> hold(state_lock);
    *free_bytes = TOTAL_BYTES - device_used[current_device];
    *total_bytes = TOTAL_BYTES;
    return cudaSuccess;
}

// ---------------------------------------------------------------- memory

cudaError_t cudaMalloc(void **ptr, size_t bytes) { return allocate(ptr, bytes, true); }
cudaError_t cudaFree(void *ptr) { return release(ptr, true); }
cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return allocate(ptr, bytes, false); }
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
    (void)flags;
    return allocate(ptr, bytes, false);
}
cudaError_t cudaFreeHost(void *ptr) { return release(ptr, false); }

cudaError_t cudaHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned int flags) {
    if (flags) return record(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> hold(state_lock);
    auto it = allocations.find((uintptr_t)host_ptr);
    if (it == allocations.end() || it->second.device) return record(cudaErrorInvalidValue);
    *device_ptr = host_ptr; // mapped memory has one address for both sides
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = refuse_during_capture("cudaMemcpy");
    if (e == cudaSuccess) e = legacy_stream_use("cudaMemcpy");
    if (e == cudaSuccess) e = check_copy(dst, src, bytes, kind, "cudaMemcpy");
    if (e == cudaSuccess && bytes) memmove(dst, src, bytes);
    return record(e);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpyAsync");
    if (e == cudaSuccess)
        e = enqueue(stream, "cudaMemcpyAsync", cudaGraphNodeTypeMemcpy, [=]() {
            if (bytes) memmove(dst, src, bytes);
        });
    return record(e);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
    if (width > dpitch || width > spitch) return record(cudaErrorInvalidValue); // as the real runtime
    if (!height || !width) return cudaSuccess;
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    if ((int)kind < 0 || kind > cudaMemcpyDefault) return record(cudaErrorInvalidMemcpyDirection);
    cudaError_t e = check_range(dst, dspan, dst_side(kind), "cudaMemcpy2DAsync", "destination");
    if (e == cudaSuccess) e = check_range(src, sspan, src_side(kind), "cudaMemcpy2DAsync", "source");
    if (e == cudaSuccess)
        e = enqueue(stream, "cudaMemcpy2DAsync", cudaGraphNodeTypeMemcpy, [=]() {
            for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        });
    return record(e);
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    cudaError_t e = refuse_during_capture("cudaMemset");
    if (e == cudaSuccess) e = legacy_stream_use("cudaMemset");
    if (e == cudaSuccess && bytes) e = check_range(dst, bytes, MEM_DEVICE, "cudaMemset", "destination");
    if (e == cudaSuccess) memset(dst, value, bytes);
    return record(e);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
    cudaError_t e = bytes ? check_range(dst, bytes, MEM_DEVICE, "cudaMemsetAsync", "destination") : cudaSuccess;
    if (e == cudaSuccess) e = enqueue(stream, "cudaMemsetAsync", cudaGraphNodeTypeMemset, [=]() { memset(dst, value, bytes); });
    return record(e);
}

// ------------------------------------------------------ streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    emu_stream *s = new emu_stream();
    s->flags = flags;
    s->device = current_device;
    std::lock_guard<std::mutex> hold(state_lock);
    streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    std::lock_guard<std::mutex> hold(state_lock);
    if (!streams.erase(stream)) return record(cudaErrorInvalidResourceHandle);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (!stream) {
        cudaError_t e = refuse_during_capture("cudaStreamSynchronize");
        return record(e != cudaSuccess ? e : legacy_stream_use("cudaStreamSynchronize"));
    }
    if (!known_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (stream->capturing) {
        stream->invalidated = true;
        EMU_NOTE("cuda-emu: cudaStreamSynchronize on a capturing stream: cudaErrorStreamCaptureUnsupported\n");
        return record(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status) {
    if (stream && !known_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    *status = !stream || !stream->capturing ? cudaStreamCaptureStatusNone
              : stream->invalidated       ? cudaStreamCaptureStatusInvalidated
                                          : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    *event = new emu_event{flags, current_device, false, 0};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return record(cudaErrorInvalidResourceHandle);
    if (emu::stream_device(stream) != event->device) {
        EMU_NOTE("cuda-emu: cudaEventRecord: an event of device %d on a stream of device %d\n", event->device,
                 emu::stream_device(stream));
        return record(cudaErrorInvalidResourceHandle);
    }
    return record(enqueue(stream, "cudaEventRecord", NOT_A_NODE, [event]() {
        event->recorded = true;
        event->ms = now_ms();
    }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return event ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return event ? cudaSuccess : record(cudaErrorInvalidResourceHandle); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || (start->flags & cudaEventDisableTiming) || (end->flags & cudaEventDisableTiming))
        return record(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return record(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

// ---------------------------------------------------------------- graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (!stream) return record(cudaErrorStreamCaptureUnsupported); // the legacy stream cannot capture
    std::lock_guard<std::mutex> hold(state_lock);
    if (!streams.count(stream)) return record(cudaErrorInvalidResourceHandle);
    if (stream->capturing) return record(cudaErrorIllegalState);
    stream->capturing = true;
    // POLAR_CUDA_EMU_BREAK_CAPTURE=1: every capture fails as if a forbidden
    // call had been made in it (tests of the fallbacks)
    const char *brk = getenv("POLAR_CUDA_EMU_BREAK_CAPTURE");
    stream->invalidated = brk && !strcmp(brk, "1");
    stream->mode = mode;
    stream->owner = std::this_thread::get_id();
    stream->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    *graph = nullptr;
    if (!stream || !known_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (!stream->capturing) return record(cudaErrorIllegalState);
    if (stream->owner != std::this_thread::get_id() && stream->mode != cudaStreamCaptureModeRelaxed)
        return record(cudaErrorStreamCaptureUnmatched);
    stream->capturing = false;
    std::vector<emu_graph_node> ops;
    ops.swap(stream->ops);
    if (stream->invalidated) return record(cudaErrorStreamCaptureInvalidated);
    *graph = new emu_graph{std::move(ops)};
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    (void)flags;
    if (!graph) return record(cudaErrorInvalidValue);
    *exec = new emu_graph_exec{}; // a copy: the graph may be destroyed
    for (const emu_graph_node &n : graph->ops) (*exec)->ops.push_back(n.op);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return record(cudaErrorInvalidValue);
    // POLAR_CUDA_EMU_BREAK_LAUNCH=1: every graph launch is refused, as a
    // recoverable error (tests of the fallback that issues the calls)
    const char *brk = getenv("POLAR_CUDA_EMU_BREAK_LAUNCH");
    if (brk && !strcmp(brk, "1")) return record(cudaErrorInvalidResourceHandle);
    if (stream && known_stream(stream) && stream->capturing) return record(cudaErrorStreamCaptureUnsupported);
    return record(enqueue(stream, "cudaGraphLaunch", cudaGraphNodeTypeGraph, [exec]() {
        for (const stream_op &op : exec->ops) op();
    }));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}

// The graph's nodes in capture order (CUDA promises no order): all of them
// when nodes is NULL, else the first *numNodes, the entries past the last
// node set to NULL and *numNodes lowered to the nodes there are.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes) {
    if (!graph || !numNodes) return record(cudaErrorInvalidValue);
    size_t n = 0;
    for (emu_graph_node &node : graph->ops) {
        if (node.type == NOT_A_NODE) continue;
        if (nodes && n < *numNodes) nodes[n] = &node;
        n++;
    }
    for (size_t i = n; nodes && i < *numNodes; i++) nodes[i] = nullptr;
    if (!nodes || n < *numNodes) *numNodes = n;
    return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *pType) {
    if (!node || !pType || node->type == NOT_A_NODE) return record(cudaErrorInvalidValue);
    *pType = (cudaGraphNodeType)node->type;
    return cudaSuccess;
}

// --------------------------------------------------------------- kernels

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    if (!func) return record(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > OPTIN_SHARED) return record(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> hold(state_lock);
        max_dynamic_shared[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess : record(cudaErrorInvalidValue);
    return record(cudaErrorInvalidValue);
}

} // extern "C"
