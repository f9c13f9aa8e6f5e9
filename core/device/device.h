#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "core/config/device_spec.h"

namespace batchpilot::core {

/// The devices of this machine and their memory meters (the header is torch-free).

/// Parses a device name (parseDeviceName) and checks it exists on this machine. Messages say what was wrong and
/// list the valid forms, e.g. "cuda:1 does not exist: this build has no CUDA support".
tl::expected<DeviceSpec, std::string> parseDevice(std::string_view text);

/// A device a user can pick, for lists in the CLI and the GUI.
struct DeviceInfo {
    std::string id;           ///< what parseDevice accepts ("cpu", "cuda:0")
    std::string description;  ///< "NVIDIA H200, 139.8 GiB" or "host memory, 21.3 GiB available"
    int64_t totalBytes = 0;
};

/// The real devices of this machine: "cpu" and each CUDA device. Virtual devices are not listed:
/// any "virtual:<size>" is valid.
std::vector<DeviceInfo> availableDevices();

/// True when this build of LibTorch can use CUDA and a CUDA device is present.
bool cudaAvailable();

/// A caching allocator's most recent OOM, with its segments as they were when it failed.
struct AllocatorFailureView {
    int64_t number = 0;  ///< OOMs the allocator raised so far (0: none, the rest is empty)
    AllocationFailure failure;
    std::vector<SegmentView> segments;
};

/// Memory figures of one device, in bytes. Only allocations made on threads that are counting
/// (see CountingScope) are included for the CPU and virtual devices.
///
/// Thread rules: all methods may be called from any thread.
class MemoryMeter {
public:
    virtual ~MemoryMeter() = default;
    virtual int64_t allocated() const = 0;
    /// Allocator cache (CUDA caching allocator); equal to allocated() where there is no cache.
    virtual int64_t reserved() const = 0;
    /// Highest allocated() since the last resetPeak().
    virtual int64_t peak() const = 0;
    /// Highest reserved() since the last resetPeak(): what the allocator really held at the peak
    /// (CUDA: allocated plus the unused parts of its cached blocks, i.e. fragmentation). The probe
    /// plans with it, so a chosen size cannot fail later for fragmentation. peak() elsewhere.
    virtual int64_t peakReserved() const { return peak(); }
    /// Since start-up, how often the allocator had to free its cache and retry an allocation
    /// (CUDA: a sign of fragmentation); 0 elsewhere.
    virtual int64_t allocatorRetries() const { return 0; }
    /// Since start-up, the allocator's out-of-memory errors (num_ooms; not injected ones). Under a
    /// caching allocator each came after a retry that failed, counted in allocatorRetries() too.
    virtual int64_t allocatorOoms() const { return 0; }
    /// Resets peak() and peakReserved() to the current values.
    virtual void resetPeak() = 0;
    /// Something the user should know about the device's limit, for a warning (a virtual GPU
    /// larger than the host's free memory: its tensors live there); empty when nothing.
    virtual std::string limitNote() const { return {}; }
    /// Memory this process may use on the device.
    virtual int64_t capacity() const = 0;
    /// capacity() minus what is in use (never negative).
    virtual int64_t free() const = 0;
    /// The device's whole memory: capacity() plus what other processes hold (CUDA).
    virtual int64_t total() const { return capacity(); }
    /// Memory other processes hold on the device (CUDA: total − driver free − reserved), 0 elsewhere.
    virtual int64_t otherProcesses() const { return 0; }
    /// Returns cached, unused memory to the device after an OOM (CUDA); no-op elsewhere.
    virtual void releaseCache() {}
    /// A simulated GPU's CUDA context, outside the allocator (virtual GPU presets), else 0.
    virtual int64_t contextBytes() const { return 0; }
    /// The cuBLAS workspace held through the allocator (virtual GPU presets), else 0.
    virtual int64_t workspaceBytes() const { return 0; }
    /// Size of the allocation that failed most recently, 0 when unknown.
    virtual int64_t lastFailedAllocation() const { return 0; }
    /// Bytes that would have been in use had that allocation succeeded, 0 when unknown.
    virtual int64_t lastFailureNeed() const { return 0; }
    /// The caching allocator's segments and their blocks now, in address order; empty where they
    /// are not known (the CPU, a virtual device counting exactly).
    virtual std::vector<SegmentView> segments() const { return {}; }
    /// The allocator's most recent OOM and its segments then (number 0 where not known).
    virtual AllocatorFailureView lastAllocatorFailure() const { return {}; }
};

/// Opens the meter for a device and makes the device the active one: for a virtual device this
/// sets the counting allocator's budget, for cpu it removes the budget.
std::unique_ptr<MemoryMeter> openMeter(const DeviceSpec& device);

}  // namespace batchpilot::core
