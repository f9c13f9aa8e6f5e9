#include "ui/report/run_record.h"

#include <algorithm>
#include <functional>
#include <type_traits>

#include <QDir>
#include <QFile>
#include <QTemporaryFile>
#include <QTextStream>

#include "core/events/event_json.h"

namespace batchpilot::ui {

// Steps are written as their bytes: the struct must stay plain numbers.
static_assert(std::is_trivially_copyable_v<core::StepMetrics>);

namespace {

constexpr std::size_t kStepsPerRead = 4096;

}  // namespace

RunRecord::RunRecord() = default;
RunRecord::~RunRecord() = default;

void RunRecord::handle(const core::Event& event) {
    if (const auto* metrics = std::get_if<core::StepMetrics>(&event)) {
        appendStep(*metrics);
        return;
    }
    // Per-micro-batch and per-step drawing data: the charts hold these.
    if (std::holds_alternative<core::MemorySample>(event) || std::holds_alternative<core::MicroBatchDone>(event) ||
        std::holds_alternative<core::MemoryBreakdown>(event))
        return;
    m_events.push_back(event);
    m_stepsBefore.push_back(m_stepCount);
    if (m_events.size() > kMaxEvents) {
        m_events.pop_front();
        m_stepsBefore.pop_front();
    }
}

void RunRecord::appendStep(const core::StepMetrics& metrics) {
    ++m_stepCount;
    if (m_memorySteps.empty()) {
        if (!m_stepFile) {
            m_stepFile =
                std::make_unique<QTemporaryFile>(QDir::temp().filePath(QStringLiteral("batchpilot-steps-XXXXXX")));
            if (!m_stepFile->open()) {
                const QString problem = m_stepFile->errorString();
                m_stepFile.reset();
                m_events.push_back(core::Warning{
                    metrics.time, "the run record cannot write its temporary file (" + problem.toStdString() +
                                      "); step metrics stay in memory for the exports instead"});
                m_stepsBefore.push_back(m_stepCount - 1);
            }
        }
        if (m_stepFile) {
            const auto bytes = static_cast<qint64>(sizeof metrics);
            if (m_stepFile->write(reinterpret_cast<const char*>(&metrics), bytes) == bytes) {
                ++m_fileSteps;
                return;
            }
            m_events.push_back(
                core::Warning{metrics.time, "the run record's temporary file is full or failed (" +
                                                m_stepFile->errorString().toStdString() +
                                                "); later step metrics stay in memory for the exports instead"});
            m_stepsBefore.push_back(m_stepCount - 1);
        }
    }
    m_memorySteps.push_back(metrics);
}

void RunRecord::clear() {
    m_events.clear();
    m_stepsBefore.clear();
    m_stepFile.reset();  // removes the file
    m_memorySteps.clear();
    m_fileSteps = 0;
    m_stepCount = 0;
}

std::size_t RunRecord::memoryBytes() const {
    return m_events.size() * (sizeof(core::Event) + sizeof(std::size_t)) +
           m_memorySteps.capacity() * sizeof(core::StepMetrics);
}

bool RunRecord::forEachStep(const std::function<void(const core::StepMetrics&)>& visit, QString* error) const {
    if (m_fileSteps > 0) {
        if (!m_stepFile->flush()) {
            if (error) *error = m_stepFile->errorString();
            return false;
        }
        QFile in(m_stepFile->fileName());
        if (!in.open(QIODevice::ReadOnly)) {
            if (error) *error = QStringLiteral("cannot read the run record's temporary file: %1").arg(in.errorString());
            return false;
        }
        std::vector<core::StepMetrics> chunk(kStepsPerRead);
        std::size_t left = m_fileSteps;
        while (left > 0) {
            const std::size_t count = std::min(left, kStepsPerRead);
            const auto bytes = static_cast<qint64>(count * sizeof(core::StepMetrics));
            if (in.read(reinterpret_cast<char*>(chunk.data()), bytes) != bytes) {
                if (error) *error = QStringLiteral("the run record's temporary file is shorter than expected");
                return false;
            }
            for (std::size_t i = 0; i < count; ++i) visit(chunk[i]);
            left -= count;
        }
    }
    for (const core::StepMetrics& m : m_memorySteps) visit(m);
    return true;
}

std::vector<core::StepMetrics> RunRecord::steps() const {
    std::vector<core::StepMetrics> out;
    out.reserve(m_stepCount);
    forEachStep([&](const core::StepMetrics& m) { out.push_back(m); }, nullptr);
    return out;
}

bool RunRecord::writeMetricsCsv(const QString& path, QString* error) const {
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Truncate | QIODevice::Text)) {
        if (error) *error = file.errorString();
        return false;
    }
    QTextStream out(&file);
    out << "step,epoch,time_s,samples_seen,loss,micro_batch,accumulation_steps,target_batch,"
           "learning_rate,samples_per_s,step_s,peak_bytes\n";
    const bool read = forEachStep(
        [&](const core::StepMetrics& m) {
            out << m.step << ',' << m.epoch << ',' << QString::number(m.time, 'f', 4) << ',' << m.samplesSeen << ','
                << QString::number(m.loss, 'g', 8) << ',' << m.microBatch << ',' << m.accumulationSteps << ','
                << m.targetBatch << ',' << QString::number(m.learningRate, 'g', 8) << ','
                << QString::number(m.samplesPerSecond, 'f', 2) << ',' << QString::number(m.stepSeconds, 'f', 5) << ','
                << m.peakBytes << '\n';
        },
        error);
    out.flush();
    if (!read) return false;
    if (out.status() != QTextStream::Ok) {
        if (error) *error = file.errorString();
        return false;
    }
    return true;
}

bool RunRecord::writeEventsJsonl(const QString& path, QString* error) const {
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Truncate)) {
        if (error) *error = file.errorString();
        return false;
    }
    const auto writeLine = [&file](const core::Event& event) {
        // The same records as the CLI's --events file.
        const std::string line = core::toJsonLine(event) + '\n';
        file.write(line.data(), static_cast<qint64>(line.size()));
    };
    // Steps and events back in the order they came: before each event, the steps recorded
    // before it.
    std::size_t next = 0;
    std::size_t written = 0;
    const bool read = forEachStep(
        [&](const core::StepMetrics& m) {
            while (next < m_events.size() && m_stepsBefore[next] <= written) writeLine(m_events[next++]);
            writeLine(m);
            ++written;
        },
        error);
    while (next < m_events.size()) writeLine(m_events[next++]);
    if (!read) return false;
    if (file.error() != QFileDevice::NoError) {
        if (error) *error = file.errorString();
        return false;
    }
    return true;
}

}  // namespace batchpilot::ui
