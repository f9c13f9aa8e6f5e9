#include "core/plan/size_choice.h"

#include <algorithm>

#include "core/base/text_format.h"

namespace batchpilot::core {

namespace {

double secondsSince(SizeChoice::Clock::time_point start, SizeChoice::Clock::time_point now) {
    return std::chrono::duration<double>(now - start).count();
}

}  // namespace

void SizeChoice::startProbe(ProbeReason reason, ProbeOptions options, int64_t upperBound, int64_t usableBytes,
                            int64_t initial, int64_t knownFit, Clock::time_point now) {
    m_timing.reset();
    m_check.reset();
    m_drift.reset();
    options.initialMicroBatch = std::max<int64_t>(m_sizes.minMicroBatch, std::min(initial, upperBound));
    m_probe.emplace(options, upperBound, usableBytes, std::min(knownFit, upperBound));
    m_repeat.reset();
    m_reason = reason;
    ++m_sequence;
    m_probeStart = now;
}

std::optional<int64_t> SizeChoice::repeatDue() const {
    if (!m_probe || !m_repeat) return std::nullopt;
    return m_repeat->size;
}

std::optional<ProbeTrial> SizeChoice::trialFit(int64_t size, int64_t peakBytes, double seconds, bool cacheHeld,
                                               double now, int64_t allocatedBytes) {
    const bool repeat = isRepeat(size);
    // Fit, and the allocator kept what the micro-batch freed: a second micro-batch of this size,
    // from that cache, decides. Where nothing is cached (exact counting, the CPU) the second would
    // need exactly what the first did.
    if (!repeat && peakBytes <= m_probe->usableBytes() && cacheHeld) {
        m_repeat = Repeat{size, peakBytes, allocatedBytes, seconds};
        return std::nullopt;
    }
    const int64_t peak = repeat ? std::max(m_repeat->firstPeak, peakBytes) : peakBytes;
    const int64_t allocated = repeat ? std::max(m_repeat->firstAllocated, allocatedBytes) : allocatedBytes;
    const double took = repeat ? m_repeat->firstSeconds + seconds : seconds;
    m_repeat.reset();
    m_probe->record({size, true, peak, allocated});
    return ProbeTrial{now, m_sequence, m_probe->trials(), size, true, peak <= m_probe->usableBytes(), peak, 0, took};
}

ProbeTrial SizeChoice::trialOutOfMemory(int64_t size, int64_t peakBytes, int64_t failedAllocationBytes, double seconds,
                                        double now, int64_t neededBytes) {
    m_repeat.reset();
    m_probe->record({size, false, peakBytes, 0, neededBytes});
    return ProbeTrial{now,   m_sequence, m_probe->trials(),     size,   false,
                      false, peakBytes,  failedAllocationBytes, seconds};
}

SizeChoice::ProbeEnd SizeChoice::finishProbe(int64_t target, double now, Clock::time_point clock) {
    const int64_t found = m_probe->result();
    m_sizes.probeFound(found);
    ProbeEnd end;
    end.newSetting = m_reason == ProbeReason::Initial || m_reason == ProbeReason::DeviceSwitch ||
                     m_reason == ProbeReason::TargetBatchChange;
    end.finished = ProbeFinished{now,
                                 m_sequence,
                                 found,
                                 static_cast<int64_t>(m_sizes.planFor(target, found).size()),
                                 target,
                                 m_probe->trials(),
                                 secondsSince(m_probeStart, clock),
                                 m_probe->hitTrialLimit()};
    if (auto fitted = m_probe->memoryLine()) {
        end.finished.fixedBytes = fitted->fixedBytes;
        end.finished.bytesPerSample = fitted->bytesPerSample;
    }
    for (const TrialOutcome& trial : m_probe->history())
        if (trial.fit) end.lastFit = trial.size;
    m_probe.reset();
    m_repeat.reset();
    return end;
}

void SizeChoice::abandonProbe() {
    m_probe.reset();
    m_repeat.reset();
}

bool SizeChoice::startTiming(const ProbeOptions& options, int64_t largest, int64_t target, int64_t warmSize,
                             Clock::time_point now, int64_t stepsLeft) {
    m_timing.reset();
    m_check.reset();
    m_drift.reset();
    if (options.objective != ProbeObjective::Fastest) return false;
    ThroughputSearchOptions search;
    search.largest = largest;
    search.target = target;
    search.multipleOf = options.multipleOf;
    search.smallest = std::max(m_sizes.minMicroBatch, m_sizes.minPart);
    search.justRan = warmSize;
    search.start = m_sizes.lastChosen;
    // A run of N steps gives the timing kTimingShare of them, counted in samples; each timing
    // spans micro-batches worth 50 ms or 1/kTimingsInShare of that, whichever is less (on a fast
    // device 50 ms are whole training batches).
    m_timingTarget = target;
    m_checkCut.clear();
    m_timingSamples =
        stepsLeft > 0
            ? std::max<int64_t>(1, static_cast<int64_t>(kTimingShare * static_cast<double>(stepsLeft))) * target
            : 0;
    search.sampleBudget = m_timingSamples;
    search.maxTimingSamples = m_timingSamples / kTimingsInShare;
    m_timing.emplace(search);
    m_timingStart = now;
    return m_timing->done();  // one size only: nothing to time
}

std::optional<ThroughputTimed> SizeChoice::recordTiming(int64_t size, double seconds, double now) {
    if (!m_timing || m_timing->next() != size) return std::nullopt;
    const int before = m_timing->timings();
    m_timing->record(size, seconds);
    // One event per finished timing, not one per micro-batch: a fast model runs dozens of them
    // per timing.
    if (m_timing->timings() == before) return std::nullopt;
    for (const ThroughputSearch::Candidate& c : m_timing->candidates()) {
        if (c.microBatch == size)
            return ThroughputTimed{now, m_sequence, size, c.median(), static_cast<int>(c.samplesPerSecond.size())};
    }
    return std::nullopt;
}

bool SizeChoice::startBatchCheck(const ProbeOptions& options) {
    if (m_check || !m_timing || !m_timing->done() || !(options.checkSeconds > 0)) return false;
    const ThroughputSearch& search = *m_timing;
    const int64_t chosen = search.chosen();
    const int64_t largest = search.plan().empty() ? chosen : search.plan().front();
    if (chosen >= largest) return false;
    // What the search left of the run's share, in whole batches: the fewest turns must fit.
    int64_t batches = 0;
    if (m_timingSamples > 0) {
        batches = std::max<int64_t>(0, m_timingSamples - search.samples()) / std::max<int64_t>(1, m_timingTarget);
        if (batches < BatchCheck::batchesFor(kBatchCheckTurns)) {
            m_checkCut = formatText("the timing's share of the run had %lld training batches left, %lld needed",
                                    static_cast<long long>(batches),
                                    static_cast<long long>(BatchCheck::batchesFor(kBatchCheckTurns)));
            return false;
        }
    }
    m_check.emplace(chosen, largest, kBatchCheckTurns, options.checkSeconds, batches);
    m_checkStart = Clock::now();
    m_checkCut.clear();
    return true;
}

std::optional<ThroughputChecked> SizeChoice::recordBatch(int64_t microBatch, double samplesPerSecond, double seconds,
                                                         double now) {
    if (!checking()) return std::nullopt;
    const size_t before = m_check->ratios().size();
    m_check->observe(microBatch, samplesPerSecond, seconds);
    if (m_check->ratios().size() == before) return std::nullopt;
    const MedianInterval interval = m_check->interval();
    return ThroughputChecked{now,
                             m_sequence,
                             m_check->chosen(),
                             m_check->largest(),
                             static_cast<int>(m_check->ratios().size()),
                             m_check->ratios().back(),
                             interval.median,
                             interval.low,
                             interval.high};
}

ThroughputChosen SizeChoice::finishTiming(int64_t size, int64_t target, const ProbeOptions& options, double now,
                                          Clock::time_point clock) {
    const ThroughputSearch& search = *m_timing;
    const int64_t largest = search.plan().empty() ? size : search.plan().front();
    // What the check on whole batches measured of the size it checked (nothing: no check, or no
    // turn finished before it was cut short).
    const bool checked = m_check && m_check->chosen() == size && !m_check->ratios().empty();
    const double batchGain = checked ? m_check->gain() : 0;
    const bool overturned = checked && m_checkCut.empty() && batchGain < 1 + kBatchCheckTie;
    if (overturned) size = largest;
    m_sizes.microBatch = size;
    m_sizes.lastChosen = size;
    ThroughputChosen chosen;
    chosen.time = now;
    chosen.sequence = m_sequence;
    chosen.microBatch = size;
    chosen.largestMicroBatch = largest;
    chosen.accumulationSteps = static_cast<int64_t>(m_sizes.planFor(target, size).size());
    chosen.targetBatch = target;
    chosen.samplesPerSecond = search.samplesPerSecond(size);
    chosen.largestSamplesPerSecond = search.samplesPerSecond(largest);
    chosen.speedOverLargest = search.overLargest(size);
    chosen.microBatchesTimed = search.spent();
    chosen.seconds = secondsSince(m_timingStart, clock);
    chosen.reason = search.reason();
    if (m_check) {
        const MedianInterval interval = m_check->interval();
        if (checked) {
            chosen.batchRatios = m_check->ratios();
            chosen.batchGainLow = interval.low;
            chosen.batchGainHigh = interval.high;
        }
        chosen.checkSeconds = secondsSince(m_checkStart, clock);
        const std::string turns =
            formatText("%zu turn%s of whole training batches of the two over %.*f s", m_check->ratios().size(),
                       m_check->ratios().size() == 1 ? "" : "s", chosen.checkSeconds < 10 ? 1 : 0, chosen.checkSeconds);
        // The gain with its 95% interval: how well the turns pin it down on this machine.
        const std::string measured = formatText("%.2fx the largest's speed (95%% interval %.2fx to %.2fx)", batchGain,
                                                interval.low, interval.high);
        if (!m_checkCut.empty()) {
            chosen.reason += "; the check on whole training batches was cut short (" + m_checkCut + ")" +
                             (checked ? formatText(" after %s: %s", turns.c_str(), measured.c_str())
                                      : std::string(" before its first turn"));
        } else if (overturned) {
            chosen.reason += formatText("; but in %s it ran at %s, no faster: the largest (%lld) is kept",
                                        turns.c_str(), measured.c_str(), static_cast<long long>(largest));
        } else {
            chosen.reason += formatText("; in %s it ran at %s", turns.c_str(), measured.c_str());
        }
    }
    if (!m_check && !m_checkCut.empty() && size != largest)
        chosen.reason += "; no check on whole training batches (" + m_checkCut + ")";
    // The claim per whole training batch: what the check measured on whole batches; else the
    // micro-batches' gain, less what every batch costs besides them (the optimizer step, …),
    // measured on the batches trained so far. Not claimed before a clean batch has been measured
    // (the search can decide in the batch after the probe's, or be cut short by an OOM).
    if (checked) {
        chosen.stepSpeedOverLargest = overturned ? 1.0 : batchGain;
    } else if (stepCosts.measured()) {
        const StepCosts costs = stepCosts.costs();
        chosen.stepSeconds = costs.perStepSeconds;
        chosen.microBatchSeconds = costs.perMicroBatchSeconds;
        chosen.stepSpeedOverLargest =
            stepSpeedOverLargest(target, size, largest, chosen.largestSamplesPerSecond, chosen.speedOverLargest, costs);
        if (size != largest && chosen.stepSpeedOverLargest > 0) {
            const double besides =
                costs.perStepSeconds + costs.perMicroBatchSeconds * static_cast<double>(chosen.accumulationSteps);
            chosen.reason += formatText(
                "; per training batch, with its %.0f ms besides the micro-batches, %.2fx the largest's speed",
                1000 * besides, chosen.stepSpeedOverLargest);
        }
    }
    m_timing.reset();
    m_check.reset();
    m_drift.reset();
    if (options.retimeEvery > 0) m_drift.emplace(options.retimeEvery, options.retimeDrift);
    return chosen;
}

int64_t SizeChoice::abandonTiming(int64_t ceiling) {
    if (m_check) {
        // The search had decided; its choice stands, below what just failed.
        m_checkCut = "an out-of-memory error interrupted it";
        return std::min(m_check->chosen(), ceiling);
    }
    m_timing->abandon("an out-of-memory error interrupted the timing");
    return std::min(m_timing->chosen(), ceiling);
}

SizeChoice::Next SizeChoice::next(BatchPlan& plan, int64_t remaining) {
    const auto leavesTooFew = [&](int64_t size) { return remaining - size > 0 && remaining - size < m_sizes.minPart; };
    if (const std::optional<int64_t> repeat = repeatDue()) {
        // A trial's second micro-batch. Where the batch has too few samples left, they train as
        // one micro-batch (smaller than the trial's first, which fit) and the second opens the
        // next batch: from a cache that smaller one also used, as training's would be.
        if (*repeat <= remaining && !leavesTooFew(*repeat)) return {Next::Kind::Train, *repeat, true};
        return {Next::Kind::Train, remaining, false};
    }
    if (m_probe) {
        const std::optional<int64_t> proposed = m_probe->next();
        // Out of sizes to try, or below the model's smallest micro-batch (none that fits is left):
        // whatever comes next is planned anew.
        if (!proposed || *proposed < m_sizes.minMicroBatch) {
            plan = {};
            return {proposed ? Next::Kind::NothingFits : Next::Kind::ProbeOver, 0, false};
        }
        // A trial that would leave one sample for a model that cannot train on one waits for
        // the next batch.
        if (*proposed <= remaining && !leavesTooFew(*proposed)) return {Next::Kind::Train, *proposed, true};
        if (const int64_t found = m_probe->result(); found > 0)
            return {Next::Kind::Train, m_sizes.planFor(remaining, found).front(), false};
        return {Next::Kind::Train, remaining, true};
    }
    const int64_t planned = plannedMicroBatch();
    if (m_timing && !m_check) {
        // Each micro-batch that can have the timed size has it exactly: the turns switch sizes
        // every timing. Only the end of a batch, too short for it, trains untimed.
        const int64_t rest = remaining - planned;
        if (rest >= 0 && (rest == 0 || rest >= m_sizes.minPart)) {
            plan.sizes = {planned};
            if (rest > 0) {
                const std::vector<int64_t> after = m_sizes.planFor(rest, planned);
                plan.sizes.insert(plan.sizes.end(), after.begin(), after.end());
            }
        } else {
            plan.sizes = m_sizes.planFor(remaining, planned);
        }
        plan.plannedFor = 0;  // planned again for the next micro-batch
    } else if (plan.sizes.empty() || planned != plan.plannedFor) {
        plan.sizes = m_sizes.planFor(remaining, planned);
        plan.plannedFor = planned;
    }
    return {Next::Kind::Train, plan.sizes.front(), false};
}

std::optional<std::string> SizeChoice::watchSpeed(double samplesPerSecond) {
    if (!m_drift || !settled()) return std::nullopt;
    std::optional<std::string> why = m_drift->observe(samplesPerSecond);
    if (why) m_sizes.lastChosen = m_sizes.microBatch;
    return why;
}

void SizeChoice::requireTwoSamples(bool trial) {
    m_sizes.requireTwoSamples();
    if (!trial) m_sizes.microBatch = std::max<int64_t>(m_sizes.microBatch, 2);
}

}  // namespace batchpilot::core
