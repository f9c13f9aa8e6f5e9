#include "core/plan/throughput_search.h"

#include <algorithm>
#include <cmath>

#include "core/base/text_format.h"

namespace batchpilot::core {

namespace {

std::string rate(double samplesPerSecond) {
    return formatText("%.0f", samplesPerSecond);
}

std::string percent(double fraction) {
    return formatText("%.0f%%", 100 * fraction);
}

/// A gain below this is shown, and taken, as a tie (the larger size keeps it).
constexpr double kTie = 0.005;

double medianOf(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// Half the spread of the middle values (at least the middle three) relative to their median: one
/// outlier does not make a series noisy. 0 with fewer than 3 values.
double spreadOf(std::vector<double> values) {
    if (values.size() < 3) return 0;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    const size_t cut = n >= 6 ? n / 4 : (n - 3) / 2;
    const double middle = medianOf(values);
    return middle > 0 ? 0.5 * (values[n - 1 - cut] - values[cut]) / middle : 0;
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
    if (options.start > 0) {
        // The size chosen before, as the even split of this target it stands for.
        const int64_t parts = (options.target + options.start - 1) / options.start;
        const int64_t start = evenSplitSize(options.target, parts, options.multipleOf, options.smallest);
        if (start < m_plan.front() && start >= m_plan.back()) {
            auto at = std::find_if(m_plan.begin(), m_plan.end(), [start](int64_t n) { return n <= start; });
            if (*at != start) at = m_plan.insert(at, start);
            m_startIndex = static_cast<size_t>(at - m_plan.begin());
        }
    }
    // A size that just ran needs no warm-up: its kernels and memory blocks are ready.
    const int64_t first = m_plan[m_startIndex];
    m_timed.push_back(Candidate{first, {}, first == m_options.justRan ? m_options.warmups : 0, 1.0});
    m_walkingUp = m_startIndex > 0;
    challenge(m_walkingUp ? m_startIndex - 1 : m_startIndex + 1);
}

void ThroughputSearch::challenge(size_t index) {
    if (m_timings >= m_options.budget) {
        finishOnBudget();
        return;
    }
    m_edge = index;
    m_timed.push_back(Candidate{m_plan[index], {}, 0});
    m_challenger = m_timed.size() - 1;
}

bool ThroughputSearch::incumbentActive() const {
    const Candidate& best = incumbent();
    if (best.warmupsDone < m_options.warmups) return true;
    if (challenger().warmupsDone < m_options.warmups) return false;
    return m_incumbentTurn;
}

std::optional<int64_t> ThroughputSearch::next() const {
    if (m_done) return std::nullopt;
    return incumbentActive() ? incumbent().microBatch : challenger().microBatch;
}

void ThroughputSearch::record(int64_t microBatch, double seconds) {
    const int64_t before = m_samples;
    take(microBatch, seconds);
    // The run's share is spent: what was measured decides, even in the middle of a comparison (a
    // comparison with the largest cut short claims what abandon() says).
    if (!m_done && m_samples > before && m_options.sampleBudget > 0 && m_samples >= m_options.sampleBudget)
        abandon(formatText("the timing's share of the run (%lld samples) was spent",
                           static_cast<long long>(m_options.sampleBudget)));
}

void ThroughputSearch::take(int64_t microBatch, double seconds) {
    if (m_done) return;
    const bool isIncumbent = incumbentActive();
    Candidate& current = isIncumbent ? incumbent() : challenger();
    if (microBatch != current.microBatch) return;
    ++m_spent;
    m_samples += microBatch;
    const bool switched = microBatch != m_lastSize;
    m_lastSize = microBatch;
    // Timing the gain once more, the first micro-batch after each switch of size is left out
    // too: it meets a cache of the other size's blocks (a caching allocator splits or frees them
    // and reserves anew), which training at one size never pays.
    if (current.warmupsDone < m_options.warmups || (m_confirming && switched)) {
        if (current.warmupsDone < m_options.warmups) ++current.warmupsDone;
        ++m_timings;
        if (!m_confirming && m_timings >= m_options.budget) finishOnBudget();
        return;
    }
    if (!(seconds > 0) || !std::isfinite(seconds)) {
        // A clock that reports no time (or none that counts) must not hold the search forever.
        if (++m_untimed >= 256)
            abandon("the clock gave no usable time for " + std::to_string(m_untimed) + " micro-batches in a row");
        return;
    }
    m_untimed = 0;
    current.pendingSeconds += seconds;
    current.pendingSamples += microBatch;
    ++current.pendingMicroBatches;
    // Short micro-batches are timed together; a cap keeps a stalled clock from holding it forever.
    // Timing the gain once more, each timing spans longer (confirmTimingFactor): its number is
    // the claim.
    const double factor = m_confirming ? m_options.confirmTimingFactor : 1;
    const double minSeconds = m_options.minTimingSeconds * factor;
    const bool enoughSamples =
        m_options.maxTimingSamples > 0 &&
        static_cast<double>(current.pendingSamples) >= static_cast<double>(m_options.maxTimingSamples) * factor;
    if (current.pendingSeconds < minSeconds && current.pendingMicroBatches < 256 && !enoughSamples) return;
    const double rate = static_cast<double>(current.pendingSamples) / current.pendingSeconds;
    current.samplesPerSecond.push_back(rate);
    current.pendingSeconds = 0;
    current.pendingSamples = 0;
    current.pendingMicroBatches = 0;
    ++m_timings;
    (isIncumbent ? m_incumbentRun : m_challengerRun).push_back(rate);
    m_incumbentTurn = !isIncumbent;
    decide();
}

void ThroughputSearch::decide() {
    const bool budgetLeft = m_timings < m_options.budget;
    const size_t pairs = m_challengerRun.size();
    // Judged only with every challenger timing between two of the incumbent's.
    const bool bracketed = pairs > 0 && m_incumbentRun.size() == pairs + 1;
    std::vector<double> ratios;
    for (size_t i = 0; bracketed && i < pairs; ++i) {
        const double around = 0.5 * (m_incumbentRun[i] + m_incumbentRun[i + 1]);
        ratios.push_back(around > 0 ? m_challengerRun[i] / around : 0);
    }
    if (m_confirming) {
        // The largest (the challenger) against the chosen size, every turn up to the cap: within
        // the noise the larger is kept; then fresh turns measure the claim. Outside the budget:
        // their turns are fixed (at most 4 timings per turn and 2 more each), and a claim the
        // budget cut short would be the biased one again.
        const int wanted = m_claiming ? m_options.claimRepetitions : m_options.maxRepetitions;
        if (!bracketed || static_cast<int>(pairs) < wanted) return;
        if (m_claiming)
            claimed(medianOf(ratios), pairs);
        else
            confirmed(medianOf(ratios), std::max(m_options.noise, spreadOf(ratios)));
        return;
    }
    // Two turns that both differ by more than twice the noise, the same way, need no third: a
    // 1.4× faster size is clear at once, and the largest sizes' timings are the longest. Not when
    // timing the gain once more (above): there the number is the claim, not only its direction.
    const bool clear = bracketed && pairs >= 2 &&
                       (*std::min_element(ratios.begin(), ratios.end()) > 1 + 2 * m_options.noise ||
                        *std::max_element(ratios.begin(), ratios.end()) < 1 - 2 * m_options.noise);
    if (!bracketed || (static_cast<int>(pairs) < m_options.repetitions && !clear)) {
        if (!budgetLeft) finishOnBudget();
        return;
    }
    const double ratio = medianOf(ratios);
    const double noise = std::max(m_options.noise, spreadOf(ratios));
    if (ratio > 1 + noise) {
        judged(true, false, ratio);
    } else if (ratio < 1 - noise) {
        judged(false, false, ratio);
    } else if (static_cast<int>(pairs) < m_options.maxRepetitions && budgetLeft) {
        return;  // within the noise: another challenger timing, and one of the incumbent after it
    } else {
        judged(false, true, ratio);
    }
}

void ThroughputSearch::judged(bool challengerWins, bool tie, double ratio) {
    const size_t index = m_challenger;
    m_timed[index].overFirst = incumbent().overFirst * ratio;
    m_challengerRun.clear();
    m_incumbentRun.clear();
    m_incumbentTurn = true;
    // Ties go to the larger size.
    const bool larger = m_timed[index].microBatch > incumbent().microBatch;
    const bool wins = challengerWins || (tie && larger);
    if (wins) m_best = index;
    if (m_refining) {
        nextRefinement();
        return;
    }
    m_notFaster = wins ? 0 : m_notFaster + 1;
    walkOn(ratio);
}

void ThroughputSearch::walkOn(double ratio) {
    const std::string direction = m_walkingUp ? "larger" : "smaller";
    std::string cause;
    if (ratio < 1 - m_options.clearlySlower) {
        cause = "a " + direction + " micro-batch (" + std::to_string(challenger().microBatch) + ") was " +
                percent(1 - ratio) + " slower";
    } else if (m_notFaster >= 2) {
        // Past a size that is not faster, one more may still be (a cache-sized step further on);
        // two in a row that are not end the walk: the plateau.
        cause = direction + " micro-batches were not faster (within " + percent(m_options.noise) + " noise or slower)";
    } else if (m_walkingUp && m_edge == 0) {
        cause = "the largest that fits was reached";
    } else if (!m_walkingUp && m_edge + 1 >= m_plan.size()) {
        cause = "the smallest candidate was reached";
    }
    if (cause.empty()) {
        challenge(m_walkingUp ? m_edge - 1 : m_edge + 1);
        return;
    }
    // Up from the start and nothing above was better (the start, timed first, is still the best):
    // walk down from it.
    if (m_walkingUp && m_best == 0 && m_startIndex + 1 < m_plan.size()) {
        m_walkingUp = false;
        m_notFaster = 0;
        challenge(m_startIndex + 1);
        return;
    }
    endWalk(cause);
}

void ThroughputSearch::endWalk(const std::string& cause) {
    m_walkCause = cause;
    m_refining = true;
    // Between the best and each nearest timed size above and below it, the size with the number
    // of micro-batches half-way between theirs: the halvings are coarse, the optimum may lie
    // between.
    const int64_t target = m_options.target;
    const auto partsOf = [target](int64_t size) { return (target + size - 1) / size; };
    const int64_t best = m_timed[m_best].microBatch;
    int64_t above = 0;
    int64_t below = 0;
    for (const Candidate& c : m_timed) {
        if (c.microBatch > best && (above == 0 || c.microBatch < above)) above = c.microBatch;
        if (c.microBatch < best && c.microBatch > below) below = c.microBatch;
    }
    for (const int64_t neighbour : {above, below}) {
        if (neighbour == 0) continue;
        const int64_t between = (partsOf(best) + partsOf(neighbour)) / 2;
        const int64_t size = evenSplitSize(target, between, m_options.multipleOf, m_options.smallest);
        const bool known =
            find(size) != nullptr || std::find(m_refinements.begin(), m_refinements.end(), size) != m_refinements.end();
        if (!known && size <= m_options.largest) m_refinements.push_back(size);
    }
    nextRefinement();
}

void ThroughputSearch::nextRefinement() {
    if (m_refinements.empty()) {
        confirmOrFinish();
        return;
    }
    if (m_timings >= m_options.budget) {
        finishOnBudget();
        return;
    }
    const int64_t size = m_refinements.front();
    m_refinements.erase(m_refinements.begin());
    m_plan.push_back(size);
    m_timed.push_back(Candidate{size, {}, 0});
    m_challenger = m_timed.size() - 1;
}

void ThroughputSearch::confirmOrFinish() {
    // The walk kept each challenger whose ratio came out above the noise: the chosen size's gain,
    // the product of those winning ratios, is biased up (noise that favoured it is why it won). A
    // comparison of its own with the largest, in turns, measures the claim afresh.
    const int64_t largest = m_plan.front();
    auto it =
        std::find_if(m_timed.begin(), m_timed.end(), [largest](const Candidate& c) { return c.microBatch == largest; });
    if (!m_options.confirm || incumbent().microBatch == largest || it == m_timed.end()) {
        finish(m_walkCause);
        return;
    }
    m_refining = false;
    m_confirming = true;
    m_challenger = static_cast<size_t>(it - m_timed.begin());
    m_challengerRun.clear();
    m_incumbentRun.clear();
    m_incumbentTurn = true;
}

void ThroughputSearch::confirmed(double ratio, double noise) {
    const int64_t walked = incumbent().microBatch;
    const double walkGain = overLargest(walked);  // the walk's own measure: nothing confirmed yet
    if (ratio >= 1 - noise) {
        // Not faster than the largest when timed against it again: the walk's gain was noise.
        m_confirming = false;
        const std::string outcome =
            ratio > 1 + noise ? percent(1 - 1 / ratio) + " slower" : "not faster (within " + percent(noise) + " noise)";
        m_best = m_challenger;
        // The walk may not have compared it with the largest (the budget ran out while walking up
        // from the size chosen before): then it has no gain of its own to quote.
        const std::string looked =
            walkGain > 0 ? formatText("%lld looked %s faster while the search walked", static_cast<long long>(walked),
                                      percent(walkGain - 1).c_str())
                         : formatText("%lld, the best when the walk ended, had not been compared with the largest",
                                      static_cast<long long>(walked));
        finish(m_walkCause + formatText("; %s, but timed in turns with the largest once more it was %s", looked.c_str(),
                                        outcome.c_str()));
        return;
    }
    m_decidedGain = 1 / ratio;
    if (m_options.claimRepetitions <= 0) {
        m_confirming = false;
        keepChosen(m_decidedGain, "; its gain timed once more, in turns with the largest");
        return;
    }
    // Kept because its turns came out faster than the noise: fresh turns measure the claim.
    m_claiming = true;
    m_challengerRun.clear();
    m_incumbentRun.clear();
    m_incumbentTurn = true;
}

void ThroughputSearch::claimed(double ratio, size_t turns) {
    m_confirming = false;
    m_claiming = false;
    const int64_t walked = incumbent().microBatch;
    if (1 / ratio < 1 + kTie) {
        // The fresh turns found no gain (or one too small to show): the one that kept it was the
        // noise's, and a tie goes to the larger size.
        m_best = m_challenger;
        finish(m_walkCause +
               formatText("; %lld was kept by %d turns with the largest (%s faster there), but in %zu "
                          "more it was %s",
                          static_cast<long long>(walked), m_options.maxRepetitions, percent(m_decidedGain - 1).c_str(),
                          turns,
                          ratio > 1 + kTie ? (percent(1 - 1 / ratio) + " slower").c_str() : "as fast as the largest"));
        return;
    }
    // The speeds shown with the claim are the same turns' (the size's earlier timings were the
    // luckier ones that kept it).
    m_claimRates[incumbent().microBatch] = medianOf(m_incumbentRun);
    m_claimRates[challenger().microBatch] = medianOf(m_challengerRun);
    keepChosen(1 / ratio, formatText("; its gain measured in %zu more turns with the largest, after the %d that kept "
                                     "it (%s faster there)",
                                     turns, m_options.maxRepetitions, percent(m_decidedGain - 1).c_str()));
}

void ThroughputSearch::keepChosen(double gain, const std::string& how) {
    m_confirmedSize = incumbent().microBatch;
    m_confirmedOverLargest = gain;
    finish(m_walkCause + how);
}

void ThroughputSearch::finishOnBudget() {
    // The walk (or the sizes between) ran out of timings: the best so far is still timed against
    // the largest, as after a walk that ended by itself.
    if (m_refining)
        m_walkCause += "; the timing budget was spent while timing the sizes between the halvings";
    else
        m_walkCause = "the timing budget of " + std::to_string(m_options.budget) + " timings was spent";
    m_refinements.clear();
    confirmOrFinish();
}

void ThroughputSearch::abandon(const std::string& why) {
    if (m_done) return;
    if (m_claiming) {
        // Cut short in the fresh turns: the turns that kept the size are all there is to claim.
        m_confirming = m_claiming = false;
        keepChosen(m_decidedGain, "; " + why +
                                      " before fresh turns measured its gain: the turns that kept it "
                                      "claim it");
        return;
    }
    if (m_confirming) {
        m_confirming = false;
        finish(m_walkCause + "; " + why + " before its gain was timed once more: the walk's own measure");
        return;
    }
    finish(why);
}

void ThroughputSearch::finish(const std::string& cause) {
    m_done = true;
    const Candidate& best = m_timed[m_best];
    const int64_t largest = m_plan.front();
    std::string text = "micro-batch " + std::to_string(best.microBatch);
    if (const double speed = samplesPerSecond(best.microBatch); speed > 0) text += " at " + rate(speed) + " samples/s";
    const double over = overLargest(best.microBatch);
    if (best.microBatch == largest) {
        text += ", the largest that fits";
    } else if (over >= 1 + kTie) {
        text += ", " + percent(over - 1) + " faster than the largest that fits (" + std::to_string(largest) +
                ", timed in turns with it)";
    } else if (over > 0) {
        text += ", as fast as the largest that fits (" + std::to_string(largest) + ") within the noise";
    } else {
        text += "; the largest that fits (" + std::to_string(largest) + ") was not timed";
    }
    if (m_startIndex > 0)
        text += "; the search started from the size chosen before (" + std::to_string(startedFrom()) + ")";
    m_reason = text + ": " + cause;
}

int64_t ThroughputSearch::chosen() const {
    if (m_plan.empty()) return m_options.largest;
    if (m_timed.empty()) return m_plan.front();
    return m_timed[m_best].microBatch;
}

const ThroughputSearch::Candidate* ThroughputSearch::find(int64_t microBatch) const {
    for (const Candidate& c : m_timed)
        if (c.microBatch == microBatch) return &c;
    return nullptr;
}

double ThroughputSearch::overLargest(int64_t microBatch) const {
    // The largest is the reference, also when it was the only size and nothing was timed.
    if (!m_plan.empty() && microBatch == m_plan.front()) return 1.0;
    if (microBatch == m_confirmedSize && m_confirmedOverLargest > 0) return m_confirmedOverLargest;
    const Candidate* c = find(microBatch);
    const Candidate* largest = m_plan.empty() ? nullptr : find(m_plan.front());
    if (!c || !largest || c->overFirst <= 0 || largest->overFirst <= 0) return 0;
    return c->overFirst / largest->overFirst;
}

double ThroughputSearch::samplesPerSecond(int64_t microBatch) const {
    if (const auto it = m_claimRates.find(microBatch); it != m_claimRates.end()) return it->second;
    const Candidate* c = find(microBatch);
    return c ? c->median() : 0;
}

MedianInterval medianInterval(std::vector<double> values) {
    MedianInterval out;
    const size_t n = values.size();
    if (n == 0) return out;
    std::sort(values.begin(), values.end());
    out.median = n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    // The largest k with P(binomial(n, 1/2) < k) <= 2.5%: [k-th, (n+1-k)-th] covers the median
    // with at least 95%. Cumulative probabilities summed in doubles (n is at most a few hundred).
    size_t k = 0;
    double below = 0;                                     // P(count < k + 1) as k grows
    double term = std::pow(0.5, static_cast<double>(n));  // P(count == 0)
    for (size_t j = 0; j < n; ++j) {
        below += term;  // P(count <= j)
        if (below > 0.025) break;
        k = j + 1;
        term *= static_cast<double>(n - j) / static_cast<double>(j + 1);
    }
    const size_t lowIndex = k == 0 ? 0 : k - 1;
    out.low = values[lowIndex];
    out.high = values[n - 1 - lowIndex];
    return out;
}

BatchCheck::BatchCheck(int64_t chosen, int64_t largest, int minTurns, double maxSeconds, int64_t maxBatches)
    : m_chosen(chosen),
      m_largest(largest),
      m_minTurns(static_cast<size_t>(std::clamp(minTurns, 1, kMaxTurns))),
      m_maxSeconds(std::max(0.0, maxSeconds)),
      m_maxBatches(std::max<int64_t>(0, maxBatches)) {}

bool BatchCheck::done() const {
    if (m_ratios.size() >= static_cast<size_t>(kMaxTurns)) return true;
    if (m_maxBatches > 0 && m_chosenBatches + m_largestBatches >= m_maxBatches) return true;
    return m_ratios.size() >= m_minTurns && (m_precise || m_seconds >= m_maxSeconds);
}

int64_t BatchCheck::next() const {
    if (done() || m_openLargest > 0 || m_period == 0) return m_chosen;
    return m_sinceLargest >= m_period ? m_largest : m_chosen;
}

void BatchCheck::observe(int64_t microBatch, double samplesPerSecond, double seconds) {
    if (done() || microBatch != next() || !(samplesPerSecond > 0)) return;
    m_seconds += std::max(0.0, seconds);
    if (microBatch == m_largest) {
        ++m_largestBatches;
        m_sinceLargest = 0;
        if (!m_warmedUp) {
            m_warmedUp = true;
            return;
        }
        m_before = m_lastChosen;
        m_openLargest = samplesPerSecond;
        return;
    }
    ++m_chosenBatches;
    if (m_period == 0) {
        // Turns `period` + 1 batches long: about kTurnSeconds, or shorter where the minimum turns
        // (and the warm-up's) would not fit in maxSeconds.
        const double turnSeconds = std::min(kTurnSeconds, m_maxSeconds / static_cast<double>(m_minTurns + 1));
        const double batches = seconds > 0 ? std::ceil(turnSeconds / seconds) - 1 : 1;
        // Within maxBatches: this first batch, then the warm-up and the fewest turns of
        // period + 1 batches each, and the batch that closes the last turn.
        double most = kMaxPeriod;
        if (m_maxBatches > 0)
            most = std::floor(static_cast<double>(m_maxBatches - 2) / static_cast<double>(m_minTurns + 1)) - 1;
        m_period = static_cast<int>(std::clamp(batches, 1.0, std::max(1.0, std::min(most, double(kMaxPeriod)))));
    }
    if (m_openLargest > 0) {
        m_ratios.push_back(0.5 * (m_before + samplesPerSecond) / m_openLargest);
        m_openLargest = 0;
        m_precise = medianInterval(m_ratios).relativeHalfWidth() <= kPrecision;
    }
    ++m_sinceLargest;
    m_lastChosen = samplesPerSecond;
}

double BatchCheck::gain() const {
    return medianOf(m_ratios);
}

DriftWatch::DriftWatch(int64_t everySteps, double drift) : m_every(std::max<int64_t>(1, everySteps)), m_drift(drift) {}

std::optional<std::string> DriftWatch::observe(double samplesPerSecond) {
    if (!(samplesPerSecond > 0)) return std::nullopt;
    m_window.push_back(samplesPerSecond);
    if (static_cast<int64_t>(m_window.size()) < m_every) return std::nullopt;
    std::vector<double> sorted = m_window;
    m_window.clear();
    std::sort(sorted.begin(), sorted.end());
    const size_t mid = sorted.size() / 2;
    const double median = sorted.size() % 2 == 1 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
    if (m_baseline <= 0) {
        m_baseline = median;
        return std::nullopt;
    }
    const double change = median / m_baseline - 1.0;
    if (std::abs(change) <= m_drift) return std::nullopt;
    return formatText(
        "training ran at %.0f samples/s over the last %lld steps, %+.0f%% from the %.0f samples/s "
        "measured after the decision (more than the %.0f%% allowed): timing the sizes again",
        median, static_cast<long long>(m_every), 100.0 * change, m_baseline, 100.0 * m_drift);
}

void StepCostWatch::observe(int64_t microBatches, double microSeconds, double accumulateSeconds, double stepSeconds) {
    if (microBatches < 1 || !(stepSeconds >= accumulateSeconds) || !(accumulateSeconds >= 0)) return;
    const auto keep = [this](std::vector<double>& values, double value) {
        values.push_back(std::max(0.0, value));
        if (values.size() > m_window) values.erase(values.begin());
    };
    keep(m_perMicroBatch, (accumulateSeconds - microSeconds) / static_cast<double>(microBatches));
    keep(m_perStep, stepSeconds - accumulateSeconds);
}

StepCosts StepCostWatch::costs() const {
    return {medianOf(m_perMicroBatch), medianOf(m_perStep)};
}

double stepSpeedOverLargest(int64_t target, int64_t size, int64_t largest, double largestSamplesPerSecond,
                            double overLargest, const StepCosts& costs) {
    if (target < 1 || size < 1 || largest < 1 || !(largestSamplesPerSecond > 0) || !(overLargest > 0)) return 0;
    const double samples = static_cast<double>(target);
    const auto batches = [target](int64_t n) { return static_cast<double>((target + n - 1) / n); };
    const double atLargest =
        samples / largestSamplesPerSecond + batches(largest) * costs.perMicroBatchSeconds + costs.perStepSeconds;
    const double atSize = samples / (overLargest * largestSamplesPerSecond) +
                          batches(size) * costs.perMicroBatchSeconds + costs.perStepSeconds;
    return atLargest / atSize;
}

}  // namespace batchpilot::core
