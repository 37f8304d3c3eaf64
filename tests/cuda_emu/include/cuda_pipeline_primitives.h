// CUDA emulation: the asynchronous global-to-shared copies of the real
// cuda_pipeline_primitives.h (cp.async on sm_80 and later). A copy is
// recorded when issued and lands only when its thread waits for its group
// (__pipeline_wait_prior), so a kernel that reads the bytes before waiting,
// or reads another thread's copy without a barrier after that thread's
// wait, sees the shared memory as it was (never-written bytes read as
// NaN): its results are wrong here as they may be on a GPU. The copies
// are made here, in the kernel's own code, so ThreadSanitizer sees them as
// the thread's writes (race.h). A thread that exits with copies never
// waited for fails (scheduler.cpp).
#ifndef POLAR_CUDA_EMU_PIPELINE_H
#define POLAR_CUDA_EMU_PIPELINE_H

#include <stddef.h>
#include <string.h>

#include "emu_device.h"

namespace emu {
struct async_copy {
    void *dst;
    const void *src;
    size_t bytes;
};
// Records a copy in the thread's open group (checks size, alignment and
// that dst is the block's shared memory).
void async_copy_issue(void *dst, const void *src, size_t bytes);
void async_copy_commit();
// Takes the next recorded copy of a group older than the `prior` most
// recent committed ones into *c; false when none is left.
bool async_copy_due(size_t prior, async_copy *c);
} // namespace emu

static inline void __pipeline_memcpy_async(void *dst_shared, const void *src_global, size_t size_and_align,
                                           size_t zfill = 0) {
    if (zfill) emu::fail("__pipeline_memcpy_async with zfill %zu: not emulated", zfill);
    emu::async_copy_issue(dst_shared, src_global, size_and_align);
}
static inline void __pipeline_commit() { emu::async_copy_commit(); }
static inline void __pipeline_wait_prior(size_t prior) {
    emu::async_copy c;
    while (emu::async_copy_due(prior, &c)) memcpy(c.dst, c.src, c.bytes);
}

#endif
