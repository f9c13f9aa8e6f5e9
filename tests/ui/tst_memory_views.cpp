#include <QtTest>
#include "tests/test_main.h"

#include <QHelpEvent>
#include <QSlider>
#include <QSpinBox>
#include <QToolTip>

#include "core/base/byte_size.h"
#include "core/events/events.h"
#include "core/plan/memory_report.h"
#include "ui/charts/memory_fit_chart.h"
#include "ui/session/event_text.h"
#include "ui/charts/memory_breakdown_bar.h"

namespace tst_memory_views {

using namespace batchpilot;

namespace {

constexpr int64_t kMiB = 1024 * 1024;
constexpr int64_t kCapacity = 64 * kMiB;
constexpr int64_t kUsable = 60 * kMiB;
constexpr int64_t kTarget = 1024;
// The synthetic device: peak = 10 MiB + 0.2 MiB per sample.
const core::MemoryModel kModel{10.0 * kMiB, 0.2 * kMiB};

int64_t peakAt(int64_t n) {
    return static_cast<int64_t>(kModel.fixedBytes + kModel.bytesPerSample * static_cast<double>(n));
}

/// A probe: 1 … 128 fit, 256 fits past the headroom line, 512 runs out of memory, 240 is chosen.
QList<core::Event> probeEvents() {
    QList<core::Event> events;
    events.append(core::ProbeStarted{0.1, 1, core::ProbeReason::Initial, "virtual:64MiB", kTarget, kUsable, 0});
    int trial = 0;
    const auto add = [&](int64_t n, bool fit, int64_t failed = 0) {
        core::ProbeTrial t;
        t.time = 0.1 + 0.01 * ++trial;
        t.sequence = 1;
        t.trial = trial;
        t.microBatch = n;
        t.fit = fit;
        t.withinHeadroom = fit && peakAt(n) <= kUsable;
        t.peakBytes = fit ? peakAt(n) : 40 * kMiB;
        t.failedAllocationBytes = failed;
        events.append(t);
    };
    for (int64_t n = 1; n <= 256; n *= 2) add(n, true);
    add(512, false, 30 * kMiB);
    add(240, true);
    core::ProbeFinished finished;
    finished.time = 0.5;
    finished.sequence = 1;
    finished.microBatch = 240;
    finished.accumulationSteps = 5;
    finished.targetBatch = kTarget;
    finished.trials = trial;
    finished.fixedBytes = kModel.fixedBytes;
    finished.bytesPerSample = kModel.bytesPerSample;
    events.append(finished);
    core::MemorySample sample;
    sample.time = 0.6;
    sample.capacityBytes = kCapacity;
    sample.headroomBytes = kUsable;
    events.append(sample);
    return events;
}

/// Virtual device: the four parts explain the whole peak.
core::MemoryBreakdown virtualBreakdown() {
    core::MemoryBreakdown b;
    b.step = 2;
    b.device = "virtual:64MiB";
    b.totalBytes = kCapacity;
    b.capacityBytes = kCapacity;
    b.usableBytes = kUsable;
    b.parameterBytes = 2 * kMiB;
    b.gradientBytes = 2 * kMiB;
    b.optimizerStateBytes = 4 * kMiB;
    b.activationBytes = 48 * kMiB;
    b.activationMicroBatch = 240;
    b.residentBytes = 8 * kMiB;
    b.peakBytes = 56 * kMiB;
    b.freeBytes = 8 * kMiB;
    return b;
}

/// CUDA: allocator cache, other processes, and 50 MiB the parts do not explain.
core::MemoryBreakdown cudaBreakdown() {
    core::MemoryBreakdown b;
    b.step = 7;
    b.device = "cuda:0";
    b.totalBytes = 1000 * kMiB;
    b.capacityBytes = 900 * kMiB;
    b.usableBytes = 855 * kMiB;
    b.parameterBytes = 100 * kMiB;
    b.gradientBytes = 100 * kMiB;
    b.optimizerStateBytes = 200 * kMiB;
    b.activationBytes = 300 * kMiB;
    b.activationMicroBatch = 64;
    b.residentBytes = 450 * kMiB;
    b.peakBytes = 750 * kMiB;
    b.cacheBytes = 50 * kMiB;
    b.otherProcessBytes = 100 * kMiB;
    b.freeBytes = 100 * kMiB;
    return b;
}

QString mibText(double bytes, int decimals) {
    return QStringLiteral("%1 MiB").arg(core::toMiB(static_cast<int64_t>(bytes)), 0, 'f', decimals);
}

}  // namespace

class TestMemoryViews : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void barSegmentsAreTheParts();
    void barAddsWhatThePartsDoNotExplain();
    void barTooltipShowsMiB();
    void fitViewShowsTrialsAndFit();
    void whatIfSlider_data();
    void whatIfSlider();
};

