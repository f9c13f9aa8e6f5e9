#pragma once

// The memory-saver survey's arithmetic (issue 15): which micro-batches to run with a saver on,
// what their peaks predict, and which saver to suggest. Torch-free: the trainer runs the
// micro-batches (Trainer::Impl::surveySavers), this decides and predicts, so it is tested with
// synthetic memory lines.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/events/events.h"

namespace batchpilot::core {

/// One micro-batch run with a saver on: forward and backward, nothing kept.
struct SaverTrial {
    int64_t microBatch = 0;
    bool fit = false;  ///< ran without running out of memory
    /// Its peak when it fit; when it ran out of memory, the bytes it was known to need (what it
    /// held when the allocation failed plus that allocation), or 0 when unknown.
    int64_t peakBytes = 0;
    double seconds = 0;
};

/// Sizes the survey runs per saver at most.
inline constexpr size_t kMaxSurveySizes = 6;

/// The second size the survey runs, in smallest micro-batches: far enough from the first that
/// the memory per sample shows through the allocator's rounding (at 1 and 2 samples a small CNN
/// peaked at the same 0.3 MiB).
inline constexpr int64_t kSecondSize = 8;

/// The next micro-batch to run for one saver, or nullopt when its measurement is complete:
/// the smallest micro-batch; then kSecondSize times it for the memory line; then the largest size
/// that line predicts within `usableBytes`, which checks the prediction and is where the
/// throughput is timed; then, while a size ran over the line or out of memory, the prediction of
/// the line between the sizes measured on either side of it (half the bracket after two misses in
/// a row). At most kMaxSurveySizes sizes; never above `upperBound`.
std::optional<int64_t> nextSurveySize(const std::vector<SaverTrial>& trials, int64_t usableBytes, int64_t upperBound,
                                      int64_t smallest);

/// What the trials predict for one saver: the memory line (as nextSurveySize draws it), the
/// largest micro-batch within
/// `usableBytes` (at most `upperBound`, below every size that ran out of memory or over the line),
/// its accumulation steps for `targetBatch` and the throughput timed at the largest size that ran
/// within the usable memory (the fastest of its runs). `fits` false: not even `smallest` fits.
SaverOption predictSaver(const std::string& savers, const std::vector<SaverTrial>& trials, int64_t usableBytes,
                         int64_t upperBound, int64_t targetBatch, int64_t smallest);

/// Predicted throughput, above which another saver is worth a change (5%: timings of one run
/// each differ by about that much from run to run).
inline constexpr double kSaverGain = 1.05;

/// The option to suggest instead of `current`: the one with the best predicted samples/s that
/// fits, when the current one does not fit or the other is more than kSaverGain faster;
/// nullopt: keep the current savers.
std::optional<size_t> suggestSaver(const std::vector<SaverOption>& options, const std::string& current);

/// The option of `survey` named `savers` ("off", "checkpoint", ...) when it was measured and fits;
/// nullptr otherwise.
const SaverOption* findOption(const SaverSurvey& survey, const std::string& savers);

/// The survey in one sentence, e.g. "checkpointing: micro-batch 6 → 23, 0.74× samples/s;
/// bfloat16: micro-batch 6 → 9, 1.31× samples/s (suggested)".
std::string saverAdvice(const SaverSurvey& survey);

/// A saver setting in words: "no memory saver", "activation checkpointing", "bfloat16 autocast",
/// "activation checkpointing and bfloat16 autocast", from its name ("off", "checkpoint", ...).
std::string describeSaverName(const std::string& savers);

}  // namespace batchpilot::core
