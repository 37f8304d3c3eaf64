// CUDA emulation: the grid group of a cooperative launch. sync() is a
// barrier of every thread of the grid; the scheduler keeps all blocks of a
// cooperative launch resident (their fibers interleaved) so it can complete.
#ifndef POLAR_CUDA_EMU_COOPERATIVE_GROUPS_H
#define POLAR_CUDA_EMU_COOPERATIVE_GROUPS_H

#include "emu_device.h"

namespace cooperative_groups {

struct grid_group {
    void sync() const { emu::grid_sync(); }
    unsigned long long size() const {
        return (unsigned long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
    }
};
static inline grid_group this_grid() { return grid_group(); }

} // namespace cooperative_groups

#endif
