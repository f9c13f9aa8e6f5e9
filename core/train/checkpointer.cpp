#include "core/train/checkpointer.h"

#include <cmath>
#include <filesystem>

namespace batchpilot::core {

tl::expected<std::string, std::string> Checkpointer::takeFolder() {
    if (auto writable = checkCheckpointDirectory(m_options.directory); !writable)
        return tl::unexpected(writable.error());
    auto lock = CheckpointFolderLock::acquire(m_options.directory);
    if (!lock) return tl::unexpected(lock.error());
    std::string warning = lock->unlockedWhy();
    m_lock.emplace(std::move(*lock));
    return warning;
}

Event Checkpointer::save(TrainerState state, const Model& model, const Optimizer& optimizer, double time,
                         const std::string& metric, double value) {
    state.bestMetric = m_options.keepBest;
    state.bestValue = m_bestValue;
    const std::string directory = metric.empty()
                                      ? m_options.directory
                                      : (std::filesystem::path(m_options.directory) / kBestCheckpointFolder).string();
    auto written = saveCheckpoint(directory, model, optimizer, state);
    if (!written) {
        m_lastError = written.error();
        return Warning{time, (metric.empty() ? "checkpoint not saved: " : "best model not saved: ") + written.error()};
    }
    if (metric.empty()) m_latestStep = state.step;
    return CheckpointSaved{time, state.step, *written, metric, value};
}

std::optional<double> Checkpointer::newBest(const ValidationDone& done) {
    const std::string& metric = m_options.keepBest;
    if (metric.empty()) return std::nullopt;
    const std::optional<double> value = validationMetric(done, metric);
    if (!value || !std::isfinite(*value) || !improves(metric, *value, m_bestValue)) return std::nullopt;
    m_bestValue = *value;
    return value;
}

void Checkpointer::resume(const TrainerState& resumed) {
    if (!m_options.keepBest.empty() && resumed.bestMetric == m_options.keepBest) m_bestValue = resumed.bestValue;
}

}  // namespace batchpilot::core
