// CUDA emulation: what a .cu file gets from <cuda_runtime.h>: the runtime
// API, and for C++ the device side (emu_device.h).
#ifndef POLAR_CUDA_EMU_RUNTIME_H
#define POLAR_CUDA_EMU_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include "emu_device.h"
#endif
#endif