void TestMemoryViews::barSegmentsAreTheParts() {
    ui::MemoryBreakdownBar bar;
    QVERIFY(!bar.hasBreakdown());
    const core::MemoryBreakdown b = virtualBreakdown();
    bar.handle(core::Event{b});
    QVERIFY(bar.hasBreakdown());
    const std::vector<core::MemoryPart> parts = core::memoryParts(b);
    QCOMPARE(bar.segments().size(), static_cast<qsizetype>(parts.size()));
    qint64 sum = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        const auto& segment = bar.segments()[static_cast<qsizetype>(i)];
        QCOMPARE(segment.name, QString::fromStdString(parts[i].name));
        QCOMPARE(segment.bytes, qint64(parts[i].bytes));
        QCOMPARE(segment.explanation, QString::fromStdString(parts[i].explanation));
        sum += segment.bytes;
    }
    QCOMPARE(sum, qint64(b.totalBytes));
    // Other events leave it alone; clear() forgets it.
    bar.handle(core::Event{core::StepMetrics{}});
    QCOMPARE(bar.breakdown().step, b.step);
    bar.clear();
    QVERIFY(!bar.hasBreakdown());
    QVERIFY(bar.segments().isEmpty());
}

void TestMemoryViews::barAddsWhatThePartsDoNotExplain() {
    ui::MemoryBreakdownBar bar;
    const core::MemoryBreakdown b = cudaBreakdown();
    bar.setBreakdown(b);
    QStringList names;
    qint64 sum = 0;
    for (const auto& segment : bar.segments()) {
        names << segment.name;
        sum += segment.bytes;
    }
    QCOMPARE(names, (QStringList{QStringLiteral("parameters"), QStringLiteral("gradients"),
                                 QStringLiteral("optimizer state"), QStringLiteral("activations (micro-batch 64)"),
                                 QStringLiteral("other resident"), QStringLiteral("allocator cache"),
                                 QStringLiteral("CUDA context and other processes"), QStringLiteral("free")}));
    QCOMPARE(bar.segments()[4].bytes, qint64(b.peakBytes - b.attributedBytes()));
    QCOMPARE(sum, qint64(b.totalBytes));
}

void TestMemoryViews::barTooltipShowsMiB() {
    ui::MemoryBreakdownBar bar;
    bar.resize(220, 320);
    bar.show();
    QVERIFY(QTest::qWaitForWindowExposed(&bar));
    bar.setBreakdown(virtualBreakdown());
    const int activations = 3;
    QVERIFY(bar.segments()[activations].name.startsWith(QLatin1String("activations")));
    const QString expected = QStringLiteral("48.00 MiB");
    QVERIFY2(bar.segmentToolTip(activations).contains(expected), qPrintable(bar.segmentToolTip(activations)));
    QVERIFY(bar.segmentToolTip(activations).contains(QLatin1String("grows with the micro-batch")));

    // Hovering: the segment under the mouse, through the widget's tooltip event.
    const QPoint centre = bar.segmentCenter(activations);
    QCOMPARE(bar.segmentAt(centre), activations);
    QHelpEvent help(QEvent::ToolTip, centre, bar.mapToGlobal(centre));
    QApplication::sendEvent(&bar, &help);
    QTRY_VERIFY2(QToolTip::text().contains(expected), qPrintable(QToolTip::text()));
    const QPoint freeCentre = bar.segmentCenter(4);
    QHelpEvent helpFree(QEvent::ToolTip, freeCentre, bar.mapToGlobal(freeCentre));
    QApplication::sendEvent(&bar, &helpFree);
    QTRY_VERIFY2(QToolTip::text().contains(QLatin1String("8.00 MiB")), qPrintable(QToolTip::text()));
    QVERIFY(QToolTip::text().contains(QLatin1String("free")));
}

