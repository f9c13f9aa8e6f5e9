#include "ui/report/report_writer.h"

#include <algorithm>

#include <QBuffer>
#include <QCoreApplication>
#include <QDateTime>
#include <QFile>
#include <QLocale>
#include <QPageSize>
#include <QPdfWriter>
#include <QTextDocument>
#include <QUrl>

#include "core/base/byte_size.h"
#include "core/plan/memory_report.h"
#include "ui/session/event_text.h"

namespace batchpilot::ui {

namespace {

QString tr(const char* text) {
    return QCoreApplication::translate("ReportWriter", text);
}

QString esc(const std::string& text) {
    return QString::fromStdString(text).toHtmlEscaped();
}

QString esc(const QString& text) {
    return text.toHtmlEscaped();
}

QString mib(int64_t bytes) {
    return QString::number(core::toMiB(bytes), 'f', 2);
}

QString bytesText(int64_t bytes) {
    return esc(core::formatBytes(bytes));
}

QString row(const QStringList& cells, bool header = false) {
    const QString tag = header ? QStringLiteral("th") : QStringLiteral("td");
    QString out = QStringLiteral("<tr>");
    for (const QString& cell : cells) out += QStringLiteral("<%1>%2</%1>").arg(tag, cell);
    return out + QStringLiteral("</tr>\n");
}

QString tableStart() {
    // Attributes as well as CSS: QTextDocument (the PDF path) reads the attributes.
    return QStringLiteral("<table border=\"1\" cellspacing=\"0\" cellpadding=\"4\">\n");
}

QString imageTag(const QImage& image, int index, bool embed, const QString& alt) {
    if (image.isNull()) return {};
    QString src;
    if (embed) {
        QByteArray png;
        QBuffer buffer(&png);
        buffer.open(QIODevice::WriteOnly);
        image.save(&buffer, "PNG");
        src = QStringLiteral("data:image/png;base64,") + QString::fromLatin1(png.toBase64());
    } else {
        src = ReportWriter::imageName(index);
    }
    // Logical size: a grab on a high-DPI screen is larger than it looks.
    const int width = std::min(680, static_cast<int>(image.width() / std::max(1.0, image.devicePixelRatio())));
    return QStringLiteral("<p><img src=\"%1\" width=\"%2\" alt=\"%3\"></p>\n").arg(src).arg(width).arg(esc(alt));
}

QString probeReason(core::ProbeReason reason) {
    return QString::fromLatin1(core::toString(reason));
}

}  // namespace

QString ReportWriter::imageName(int index) {
    static const char* names[] = {"memory-fit.png", "memory-breakdown.png", "loss.png"};
    return QStringLiteral("report-image:/") + QLatin1String(names[std::clamp(index, 0, 2)]);
}

QString ReportWriter::html(const Images& images, bool embedImages) const {
    QString h;
    h += QStringLiteral(
             "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n<title>%1</title>\n"
             "<style>body{font-family:sans-serif;max-width:60em;margin:1em auto;padding:0 1em;}"
             "table{border-collapse:collapse;margin:0.5em 0;}th,td{border:1px solid #999;padding:3px 8px;"
             "text-align:left;}img{max-width:100%;}"
             ".note{color:#555;}</style>\n</head><body>\n")
             .arg(tr("BatchPilot run report"));
    h += QStringLiteral("<h1>%1</h1>\n<p class=\"note\">%2</p>\n")
             .arg(tr("BatchPilot run report"),
                  esc(tr("Written %1").arg(QLocale().toString(QDateTime::currentDateTime(), QLocale::LongFormat))));

    h += runSection();
    h += probeSection(images, embedImages);
    h += memorySection(images, embedImages);
    h += accumulationSection();
    h += equivalenceSection();
    h += trainingSection(images, embedImages);
    h += QStringLiteral("</body></html>\n");
    return h;
}

QString ReportWriter::runSection() const {
    QString h;
    // The run.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Run"));
    if (m_digest.summary) {
        const core::RunSummary& s = *m_digest.summary;
        h += tableStart();
        h += row({tr("device"), esc(s.device)});
        h += row({tr("model"), esc(s.model)});
        h += row({tr("parameters"), esc(QLocale().toString(s.parameterCount))});
        h += row({tr("dataset"), esc(s.dataset)});
        h += row({tr("dataset size"), esc(tr("%1 samples").arg(QLocale().toString(s.datasetSize)))});
        h += row({tr("optimizer"), esc(s.optimizer)});
        h += row({tr("loss"), esc(s.loss)});
        h += row({tr("target batch"), QString::number(s.targetBatch)});
        if (s.batchStatistics)
            h += row({tr("note"), esc(tr("the model has BatchNorm layers: each micro-batch is "
                                         "normalised with its own statistics"))});
        h += QStringLiteral("</table>\n");
    } else {
        h += QStringLiteral("<p>%1</p>\n").arg(esc(tr("No run has reported its setup yet.")));
    }
    return h;
}

QString ReportWriter::probeSection(const Images& images, bool embedImages) const {
    QString h;
    // The probe.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Probe: the largest micro-batch that fits"));
    if (m_digest.probeStarted || !m_digest.trials.empty()) {
        if (m_digest.probeStarted)
            h += QStringLiteral("<p>%1</p>\n")
                     .arg(esc(tr("Probe %1 (%2) on %3: usable %4 (capacity minus headroom), micro-batch at most %5.")
                                  .arg(m_digest.probeStarted->sequence)
                                  .arg(probeReason(m_digest.probeStarted->reason),
                                       QString::fromStdString(m_digest.probeStarted->device),
                                       QString::fromStdString(core::formatBytes(m_digest.probeStarted->usableBytes)))
                                  .arg(m_digest.probeStarted->upperBound)));
        h += tableStart();
        h += row({tr("trial"), tr("micro-batch"), tr("result"), tr("peak")}, /*header=*/true);
        for (const core::ProbeTrial& t : m_digest.trials) {
            const QString result = !t.fit             ? tr("out of memory")
                                   : t.withinHeadroom ? tr("fits")
                                                      : tr("fits, past headroom");
            QString peak = bytesText(t.peakBytes);
            if (!t.fit && t.failedAllocationBytes > 0)
                peak += esc(tr(" (failed to get %1 more)")
                                .arg(QString::fromStdString(core::formatBytes(t.failedAllocationBytes))));
            h += row({QString::number(t.trial), QString::number(t.microBatch), esc(result), peak});
        }
        h += QStringLiteral("</table>\n");
    }
    if (m_digest.probeFinished) {
        const core::ProbeFinished& f = *m_digest.probeFinished;
        QString model;
        if (f.bytesPerSample > 0) {
            model = tr("Memory model: %1.")
                        .arg(QString::fromStdString(
                            core::describeMemoryModel(core::MemoryModel{f.fixedBytes, f.bytesPerSample})));
        } else {
            std::vector<core::TrialOutcome> outcomes;
            for (const core::ProbeTrial& t : m_digest.trials) outcomes.push_back({t.microBatch, t.fit, t.peakBytes});
            if (const auto fitted = core::fitMemoryModel(outcomes))
                model = tr("Memory model (fitted to the trials): %1.")
                            .arg(QString::fromStdString(core::describeMemoryModel(*fitted)));
            else
                model = tr("Memory model: not fitted (fewer than two sizes fit).");
        }
        h += QStringLiteral("<p>%1 %2</p>\n")
                 .arg(esc(tr("Chose micro-batch %1 after %2 trial(s) in %3 s.")
                              .arg(f.microBatch)
                              .arg(f.trials)
                              .arg(f.seconds, 0, 'f', 2)),
                      esc(model));
    } else if (!m_digest.probeStarted) {
        h += QStringLiteral("<p>%1</p>\n").arg(esc(tr("No probe has run.")));
    }
    h += imageTag(images.memoryFit, 0, embedImages, tr("peak memory against micro-batch"));
    return h;
}

QString ReportWriter::memorySection(const Images& images, bool embedImages) const {
    QString h;
    // Where the memory goes.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Where the memory goes"));
    if (m_digest.breakdown) {
        const core::MemoryBreakdown& b = *m_digest.breakdown;
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("On %1 after step %2, at the peak of a %3-sample micro-batch.")
                              .arg(QString::fromStdString(b.device))
                              .arg(b.step)
                              .arg(b.activationMicroBatch)));
        h += tableStart();
        h += row({tr("part"), tr("MiB"), tr("share")}, /*header=*/true);
        const double total = static_cast<double>(std::max<int64_t>(1, b.totalBytes));
        for (const core::MemoryPart& part : core::memoryParts(b))
            h += row({esc(part.name), mib(part.bytes),
                      QStringLiteral("%1 %").arg(100.0 * static_cast<double>(part.bytes) / total, 0, 'f', 1)});
        h += row({tr("total"), mib(b.totalBytes), QStringLiteral("100.0 %")});
        h += QStringLiteral("</table>\n");
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("Capacity %1, usable %2. Measured peak %3 MiB; the parts above the allocator "
                             "cache add up to %4 MiB.")
                              .arg(QString::fromStdString(core::formatBytes(b.capacityBytes)),
                                   QString::fromStdString(core::formatBytes(b.usableBytes)), mib(b.peakBytes),
                                   mib(b.attributedBytes()))));
        h += imageTag(images.memoryBreakdown, 1, embedImages, tr("memory breakdown"));
    } else {
        h += QStringLiteral("<p>%1</p>\n").arg(esc(tr("No memory breakdown yet.")));
    }
    return h;
}

