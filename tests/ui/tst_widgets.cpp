#include <sched.h>

#include <memory>

#include <QtTest>
#include "tests/test_main.h"

#include <QApplication>
#include <QClipboard>
#include <QImage>
#include <QMenu>
#include <QTemporaryDir>
#include <QChartView>
#include <QValueAxis>
#include <QXYSeries>

#include "core/events/events.h"
#include "core/device/math_libraries.h"
#include "core/records/series_export.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/memory_fit_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/runs_panel.h"
#include "core/records/run_folder.h"
#include <QTableWidget>
#include "ui/charts/speed_chart.h"
#include "ui/charts/throughput_chart.h"
#include "ui/log/event_log.h"
#include "ui/session/event_text.h"
#include "ui/window/help_text.h"

namespace tst_widgets {

using namespace batchpilot;

namespace {

constexpr int64_t kMiB = 1024 * 1024;

core::StepMetrics step(int64_t n, double loss) {
    core::StepMetrics m;
    m.time = 0.1 * static_cast<double>(n);
    m.step = n;
    m.samplesSeen = n * 256;
    m.loss = loss;
    m.microBatch = 64;
    m.accumulationSteps = 4;
    m.targetBatch = 256;
    m.samplesPerSecond = 2000;
    m.peakBytes = 40 * kMiB;
    return m;
}

/// A probe sequence: 1, 2, 4 ... fit, `oomAt` runs out of memory.
QList<core::Event> probe(int sequence, int64_t oomAt, double t0) {
    QList<core::Event> events;
    events.append(core::ProbeStarted{t0, sequence, core::ProbeReason::Initial, "virtual:64MiB", 256, 60 * kMiB, 0});
    int trial = 0;
    for (int64_t n = 1; n <= oomAt; n *= 2) {
        core::ProbeTrial t;
        t.time = t0 + 0.01 * ++trial;
        t.sequence = sequence;
        t.trial = trial;
        t.microBatch = n;
        t.fit = n < oomAt;
        t.withinHeadroom = t.fit;
        t.peakBytes = n * kMiB;
        t.failedAllocationBytes = t.fit ? 0 : 3 * kMiB;
        events.append(t);
    }
    events.append(core::ProbeFinished{t0 + 0.5, sequence, oomAt / 2, 256 / (oomAt / 2), 256, trial, 0.5, false, 0, 0});
    return events;
}

}  // namespace

class TestWidgets : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void planCaption_data();
    void planCaption();
    void lossChartDrawsRawAndSmoothed();
    void lossChartAxesAndScale();
    void probeChartShowsSequences();
    void memoryChartMarksOoms();
    void chartsShowALanePerRank();
    void zoomPausesFollowLive();
    void wallTimeChartsZoomTogether();
    void lossChartMarksValidations();
    void runsPanelComparesRuns();
    void chartsExportPng();
    void chartMenusExportTheirSeries();
    void throughputAxisInThousands();
    void speedChartShowsTheSearch();
    void accumulationFillsAndReplays();
    void eventLogFiltersAndCopies();
    void aboutLeavesACpuForTheWindow();
};

void TestWidgets::planCaption_data() {
    QTest::addColumn<qint64>("target");
    QTest::addColumn<qint64>("micro");
    QTest::addColumn<QString>("caption");
    QTest::newRow("even") << qint64(4096) << qint64(128)
                          << QStringLiteral("4096 = 32 × 128 (micro-batch 128, 32 accumulation steps)");
    QTest::newRow("uneven split evenly") << qint64(100) << qint64(32)
                                         << QStringLiteral("100 = 4 × 25 (micro-batch 32, 4 accumulation steps)");
    QTest::newRow("sizes differ by one") << qint64(1000) << qint64(96)
                                         << QStringLiteral(
                                                "1000 = 10 × 91 + 1 × 90 (micro-batch 96, 11 accumulation steps)");
    QTest::newRow("fits at once") << qint64(64) << qint64(64)
                                  << QStringLiteral("64 = 1 × 64 (micro-batch 64, 1 accumulation steps)");
}

void TestWidgets::planCaption() {
    QFETCH(qint64, target);
    QFETCH(qint64, micro);
    QFETCH(QString, caption);
    QCOMPARE(ui::planCaption(target, micro), caption);
}

