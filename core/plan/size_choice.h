#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/events/events.h"
#include "core/plan/micro_batch_sizes.h"
#include "core/plan/probe_search.h"
#include "core/plan/throughput_search.h"

namespace batchpilot::core {

/// How the trainer settles on its micro-batch size between the micro-batches it runs: a probe for
/// the largest size that fits (ProbeSearch), then, for the fastest objective, a timing of the sizes
/// up to it (ThroughputSearch), a watch on the chosen size's speed that times again when it drifts
/// (DriftWatch), what whole batches cost besides their micro-batches (StepCostWatch), and the sizes
/// in use (MicroBatchSizes). One state machine: idle → probing → timing (fastest only; a size
/// below the largest is then checked on whole training batches, BatchCheck) → settled, back to
/// probing on a re-probe, a regrow or a device switch.
///
/// Torch-free and without a device: the trainer runs each micro-batch and reports it here; this
/// says which size comes next and builds what the user is told (tests/core/plan/tst_size_choice.cpp).
///
/// Thread rules: the trainer's thread only.
class SizeChoice {
public:
    using Clock = std::chrono::steady_clock;
    /// The fewest turns of a check on whole batches (BatchCheck; it goes on until the gain is known
    /// to ±2% or probe.check_seconds are spent). One turn's ratio spreads ±4-6% on a shared 2-core
    /// machine (the 64 px ResNet, docs/PERFORMANCE.md §6): the median of five missed the run's own
    /// gain by 5% once in four. Odd, so that the median is one of them; more turns cost nothing
    /// but a batch of the largest each.
    static constexpr int kBatchCheckTurns = 9;
    /// A size the check measures less than this much faster than the largest is not kept: the
    /// search's own tie (ThroughputSearch).
    static constexpr double kBatchCheckTie = 0.005;
    /// The share of a run's steps left that the timing (the search and the check on whole batches)
    /// may train, counted in samples: 4%, so that with the batches it starts and ends in it spans
    /// at most 5% of a run of 1,000 steps or more. On an H200 the unbounded timing took 44% of a
    /// 100-step run (docs/GPU.md).
    static constexpr double kTimingShare = 0.04;
    /// A timing spans at most the share's samples over this (timings of the search and of its
    /// comparisons with the largest, which span confirmTimingFactor as many, fit in the share).
    static constexpr int kTimingsInShare = 128;

    StepCostWatch stepCosts;  ///< what a batch costs besides its micro-batches, on this device and setting

    // ---- The sizes in use and their limits (changed only through the calls below) ----

    const MicroBatchSizes& sizes() const { return m_sizes; }
    /// The model uses BatchNorm: the parts of a batch hold at least 2 samples from the start.
    void keepPartsOfTwo() { m_sizes.minPart = 2; }
    /// BatchNorm refused a single sample: micro-batches hold at least 2 from now on, and outside
    /// a probe (`trial` false) the size in use is raised to 2.
    void requireTwoSamples(bool trial);
    /// Resumed where `size` fit on this device: training goes on at it without a probe.
    void resumeAt(int64_t size) { m_sizes.probeFound(size); }
    /// Nothing is known of the sizes on this device (a rank joining a job): the next probe finds them.
    void forgetSizes() { m_sizes.microBatch = m_sizes.probed = 0; }
    /// Other hardware or memory savers: the last fastest-size search's choice says nothing.
    void forgetLastChoice() { m_sizes.lastChosen = 0; }
    // What a micro-batch or a step did to the sizes (MicroBatchSizes has the rules).
    void succeeded() { m_sizes.succeeded(); }
    bool retrySingleSample(int64_t size) { return m_sizes.retrySingleSample(size); }
    std::optional<int64_t> shrinkAfterOom(int64_t size) { return m_sizes.shrinkAfterOom(size); }
    bool cleanStep(int regrowAfter) { return m_sizes.cleanStep(regrowAfter); }
    bool thrashing(int64_t retriesInStep, bool settled) { return m_sizes.thrashing(retriesInStep, settled); }

    // ---- The probe ----