QString ReportWriter::accumulationSection() const {
    QString h;
    // The accumulation plan: the latest step says what the run actually used.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Accumulation plan"));
    QString plan;
    if (m_digest.lastStep && (!m_digest.probeFinished || m_digest.lastStep->time >= m_digest.probeFinished->time))
        plan = planCaption(m_digest.lastStep->targetBatch, m_digest.lastStep->microBatch);
    else if (m_digest.probeFinished)
        plan = planCaption(m_digest.probeFinished->targetBatch, m_digest.probeFinished->microBatch);
    h += QStringLiteral("<p>%1</p>\n")
             .arg(plan.isEmpty() ? esc(tr("No plan yet: the probe has not finished."))
                                 : QStringLiteral("<b>%1</b>").arg(esc(plan)));
    return h;
}

QString ReportWriter::equivalenceSection() const {
    QString h;
    // The equivalence check.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Accumulation against one full pass"));
    if (!m_digest.equivalence) {
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("Not run. Run it from the Run menu while a run trains (it compares the "
                             "gradient accumulated over the micro-batches with one full pass over the "
                             "same samples), or with the command line's --check-equivalence N.")));
    } else if (!m_digest.equivalence->error.empty()) {
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("The check could not run: %1").arg(QString::fromStdString(m_digest.equivalence->error))));
    } else {
        const core::EquivalenceChecked& e = *m_digest.equivalence;
        QStringList sizes;
        for (int64_t n : e.microBatchSizes) sizes << QString::number(n);
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("After step %1: %2 samples accumulated as %3, against one pass.")
                              .arg(e.step)
                              .arg(e.samples)
                              .arg(sizes.join(QStringLiteral(" + ")))));
        h += QStringLiteral("<p><b>%1</b></p>\n")
                 .arg(esc(tr("Overall: relative difference %1, max |difference| %2, cosine similarity %3")
                              .arg(e.overall.relativeDifference, 0, 'g', 3)
                              .arg(e.overall.maxAbsDifference, 0, 'g', 3)
                              .arg(e.overall.cosineSimilarity, 0, 'f', 9)));
        h += tableStart();
        h += row({tr("parameter tensor"), tr("elements"), tr("max |difference|"), tr("relative"), tr("cosine")},
                 /*header=*/true);
        for (const core::TensorDifference& d : e.tensors)
            h += row({esc(d.name), QString::number(d.elements), QString::number(d.maxAbsDifference, 'g', 3),
                      QString::number(d.relativeDifference, 'g', 3), QString::number(d.cosineSimilarity, 'f', 9)});
        h += QStringLiteral("</table>\n");
        if (!e.explanation.empty()) h += QStringLiteral("<p>%1</p>\n").arg(esc(e.explanation));
        if (e.batchStatistics && e.runningStatisticsRelativeDifference >= 0)
            h += QStringLiteral("<p>%1</p>\n")
                     .arg(esc(tr("With the running statistics (eval mode) the relative difference is %1.")
                                  .arg(e.runningStatisticsRelativeDifference, 0, 'g', 3)));
        if (e.fullPassOutsideBudget)
            h += QStringLiteral("<p class=\"note\">%1</p>\n")
                     .arg(esc(tr("The full pass did not fit the virtual budget and ran in host memory.")));
    }
    return h;
}

