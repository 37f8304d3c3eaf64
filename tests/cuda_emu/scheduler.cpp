// CUDA emulation: runs a kernel launch on the CPU. Every GPU thread is a
// fiber: a stack made with makecontext and switched with _setjmp/_longjmp
// (unlike swapcontext, no system call per switch), or on x86-64 a stack set
// up by hand and switched by six register pushes (emu_switch below: a
// switch costs a few nanoseconds, and a kernel test makes millions). A
// block's fibers run until
// each waits at a barrier or a warp collective or exits, then the next.
// A cooperative launch runs all blocks' fibers in one scheduler, so a grid
// sync can complete. What a GPU would punish fails here with a message
// naming the kernel, block and thread, and aborts:
//  - a barrier not every thread reaches (a thread exited, or threads wait at
//    different barriers: the scheduler finds no fiber that can run),
//  - a warp collective whose mask names an exited or absent lane, or whose
//    lanes disagree (kind, mask, WMMA pointer),
//  - a shuffle reading a lane outside its mask,
//  - a write past either end of a __shared__ variable or the dynamic shared
//    memory (redzones checked when the block ends),
//  - more shared memory than a block can have,
//  - a fiber stack overflow (canary).
// POLAR_CUDA_EMU_ORDER=forward|reverse|random picks the order in which the
// runnable threads (and blocks) are resumed; results must not depend on it.
// Built with POLAR_CUDA_EMU_RACE, ThreadSanitizer also watches the threads'
// accesses, ordered only by what orders them on a GPU (race.h).
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "emu_device.h"
#include "cuda_pipeline_primitives.h"
#include "emu_internal.h"
#include "race.h"

dim3 blockDim, gridDim;

