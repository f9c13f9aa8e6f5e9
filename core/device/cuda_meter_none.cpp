#include <stdexcept>

#include "core/device/cuda_meter.h"

// Used when LibTorch has no CUDA: parseDevice() rejects cuda:N before these can be called.
namespace batchpilot::core {

std::unique_ptr<MemoryMeter> openCudaMeter(int index) {
    throw std::logic_error("cuda:" + std::to_string(index) + " requested in a build without CUDA");
}

DeviceInfo describeCudaDevice(int index) {
    throw std::logic_error("cuda:" + std::to_string(index) + " described in a build without CUDA");
}

void setCudaMemoryFraction(int index, double) {
    throw std::logic_error("cuda:" + std::to_string(index) + " memory capped in a build without CUDA");
}

}  // namespace batchpilot::core
