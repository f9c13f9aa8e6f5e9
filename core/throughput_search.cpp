#include "core/throughput_search.h"

#include <algorithm>
#include <cmath>

#include "core/text_format.h"

namespace batchpilot::core {

namespace {

std::string rate(double samplesPerSecond) {
    return formatText("%.0f", samplesPerSecond);
}

std::string percent(double fraction) {
    return formatText("%.0f%%", 100 * fraction);
}

double medianOf(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

int64_t evenSplitSize(int64_t target, int64_t parts, int64_t multipleOf, int64_t smallest) {
    int64_t size = (target + parts - 1) / parts;
    if (multipleOf > 1 && size >= multipleOf) size -= size % multipleOf;
    return std::max(size, std::max<int64_t>(1, smallest));
}

std::vector<int64_t> throughputCandidates(int64_t largest, int64_t target, int64_t multipleOf, int64_t smallest) {
    std::vector<int64_t> sizes;
    smallest = std::max<int64_t>(1, smallest);
    largest = std::min(largest, target);
    if (largest < smallest || target < 1) return sizes;
    for (int64_t halving = largest; halving >= smallest; halving /= 2) {
        // The even split with the fewest micro-batches of at most `halving` samples.
        const int64_t size = evenSplitSize(target, (target + halving - 1) / halving, multipleOf, smallest);
        if (sizes.empty() || size < sizes.back()) sizes.push_back(size);
        if (halving == 1) break;
    }
    return sizes;
}

double ThroughputSearch::Candidate::median() const {
    return medianOf(samplesPerSecond);
}

double ThroughputSearch::Candidate::spread() const {
    if (samplesPerSecond.size() < 3) return 0;
    std::vector<double> sorted = samplesPerSecond;
    std::sort(sorted.begin(), sorted.end());
    // The middle half (at least the middle three): one slow outlier does not make it noisy.
    const size_t n = sorted.size();
    const size_t cut = n >= 6 ? n / 4 : (n - 3) / 2;
    const double low = sorted[cut];
    const double high = sorted[n - 1 - cut];
    const double middle = median();
    return middle > 0 ? 0.5 * (high - low) / middle : 0;
}

ThroughputSearch::ThroughputSearch(const ThroughputSearchOptions& options) : m_options(options) {
    m_options.repetitions = std::max(1, m_options.repetitions);
    m_options.maxRepetitions = std::max(m_options.repetitions, m_options.maxRepetitions);
    m_options.warmups = std::max(0, m_options.warmups);
    m_plan = throughputCandidates(options.largest, options.target, options.multipleOf, options.smallest);
    if (m_plan.size() <= 1) {
        m_done = true;
        m_reason = m_plan.empty() ? "no micro-batch size to time"
                                  : "only one micro-batch size can be chosen (" + std::to_string(m_plan[0]) + ")";
        return;
    }
    // A size that just ran needs no warm-up: its kernels and memory blocks are ready.
    m_timed.push_back(Candidate{m_plan[0], {}, m_plan[0] == m_options.justRan ? m_options.warmups : 0});
}

std::optional<int64_t> ThroughputSearch::next() const {
    if (m_done) return std::nullopt;
    return m_timed.back().microBatch;
}

void ThroughputSearch::record(int64_t microBatch, double seconds) {
    if (m_done || microBatch != m_timed.back().microBatch) return;
    Candidate& current = m_timed.back();
    ++m_spent;
    if (current.warmupsDone < m_options.warmups) {
        ++current.warmupsDone;
        ++m_timings;
        decide();
        return;
    }
    if (!(seconds > 0) || !std::isfinite(seconds)) return;
    current.pendingSeconds += seconds;
    current.pendingSamples += microBatch;
    ++current.pendingMicroBatches;
    // Short micro-batches are timed together; a cap keeps a stalled clock from holding it forever.
    if (current.pendingSeconds < m_options.minTimingSeconds && current.pendingMicroBatches < 256) return;
    current.samplesPerSecond.push_back(static_cast<double>(current.pendingSamples) / current.pendingSeconds);
    current.pendingSeconds = 0;
    current.pendingSamples = 0;
    current.pendingMicroBatches = 0;
    ++m_timings;
    decide();
}

double ThroughputSearch::noiseBetween(const Candidate& a, const Candidate& b) const {
    // Each median can be off by about its own spread: only a difference beyond both is real.
    return std::max(m_options.noise, a.spread() + b.spread());
}

void ThroughputSearch::decide() {
    const size_t index = m_timed.size() - 1;
    Candidate& current = m_timed.back();
    const auto counted = static_cast<int>(current.samplesPerSecond.size());
    const bool budgetLeft = m_timings < m_options.budget;
    if (counted < m_options.repetitions) {
        if (!budgetLeft) finish("the timing budget of " + std::to_string(m_options.budget) + " timings was spent");
        return;
    }
    bool moveOn = true;
    bool tie = false;
    if (index != m_best) {
        const Candidate& best = m_timed[m_best];
        const double noise = noiseBetween(best, current);
        const double ratio = best.median() > 0 ? current.median() / best.median() : 0;
        if (ratio > 1 + noise) {
            m_best = index;
        } else if (ratio >= 1 - noise) {
            if (counted < m_options.maxRepetitions && budgetLeft)
                moveOn = false;  // within the noise: time it again before ranking it
            else
                tie = true;
        }
    }
    if (!moveOn) return;
    if (m_refining) {
        if (tie && current.microBatch > m_timed[m_best].microBatch) m_best = index;  // ties go to the larger
        nextRefinement();
        return;
    }
    // Past a size that is not faster, one more halving may still be (a cache-sized step further
    // down); two in a row that are not faster end the walk: the plateau.
    const size_t sinceBest = index - m_best;
    if (sinceBest >= 2) {
        endWalk("smaller micro-batches were not faster (within " + percent(m_options.noise) + " noise or slower)");
    } else if (index + 1 >= m_plan.size()) {
        endWalk("the smallest candidate was reached");
    } else if (!budgetLeft) {
        finish("the timing budget of " + std::to_string(m_options.budget) + " timings was spent");
    } else {
        m_timed.push_back(Candidate{m_plan[index + 1], {}, 0});
    }
}

void ThroughputSearch::endWalk(const std::string& cause) {
    m_walkCause = cause;
    m_refining = true;
    // Between the best halving and each neighbour that was timed, the size with the number of
    // micro-batches half-way between theirs: the halvings are coarse, the optimum may lie between.
    const int64_t target = m_options.target;
    const auto partsOf = [target](int64_t size) { return (target + size - 1) / size; };
    const int64_t bestParts = partsOf(m_timed[m_best].microBatch);
    std::vector<size_t> neighbours;
    if (m_best > 0) neighbours.push_back(m_best - 1);
    if (m_best + 1 < m_timed.size()) neighbours.push_back(m_best + 1);
    for (size_t n : neighbours) {
        const int64_t between = (bestParts + partsOf(m_timed[n].microBatch)) / 2;
        const int64_t size = evenSplitSize(target, between, m_options.multipleOf, m_options.smallest);
        const bool known =
            std::any_of(m_timed.begin(), m_timed.end(), [size](const Candidate& c) { return c.microBatch == size; }) ||
            std::find(m_refinements.begin(), m_refinements.end(), size) != m_refinements.end();
        if (!known && size <= m_options.largest) m_refinements.push_back(size);
    }
    nextRefinement();
}

void ThroughputSearch::nextRefinement() {
    if (m_refinements.empty()) {
        finish(m_walkCause);
        return;
    }
    if (m_timings >= m_options.budget) {
        finish(m_walkCause + "; the timing budget was spent before the sizes between the halvings");
        return;
    }
    const int64_t size = m_refinements.front();
    m_refinements.erase(m_refinements.begin());
    m_plan.push_back(size);
    m_timed.push_back(Candidate{size, {}, 0});
}

void ThroughputSearch::abandon(const std::string& why) {
    if (!m_done) finish(why);
}

void ThroughputSearch::finish(const std::string& cause) {
    m_done = true;
    const Candidate& best = m_timed[m_best];
    const Candidate& first = m_timed.front();
    std::string text = "micro-batch " + std::to_string(best.microBatch);
    if (best.median() > 0) text += " at " + rate(best.median()) + " samples/s";
    if (m_best != 0 && first.median() > 0) {
        text += ", " + percent(best.median() / first.median() - 1) + " faster than the largest that fits (" +
                std::to_string(first.microBatch) + " at " + rate(first.median()) + " samples/s)";
    } else if (m_best == 0) {
        text += ", the largest that fits";
    }
    m_reason = text + ": " + cause;
}

int64_t ThroughputSearch::chosen() const {
    if (m_plan.empty()) return m_options.largest;
    if (m_timed.empty()) return m_plan.front();
    return m_timed[m_best].microBatch;
}

double ThroughputSearch::samplesPerSecond(int64_t microBatch) const {
    for (const Candidate& c : m_timed)
        if (c.microBatch == microBatch) return c.median();
    return 0;
}

}  // namespace batchpilot::core