namespace emu {

thread_info *cur;
launch_info *cur_launch;

namespace {

#ifdef POLAR_CUDA_EMU_RACE
const size_t STACK_BYTES = 512 << 10; // ThreadSanitizer's reports run on the fiber's stack
// Neighbouring blocks run on different fibers, so their races show. Blocks
// an even distance apart in run order share fibers, whose history orders
// the later one after the earlier one's barriers: the race runs shuffle the
// block order so that those pairs vary.
const unsigned BLOCK_FIBER_SETS = 2;
#else
const size_t STACK_BYTES = 64 << 10;
const unsigned BLOCK_FIBER_SETS = 1;
#endif
const size_t STACKS_PER_MAP = 64;
const size_t REDZONE = 64;
const unsigned char REDZONE_BYTE = 0xA5;
const uint64_t CANARY = 0x5AFE57AC4CA9A4F1ull;
const size_t STATIC_SHARED_LIMIT = 48 << 10;   // what a kernel may declare
const size_t BLOCK_SHARED_LIMIT = 227 << 10;   // static + dynamic, opted in (H100)

enum fiber_state { RUNNABLE, WAITING, EXITED };

struct block_state;

struct fiber : thread_info {
    jmp_buf ctx;  // the switch of other machines
    void *sp;     // x86-64: the saved stack pointer
    char *stack;
    fiber_state state;
    const uint64_t *wait_on; // waiting until *wait_on != wait_gen
    uint64_t wait_gen;
    const char *wait_what;
    unsigned linear, lane, warp;
    bool awaited; // called cudaGridDependencySynchronize
    // cuda_pipeline_primitives.h's copies not yet landed, each with its
    // group (groups committed before it), and the groups committed so far
    std::vector<std::pair<async_copy, unsigned>> copies;
    unsigned copy_groups;
    size_t pos; // in the run order
    block_state *blk;
    void *tsan; // its ThreadSanitizer fiber (race.h), or NULL
};

struct warp_state {
    unsigned present, exited; // lanes that exist, lanes that returned
    unsigned arrived, mask;   // the pending collective
    warp_kind kind;
    uint64_t gen;
    uint64_t in[32], out[32];
    int arg[32], width[32];
    void *ptr[32];
    void (*complete)(void *const lanes[32]);
};

struct shared_alloc {
    const shared_site *site;
    char *raw, *data;
    size_t bytes;
};

struct block_state : block_info {
    unsigned nthreads, exited, bar_arrived;
    uint64_t bar_gen;
    std::vector<warp_state> warps;
    std::vector<shared_alloc> shared;
    size_t static_bytes;
    shared_alloc dynamic;
    size_t dynamic_align; // its placement, fixed by the first dynamic_shared call (dynamic_placed)
    bool dynamic_placed;
    std::vector<fiber *> fibers;
    // race.h's happens-before objects, two per barrier (even and odd
    // generations): __syncthreads, then each warp's collectives. Heap memory
    // of this block alone: freeing it drops them, so no other block's
    // threads are ordered through them.
    char *sync;
};

struct launch_state : launch_info {
    const launch_record *rec;
    unsigned long long grid_threads, grid_arrived;
    uint64_t grid_gen;
    char *grid_sync; // as block_state::sync, for grid sync
};

// race.h's happens-before objects of all launches: what preceded a launch
// (its threads acquire it), what their threads did (the host acquires it).
char launch_start, launch_end;

char *new_sync(size_t n) {
    race_ignore_begin();
    char *p = (char *)malloc(n);
    race_ignore_end();
    if (!p) {
        fprintf(stderr, "cuda-emu: out of host memory\n");
        abort();
    }
    return p;
}

// Frees what new_sync or alloc_with_redzones made, unseen as they made it.
void free_unseen(char *p) {
    race_ignore_begin();
    free(p);
    race_ignore_end();
}

std::mutex device_lock; // one launch at a time, like one GPU's queue
std::vector<fiber *> pool;
launch_state *now;

const char *kind_name(warp_kind k) {
    static const char *names[] = {"__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_up_sync",
                                  "__shfl_down_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                  "__match_any_sync", "wmma::load_matrix_sync", "wmma::store_matrix_sync",
                                  "wmma::mma_sync"};
    return names[k];
}

fiber *me() { return static_cast<fiber *>(cur); }

void thread_exit(fiber *f);
void fiber_loop(fiber *f);

void *scheduler_tsan; // the ThreadSanitizer context of the thread running the launch (race.h)

#if defined(__x86_64__) && !defined(POLAR_CUDA_EMU_UCONTEXT) // -DPOLAR_CUDA_EMU_UCONTEXT: the portable path
// emu_switch(save, to): pushes the callee-saved registers, stores the stack
// pointer in *save, continues on the stack `to` (saved the same way).
extern "C" void emu_switch(void **save, void *to);
asm(".text\n"
    ".globl emu_switch\n"
    ".type emu_switch, @function\n"
    "emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n");

void *scheduler_sp;

// Leaves fiber `from` for fiber `to`, or for the scheduler (to == NULL).
void jump(fiber *from, fiber *to) {
    race_switch(to ? to->tsan : scheduler_tsan);
    emu_switch(&from->sp, to ? to->sp : scheduler_sp);
}

void resume(fiber *f) {
    cur = f;
    scheduler_tsan = race_current();
    race_switch(f->tsan);
    emu_switch(&scheduler_sp, f->sp);
    cur = nullptr;
}

// A new fiber's first switch "returns" here (cur is the fiber).
void fiber_start() { fiber_loop(me()); }

// A fiber on the given stack: six zero registers for emu_switch to pop,
// then fiber_start as the return address, aligned as after a call.
fiber *create_fiber(char *stack) {
    fiber *f = new fiber();
    f->stack = stack;
    f->tsan = race_new_fiber();
    memcpy(f->stack, &CANARY, sizeof CANARY);
    uintptr_t top = ((uintptr_t)stack + STACK_BYTES) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;                    // fiber_start's own return address: never used
    *--sp = (void *)&fiber_start;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    f->sp = sp;
    return f;
}
#else
jmp_buf scheduler_ctx;
fiber *starting;
jmp_buf creator_ctx;

void jump(fiber *from, fiber *to) {
    if (_setjmp(from->ctx)) return;
    race_switch(to ? to->tsan : scheduler_tsan);
    _longjmp(to ? to->ctx : scheduler_ctx, 1);
}

void resume(fiber *f) {
    cur = f;
    scheduler_tsan = race_current();
    if (!_setjmp(scheduler_ctx)) {
        race_switch(f->tsan);
        _longjmp(f->ctx, 1);
    }
    cur = nullptr;
}

void fiber_entry() {
    fiber *f = starting;
    if (!_setjmp(f->ctx)) _longjmp(creator_ctx, 1);
    fiber_loop(f);
}

// A fiber on the given stack, parked at the start of fiber_entry. (Its own
// function: no local of the caller lives across the jumps.)
fiber *create_fiber(char *stack) {
    fiber *f = new fiber();
    f->stack = stack;
    f->tsan = race_new_fiber();
    memcpy(f->stack, &CANARY, sizeof CANARY);
    ucontext_t uc, back;
    getcontext(&uc);
    uc.uc_stack.ss_sp = f->stack;
    uc.uc_stack.ss_size = STACK_BYTES;
    uc.uc_link = nullptr;
    makecontext(&uc, fiber_entry, 0);
    starting = f;
    if (!_setjmp(creator_ctx)) swapcontext(&back, &uc);
    return f;
}
#endif

const std::vector<fiber *> *run_order; // the fibers of the running launch, in resume order

// The next fiber after f in the order that can run (f itself last), or NULL.
fiber *next_runnable(fiber *f) {
    const std::vector<fiber *> &o = *run_order;
    size_t n = o.size();
    for (size_t i = 1; i <= n; i++) {
        fiber *g = o[(f->pos + i) % n];
        if (g->state == RUNNABLE) return g;
        if (g->state == WAITING && *g->wait_on != g->wait_gen) {
            g->state = RUNNABLE;
            return g;
        }
    }
    return nullptr;
}

// f waits or has exited: straight on to the next fiber that can run (one
// switch, not two through the scheduler); the scheduler when none can.
void switch_away(fiber *f) {
    fiber *g = next_runnable(f);
    cur = g;
    jump(f, g);
}

void wait_for(fiber *f, const uint64_t *gen, const char *what) {
    f->state = WAITING;
    f->wait_on = gen;
    f->wait_gen = *gen;
    f->wait_what = what;
    switch_away(f);
}

// Runs the launch's kernel as this thread, once per resume after an exit.
// A kernel launched to overlap the previous one is ordered after what
// preceded it only from its cudaGridDependencySynchronize on; until the
// kernel itself starts (kernel_entry), the launch's own machinery reads its
// arguments, which is no access of the kernel's.
void fiber_loop(fiber *f) {
    for (;;) {
        if (now->rec->overlap) race_ignore_begin();
        else race_acquire(&launch_start);
        now->rec->body();
        race_release(&launch_end);
        thread_exit(f);
        switch_away(f);
    }
}

void grow_pool(size_t n) {
    while (pool.size() < n) {
        size_t bytes = STACK_BYTES * STACKS_PER_MAP;
        void *map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (map == MAP_FAILED) {
            fprintf(stderr, "cuda-emu: cannot map %zu bytes of fiber stacks (%zu fibers)\n", bytes, pool.size());
            abort();
        }
        for (size_t i = 0; i < STACKS_PER_MAP; i++) pool.push_back(create_fiber((char *)map + i * STACK_BYTES));
    }
}

unsigned order_mode() { // 0 forward, 1 reverse, 2 random
    static unsigned mode = [] {
        const char *e = getenv("POLAR_CUDA_EMU_ORDER");
        if (!e || !*e || !strcmp(e, "forward")) return 0u;
        if (!strcmp(e, "reverse")) return 1u;
        if (!strcmp(e, "random")) return 2u;
        fprintf(stderr, "cuda-emu: POLAR_CUDA_EMU_ORDER=%s: expected forward, reverse or random\n", e);
        abort();
    }();
    return mode;
}

std::mt19937_64 &order_rng() {
    static std::mt19937_64 rng([] {
        const char *e = getenv("POLAR_CUDA_EMU_SEED");
        return e ? strtoull(e, nullptr, 10) : 1ull;
    }());
    return rng;
}

template <typename T>
void arrange(std::vector<T> &v) {
    if (order_mode() == 1) std::reverse(v.begin(), v.end());
    else if (order_mode() == 2) std::shuffle(v.begin(), v.end(), order_rng());
}

// Aligned to align and to no more: a GPU gives a shared variable only its
// declared alignment, so a float array read as float4 must fault here as it
// may there (the kernels are built with -fsanitize=alignment).
char *alloc_with_redzones(size_t bytes, size_t align, char **data) {
    if (align < 1 || align > (64 << 10) || (align & (align - 1))) {
        fprintf(stderr, "cuda-emu: shared memory alignment %zu: expected a power of two up to 64 KB\n", align);
        abort();
    }
    const size_t twice = 2 * align > 256 ? 2 * align : 256;
    size_t total = bytes + 2 * REDZONE + 2 * twice;
    race_ignore_begin(); // placing it is no GPU thread's access
    char *raw = (char *)malloc(total);
    if (!raw) {
        fprintf(stderr, "cuda-emu: out of host memory for %zu bytes of shared memory\n", bytes);
        abort();
    }
    uintptr_t base = ((uintptr_t)raw + REDZONE + twice - 1) & ~(uintptr_t)(twice - 1);
    char *d = (char *)(base + align); // a multiple of align, not of 2 * align
    memset(raw, REDZONE_BYTE, total);
    memset(d, 0xff, bytes); // never-written shared memory reads as NaN
    race_ignore_end();
    *data = d;
    return raw;
}

// 0, or how far out of bounds the first damaged byte lies (negative: before).
long redzone_damage(const shared_alloc &a) {
    for (char *p = a.raw; p < a.data; p++)
        if ((unsigned char)*p != REDZONE_BYTE) return (long)(p - a.data);
    for (size_t i = 0; i < REDZONE; i++)
        if ((unsigned char)a.data[a.bytes + i] != REDZONE_BYTE) return (long)i + 1;
    return 0;
}

void check_and_free_shared(block_state *b) {
    for (auto &a : b->shared) {
        long d = redzone_damage(a);
        if (d)
            fail("block (%u,%u,%u): a write %ld bytes %s the __shared__ variable %s (%zu bytes, %s:%d)",
                 b->block_idx.x, b->block_idx.y, b->block_idx.z, d < 0 ? -d : d, d < 0 ? "before" : "past the end of",
                 a.site->name, a.bytes, a.site->file, a.site->line);
        free_unseen(a.raw);
    }
    b->shared.clear();
    if (b->dynamic.raw) {
        long d = redzone_damage(b->dynamic);
        if (d)
            fail("block (%u,%u,%u): a write %ld bytes %s the dynamic shared memory (%zu bytes at launch)",
                 b->block_idx.x, b->block_idx.y, b->block_idx.z, d < 0 ? -d : d, d < 0 ? "before" : "past the end of",
                 b->dynamic.bytes);
        free_unseen(b->dynamic.raw);
        b->dynamic.raw = nullptr;
    }
    free_unseen(b->sync);
    b->sync = nullptr;
}

void thread_exit(fiber *f) {
    block_state *b = f->blk;
    warp_state &w = b->warps[f->warp];
    uint64_t canary;
    memcpy(&canary, f->stack, sizeof canary);
    if (canary != CANARY) fail("the thread overflowed its %zu-byte fiber stack", STACK_BYTES);
    if (now->rec->overlap && !f->awaited)
        fail("the thread of a kernel launched to overlap the previous one (programmatic stream serialization) "
             "exited without cudaGridDependencySynchronize: its reads and writes could race that kernel's");
    if (!f->copies.empty())
        fail("the thread exited with %zu asynchronous copies (__pipeline_memcpy_async) never waited for "
             "(__pipeline_wait_prior)", f->copies.size());
    f->copy_groups = 0;
    f->state = EXITED;
    b->exited++;
    w.exited |= 1u << f->lane;
    if (b->bar_arrived)
        fail("the thread exited while %u threads of its block wait at __syncthreads for it", b->bar_arrived);
    if (w.arrived && (w.mask & (1u << f->lane)))
        fail("lane %u exited while lanes 0x%08x wait for it at %s (mask 0x%08x)", f->lane, w.arrived,
             kind_name(w.kind), w.mask);
    if (now->grid_arrived)
        fail("the thread exited while %llu threads of the grid wait at grid sync for it", now->grid_arrived);
}

[[noreturn]] void deadlock(const std::vector<fiber *> &order) {
    std::string why;
    char line[512];
    std::vector<block_state *> seen;
    for (fiber *f : order) {
        block_state *b = f->blk;
        if (std::find(seen.begin(), seen.end(), b) != seen.end() || b->exited == b->nthreads) continue;
        seen.push_back(b);
        snprintf(line, sizeof line, "\n  block (%u,%u,%u): %u of %u threads exited", b->block_idx.x, b->block_idx.y,
                 b->block_idx.z, b->exited, b->nthreads);
        why += line;
        if (b->bar_arrived) {
            snprintf(line, sizeof line, "; %u wait at __syncthreads", b->bar_arrived);
            why += line;
        }
        for (size_t i = 0; i < b->warps.size(); i++) {
            const warp_state &w = b->warps[i];
            if (!w.arrived) continue;
            snprintf(line, sizeof line, "; warp %zu: lanes 0x%08x wait at %s (mask 0x%08x)", i, w.arrived,
                     kind_name(w.kind), w.mask);
            why += line;
        }
        if (seen.size() > 8) break;
    }
    if (now->grid_arrived) {
        snprintf(line, sizeof line, "\n  %llu of %llu threads wait at grid sync", now->grid_arrived, now->grid_threads);
        why += line;
    }
    cur = nullptr;
    fail("deadlock: no thread can go on (a barrier or collective that not every thread it names reaches):%s",
         why.c_str());
}

void run_fibers(const std::vector<fiber *> &order) {
    for (size_t i = 0; i < order.size(); i++) order[i]->pos = i;
    run_order = &order;
    if (!order.empty()) resume(order[0]); // returns when no fiber can run
    for (fiber *f : order)
        if (f->state != EXITED) deadlock(order);
    run_order = nullptr;
}

void setup_block(block_state *b, unsigned linear_block, fiber **fibers) {
    const dim3 &g = now->grid_dim, &bd = now->block_dim;
    b->block_idx = uint3{linear_block % g.x, linear_block / g.x % g.y, linear_block / (g.x * g.y)};
    b->nthreads = bd.x * bd.y * bd.z;
    b->exited = b->bar_arrived = 0;
    b->bar_gen = 0;
    b->warps.assign((b->nthreads + 31) / 32, warp_state());
    b->sync = new_sync(2 + 2 * b->warps.size());
    for (size_t i = 0; i < b->warps.size(); i++) {
        unsigned lanes = b->nthreads - 32 * (unsigned)i;
        b->warps[i].present = lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    b->static_bytes = 0;
    b->shared.clear();
    b->dynamic.site = nullptr;
    b->dynamic.bytes = now->rec->cfg.smem;
    b->dynamic.raw = alloc_with_redzones(b->dynamic.bytes, 16, &b->dynamic.data);
    b->dynamic_align = 16;
    b->dynamic_placed = false;
    b->fibers.assign(fibers, fibers + b->nthreads);
    for (unsigned t = 0; t < b->nthreads; t++) {
        fiber *f = fibers[t];
        f->thread_idx = uint3{t % bd.x, t / bd.x % bd.y, t / (bd.x * bd.y)};
        f->block = b;
        f->blk = b;
        f->linear = t, f->lane = t % 32, f->warp = t / 32;
        f->awaited = false, f->fenced = false;
        f->state = RUNNABLE;
    }
}

} // namespace

void describe(char *buf, size_t size) {
    fiber *f = me();
    int n = snprintf(buf, size, "cuda-emu: kernel %s", now ? now->rec->name : "(none)");
    if (f && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - n, ", block (%u,%u,%u), thread (%u,%u,%u)", f->blk->block_idx.x,
                 f->blk->block_idx.y, f->blk->block_idx.z, f->thread_idx.x, f->thread_idx.y, f->thread_idx.z);
}

// ------------------------------------------------------------ errors

void fail(const char *fmt, ...) {
    char head[256];
    describe(head, sizeof head);
    va_list ap;
    va_start(ap, fmt);
    char msg[4096];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", head, msg);
    fflush(stderr);
    fflush(stdout);
    abort();
}

// ------------------------------------------------------- shared memory

void *shared_var(const shared_site *site, size_t bytes, size_t align) {
    block_state *b = me()->blk;
    for (auto &a : b->shared)
        if (a.site == site) return a.data;
    shared_alloc a;
    a.site = site;
    a.bytes = bytes;
    a.raw = alloc_with_redzones(bytes, align, &a.data);
    race_ignore_begin(); // the list's memory is no GPU thread's either
    b->shared.push_back(a);
    race_ignore_end();
    b->static_bytes += bytes;
    if (b->static_bytes > STATIC_SHARED_LIMIT)
        fail("__shared__ %s (%s:%d) takes the block's static shared memory to %zu bytes, beyond the %zu allowed",
             site->name, site->file, site->line, b->static_bytes, STATIC_SHARED_LIMIT);
    if (b->static_bytes + b->dynamic.bytes > BLOCK_SHARED_LIMIT)
        fail("%zu bytes of static and %zu of dynamic shared memory: more than a block can have (%zu)",
             b->static_bytes, b->dynamic.bytes, BLOCK_SHARED_LIMIT);
    return a.data;
}

// The dynamic shared memory starts 16-byte aligned (and no more), or as its
// extern __shared__ declaration asks: the first one a block reaches places
// it, before any thread can have written it.
void *dynamic_shared(size_t align) {
    block_state *b = me()->blk;
    if (align < 16) align = 16;
    if (align != b->dynamic_align) {
        if (b->dynamic_placed)
            fail("extern __shared__ declarations aligned to %zu and to %zu bytes in one kernel: the emulation "
                 "places the dynamic shared memory once", b->dynamic_align, align);
        free_unseen(b->dynamic.raw);
        b->dynamic.raw = alloc_with_redzones(b->dynamic.bytes, align, &b->dynamic.data);
        b->dynamic_align = align;
    }
    b->dynamic_placed = true;
    return b->dynamic.data;
}

// ------------------------------------------------------------ barriers

void syncthreads() {
    fiber *f = me();
    block_state *b = f->blk;
    if (b->exited)
        fail("__syncthreads after %u threads of the block exited: they can never arrive", b->exited);
    const char *sync = &b->sync[b->bar_gen & 1];
    race_release(sync);
    if (++b->bar_arrived == b->nthreads) {
        b->bar_arrived = 0;
        b->bar_gen++;
    } else {
        wait_for(f, &b->bar_gen, "__syncthreads");
    }
    race_acquire(sync);
}

void kernel_entry() {
    if (now->rec->overlap) race_ignore_end(); // begun in fiber_loop
}

// Launches run one after the other, so the previous kernel has finished:
// record that the thread waited (thread_exit checks it), and from here on
// order it after that kernel (race.h).
void grid_dependency_sync() {
    if (now->rec->overlap) race_acquire(&launch_start);
    me()->awaited = true;
}

// ------------------------------------------------- asynchronous copies

bool in_shared(const block_state *b, const void *p, size_t n) {
    const char *c = (const char *)p;
    if (b->dynamic.raw && c >= b->dynamic.data && c + n <= b->dynamic.data + b->dynamic.bytes) return true;
    for (const shared_alloc &a : b->shared)
        if (c >= a.data && c + n <= a.data + a.bytes) return true;
    return false;
}

void async_copy_issue(void *dst, const void *src, size_t bytes) {
    fiber *f = me();
    if (bytes != 4 && bytes != 8 && bytes != 16) fail("__pipeline_memcpy_async of %zu bytes (4, 8 or 16)", bytes);
    if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes)
        fail("__pipeline_memcpy_async of %zu bytes from %p to %p: both must be aligned to the size", bytes, src, dst);
    if (!in_shared(f->blk, dst, bytes))
        fail("__pipeline_memcpy_async to %p: not in the block's shared memory", dst);
    f->copies.push_back({{dst, src, bytes}, f->copy_groups});
}

void async_copy_commit() { me()->copy_groups++; }

bool async_copy_due(size_t prior, async_copy *c) {
    fiber *f = me();
    for (size_t i = 0; i < f->copies.size(); i++) {
        if ((size_t)f->copies[i].second + prior >= f->copy_groups) continue; // a recent group, or not committed
        *c = f->copies[i].first;
        f->copies.erase(f->copies.begin() + (long)i);
        return true;
    }
    return false;
}

void trigger_dependents() {} // scheduling the next launch early changes nothing here

void unsupported_launch_attribute(int id) { fail("cudaLaunchKernelEx with launch attribute %d, not emulated", id); }

void grid_sync() {
    fiber *f = me();
    if (!now->rec->cooperative) fail("grid sync in a kernel not launched with cudaLaunchCooperativeKernel");
    const char *sync = &now->grid_sync[now->grid_gen & 1];
    race_release(sync);
    if (++now->grid_arrived == now->grid_threads) {
        now->grid_arrived = 0;
        now->grid_gen++;
    } else {
        wait_for(f, &now->grid_gen, "grid sync");
    }
    race_acquire(sync);
}

namespace {

// The calling lane joins the warp's pending collective (or starts one);
// true when it is the last to arrive.
bool join(fiber *f, warp_state &w, warp_kind kind, unsigned mask) {
    unsigned bit = 1u << f->lane;
    if (!(mask & bit)) fail("%s with mask 0x%08x, which does not name the calling lane %u", kind_name(kind), mask, f->lane);
    if (mask & ~w.present)
        fail("%s with mask 0x%08x names lanes 0x%08x that the block does not have", kind_name(kind), mask,
             mask & ~w.present);
    if (mask & w.exited)
        fail("%s with mask 0x%08x names lanes 0x%08x that have exited", kind_name(kind), mask, mask & w.exited);
    if (w.arrived) {
        if (w.kind != kind || w.mask != mask)
            fail("lane %u reached %s (mask 0x%08x) while lanes 0x%08x of its warp wait at %s (mask 0x%08x)", f->lane,
                 kind_name(kind), mask, w.arrived, kind_name(w.kind), w.mask);
    } else {
        w.kind = kind;
        w.mask = mask;
    }
    w.arrived |= bit;
    return w.arrived == mask;
}

int source_lane(warp_kind kind, int lane, int arg, int width) {
    if (width < 1 || width > 32 || (width & (width - 1))) fail("%s with width %d", kind_name(kind), width);
    int base = lane & ~(width - 1), src = lane;
    switch (kind) {
    case W_SHFL_IDX: src = base + (arg & (width - 1)); break;
    case W_SHFL_XOR: src = lane ^ arg; if (src >= base + width) src = lane; break;
    case W_SHFL_UP: src = lane - arg; if (src < base) src = lane; break;
    case W_SHFL_DOWN: src = lane + arg; if (src >= base + width) src = lane; break;
    default: break;
    }
    return src;
}

void complete(warp_state &w) {
    unsigned m = w.mask;
    switch (w.kind) {
    case W_SHFL_IDX:
    case W_SHFL_XOR:
    case W_SHFL_UP:
    case W_SHFL_DOWN:
        for (int l = 0; l < 32; l++) {
            if (!(m >> l & 1)) continue;
            int src = source_lane(w.kind, l, w.arg[l], w.width[l]);
            if (src < 0 || src > 31 || !(m >> src & 1))
                fail("%s: lane %d reads lane %d, which is not in the mask 0x%08x", kind_name(w.kind), l, src, m);
            w.out[l] = w.in[src];
        }
        break;
    case W_BALLOT:
    case W_ANY:
    case W_ALL: {
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            if ((m >> l & 1) && w.in[l]) ballot |= 1u << l;
        uint64_t r = w.kind == W_BALLOT ? ballot : w.kind == W_ANY ? ballot != 0 : ballot == m;
        for (int l = 0; l < 32; l++) w.out[l] = r;
        break;
    }
    case W_MATCH_ANY:
        for (int l = 0; l < 32; l++) {
            if (!(m >> l & 1)) continue;
            unsigned same = 0;
            for (int o = 0; o < 32; o++)
                if ((m >> o & 1) && w.in[o] == w.in[l]) same |= 1u << o;
            w.out[l] = same;
        }
        break;
    case W_WMMA_LOAD:
    case W_WMMA_STORE:
        for (int l = 0; l < 32; l++)
            if ((m >> l & 1) && w.in[l] != w.in[__builtin_ctz(m)])
                fail("%s: the lanes of the warp passed different pointers or strides", kind_name(w.kind));
        break;
    case W_WMMA_MMA:
        w.complete(w.ptr);
        break;
    case W_SYNC:
        break;
    }
}

// The warp's happens-before object for its pending collective (race.h).
// Every collective orders the lanes it names, shuffles and votes included:
// a lane cannot leave one before all have reached it, so a lane's write
// after a reduction cannot overtake another lane's read before it (the
// pattern of a warp's lane 0 storing what the warp reduced). The CUDA
// guide promises memory ordering only for __syncwarp, but
// compute-sanitizer's racecheck accepts these kernels too.
const char *warp_sync(const fiber *f, const warp_state &w) { return &f->blk->sync[2 + 2 * f->warp + (w.gen & 1)]; }

// The calling lane's part of a collective whose inputs it has set: the last
// lane to arrive completes it for all (a WMMA completion reads and writes
// the lanes' fragments, so it acquires first and releases after), the
// others wait for that.
void collective(fiber *f, warp_state &w, warp_kind kind, unsigned mask) {
    const char *sync = warp_sync(f, w);
    race_release(sync);
    if (join(f, w, kind, mask)) {
        race_acquire(sync);
        complete(w);
        race_release(sync);
        w.arrived = 0;
        w.gen++;
        return;
    }
    wait_for(f, &w.gen, kind_name(kind));
    race_acquire(sync);
}

} // namespace

uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t value, int arg, int width) {
    fiber *f = me();
    warp_state &w = f->blk->warps[f->warp];
    w.in[f->lane] = value;
    w.arg[f->lane] = arg;
    w.width[f->lane] = width;
    collective(f, w, kind, mask);
    return w.out[f->lane];
}

