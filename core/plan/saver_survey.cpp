#include "core/plan/saver_survey.h"

#include <algorithm>
#include <limits>

#include "core/config/memory_savers.h"
#include "core/plan/probe_search.h"
#include "core/base/text_format.h"

namespace batchpilot::core {

namespace {

bool within(const SaverTrial& t, int64_t usableBytes) {
    return t.fit && t.peakBytes <= usableBytes;
}

/// A size measured, with its peak (0: ran out of memory without a known need).
struct Point {
    int64_t size = 0;
    int64_t peak = 0;
};

/// The line the prediction follows: through the largest size measured within the usable memory
/// and the smallest measured above it (over the line, or out of memory with what it needed), so
/// that it interpolates between the two sides; without a size above, through the two largest
/// sizes within (it extrapolates).
std::optional<MemoryModel> memoryLine(const std::vector<SaverTrial>& trials, int64_t usableBytes) {
    std::optional<Point> below, belowBefore, above;
    for (const SaverTrial& t : trials) {
        if (t.peakBytes <= 0) continue;
        const Point p{t.microBatch, t.peakBytes};
        if (within(t, usableBytes)) {
            if (!below || p.size > below->size) {
                if (below) belowBefore = below;
                below = p;
            } else if (p.size != below->size && (!belowBefore || p.size > belowBefore->size)) {
                belowBefore = p;
            }
        } else if (!above || p.size < above->size) {
            above = p;
        }
    }
    std::vector<TrialOutcome> points;
    if (below) points.push_back({below->size, true, below->peak});
    if (above && below && above->size > below->size)
        points.push_back({above->size, true, above->peak});
    else if (belowBefore)
        points.push_back({belowBefore->size, true, belowBefore->peak});
    return fitMemoryModel(points);
}

/// The largest size that ran within the usable memory (0: none).
int64_t largestWithin(const std::vector<SaverTrial>& trials, int64_t usableBytes) {
    int64_t best = 0;
    for (const SaverTrial& t : trials)
        if (within(t, usableBytes)) best = std::max(best, t.microBatch);
    return best;
}

int64_t predicted(const std::vector<SaverTrial>& trials, int64_t usableBytes, int64_t upperBound) {
    int64_t lowestBad = std::numeric_limits<int64_t>::max();
    for (const SaverTrial& t : trials)
        if (!within(t, usableBytes)) lowestBad = std::min(lowestBad, t.microBatch);
    const int64_t good = largestWithin(trials, usableBytes);
    int64_t p = good;
    if (const std::optional<MemoryModel> line = memoryLine(trials, usableBytes)) {
        p = line->largestWithin(usableBytes);
        // Two sizes in a row above the line: what a failure needed is only a lower bound of its
        // peak, and the line can creep towards the bracket's upper end; halve the bracket instead.
        const size_t n = trials.size();
        if (n >= 2 && !within(trials[n - 1], usableBytes) && !within(trials[n - 2], usableBytes) &&
            lowestBad != std::numeric_limits<int64_t>::max())
            p = std::min(p, good + (lowestBad - good) / 2);
    } else if (lowestBad != std::numeric_limits<int64_t>::max()) {
        p = good + (lowestBad - good) / 2;
    }
    p = std::min({p, upperBound, lowestBad - 1});
    return std::max(p, good);
}

}  // namespace

std::optional<int64_t> nextSurveySize(const std::vector<SaverTrial>& trials, int64_t usableBytes, int64_t upperBound,
                                      int64_t smallest) {
    if (trials.empty()) return smallest;
    if (!within(trials.front(), usableBytes) || upperBound <= smallest) return std::nullopt;
    if (trials.size() == 1) return std::min(upperBound, kSecondSize * smallest);
    if (trials.size() >= kMaxSurveySizes) return std::nullopt;
    const int64_t p = predicted(trials, usableBytes, upperBound);
    const bool ran = std::any_of(trials.begin(), trials.end(), [p](const SaverTrial& t) { return t.microBatch == p; });
    if (p <= 0 || ran) return std::nullopt;
    return p;
}

SaverOption predictSaver(const std::string& savers, const std::vector<SaverTrial>& trials, int64_t usableBytes,
                         int64_t upperBound, int64_t targetBatch, int64_t smallest) {
    SaverOption o;
    o.savers = savers;
    o.trials = static_cast<int64_t>(trials.size());
    if (trials.empty() || trials.front().microBatch != smallest || !within(trials.front(), usableBytes)) return o;
    o.fits = true;
    o.microBatch = predicted(trials, usableBytes, upperBound);
    if (const std::optional<MemoryModel> line = memoryLine(trials, usableBytes)) {
        o.fixedBytes = line->fixedBytes;
        o.bytesPerSample = line->bytesPerSample;
        o.peakBytes = static_cast<int64_t>(line->fixedBytes + line->bytesPerSample * static_cast<double>(o.microBatch));
    } else {
        o.peakBytes = trials.front().peakBytes;  // one size only: its own peak
    }
    o.accumulationSteps = (targetBatch + o.microBatch - 1) / o.microBatch;
    o.timedMicroBatch = largestWithin(trials, usableBytes);
    double fastest = 0;
    for (const SaverTrial& t : trials) {
        if (t.fit && t.microBatch == o.timedMicroBatch && t.seconds > 0 && (fastest == 0 || t.seconds < fastest))
            fastest = t.seconds;
    }
    if (fastest > 0) o.samplesPerSecond = static_cast<double>(o.timedMicroBatch) / fastest;
    return o;
}

std::optional<size_t> suggestSaver(const std::vector<SaverOption>& options, const std::string& current) {
    std::optional<size_t> best;
    const SaverOption* now = nullptr;
    for (size_t i = 0; i < options.size(); ++i) {
        const SaverOption& o = options[i];
        if (o.savers == current) now = &o;
        if (!o.fits || !o.unavailable.empty()) continue;
        if (!best || o.samplesPerSecond > options[*best].samplesPerSecond) best = i;
    }
    if (!best) return std::nullopt;
    const bool nowFits = now != nullptr && now->fits && now->unavailable.empty();
    if (nowFits &&
        (options[*best].savers == current || options[*best].samplesPerSecond <= kSaverGain * now->samplesPerSecond))
        return std::nullopt;
    return best;
}

std::string describeSaverName(const std::string& savers) {
    const auto parsed = parseMemorySavers(savers);
    return parsed ? describeSavers(*parsed) : "no memory saver";
}

const SaverOption* findOption(const SaverSurvey& survey, const std::string& savers) {
    for (const SaverOption& o : survey.options)
        if (o.savers == savers && o.fits && o.unavailable.empty()) return &o;
    return nullptr;
}

std::string saverAdvice(const SaverSurvey& survey) {
    const SaverOption* now = findOption(survey, survey.current);
    std::string text;
    const auto add = [&text](const std::string& part) { text += (text.empty() ? "" : "; ") + part; };
    if (now != nullptr) {
        add(describeSaverName(now->savers) + " (in use): micro-batch " + std::to_string(now->microBatch) + ", " +
            formatText("%.3g", now->samplesPerSecond) + " samples/s");
    }
    bool anyFits = now != nullptr;
    for (const SaverOption& o : survey.options) {
        if (&o == now) continue;
        const std::string name = describeSaverName(o.savers);
        if (!o.unavailable.empty()) {
            add(name + ": not available (" + o.unavailable + ")");
        } else if (!o.fits) {
            add(name + ": does not fit");
        } else if (now != nullptr) {
            anyFits = true;
            add(name + ": micro-batch " + std::to_string(now->microBatch) + " → " + std::to_string(o.microBatch) +
                ", " + formatText("%.2f", now->samplesPerSecond > 0 ? o.samplesPerSecond / now->samplesPerSecond : 0) +
                "× samples/s");
        } else {
            anyFits = true;
            add(name + ": micro-batch " + std::to_string(o.microBatch) + ", " + formatText("%.3g", o.samplesPerSecond) +
                " samples/s");
        }
    }
    if (!anyFits) return text + " — nothing fits even at the smallest micro-batch";
    if (!survey.suggestion.empty()) return text + " — suggested: " + describeSaverName(survey.suggestion);
    return text + " — keep " + describeSaverName(survey.current) + ": no other is more than " +
           formatText("%.0f", (kSaverGain - 1) * 100) + "% faster";
}

}  // namespace batchpilot::core