void TestWidgets::lossChartDrawsRawAndSmoothed() {
    ui::LossChart chart;
    chart.resize(600, 400);
    chart.show();
    for (int i = 1; i <= 5000; ++i) chart.handle(step(i, 2.0 / std::sqrt(i) + (i % 2 ? 0.2 : -0.2)));
    chart.redraw();
    QCOMPARE(chart.rawStore().rawCount(), std::size_t(5000));
    QCOMPARE(chart.smoothedStore().rawCount(), std::size_t(5000));
    // Thinned to about two points per pixel column, not 5000.
    QVERIFY(chart.drawnPointCount() > 50);
    QVERIFY2(chart.drawnPointCount() < 2 * 600 + 4, qPrintable(QString::number(chart.drawnPointCount())));
    // The smoothed line is computed on raw data: much less noisy than the ±0.2 alternation.
    const auto& smooth = chart.smoothedStore().points();
    const double jump = std::abs(smooth[4000].y() - smooth[4001].y());
    QVERIFY2(jump < 0.1, qPrintable(QString::number(jump)));
    chart.setSmoothing(0.0);  // recomputed from the raw values
    const auto& raw = chart.smoothedStore().points();
    QCOMPARE(raw[4000].y(), chart.rawStore().points()[4000].y());
}

void TestWidgets::lossChartAxesAndScale() {
    ui::LossChart chart;
    chart.resize(600, 400);
    chart.show();
    for (int i = 1; i <= 100; ++i) chart.handle(step(i, 1.0 / i));
    chart.setXAxis(ui::LossChart::XAxis::Samples);
    QCOMPARE(chart.rawStore().maxX(), 100.0 * 256);
    chart.setXAxis(ui::LossChart::XAxis::WallTime);
    QCOMPARE(chart.rawStore().maxX(), 10.0);
    chart.setLogScale(true);
    QVERIFY(chart.logScale());
    chart.redraw();
    chart.setLogScale(false);
    chart.redraw();
    QCOMPARE(chart.smoothedStore().rawCount(), std::size_t(100));
}

void TestWidgets::probeChartShowsSequences() {
    ui::ProbeChart chart;
    chart.resize(600, 400);
    chart.show();
    for (const auto& e : probe(1, 64, 0)) chart.handle(e);
    QCOMPARE(chart.sequenceCount(), 1);
    QCOMPARE(chart.trialCount(), 7);  // 1, 2, 4, ..., 64
    QCOMPARE(chart.chosenMicroBatch(), qint64(32));
    for (const auto& e : probe(2, 128, 5)) chart.handle(e);
    chart.redraw();
    QCOMPARE(chart.sequenceCount(), 2);
    QCOMPARE(chart.trialCount(), 15);
    QCOMPARE(chart.chosenMicroBatch(), qint64(64));
    chart.setXAxis(ui::ProbeChart::XAxis::WallTime);
    chart.redraw();
    chart.clear();
    QCOMPARE(chart.trialCount(), 0);
}

void TestWidgets::memoryChartMarksOoms() {
    ui::MemoryChart chart;
    chart.resize(600, 400);
    chart.show();
    for (int i = 0; i < 2000; ++i)
        chart.handle(core::MemorySample{i * 0.01, (10 + i % 40) * kMiB, (10 + i % 40) * kMiB, (12 + i % 40) * kMiB,
                                        64 * kMiB, 60 * kMiB});
    core::OomEvent oom;
    oom.time = 7.5;
    oom.step = 12;
    oom.phase = core::Phase::Backward;
    oom.microBatch = 48;
    oom.requestedBytes = 6 * kMiB;
    oom.recovered = true;
    oom.newMicroBatch = 32;
    chart.handle(oom);
    chart.redraw();
    QCOMPARE(chart.allocatedStore().rawCount(), std::size_t(2000));
    QCOMPARE(chart.oomMarkerCount(), 1);
    const QString tip = chart.oomText(0);
    QVERIFY2(tip.contains(QLatin1String("backward")), qPrintable(tip));
    QVERIFY(tip.contains(QLatin1String("micro-batch 48")));
    QVERIFY(tip.contains(QLatin1String("6.0 MiB")) || tip.contains(QLatin1String("6.00 MiB")));
}