void TestMemoryViews::fitViewShowsTrialsAndFit() {
    ui::MemoryFitChart chart;
    chart.resize(900, 600);
    chart.show();
    QVERIFY(QTest::qWaitForWindowExposed(&chart));
    const QList<core::Event> events = probeEvents();
    chart.setTargetBatch(kTarget);  // from the run model
    for (const core::Event& event : events) chart.handle(event);
    chart.redraw();
    QCOMPARE(chart.trialCount(), 11);
    QCOMPARE(chart.plottedTrialCount(), 11);
    QCOMPARE(chart.chosenMicroBatch(), qint64(240));
    QVERIFY(chart.memoryModel().has_value());
    const QString fit = QString::fromStdString(core::describeMemoryModel(kModel));
    QVERIFY2(chart.caption().contains(fit), qPrintable(chart.caption()));
    // The slider starts at the chosen size and reaches past it.
    QCOMPARE(chart.whatIf(), qint64(240));
    QCOMPARE(chart.whatIfSlider()->maximum(), int(kTarget));

    // A new probe replaces the trials.
    chart.handle(
        core::Event{core::ProbeStarted{2.0, 2, core::ProbeReason::UserRequest, "virtual:64MiB", kTarget, kUsable, 0}});
    chart.redraw();
    QCOMPARE(chart.trialCount(), 0);
    QCOMPARE(chart.plottedTrialCount(), 0);
    QVERIFY(!chart.whatIfSlider()->isEnabled());
}

void TestMemoryViews::whatIfSlider_data() {
    QTest::addColumn<int>("microBatch");
    QTest::addColumn<int>("verdict");
    QTest::addColumn<QString>("verdictText");
    QTest::newRow("fits") << 100 << int(ui::WhatIfRow::Verdict::Fits) << QStringLiteral("fits —");
    QTest::newRow("past headroom") << 260 << int(ui::WhatIfRow::Verdict::PastHeadroom)
                                   << QStringLiteral("fits, but past the headroom line");
    QTest::newRow("does not fit") << 400 << int(ui::WhatIfRow::Verdict::DoesNotFit) << QStringLiteral("does not fit");
}

void TestMemoryViews::whatIfSlider() {
    QFETCH(int, microBatch);
    QFETCH(int, verdict);
    QFETCH(QString, verdictText);
    ui::MemoryFitChart chart;
    chart.resize(900, 600);
    chart.show();
    chart.setTargetBatch(kTarget);
    for (const core::Event& event : probeEvents()) chart.handle(event);
    chart.whatIfSlider()->setValue(microBatch);  // as a user drags it
    QCOMPARE(chart.whatIfBox()->value(), microBatch);
    QCOMPARE(chart.whatIf(), qint64(microBatch));

    const core::WhatIf expected = core::predictWhatIf(kModel, microBatch, kTarget, kUsable, kCapacity);
    QCOMPARE(int(chart.whatIfVerdict()), verdict);
    QCOMPARE(expected.fitsUsable, verdict == int(ui::WhatIfRow::Verdict::Fits));
    QCOMPARE(expected.fitsCapacity, verdict != int(ui::WhatIfRow::Verdict::DoesNotFit));
    const QString text = chart.whatIfText();
    QVERIFY2(text.startsWith(verdictText), qPrintable(text));
    QVERIFY2(text.contains(QStringLiteral("predicted peak %1").arg(mibText(expected.predictedPeakBytes, 1))),
             qPrintable(text));
    QVERIFY2(text.contains(QStringLiteral("%1 accumulation steps").arg(expected.accumulationSteps)), qPrintable(text));
    QVERIFY2(text.contains(ui::planCaption(kTarget, microBatch)), qPrintable(text));
    // The spin box drives the same row.
    chart.whatIfBox()->setValue(240);
    QCOMPARE(chart.whatIfSlider()->value(), 240);
    QCOMPARE(chart.whatIfVerdict(), ui::WhatIfRow::Verdict::Fits);
}

}  // namespace tst_memory_views

BATCHPILOT_TEST_MAIN(tst_memory_views::TestMemoryViews)
#include "tst_memory_views.moc"
