#pragma once

#include <memory>

#include "core/device/device.h"

/// CUDA memory figures. Implemented in cuda_meter.cpp when LibTorch has CUDA, otherwise by
/// cuda_meter_none.cpp (the CUDA device is then never offered, so these are never reached).
namespace batchpilot::core {

/// Meter over the CUDA caching allocator (allocated, reserved, peak) and the driver (free/total,
/// which includes other processes).
std::unique_ptr<MemoryMeter> openCudaMeter(int index);

/// Name and memory of CUDA device `index`.
DeviceInfo describeCudaDevice(int index);

/// Caps what this process may allocate on CUDA device `index` to `fraction` (0 < fraction <= 1)
/// of its memory, through the caching allocator: allocations past it raise a real CUDA OOM. Used
/// by the GPU check to run out of memory on a large GPU; the meter's capacity follows the cap.
void setCudaMemoryFraction(int index, double fraction);

}  // namespace batchpilot::core
