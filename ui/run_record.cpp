#include "ui/run_record.h"

#include <QFile>
#include <QTextStream>

#include "core/event_json.h"

namespace batchpilot::ui {

void RunRecord::handle(const core::Event& event)
{
    if (const auto* metrics = std::get_if<core::StepMetrics>(&event)) {
        m_steps.push_back(*metrics);
        if (m_steps.size() > kMaxSteps)
            m_steps.pop_front();
    }
    // Per-step and per-micro-batch: the metrics CSV and the charts already hold these.
    if (std::holds_alternative<core::MemorySample>(event) ||
        std::holds_alternative<core::MicroBatchDone>(event) ||
        std::holds_alternative<core::MemoryBreakdown>(event))
        return;
    m_events.push_back(event);
    if (m_events.size() > kMaxEvents)
        m_events.pop_front();
}

void RunRecord::clear()
{
    m_steps.clear();
    m_events.clear();
}

bool RunRecord::writeMetricsCsv(const QString& path, QString* error) const
{
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Truncate | QIODevice::Text)) {
        if (error)
            *error = file.errorString();
        return false;
    }
    QTextStream out(&file);
    out << "step,epoch,time_s,samples_seen,loss,micro_batch,accumulation_steps,target_batch,"
           "learning_rate,samples_per_s,step_s,peak_bytes\n";
    for (const core::StepMetrics& m : m_steps) {
        out << m.step << ',' << m.epoch << ',' << QString::number(m.time, 'f', 4) << ','
            << m.samplesSeen << ',' << QString::number(m.loss, 'g', 8) << ',' << m.microBatch
            << ',' << m.accumulationSteps << ',' << m.targetBatch << ','
            << QString::number(m.learningRate, 'g', 8) << ','
            << QString::number(m.samplesPerSecond, 'f', 2) << ','
            << QString::number(m.stepSeconds, 'f', 5) << ',' << m.peakBytes << '\n';
    }
    out.flush();
    if (out.status() != QTextStream::Ok) {
        if (error)
            *error = file.errorString();
        return false;
    }
    return true;
}

bool RunRecord::writeEventsJsonl(const QString& path, QString* error) const
{
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Truncate)) {
        if (error)
            *error = file.errorString();
        return false;
    }
    for (const core::Event& event : m_events) {
        // The same records as the CLI's --events file.
        const std::string line = core::toJsonLine(event) + '\n';
        file.write(line.data(), static_cast<qint64>(line.size()));
    }
    return file.error() == QFileDevice::NoError;
}

}  // namespace batchpilot::ui