    /// A new probe session, numbered from 1; it ends a timing in progress and the drift watch (the
    /// sizes are timed again when it finishes). `upperBound` ≥ 1; `initial` is clamped into
    /// [sizes().minMicroBatch, upperBound], `knownFit` to upperBound.
    void startProbe(ProbeReason reason, ProbeOptions options, int64_t upperBound, int64_t usableBytes, int64_t initial,
                    int64_t knownFit, Clock::time_point now);
    bool probing() const { return m_probe.has_value(); }
    /// The running probe (only while probing()).
    ProbeSearch& probe() { return *m_probe; }
    const ProbeSearch& probe() const { return *m_probe; }
    int sequence() const { return m_sequence; }
    ProbeReason probeReason() const { return m_reason; }
    /// The size found so far: the probe's result while probing, else the size in use.
    int64_t currentSize() const { return m_sizes.microBatch > 0 || !m_probe ? m_sizes.microBatch : m_probe->result(); }

    /// Where the allocator caches, a trial that fit is decided by a second micro-batch of its size,
    /// run from the cache the first left (as training's would be). The size of the trial whose
    /// second micro-batch is due, while probing; nullopt when none is.
    std::optional<int64_t> repeatDue() const;
    /// Whether a trial of `size` now is that second micro-batch.
    bool isRepeat(int64_t size) const { return repeatDue() == size; }
    /// A trial micro-batch of `size` fit with `peakBytes` in `seconds`; `cacheHeld`: the allocator
    /// kept memory the micro-batch freed; `allocatedBytes`: the tensors' peak (0: peakBytes).
    /// Returns the trial, recorded in the probe (its peaks and time those of both micro-batches
    /// where there were two), or nullopt when a second micro-batch of the size decides
    /// (repeatDue()).
    std::optional<ProbeTrial> trialFit(int64_t size, int64_t peakBytes, double seconds, bool cacheHeld, double now,
                                       int64_t allocatedBytes = 0);
    /// A trial micro-batch of `size` ran out of memory at `peakBytes`, needing `neededBytes` with
    /// the allocation that failed (0: unknown): recorded in the probe.
    ProbeTrial trialOutOfMemory(int64_t size, int64_t peakBytes, int64_t failedAllocationBytes, double seconds,
                                double now, int64_t neededBytes = 0);
    /// A trial micro-batch failed otherwise, or the batch it was in was dropped: no second
    /// micro-batch is due any more.
    void forgetRepeat() { m_repeat.reset(); }

    /// The end of a probe that found a size (probe().result() > 0): it is used from now on.
    struct ProbeEnd {
        ProbeFinished finished;  ///< the event
        /// The probe's last trial that fit: it warmed its size up for the timing.
        int64_t lastFit = 0;
        /// A probe of a new setting (the first, another device, another target batch): not a
        /// regrow, a re-probe asked for, nor one a memory-saver change started.
        bool newSetting = false;
    };
    ProbeEnd finishProbe(int64_t target, double now, Clock::time_point clock);
    /// The run ends during a probe (read currentSize() first: the sizes are left as they are).
    void abandonProbe();

    // ---- The fastest size ----

