#include "core/plan/rank_shares.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/base/text_format.h"

namespace batchpilot::core {

std::vector<int64_t> splitShares(int64_t total, const std::vector<double>& weights, int64_t minShare) {
    const auto n = static_cast<int64_t>(weights.size());
    std::vector<int64_t> shares(weights.size(), 0);
    if (n == 0 || total <= 0) return shares;
    minShare = std::max<int64_t>(minShare, 0);
    if (total < n * minShare) {
        // Not enough for everyone's minimum: the first ranks get it, the rest nothing, and what
        // is left below a minimum joins the last rank that got one (or the first).
        int64_t left = total;
        size_t last = 0;
        for (size_t r = 0; r < shares.size() && left >= minShare && minShare > 0; ++r) {
            shares[r] = minShare;
            left -= minShare;
            last = r;
        }
        shares[last] += left;
        return shares;
    }
    double smallestPositive = 0;
    for (const double w : weights)
        if (w > 0 && std::isfinite(w) && (smallestPositive == 0 || w < smallestPositive)) smallestPositive = w;
    std::vector<double> w(weights.size(), 1.0);
    if (smallestPositive > 0) {
        for (size_t r = 0; r < weights.size(); ++r)
            w[r] = weights[r] > 0 && std::isfinite(weights[r]) ? weights[r] : smallestPositive;
    }
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    std::vector<double> ideal(weights.size());
    int64_t given = 0;
    for (size_t r = 0; r < w.size(); ++r) {
        ideal[r] = static_cast<double>(total) * w[r] / sum;
        shares[r] = std::max(minShare, static_cast<int64_t>(std::floor(ideal[r])));
        given += shares[r];
    }
    // Largest remainder: one sample at a time to the rank furthest below its ideal, or from the
    // one furthest above it (never below the minimum); ties go to the lower rank.
    while (given < total) {
        size_t best = 0;
        for (size_t r = 1; r < w.size(); ++r)
            if (ideal[r] - static_cast<double>(shares[r]) > ideal[best] - static_cast<double>(shares[best])) best = r;
        ++shares[best];
        ++given;
    }
    while (given > total) {
        std::optional<size_t> best;
        for (size_t r = 0; r < w.size(); ++r) {
            if (shares[r] <= minShare) continue;
            if (!best || static_cast<double>(shares[r]) - ideal[r] > static_cast<double>(shares[*best]) - ideal[*best])
                best = r;
        }
        --shares[*best];  // exists: total >= n * minShare
        --given;
    }
    return shares;
}

std::vector<int64_t> scaleShares(const std::vector<int64_t>& shares, int64_t total, int64_t minShare) {
    std::vector<double> weights(shares.begin(), shares.end());
    return splitShares(total, weights, minShare);
}

int64_t shareOffset(const std::vector<int64_t>& shares, int rank) {
    int64_t offset = 0;
    for (int r = 0; r < rank && r < static_cast<int>(shares.size()); ++r) offset += shares[static_cast<size_t>(r)];
    return offset;
}

std::optional<ShareBalancer::Change> ShareBalancer::observe(const std::vector<RankStepTiming>& step,
                                                            const std::vector<int64_t>& shares, int64_t target) {
    if (step.empty()) return std::nullopt;
    if (m_speed.size() != step.size()) {
        m_speed.assign(step.size(), 0.0);
        m_settledSteps = 0;
    }
    double slowest = 0;
    double fastest = 0;
    bool settled = true;
    for (const RankStepTiming& rank : step) {
        settled = settled && rank.settled;
        if (rank.share <= 0) continue;  // no work, no measurement (and nothing to wait for)
        slowest = std::max(slowest, rank.computeSeconds);
        fastest = fastest == 0 ? rank.computeSeconds : std::min(fastest, rank.computeSeconds);
    }
    m_lastImbalance = fastest > 0 ? slowest / fastest : 0;
    // Probing and timing run other sizes than training will: their speed says nothing yet.
    if (!settled) {
        m_settledSteps = 0;
        return std::nullopt;
    }
    for (size_t r = 0; r < step.size(); ++r) {
        if (step[r].share <= 0 || step[r].computeSeconds <= 0) continue;
        const double speed = static_cast<double>(step[r].share) / step[r].computeSeconds;
        m_speed[r] = m_speed[r] > 0 ? m_options.smoothing * speed + (1 - m_options.smoothing) * m_speed[r] : speed;
    }
    if (++m_settledSteps < m_options.stepsBetween || m_lastImbalance <= m_options.imbalance) return std::nullopt;
    std::vector<int64_t> next = splitShares(target, m_speed, m_options.minShare);
    if (next == shares) return std::nullopt;
    m_settledSteps = 0;
    return Change{std::move(next),
                  formatText("the slowest rank computed %.0f%% longer than the fastest", (m_lastImbalance - 1) * 100)};
}

void ShareBalancer::reset() {
    m_speed.clear();
    m_settledSteps = 0;
}

std::string rankName(int rank, const std::vector<std::string>& devices) {
    std::string text = "rank " + std::to_string(rank);
    if (rank >= 0 && static_cast<size_t>(rank) < devices.size())
        text += " (" + devices[static_cast<size_t>(rank)] + ")";
    return text;
}

CollectivesChoice chooseCollectives(const std::vector<std::string>& devices, const std::vector<std::string>& places) {
    const auto name = [&](size_t r) { return rankName(static_cast<int>(r), devices); };
    if (places.size() != devices.size()) return {false, "the ranks did not all say where they run"};
    for (size_t r = 0; r < devices.size(); ++r) {
        if (devices[r].rfind("cuda:", 0) != 0) return {false, name(r) + " is not on a GPU"};
        if (places[r].empty())
            return {false, name(r) + " has no NCCL (a LibTorch without CUDA, or BATCHPILOT_COLLECTIVES=gloo)"};
        for (size_t other = 0; other < r; ++other) {
            if (devices[other] == devices[r] && places[other] == places[r]) {
                return {false, name(other) + " and rank " + std::to_string(r) + " share a GPU of " + places[r] +
                                   ", which NCCL refuses"};
            }
        }
    }
    return {true, {}};
}

}  // namespace batchpilot::core