QString ReportWriter::trainingSection(const Images& images, bool embedImages) const {
    QString h;
    // Training.
    h += QStringLiteral("<h2>%1</h2>\n").arg(tr("Training"));
    if (m_digest.lastStep) {
        const core::StepMetrics& m = *m_digest.lastStep;
        h += QStringLiteral("<p>%1</p>\n")
                 .arg(esc(tr("Last step %1 (epoch %2, %3 samples seen): loss %4, %5 samples/s.")
                              .arg(m.step)
                              .arg(m.epoch)
                              .arg(QLocale().toString(m.samplesSeen))
                              .arg(m.loss, 0, 'g', 6)
                              .arg(m.samplesPerSecond, 0, 'f', 0)));
    } else {
        h += QStringLiteral("<p>%1</p>\n").arg(esc(tr("No optimizer step yet.")));
    }
    if (m_digest.lastState)
        h += QStringLiteral("<p class=\"note\">%1</p>\n")
                 .arg(esc(
                     tr("Run state: %1%2")
                         .arg(QString::fromLatin1(core::toString(m_digest.lastState->state)),
                              m_digest.lastState->detail.empty()
                                  ? QString()
                                  : QStringLiteral(" (%1)").arg(QString::fromStdString(m_digest.lastState->detail)))));
    h += imageTag(images.loss, 2, embedImages, tr("loss per optimizer step"));
    return h;
}

