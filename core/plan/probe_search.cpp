#include "core/plan/probe_search.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

namespace batchpilot::core {
namespace {

constexpr int64_t kMaxJump = 8;

}  // namespace

int64_t MemoryModel::largestWithin(int64_t usableBytes) const {
    if (bytesPerSample <= 0) {
        return 0;
    }
    const double n = (static_cast<double>(usableBytes) - fixedBytes) / bytesPerSample;
    return n < 1 ? 0 : static_cast<int64_t>(std::min(n, 9.0e15));
}

ProbeSearch::ProbeSearch(const ProbeOptions& options, int64_t upperBound, int64_t usableBytes, int64_t knownFit)
    : m_options(options),
      m_upperBound(std::max<int64_t>(1, upperBound)),
      m_usable(usableBytes),
      m_unit(std::max<int64_t>(1, options.multipleOf)) {
    if (m_unit > m_upperBound) {
        m_unit = 1;
    } else {
        m_upperBound -= m_upperBound % m_unit;
    }
    m_lo = std::min(snap(knownFit), m_upperBound);
}

int64_t ProbeSearch::snap(int64_t size) const {
    return size - size % m_unit;
}

bool ProbeSearch::converged() const {
    if (m_lo >= m_upperBound) {
        return true;
    }
    if (!m_failSeen) {
        return false;
    }
    const int64_t gap = m_hi - m_lo;
    return gap <= m_unit || static_cast<double>(gap) <= m_options.tolerance * static_cast<double>(m_lo);
}

std::optional<MemoryModel> fitMemoryModel(const std::vector<TrialOutcome>& trials, size_t largest, double spread,
                                          bool tensors) {
    std::map<int64_t, int64_t> peaks;  // size → peak, largest sizes last
    for (const TrialOutcome& t : trials) {
        const int64_t peak = tensors && t.allocatedBytes > 0 ? t.allocatedBytes : t.peakBytes;
        if (t.fit && peak > 0) peaks[t.size] = peak;
    }
    if (peaks.size() < 2) {
        return std::nullopt;
    }
    // The largest sizes; with a spread, the largest and then only sizes at most `spread` of it.
    std::vector<std::pair<int64_t, int64_t>> chosen{*peaks.rbegin()};
    const auto top = static_cast<double>(peaks.rbegin()->first);
    for (auto it = std::next(peaks.rbegin()); it != peaks.rend() && (largest == 0 || chosen.size() < largest); ++it)
        if (spread <= 0 || static_cast<double>(it->first) <= spread * top) chosen.push_back(*it);
    if (chosen.size() < 2) {  // every other fit is close to the largest: take them as they are
        chosen.assign(peaks.rbegin(), peaks.rend());
        if (largest != 0 && chosen.size() > largest) chosen.resize(largest);
    }
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [size, peak] : chosen) {
        const auto x = static_cast<double>(size);
        const auto y = static_cast<double>(peak);
        n += 1;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    const double denominator = n * sxx - sx * sx;
    if (denominator <= 0) {
        return std::nullopt;
    }
    MemoryModel model;
    model.bytesPerSample = (n * sxy - sx * sy) / denominator;
    model.fixedBytes = (sy - model.bytesPerSample * sx) / n;
    if (model.bytesPerSample <= 0) {
        return std::nullopt;
    }
    return model;
}

std::optional<MemoryModel> ProbeSearch::memoryLine() const {
    // The line the probe reports, for the memory report and the plan on other GPUs: through the
    // largest fit and the largest fit at most 80% of its size. Sizes a few percent apart say
    // little about the slope where peaks move in steps (a caching allocator's 2 MiB and 20 MiB
    // segments): on an H200 the three largest fits, 124, 126 and 128 samples, gave 42.5 MiB per
    // sample and −1436 MiB fixed. Two points, not more: where the caching allocator makes memory
    // grow faster than a line, the slope near the largest fit is the one a plan extrapolates.
    // Only fits under the headroom line where two are: above it a caching allocator's reserved
    // bytes stay at the capacity (it frees its cache to make room), so two fits there, 534 and
    // 425 samples of a cnn on 128 MiB, made a line of 0.055 MiB per sample where the sizes below
    // grow by 0.22.
    std::vector<TrialOutcome> accepted;
    for (const TrialOutcome& t : m_history)
        if (accepts(t)) accepted.push_back(t);
    if (auto line = fitMemoryModel(accepted, /*largest=*/2, /*spread=*/0.8)) return line;
    return fitMemoryModel(m_history, /*largest=*/2, /*spread=*/0.8);
}

std::optional<MemoryModel> ProbeSearch::memoryModel() const {
    // The three largest sizes that physically fit (also above the headroom line): memory per
    // sample at small sizes often differs (kernel workspaces, allocator rounding), and the
    // largest fits are the closest to the limit being predicted. On the tensors' peaks: under a
    // caching allocator the reserved peaks of a 256 MiB cnn's fits at 838, 849 and 851 samples
    // were all 254 MiB (no slope, so the search doubled to 1702 and failed three times), while
    // 1010 still fit; the tensors' bytes grow with the size all the way.
    return fitMemoryModel(m_history, /*largest=*/3, /*spread=*/0, /*tensors=*/true);
}

int64_t ProbeSearch::interpolatedBelowFailure() const {
    // Between the largest accepted fit (its peak) and the smallest failure (what it needed: at
    // least the bytes of its failed allocation, or the peak of a fit over the headroom line),
    // where the line through the two meets the usable memory. An OOM's need is a lower bound, so
    // the size is an upper estimate; at least one unit above the fit.
    const TrialOutcome* fit = nullptr;
    const TrialOutcome* failure = nullptr;
    for (const TrialOutcome& t : m_history) {
        if (t.size == m_lo && t.fit) fit = &t;
        if (t.size == m_hi) failure = &t;
    }
    const int64_t need = !failure ? 0 : failure->fit ? failure->peakBytes : failure->neededBytes;
    if (!fit || need <= m_usable || fit->peakBytes >= m_usable || need <= fit->peakBytes) return m_hi;
    const double share = static_cast<double>(m_usable - fit->peakBytes) / static_cast<double>(need - fit->peakBytes);
    return std::max(m_lo + m_unit, snap(m_lo + static_cast<int64_t>(share * static_cast<double>(m_hi - m_lo))));
}

std::optional<int64_t> ProbeSearch::candidate() const {
    const int64_t hi = m_failSeen ? m_hi : m_upperBound + 1;
    const auto usable = [&](int64_t size) {
        return size > m_lo && size < hi && size <= m_upperBound && !m_tried.contains(size);
    };
    if (m_lo == 0 && m_tried.empty()) {
        const int64_t first = std::clamp(snap(m_options.initialMicroBatch), m_unit, m_upperBound);
        return first;
    }
    if (const auto model = memoryModel()) {
        const int64_t predicted = snap(std::min(model->largestWithin(m_usable), m_upperBound));
        // Extrapolating far from the measured sizes is unreliable: jump at most kMaxJump times
        // the largest fit and measure again.
        if (predicted > m_lo * kMaxJump && usable(m_lo * kMaxJump)) {
            return m_lo * kMaxJump;
        }
        if (usable(predicted)) {
            return predicted;
        }
        const auto widen = [&](int64_t base, int streak) {
            const double step =
                m_options.tolerance * static_cast<double>(base) * std::pow(2.0, std::max(0, streak - 1));
            return std::max(m_unit, snap(static_cast<int64_t>(step)));
        };
        // The model overestimates (its prediction failed): one step down from the failure, by
        // what the failure says it needed (or 2% where it says nothing). A second failure says
        // memory is not the line near the limit (a caching allocator's segments make it a cliff:
        // a 64 MiB cnn's fits lay on a line to 140 samples, predicting 198, where 162 already
        // failed), so bisect the bracket.
        if (predicted >= hi && m_failSeen && !m_modelMissed && m_failStreak < 2) {
            const int64_t below = std::min(interpolatedBelowFailure(), snap(hi - widen(hi, m_failStreak)));
            if (usable(below)) return below;
        }
        // The model says we are at the limit: step up from the largest fit to close the bracket.
        if (predicted <= m_lo && !m_modelMissed) {
            const int64_t above = m_lo + widen(m_lo, m_fitStreak);
            if (usable(above)) return above;
        }
    }
    if (!m_failSeen) {
        const int64_t grown = std::min(m_upperBound, std::max(m_lo * 2, m_lo + m_unit));
        if (usable(grown)) {
            return grown;
        }
    }
    // Bisect; a third of the way up where the line through the fits overshot (two failures in a
    // row): memory then grows faster than the line near the limit, the limit is nearer the fit,
    // and a trial that fails costs more than one that fits (its batch starts over).
    const int64_t middle = snap(m_lo + (hi - m_lo) / (m_failStreak >= 2 ? 3 : 2));
    if (usable(middle)) {
        return middle;
    }
    if (usable(m_lo + m_unit)) {
        return m_lo + m_unit;
    }
    return std::nullopt;
}

std::optional<int64_t> ProbeSearch::next() {
    if (m_finished) {
        return std::nullopt;
    }
    if (converged() || (m_lo == 0 && m_failSeen && m_hi <= 1)) {
        m_finished = true;
        return std::nullopt;
    }
    if (trials() >= m_options.maxTrials) {
        m_finished = true;
        m_hitTrialLimit = true;
        return std::nullopt;
    }
    const auto size = candidate();
    if (!size) {
        m_finished = true;
    }
    return size;
}

void ProbeSearch::record(const TrialOutcome& outcome) {
    const bool modelled = memoryModel().has_value();
    m_history.push_back(outcome);
    m_tried.insert(outcome.size);
    const bool accepted = accepts(outcome);
    if (modelled) {
        // Streaks since the memory model exists size the steps around its prediction.
        // A fit after failures (or a failure after fits) means the prediction was bracketed:
        // from then on bisection is the faster way to close the gap.
        if ((accepted && m_failStreak > 0) || (!accepted && m_fitStreak > 0 && m_failSeen)) m_modelMissed = true;
        m_fitStreak = accepted ? m_fitStreak + 1 : 0;
        m_failStreak = accepted ? 0 : m_failStreak + 1;
    }
    if (accepted) {
        m_lo = std::max(m_lo, outcome.size);
        if (m_failSeen && m_lo >= m_hi) {
            // Memory is not monotone in the size (or came back): forget the stale failure.
            m_failSeen = false;
        }
        return;
    }
    if (!m_failSeen || outcome.size < m_hi) {
        m_hi = outcome.size;
        m_failSeen = true;
    }
    if (m_hi <= m_lo) {
        m_lo = 0;  // an accepted size failed now: memory shrank, search below the failure
        for (const TrialOutcome& t : m_history) {
            if (accepts(t) && t.size < m_hi) {
                m_lo = std::max(m_lo, t.size);
            }
        }
    }
    if (m_lo == 0 && m_unit > 1 && outcome.size == m_unit) {
        // Not even one multiple fits: search single samples below it.
        m_unit = 1;
    }
}

}  // namespace batchpilot::core
