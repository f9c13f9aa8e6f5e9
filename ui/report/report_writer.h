#pragma once

#include <QImage>
#include <QString>

#include "core/events/events.h"
#include "core/plan/memory_report.h"

namespace batchpilot::ui {

/// File → Save report: one self-contained HTML file (charts embedded as PNG data URIs), or a PDF
/// when the file name ends in ".pdf". It keeps only the latest of what it reports (run summary,
/// the latest probe's trials and result, memory breakdown, equivalence check, step metrics), so
/// feeding it every event of a long run costs nothing that grows with the run.
///
/// Thread rules: GUI thread only (QTextDocument and QPdfWriter).
class ReportWriter {
public:
    /// Chart images, as the window shows them now; a null image leaves its place out.
    struct Images {
        QImage memoryFit;
        QImage memoryBreakdown;
        QImage loss;
    };

    void handle(const core::Event& event) { m_digest.handle(event); }
    void clear() { m_digest = {}; }

    /// The report as HTML. With `embedImages`, images are data: URIs (a self-contained file);
    /// without, they refer to the resource names imageName() gives (for QTextDocument).
    QString html(const Images& images, bool embedImages = true) const;
    /// Writes HTML, or PDF when `path` ends in ".pdf" (any case). On failure returns false and
    /// sets `error` to what went wrong.
    bool write(const QString& path, const Images& images, QString* error = nullptr) const;

    /// Resource names of the images in the non-embedded HTML.
    static QString imageName(int index);

    bool hasSummary() const { return m_digest.summary.has_value(); }
    int trialCount() const { return static_cast<int>(m_digest.trials.size()); }

private:
    // The report's sections, in order.
    QString runSection() const;
    QString probeSection(const Images& images, bool embedImages) const;
    QString memorySection(const Images& images, bool embedImages) const;
    QString accumulationSection() const;
    QString equivalenceSection() const;
    QString trainingSection(const Images& images, bool embedImages) const;
    core::RunDigest m_digest;
};

}  // namespace batchpilot::ui
