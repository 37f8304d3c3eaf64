// CUDA emulation: data-race detection by ThreadSanitizer (make
// test-cuda-race builds the kernels with -fsanitize=thread and the
// emulation with POLAR_CUDA_EMU_RACE). Each GPU thread's fiber is a TSan
// fiber, switched without implying any order; the only happens-before
// edges are the ones a GPU gives: the launch boundaries (a kernel launched to
// overlap the previous one: from its cudaGridDependencySynchronize on),
// __syncthreads, grid sync and the warp collectives (see warp_sync in
// scheduler.cpp).
// Two GPU threads touching the same byte of shared or global memory, one
// of them writing, with none of these between them, is a reported race.
//
// The emulation's own code (scheduler, runtime) is not instrumented: its
// bookkeeping is not a GPU thread's access. What it does to memory a
// kernel sees (placing shared memory) it does with accesses ignored.
#ifndef POLAR_CUDA_EMU_RACE_H
#define POLAR_CUDA_EMU_RACE_H

#ifdef POLAR_CUDA_EMU_RACE
#include <sanitizer/tsan_interface.h>

extern "C" void AnnotateIgnoreReadsBegin(const char *file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char *file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char *file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char *file, int line);

namespace emu {
// A new fiber starts ordered after all its creator has seen, so fibers are
// made from a "factory" fiber that does nothing else: it has seen only what
// the host did before the first launch, and a GPU thread is ordered after
// earlier launches by the launch edges alone.
inline void *race_new_fiber() {
    static void *factory = __tsan_create_fiber(0);
    void *self = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(factory, __tsan_switch_to_fiber_no_sync);
    void *made = __tsan_create_fiber(0);
    __tsan_switch_to_fiber(self, __tsan_switch_to_fiber_no_sync);
    return made;
}
inline void *race_current() { return __tsan_get_current_fiber(); }
// Right before the stack switch to the fiber `to`.
inline void race_switch(void *to) { __tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync); }
inline void race_release(const void *sync) { __tsan_release(const_cast<void *>(sync)); }
inline void race_acquire(const void *sync) { __tsan_acquire(const_cast<void *>(sync)); }
inline void race_ignore_begin() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
}
inline void race_ignore_end() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}
} // namespace emu
#else
namespace emu {
inline void *race_new_fiber() { return nullptr; }
inline void *race_current() { return nullptr; }
inline void race_switch(void *) {}
inline void race_release(const void *) {}
inline void race_acquire(const void *) {}
inline void race_ignore_begin() {}
inline void race_ignore_end() {}
} // namespace emu
#endif

#endif