void TestWidgets::chartsShowALanePerRank() {
    // Several devices: this window trains rank 0, whose probe and memory the charts show in detail;
    // each other rank gets a lane of its own from the steps' exchange — its micro-batch (a step
    // line that changes where the rank's micro-batch changed) and its device's peak per step.
    ui::ChartsPanel panel;
    panel.resize(1200, 800);
    panel.show();
    for (const auto& e : probe(1, 64, 0)) panel.handle(e);
    const auto stepped = [](int64_t step, int64_t second, int64_t third) {
        core::RanksStepped r;
        r.time = 1.0 + static_cast<double>(step);
        r.step = step;
        r.ranks = {{0, "virtual:64MiB", 256, 32, 8, 1, 256, 0, 50 * kMiB, 0, true},
                   {1, "virtual:12MiB", 128, second, 4, 1, 128, 0, (8 + step) * kMiB, 0, true},
                   {2, "virtual:192MiB", 640, third, 2, 1, 640, 0, (100 + step) * kMiB, 0, true}};
        return r;
    };
    panel.handle(stepped(1, 16, 320));
    panel.handle(stepped(2, 16, 320));
    panel.handle(stepped(3, 12, 320));  // rank 1 recovered from an OOM at a smaller size
    panel.redrawNow();

    ui::ProbeChart* probeChart = panel.probeChart();
    QCOMPARE(probeChart->rankLaneCount(), 2);  // ranks 1 and 2; rank 0 is the chart's own
    QCOMPARE(probeChart->rankMicroBatch(1), qint64(12));
    QCOMPARE(probeChart->rankMicroBatch(2), qint64(320));
    QCOMPARE(probeChart->rankMicroBatch(0), qint64(0));
    QCOMPARE(probeChart->rankChangeSteps(1), (QList<qint64>{1, 3}));
    QCOMPARE(probeChart->rankChangeSteps(2), (QList<qint64>{1}));
    QVERIFY2(probeChart->rankLaneName(2).contains(QLatin1String("virtual:192MiB")),
             qPrintable(probeChart->rankLaneName(2)));
    QCOMPARE(probeChart->chosenMicroBatch(), qint64(32));  // rank 0's probe, as before

    ui::MemoryChart* memoryChart = panel.memoryChart();
    QCOMPARE(memoryChart->rankLaneCount(), 2);
    const ui::SeriesStore* peaks = memoryChart->rankPeaks(2);
    QVERIFY(peaks != nullptr);
    QCOMPARE(peaks->rawCount(), std::size_t(3));
    QCOMPARE(peaks->last(), QPointF(4.0, 103.0));  // step 3 ended at 4 s with a 103 MiB peak
    QCOMPARE(memoryChart->rankPeaks(1)->last(), QPointF(4.0, 11.0));
    QVERIFY(memoryChart->rankPeaks(0) == nullptr);
    QCOMPARE(memoryChart->rankLaneName(1), QStringLiteral("rank 1"));
    QVERIFY2(memoryChart->captionText().contains(QLatin1String("rank 0's")), qPrintable(memoryChart->captionText()));

    // Each lane has its own colour, and a line series on the chart that holds its points.
    const auto lanesOf = [](ui::LiveChart* chart, const QString& prefix) {
        QList<QXYSeries*> found;
        for (QAbstractSeries* s : chart->chartView()->chart()->series())
            if (s->name().startsWith(prefix)) found.append(qobject_cast<QXYSeries*>(s));
        return found;
    };
    for (ui::LiveChart* chart : {static_cast<ui::LiveChart*>(probeChart), static_cast<ui::LiveChart*>(memoryChart)}) {
        const auto lanes = lanesOf(chart, QStringLiteral("rank "));
        QCOMPARE(lanes.size(), 2);
        QVERIFY(lanes[0]->pen().color() != lanes[1]->pen().color());
        QVERIFY(lanes[0]->count() > 0 && lanes[1]->count() > 0);
    }

    panel.probeChart()->clear();
    panel.memoryChart()->clear();
    QCOMPARE(probeChart->rankLaneCount(), 0);
    QCOMPARE(memoryChart->rankLaneCount(), 0);
    QVERIFY(!memoryChart->captionText().contains(QLatin1String("rank")));
    QCOMPARE(lanesOf(memoryChart, QStringLiteral("rank ")).size(), 0);
}

void TestWidgets::zoomPausesFollowLive() {
    ui::ChartsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    for (int i = 1; i <= 200; ++i) panel.handle(step(i, 1.0 / i));
    panel.redrawNow();
    QVERIFY(panel.followLive());
    QSignalSpy spy(&panel, &ui::ChartsPanel::followLiveChanged);
    panel.lossChart()->zoomTo(QRectF(QPointF(10, 0), QPointF(50, 1)));
    QVERIFY(!panel.lossChart()->followLive());
    QVERIFY(!panel.followLive());
    QCOMPARE(spy.count(), 1);
    QCOMPARE(spy.last().first().toBool(), false);
    // More data does not move a paused chart.
    for (int i = 201; i <= 400; ++i) panel.handle(step(i, 1.0 / i));
    panel.redrawNow();
    QCOMPARE(panel.lossChart()->xAxis()->max(), 50.0);
    QCOMPARE(panel.lossChart()->rawStore().size(), std::size_t{400});  // kept while zoomed
    // The button (and View > Follow live) resumes, and shows what arrived meanwhile.
    panel.setFollowLive(true);
    QVERIFY(panel.followLive());
    QCOMPARE(spy.last().first().toBool(), true);
    panel.redrawNow();
    QVERIFY(panel.lossChart()->xAxis()->max() >= 400.0);
}

