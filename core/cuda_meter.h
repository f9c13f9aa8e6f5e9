#pragma once

#include <memory>

#include "core/device.h"

/// CUDA memory figures. Implemented in cuda_meter.cpp when LibTorch has CUDA, otherwise by
/// cuda_meter_none.cpp (the CUDA device is then never offered, so these are never reached).
namespace batchpilot::core {

/// Meter over the CUDA caching allocator (allocated, reserved, peak) and the driver (free/total,
/// which includes other processes).
std::unique_ptr<MemoryMeter> openCudaMeter(int index);

/// Name and memory of CUDA device `index`.
DeviceInfo describeCudaDevice(int index);

}  // namespace batchpilot::core