    /// Times the sizes up to `largest` for a training batch of `target` samples when the objective
    /// is the fastest (else nothing to time). `warmSize` just ran. `stepsLeft`: the run's training
    /// batches still to come (0: the run has no end); the timing then trains at most kTimingShare
    /// of their samples. Returns true when the decision is due at once (one size only):
    /// finishTiming(timing().chosen()).
    bool startTiming(const ProbeOptions& options, int64_t largest, int64_t target, int64_t warmSize,
                     Clock::time_point now, int64_t stepsLeft = 0);
    bool timing() const { return m_timing.has_value(); }
    /// The running timing (only while timing()).
    ThroughputSearch& search() { return *m_timing; }
    /// The size the next micro-batch should have: the one being timed, the one a check on whole
    /// batches wants for this batch, else the size in use.
    int64_t plannedMicroBatch() const {
        if (checking()) return m_check->next();
        return m_timing && m_timing->next() ? *m_timing->next() : m_sizes.microBatch;
    }
    /// A training micro-batch of `size` took `seconds`: counted when it is the size being timed.
    /// Returns the event of a timing it finished (a warm-up, or micro-batches worth the minimum).
    std::optional<ThroughputTimed> recordTiming(int64_t size, double seconds, double now);
    /// Whether the search decided and the check on whole batches, if one ran, is done:
    /// startBatchCheck, else finishTiming(search().chosen()), is due.
    bool timingDone() const { return m_timing && m_timing->done() && (!m_check || m_check->done()); }
    /// The search chose a size below the largest: whole training batches of the two are timed in
    /// turns before it is kept (options.checkSeconds > 0: at most about that long once the fewest
    /// turns ran), within what the search left of the run's share. Returns whether that check
    /// started; false when it ran already, is not wanted, or the share left cannot hold its fewest
    /// turns (finishTiming is then due, and the gain per batch is computed).
    bool startBatchCheck(const ProbeOptions& options);
    /// Whether that check is running: the batches have the sizes plannedMicroBatch() gives.
    bool checking() const { return m_check && !m_check->done(); }
    /// A whole training batch, every micro-batch of it `microBatch` samples, ran at
    /// `samplesPerSecond` in `seconds`: counted by a check in progress. Returns the event of a
    /// turn it finished.
    std::optional<ThroughputChecked> recordBatch(int64_t microBatch, double samplesPerSecond, double seconds,
                                                 double now);
    /// The decision: training uses `size` from now on — or the largest, where the check on whole
    /// batches found `size` no faster. Builds the event with its claims (per micro-batch, and per
    /// whole batch: the check's, else computed once a clean batch was measured), ends the timing,
    /// and watches the size's speed from now on (options.retimeEvery > 0).
    ThroughputChosen finishTiming(int64_t size, int64_t target, const ProbeOptions& options, double now,
                                  Clock::time_point clock);
    /// The sizes being timed all fit at the probe; memory was taken since: the timing ends at the
    /// best measured so far, never above `ceiling` (a check on whole batches ends where it is).
    /// Returns the size to finish with.
    int64_t abandonTiming(int64_t ceiling);

    // ---- The next micro-batch ----

    /// The micro-batch sizes planned for the rest of a training batch (the trainer keeps one per
    /// pass over the batch; an OOM or a new probe clears it).
    struct BatchPlan {
        std::vector<int64_t> sizes;  ///< remaining micro-batch sizes when not probing
        int64_t plannedFor = 0;      ///< the micro-batch size `sizes` was made for (0: plan again)
    };
    /// What the trainer does next with `remaining` samples of a batch left.
    struct Next {
        enum class Kind {
            Train,        ///< train a micro-batch of `size` (a probe trial when `trial`)
            ProbeOver,    ///< the probe has no size left to try: finish it (finishProbe), then choose again
            NothingFits,  ///< the probe went below the model's smallest micro-batch: memory savers, or stop
        };
        Kind kind = Kind::Train;
        int64_t size = 0;
        bool trial = false;
    };
    /// Chooses the next micro-batch: a trial's second micro-batch, the probe's next trial, the
    /// timed size exactly while timing (an even split of the rest would leave micro-batches of
    /// neither size), else the plan's next size. A trial that would leave fewer samples than the
    /// model's smallest part waits for the next batch. `plan` is updated; the trainer removes a
    /// planned size once it trained (not a trial).
    Next next(BatchPlan& plan, int64_t remaining);

    // ---- Settled ----

    /// Neither probing nor timing.
    bool settled() const { return !m_probe && !m_timing; }
    /// The chosen size's speed is no longer watched (it is no longer the chosen size).
    void stopWatchingSpeed() { m_drift.reset(); }
    /// A full training batch at the chosen size ran at `samplesPerSecond`: why the sizes should be
    /// timed again (their speed drifted), once they should; the timing then starts from the size
    /// in use (startTiming is the caller's).
    std::optional<std::string> watchSpeed(double samplesPerSecond);

private:
    MicroBatchSizes m_sizes;
    struct Repeat {
        int64_t size = 0;
        int64_t firstPeak = 0;
        int64_t firstAllocated = 0;
        double firstSeconds = 0;
    };
    std::optional<ProbeSearch> m_probe;
    ProbeReason m_reason = ProbeReason::Initial;
    int m_sequence = 0;
    Clock::time_point m_probeStart;
    std::optional<Repeat> m_repeat;
    std::optional<ThroughputSearch> m_timing;
    Clock::time_point m_timingStart;
    int64_t m_timingSamples = 0;  ///< the samples the timing may train (0: no limit)
    int64_t m_timingTarget = 0;   ///< the training batch it times for
    std::optional<BatchCheck> m_check;
    Clock::time_point m_checkStart;
    std::string m_checkCut;  ///< why the check ended before its turns (empty: it did not)
    std::optional<DriftWatch> m_drift;
};

}  // namespace batchpilot::core