void warp_exchange(warp_kind kind, unsigned mask, void *mine, void (*done)(void *const lanes[32])) {
    fiber *f = me();
    warp_state &w = f->blk->warps[f->warp];
    w.ptr[f->lane] = mine;
    w.complete = done;
    collective(f, w, kind, mask);
}

// ------------------------------------------------------------- launches

void execute(const launch_record &rec) {
    std::lock_guard<std::mutex> hold(device_lock);
    launch_state L;
    L.grid_dim = rec.cfg.grid;
    L.block_dim = rec.cfg.block;
    L.rec = &rec;
    L.grid_arrived = 0;
    L.grid_gen = 0;
    unsigned nthreads = rec.cfg.block.x * rec.cfg.block.y * rec.cfg.block.z;
    unsigned long long nblocks = (unsigned long long)rec.cfg.grid.x * rec.cfg.grid.y * rec.cfg.grid.z;
    L.grid_threads = nblocks * nthreads;
    now = &L;
    cur_launch = &L;
    blockDim = L.block_dim, gridDim = L.grid_dim;
    std::vector<unsigned> blocks(nblocks);
    for (unsigned i = 0; i < nblocks; i++) blocks[i] = i;
    arrange(blocks);
    if (rec.cooperative) { // every block resident: one scheduler over all fibers
        grow_pool(nblocks * nthreads);
        std::vector<block_state> states(nblocks);
        std::vector<fiber *> order;
        order.reserve(nblocks * nthreads);
        for (unsigned i = 0; i < nblocks; i++) {
            setup_block(&states[i], blocks[i], &pool[(size_t)i * nthreads]);
            std::vector<fiber *> mine = states[i].fibers;
            arrange(mine);
            order.insert(order.end(), mine.begin(), mine.end());
        }
        L.grid_sync = new_sync(2);
        race_release(&launch_start); // what the host, earlier launches and the setup did
        run_fibers(order);
        race_acquire(&launch_end); // for the host, and before the blocks' memory is freed
        free_unseen(L.grid_sync);
        for (auto &b : states) check_and_free_shared(&b);
    } else {
        // Blocks of this launch and the next ones run on rotating sets of
        // fibers: a fiber's own accesses are ordered, so threads of nearby
        // blocks, or of consecutive launches, must be different fibers for
        // their races to show.
        static unsigned next_set;
        grow_pool((size_t)nthreads * BLOCK_FIBER_SETS);
        block_state b;
        std::vector<fiber *> order;
        for (unsigned i = 0; i < nblocks; i++) {
            setup_block(&b, blocks[i], &pool[(size_t)(next_set++ % BLOCK_FIBER_SETS) * nthreads]);
            // What the host and earlier launches did, and the setup. Not
            // again for later blocks: the scheduler has not seen this
            // launch's threads finish (launch_end), and passes on nothing of
            // theirs.
            if (i == 0) race_release(&launch_start);
            order = b.fibers;
            arrange(order);
            run_fibers(order);
            check_and_free_shared(&b);
        }
        race_acquire(&launch_end);
    }
    now = nullptr;
    cur_launch = nullptr;
}

} // namespace emu