void TestWidgets::wallTimeChartsZoomTogether() {
    ui::ChartsPanel panel;
    panel.resize(1200, 800);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    for (int i = 1; i <= 300; ++i) {
        panel.handle(step(i, 1.0 / i));
        panel.handle(core::MemorySample{0.1 * i, 10 * kMiB, 10 * kMiB, 20 * kMiB, 64 * kMiB, 60 * kMiB});
    }
    panel.redrawNow();
    ui::LiveChart* memory = panel.charts()[2];
    ui::LiveChart* throughput = panel.charts()[3];
    QVERIFY(memory->timeAxis() && throughput->timeAxis() && !panel.lossChart()->timeAxis());
    // The wheel over the throughput chart zooms it, and the memory chart shows the same span;
    // the loss chart (x: optimizer steps) keeps following.
    const double before = throughput->xAxis()->max() - throughput->xAxis()->min();
    QWidget* view = throughput->chartView()->viewport();
    const QPointF centre(view->width() / 2.0, view->height() / 2.0);
    QWheelEvent wheel(centre, view->mapToGlobal(centre), QPoint(), QPoint(0, 120), Qt::NoButton, Qt::NoModifier,
                      Qt::NoScrollPhase, false);
    QApplication::sendEvent(view, &wheel);
    const double x0 = throughput->xAxis()->min();
    const double x1 = throughput->xAxis()->max();
    QVERIFY2(x1 - x0 < 0.9 * before, qPrintable(QStringLiteral("%1 .. %2 of %3 s").arg(x0).arg(x1).arg(before)));
    QVERIFY(!throughput->followLive() && !memory->followLive());
    QCOMPARE(memory->xAxis()->min(), x0);
    QCOMPARE(memory->xAxis()->max(), x1);
    QVERIFY(panel.lossChart()->followLive());
    // Panning the memory chart (middle button) moves both.
    QWidget* memoryView = memory->chartView()->viewport();
    const QPoint from(memoryView->width() / 2, memoryView->height() / 2);
    QTest::mousePress(memoryView, Qt::MiddleButton, Qt::NoModifier, from);
    QMouseEvent move(QEvent::MouseMove, QPointF(from + QPoint(60, 0)),
                     memoryView->mapToGlobal(QPointF(from + QPoint(60, 0))), Qt::NoButton, Qt::MiddleButton,
                     Qt::NoModifier);
    QApplication::sendEvent(memoryView, &move);
    QTest::mouseRelease(memoryView, Qt::MiddleButton, Qt::NoModifier, from + QPoint(60, 0));
    QVERIFY2(memory->xAxis()->min() < x0, "dragging right shows earlier times");
    QCOMPARE(throughput->xAxis()->min(), memory->xAxis()->min());
    // A double click follows live again, in both.
    QTest::mouseDClick(memoryView, Qt::LeftButton, Qt::NoModifier, from);
    QVERIFY(memory->followLive());
    QVERIFY(throughput->followLive());
}

void TestWidgets::lossChartMarksValidations() {
    ui::LossChart chart;
    for (int i = 1; i <= 20; ++i) chart.handle(step(i, 2.0 / i));
    core::ValidationDone v;
    v.time = 1.0;
    v.step = 10;
    v.samplesSeen = 2560;
    v.loss = 0.4;
    v.accuracy = 0.875;
    chart.handle(v);
    v.time = 2.0;
    v.step = 20;
    v.samplesSeen = 5120;
    v.loss = 0.3;
    chart.handle(v);
    QCOMPARE(chart.validationStore().size(), std::size_t{2});
    QCOMPARE(chart.validationStore().points().back(), QPointF(20, 0.3));
    chart.setXAxis(ui::LossChart::XAxis::Samples);
    QCOMPARE(chart.validationStore().points().front(), QPointF(2560, 0.4));
    chart.setXAxis(ui::LossChart::XAxis::WallTime);
    QCOMPARE(chart.validationStore().points().back(), QPointF(2.0, 0.3));
    QVERIFY(chart.timeAxis());
    chart.clear();
    QCOMPARE(chart.validationStore().size(), std::size_t{0});
}

