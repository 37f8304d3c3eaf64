// CUDA emulation: what runtime.cpp and scheduler.cpp share.
#ifndef POLAR_CUDA_EMU_INTERNAL_H
#define POLAR_CUDA_EMU_INTERNAL_H

#include <functional>

#include "emu_device.h"

namespace emu {

// One kernel launch: what runs now, or what a graph replays later.
struct launch_record {
    const void *func;
    const char *name;
    launch_config cfg;
    std::function<void()> body; // the kernel called with copies of its arguments
    bool cooperative, overlap;  // overlap: programmatic stream serialization (submit)
};

// Runs every block of the launch to completion (or aborts with what a GPU
// would have punished).
void execute(const launch_record &rec);

// Host work on a stream (cuBLASLt's GEMM, NCCL's collectives): now, or recorded
// when it captures, a kernel node of the graph as on a GPU.
cudaError_t run_on_stream(cudaStream_t s, const char *api, std::function<void()> op);
// cudaSuccess when [p, p + bytes) lies inside one device allocation; else
// says why on stderr.
cudaError_t check_device_range(const void *p, size_t bytes, const char *api, const char *what);

// The device of the device allocation holding p (-1: none), of stream s
// (the legacy stream: the current device's; -1: not a stream), and the
// calling thread's current device.
int device_of(const void *p);
int stream_device(cudaStream_t s);
int current();

// "cuda-emu: kernel K, block (..), thread (..)" for the GPU thread running
// now ("kernel (none)" outside a kernel).
void describe(char *buf, size_t size);

// Whether to keep quiet about refused calls (POLAR_CUDA_EMU_QUIET=1): they
// are said on stderr otherwise, the error code alone being terse.
bool quiet();
#define EMU_NOTE(...)                                      \
    do {                                                   \
        if (!emu::quiet()) fprintf(stderr, __VA_ARGS__);   \
    } while (0)

// Multiprocessors: an H100's 132, or POLAR_CUDA_EMU_SMS. Kernels size their
// grids by it (split-K attention, the cooperative predictor), so fewer make
// the emulation faster without changing what runs; make test uses 16.
int sms();
// The occupancy the emulation reports for every kernel: one block per
// multiprocessor (a GPU reports more; fibers for a bigger co-resident grid
// would cost the host memory and time for nothing).
const int EMU_BLOCKS_PER_SM = 1;

} // namespace emu

#endif
