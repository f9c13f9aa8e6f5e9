#pragma once

#include <cstdint>

namespace batchpilot::core {

/// The largest numbers an event can carry: what the options that bound them allow (equal to
/// core/config/options.h's kMaxTargetBatch, kMaxSteps, kMaxDevices and kMaxProbeTrials, checked
/// where those are defined). Reading an event holds its fields to them (eventFromJson): a line of
/// an events file or of a served stream beyond them is not an event.
inline constexpr int64_t kMaxEventSamples = int64_t{1} << 31;  ///< a batch, a share, a micro-batch, an offset
inline constexpr int64_t kMaxEventSteps = int64_t{1} << 40;    ///< optimizer steps
inline constexpr int kMaxEventRanks = 256;                     ///< devices of one job
inline constexpr int kMaxEventTrials = 1000;                   ///< trials of one probe

}  // namespace batchpilot::core