void TestWidgets::runsPanelComparesRuns() {
    // Two recorded runs with different target batches (64 and 256), validated every 2 steps.
    QTemporaryDir dir;
    const auto record = [&](int64_t target, double accuracyGain, std::time_t when) {
        core::TrainerOptions o;
        o.model.name = "mlp";
        o.targetBatch = target;
        auto folder = core::RunFolder::create(dir.path().toStdString(), o, when);
        if (!folder) qFatal("%s", folder.error().c_str());
        core::RunSummary s;
        s.model = "mlp";
        s.dataset = "synthetic";
        s.targetBatch = target;
        (*folder)->onEvent(s);
        for (int n = 1; n <= 6; ++n) {
            core::StepMetrics m = step(n, 1.0 / n);
            m.targetBatch = target;
            m.samplesSeen = n * target;
            (*folder)->onEvent(m);
            if (n % 2 == 0) {
                core::ValidationDone v;
                v.time = m.time;
                v.step = n;
                v.samplesSeen = m.samplesSeen;
                v.loss = 1.0 / n;
                v.accuracy = std::min(1.0, accuracyGain * n);
                (*folder)->onEvent(v);
            }
        }
        (*folder)->onEvent(core::RunStateChanged{1.0, core::RunState::Finished, "done"});
        return QString::fromStdString((*folder)->path());
    };
    const QString small = record(64, 0.1, 1'700'000'000);
    const QString large = record(256, 0.15, 1'700'000'100);
    ui::RunsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    panel.setRunsDirectory(dir.path());
    QCOMPARE(panel.folders(), (QStringList{large, small}));  // newest first
    // Sorting by best validation accuracy (0.6 and 0.9), ascending: the small batch first.
    panel.table()->sortItems(7, Qt::AscendingOrder);
    QCOMPARE(panel.folders(), (QStringList{small, large}));
    QCOMPARE(panel.table()->item(0, 7)->text(), QStringLiteral("60.0%"));
    // Ticking both overlays them: validation accuracy on the samples-seen axis.
    panel.setCompared(small, true);
    panel.setCompared(large, true);
    ui::CompareChart* chart = panel.chart();
    chart->setMetric(ui::CompareChart::Metric::ValidationAccuracy);
    chart->setXAxis(ui::CompareChart::XAxis::Samples);
    QCOMPARE(chart->overlayCount(), std::size_t{2});
    const auto first = chart->overlayPoints(0);  // the small batch (table order)
    const auto second = chart->overlayPoints(1);
    QCOMPARE(first.size(), std::size_t{3});
    QCOMPARE(first.back().x(), 6.0 * 64);
    QVERIFY(std::abs(first.back().y() - 0.6) < 1e-12);
    QCOMPARE(second.back().x(), 6.0 * 256);
    QVERIFY(std::abs(second.back().y() - 0.9) < 1e-12);
    // The live run is drawn with them.
    core::ValidationDone live;
    live.step = 2;
    live.samplesSeen = 200;
    live.accuracy = 0.3;
    chart->handle(live);
    QCOMPARE(chart->livePoints().size(), std::size_t{1});
    QCOMPARE(chart->livePoints().front(), QPointF(200, 0.3));
    chart->redraw();
    // Rename and delete, but never the live run's folder.
    QVERIFY(panel.renameRun(small, QStringLiteral("batch 64")));
    QCOMPARE(panel.table()->item(panel.folders().indexOf(small), 1)->text(), QStringLiteral("batch 64"));
    panel.setLiveFolder(large);
    QVERIFY(!panel.deleteRun(large));
    QVERIFY2(panel.errorText().contains(QStringLiteral("still running")), qPrintable(panel.errorText()));
    panel.setLiveFolder(QString());
    QVERIFY(panel.deleteRun(large));
    QCOMPARE(panel.folders(), QStringList{small});
    QVERIFY(!QDir(large).exists());
    QCOMPARE(chart->overlayCount(), std::size_t{1});  // the ticked run that is left
}

void TestWidgets::chartsExportPng() {
    ui::ChartsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    for (int i = 1; i <= 50; ++i) panel.handle(step(i, 1.0 / i));
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QStringList failed;
    const QStringList files = panel.exportAll(dir.path(), &failed);
    QCOMPARE(files.size(), 7);  // four live charts, the speed chart, the memory fit and the breakdown bar
    QVERIFY2(failed.isEmpty(), qPrintable(failed.join(QLatin1Char(' '))));
    for (const QString& file : files) {
        QImage image(file);
        QVERIFY2(!image.isNull(), qPrintable(file));
        QVERIFY(image.width() > 100);
    }
}

void TestWidgets::chartMenusExportTheirSeries() {
    ui::ChartsPanel panel;
    panel.resize(1000, 700);
    panel.show();
    for (int i = 1; i <= 50; ++i) panel.handle(step(i, 1.0 / i));
    panel.redrawNow();
    QSignalSpy requested(&panel, &ui::ChartsPanel::exportDataRequested);
    const auto& names = core::exportedSeries();
    const QList<std::pair<ui::LiveChart*, QString>> charts = {
        {panel.lossChart(), QStringLiteral("train_loss")},
        {panel.probeChart(), QStringLiteral("probe_fit_peak_bytes")},
        {panel.memoryChart(), QStringLiteral("memory_allocated_bytes")},
        {panel.throughputChart(), QStringLiteral("samples_per_second")},
        {panel.memoryFitChart(), QStringLiteral("probe_fit_peak_bytes")},
        {panel.speedChart(), QStringLiteral("timed_samples_per_second")},
    };
    for (const auto& [chart, mainSeries] : charts) {
        const QStringList series = chart->dataSeries();
        QVERIFY2(series.contains(mainSeries), qPrintable(chart->title()));
        for (const QString& name : series)  // names the exported table really uses
            QVERIFY2(std::find(names.begin(), names.end(), name.toStdString()) != names.end(), qPrintable(name));
        std::unique_ptr<QMenu> menu(chart->createContextMenu(nullptr));
        auto* exportData = menu->findChild<QAction*>(QStringLiteral("exportDataAction"));
        QVERIFY2(exportData, qPrintable(chart->title()));
        QVERIFY(menu->findChild<QAction*>(QStringLiteral("exportPngAction")));
        exportData->trigger();
        QCOMPARE(requested.count(), 1);
        QCOMPARE(requested.last().at(0).toStringList(), series);
        QVERIFY(requested.last().at(1).toString().endsWith(QLatin1String(".csv")));
        requested.clear();
    }
    // The compare chart overlays other runs: its data is exported per run (--export-csv), not here.
    std::unique_ptr<QMenu> compare(panel.runsPanel()->chart()->createContextMenu(nullptr));
    QVERIFY(!compare->findChild<QAction*>(QStringLiteral("exportDataAction")));

    // The menu's Follow live resumes a zoomed chart.
    panel.lossChart()->zoomTo(QRectF(QPointF(10, 0), QPointF(20, 1)));
    std::unique_ptr<QMenu> menu(panel.lossChart()->createContextMenu(nullptr));
    auto* follow = menu->findChild<QAction*>(QStringLiteral("followLiveAction"));
    QVERIFY(follow && !follow->isChecked());
    follow->trigger();
    QVERIFY(panel.lossChart()->followLive());

    // A right click on the chart opens that menu (and no longer zooms out or resumes by itself).
    panel.lossChart()->zoomTo(QRectF(QPointF(10, 0), QPointF(20, 1)));
    QWidget* viewport = panel.lossChart()->chartView()->viewport();
    QTest::mouseClick(viewport, Qt::RightButton, {}, viewport->rect().center());
    QTRY_VERIFY(qobject_cast<QMenu*>(QApplication::activePopupWidget()));
    auto* popup = qobject_cast<QMenu*>(QApplication::activePopupWidget());
    QVERIFY(popup->findChild<QAction*>(QStringLiteral("exportDataAction")));
    QVERIFY(!panel.lossChart()->followLive());
    popup->close();
}

void TestWidgets::throughputAxisInThousands() {
    ui::ThroughputChart chart;
    chart.resize(640, 400);
    chart.show();
    // 2,000 samples/s (step()): the left axis counts whole thousands, the points are drawn in
    // them, and the store keeps the measured values.
    for (int i = 1; i <= 20; ++i) chart.handle(step(i, 1.0));
    chart.redraw();
    QCOMPARE(chart.rateUnit(), 1000.0);
    QCOMPARE(chart.rateAxis()->labelFormat(), QStringLiteral("%.0fk"));
    QCOMPARE(chart.rateAxis()->max(), 3.0);  // 2,000 and 4% headroom: ticks 0k, 1k, 2k, 3k
    QCOMPARE(chart.rateAxis()->tickCount(), 4);
    auto* line = qobject_cast<QXYSeries*>(chart.chart()->series().first());
    QVERIFY(line && !line->points().isEmpty());
    for (const QPointF& p : line->points()) QCOMPARE(p.y(), 2.0);
    QCOMPARE(chart.throughputStore().maxY(), 2000.0);
    // 26,000 samples/s: ticks every 10k.
    core::StepMetrics fast = step(21, 1.0);
    fast.samplesPerSecond = 26'000;
    chart.handle(fast);
    chart.redraw();
    QCOMPARE(chart.rateAxis()->max(), 30.0);
    QCOMPARE(chart.rateAxis()->tickCount(), 4);
    // A slower run starts again in samples per second.
    chart.clear();
    for (int i = 1; i <= 20; ++i) {
        core::StepMetrics m = step(i, 1.0);
        m.samplesPerSecond = 640;
        chart.handle(m);
    }
    chart.redraw();
    QCOMPARE(chart.rateUnit(), 1.0);
    QCOMPARE(chart.rateAxis()->labelFormat(), QStringLiteral("%.0f"));
    QVERIFY(chart.rateAxis()->max() >= 640.0);
}

void TestWidgets::speedChartShowsTheSearch() {
    ui::SpeedChart chart;
    chart.resize(800, 500);
    chart.show();
    core::ProbeStarted started;
    started.sequence = 1;
    core::ProbeFinished finished;
    finished.sequence = 1;
    finished.microBatch = 256;
    chart.handle(started);
    chart.handle(finished);
    QVERIFY2(chart.caption().contains(QLatin1String("Nothing timed")), qPrintable(chart.caption()));
    // The search: 256 warm-up then 2000/s, 128 at 3000/s (its median moves), 64 at 2500/s.
    const QList<core::ThroughputTimed> timed = {{1.0, 1, 256, 0, 0},    {1.1, 1, 256, 2000, 1}, {1.2, 1, 128, 0, 0},
                                                {1.3, 1, 128, 2900, 1}, {1.4, 1, 128, 3000, 2}, {1.5, 1, 64, 0, 0},
                                                {1.6, 1, 64, 2500, 1}};
    for (const core::ThroughputTimed& t : timed) chart.handle(t);
    QVERIFY2(chart.caption().contains(QLatin1String("Timing")), qPrintable(chart.caption()));
    QCOMPARE(chart.candidates().size(), size_t(3));  // one per size, not per timing
    QCOMPARE(chart.candidates()[1].samplesPerSecond, 3000.0);
    QCOMPARE(chart.candidates()[1].repetitions, 2);
    core::ThroughputChosen chosen;
    chosen.sequence = 1;
    chosen.microBatch = 128;
    chosen.largestMicroBatch = 256;
    chosen.reason = "micro-batch 128 at 3000 samples/s";
    chart.handle(chosen);
    chart.redraw();
    QCOMPARE(chart.chosenMicroBatch(), qint64(128));
    QVERIFY2(chart.caption().contains(QLatin1String("Chose 128 over the largest that fits (256)")),
             qPrintable(chart.caption()));
    // A new probe starts a new search.
    started.sequence = 2;
    chart.handle(started);
    QVERIFY(chart.candidates().empty());
    QCOMPARE(chart.chosenMicroBatch(), qint64(0));
}

void TestWidgets::accumulationFillsAndReplays() {
    ui::AccumulationView view;
    view.resize(800, 80);
    view.show();
    view.setPlan(ui::RunPlan{64, 4, 256});  // from the run model
    QCOMPARE(view.caption(), QStringLiteral("Training batch: 256 = 4 × 64 (micro-batch 64, 4 accumulation steps)"));
    const auto micro = [](int64_t stepNumber, int64_t index, int64_t offset, int64_t size) {
        core::MicroBatchDone m;
        m.step = stepNumber;
        m.index = index;
        m.offset = offset;
        m.size = size;
        m.targetBatch = 256;
        return m;
    };
    view.handle(micro(1, 0, 0, 64));
    view.handle(micro(1, 1, 64, 64));
    QCOMPARE(view.filledSamples(), qint64(128));
    core::OomEvent oom;
    oom.step = 1;
    oom.microBatch = 64;
    oom.recovered = true;
    oom.newMicroBatch = 32;
    view.handle(oom);
    view.handle(micro(1, 0, 0, 32));  // replay from the start at the smaller size
    QCOMPARE(view.replays(), 1);
    QCOMPARE(view.filledSamples(), qint64(32));
    view.handle(core::OptimizerStepped{1, 1, 8});
    view.handle(micro(2, 0, 0, 32));
    QCOMPARE(view.replays(), 0);
    view.repaint();
}

void TestWidgets::eventLogFiltersAndCopies() {
    ui::EventLog log;
    QList<core::Event> events = probe(1, 16, 0);
    events.append(core::MemorySample{});  // not logged
    events.append(core::DeviceSwitched{1.0, "virtual:64MiB", "virtual:256MiB"});
    events.append(core::ErrorEvent{2.0, "the model does not fit", "setup"});
    log.addEvents(events);
    QCOMPARE(log.model()->rowCount(), 5 + 2 + 2);  // 5 trials, start/finish, switch, error
    log.setKindFilter(QStringLiteral("OOM"));
    QCOMPARE(log.visibleRowCount(), 0);
    log.setKindFilter(QStringLiteral("probe trial"));
    QCOMPARE(log.visibleRowCount(), 5);
    log.setKindFilter(QString());
    log.setFilterText(QStringLiteral("256MiB"));
    QCOMPARE(log.visibleRowCount(), 1);
    log.copySelection();
    const QString copied = QApplication::clipboard()->text();
    QVERIFY2(copied.contains(QStringLiteral("device switch\tvirtual:64MiB → virtual:256MiB")), qPrintable(copied));
    log.setFilterText(QString());
    QCOMPARE(log.visibleRowCount(), 9);

    // A turn of the check on whole batches is a row of its own, with the turn's ratio, the
    // median so far and how well it is known.
    log.addEvents({core::ThroughputChecked{3.0, 1, 22, 64, 12, 1.041, 1.035, 1.012, 1.061}});
    log.setFilterText(QStringLiteral("turn 12"));
    QCOMPARE(log.visibleRowCount(), 1);
    log.copySelection();
    const QString turn = QApplication::clipboard()->text();
    QVERIFY2(turn.contains(QStringLiteral("throughput\twhole batches of 22 and 64, turn 12: 1.041× (median 1.035×, "
                                          "with 95% confidence 1.012× to 1.061×)")),
             qPrintable(turn));
}

/// The desktop app leaves one CPU to the GUI thread (it draws the charts with about half a
/// core; docs/PERFORMANCE.md, threads), a headless run uses them all, and a run never gets fewer
/// than one thread. The CPUs are this process's affinity mask, set here. OMP_NUM_THREADS, when it
/// is a positive number, is taken instead (as PyTorch takes it); the test runner sets it, so it is
/// unset here and given back at the end.
void TestWidgets::aboutLeavesACpuForTheWindow() {
    const QByteArray ompThreads = qgetenv("OMP_NUM_THREADS");
    const bool hadOmpThreads = qEnvironmentVariableIsSet("OMP_NUM_THREADS");
    qunsetenv("OMP_NUM_THREADS");
    const std::shared_ptr<void> restoreOmp(nullptr, [&](void*) {
        if (hadOmpThreads)
            qputenv("OMP_NUM_THREADS", ompThreads);
        else
            qunsetenv("OMP_NUM_THREADS");
    });
    cpu_set_t original;
    QCOMPARE(sched_getaffinity(0, sizeof original, &original), 0);
    // Given back however the test ends, so the remaining tests run on every CPU.
    const std::shared_ptr<void> restore(nullptr, [&](void*) { sched_setaffinity(0, sizeof original, &original); });
    const auto restrictTo = [](int cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int cpu = 0; cpu < cpus; ++cpu) CPU_SET(cpu, &set);
        return sched_setaffinity(0, sizeof set, &set) == 0;
    };
    QVERIFY(restrictTo(1));
    QVERIFY2(ui::aboutHtml().contains(QStringLiteral(", 1 intra-op thread")), qPrintable(ui::aboutHtml()));
    QCOMPARE(core::mathLibraries().intraOpThreads, 1);
    qputenv("OMP_NUM_THREADS", "3");
    QCOMPARE(core::mathLibraries().intraOpThreads, 3);
    QVERIFY2(ui::aboutHtml().contains(QStringLiteral(", 3 intra-op threads")), qPrintable(ui::aboutHtml()));
    QCOMPARE(core::mathLibraries(2).intraOpThreads, 2);  // --threads wins over the environment
    for (const char* ignored : {"0", "-2", "many", "", "2x"}) {
        qputenv("OMP_NUM_THREADS", ignored);
        QCOMPARE(core::mathLibraries().intraOpThreads, 1);
    }
    qputenv("OMP_NUM_THREADS", "5,2");  // OpenMP's nested list: the first level's count
    QCOMPARE(core::mathLibraries().intraOpThreads, 5);
    qunsetenv("OMP_NUM_THREADS");
    const bool two = CPU_COUNT(&original) >= 2 && CPU_ISSET(0, &original) && CPU_ISSET(1, &original) && restrictTo(2);
    if (two) {
        QVERIFY2(ui::aboutHtml().contains(QStringLiteral(", 1 intra-op thread")), qPrintable(ui::aboutHtml()));
        QVERIFY(!ui::aboutHtml().contains(QStringLiteral("intra-op threads")));
        QCOMPARE(core::mathLibraries().intraOpThreads, 2);
        QCOMPARE(core::mathLibraries(3).intraOpThreads, 3);  // asked for: given
        qputenv("OMP_NUM_THREADS", "1");                     // one of two CPUs, as a shared machine's share
        QCOMPARE(core::mathLibraries().intraOpThreads, 1);
        qunsetenv("OMP_NUM_THREADS");
    }
    if (!two) QSKIP("this machine lets the test use fewer than CPUs 0 and 1: the two-CPU case was not checked");
}

}  // namespace tst_widgets

BATCHPILOT_TEST_MAIN(tst_widgets::TestWidgets)
#include "tst_widgets.moc"