bool ReportWriter::write(const QString& path, const Images& images, QString* error) const {
    QFile file(path);
    if (!file.open(QIODevice::WriteOnly | QIODevice::Truncate)) {
        if (error) *error = file.errorString();
        return false;
    }
    if (!path.endsWith(QLatin1String(".pdf"), Qt::CaseInsensitive)) {
        const QByteArray bytes = html(images, /*embedImages=*/true).toUtf8();
        if (file.write(bytes) != bytes.size() || !file.flush()) {
            if (error) *error = file.errorString();
            return false;
        }
        return true;
    }
    // QTextDocument does not load data: URIs: hand it the images as resources.
    QTextDocument document;
    const QImage list[] = {images.memoryFit, images.memoryBreakdown, images.loss};
    for (int i = 0; i < 3; ++i)
        if (!list[i].isNull()) document.addResource(QTextDocument::ImageResource, QUrl(imageName(i)), list[i]);
    document.setHtml(html(images, /*embedImages=*/false));
    QPdfWriter writer(&file);
    writer.setPageSize(QPageSize(QPageSize::A4));
    writer.setTitle(tr("BatchPilot run report"));
    writer.setCreator(QStringLiteral("BatchPilot"));
    document.print(&writer);
    file.close();
    if (file.error() != QFileDevice::NoError) {
        if (error) *error = file.errorString();
        return false;
    }
    return true;
}

}  // namespace batchpilot::ui
