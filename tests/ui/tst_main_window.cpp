#include <QtTest>
#include "tests/test_main.h"

#include <optional>

#include <QAction>
#include <QComboBox>
#include <QDir>
#include <QFileInfo>
#include <QLineEdit>
#include <QProcess>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTemporaryDir>

#include "core/events/events.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/segments_view.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/runs_panel.h"
#include <QTabWidget>
#include <QTableWidget>
#include "ui/charts/speed_chart.h"
#include "ui/config/demo_options.h"
#include "ui/log/event_log.h"
#include "ui/window/main_window.h"
#include "ui/config/run_panel.h"
#include "ui/session/trainer_controller.h"
#include "ui/window/savers_view.h"

namespace tst_main_window {

using namespace batchpilot;

namespace {

constexpr int kTimeout = 300'000;  // ms; the trainer runs on the CPU of a shared test machine

/// The most recent event of type T the window received, or nullopt.
template <class T>
std::optional<T> lastEvent(const ui::MainWindow& w) {
    const auto& events = w.record().events();
    for (auto it = events.rbegin(); it != events.rend(); ++it)
        if (const auto* e = std::get_if<T>(&*it)) return *e;
    return std::nullopt;
}

std::optional<core::ProbeFinished> lastProbe(const ui::MainWindow& w) {
    return lastEvent<core::ProbeFinished>(w);
}

bool hasEvent(const ui::MainWindow& w, auto predicate) {
    for (const auto& event : w.record().events())
        if (predicate(event)) return true;
    return false;
}

QString screenshotPath(const QString& name) {
    // The build tree, next to the test executable, so a person can open it after a run.
    return QDir(QCoreApplication::applicationDirPath()).filePath(name);
}

}  // namespace

class TestMainWindow : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void demoEndToEnd();
    void modelTooBigKeepsWindowUsable();
    void invalidInputsDisableStart();
    void exportsFiles();
    void configurationsAndResume();
    void comparesRunsWithDifferentTargetBatches();
    void memorySaversPanelMeasuresAndApplies();
    void savesAMemorySnapshotOfTheVirtualGpu();

private:
    static void startDemo(ui::MainWindow& w, int64_t steps = 100000) {
        core::TrainerOptions options = ui::demoOptions();
        options.steps = steps;
        // The check of a fastest size on whole batches spans 20 s of training by default; 3 s
        // still runs it (its turns, its decision) without waiting out the default twice.
        options.probe.checkSeconds = 3;
        w.runPanel()->setOptions(options);
        QVERIFY2(w.runPanel()->isValid(), qPrintable(w.runPanel()->problem()));
        QTest::mouseClick(w.runPanel()->startButton(), Qt::LeftButton);
        QVERIFY(w.controller()->isRunning());
    }
};

void TestMainWindow::initTestCase() {
    QStandardPaths::setTestModeEnabled(true);  // keep the user's settings out of it
    QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotTests"));
    QCoreApplication::setApplicationName(QStringLiteral("tst_main_window"));
    QSettings().clear();
}

void TestMainWindow::demoEndToEnd() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    QSignalSpy batches(w.controller(), &ui::TrainerController::eventsReceived);
    QElapsedTimer clock;
    clock.start();

    startDemo(w);
    auto* charts = w.chartsPanel();
    // Loss, probe and memory charts fill, and the caption states the plan.
    QTRY_VERIFY_WITH_TIMEOUT(charts->lossChart()->rawStore().rawCount() >= 3, kTimeout);
    QVERIFY(charts->probeChart()->trialCount() > 0);
    QVERIFY(!charts->memoryChart()->allocatedStore().isEmpty());
    QVERIFY2(w.accumulationView()->caption().contains(QLatin1String("accumulation steps")),
             qPrintable(w.accumulationView()->caption()));
    // The demo is chosen so the probe runs out of memory and the target needs accumulation.
    const auto first = lastProbe(w);
    QVERIFY(first.has_value());
    QVERIFY2(first->accumulationSteps > 1, qPrintable(QString::number(first->accumulationSteps)));
    QVERIFY2(charts->memoryChart()->oomMarkerCount() > 0, "the demo probe hit no OOM");
    QVERIFY(w.eventLog()->model()->rowCount() > 0);

    // Re-probe: a new probe sequence appears, the run goes on.
    const int sequences = charts->probeChart()->sequenceCount();
    QTest::mouseClick(w.runPanel()->reprobeButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(charts->probeChart()->sequenceCount() > sequences, kTimeout);
    QTRY_VERIFY_WITH_TIMEOUT(lastProbe(w)->sequence > first->sequence, kTimeout);
    QVERIFY(hasEvent(w, [](const core::Event& e) {
        const auto* p = std::get_if<core::ProbeStarted>(&e);
        return p && p->reason == core::ProbeReason::UserRequest;
    }));

    // Mid-run screenshot at 1280×800 on the demo's small GPU (OOMs, accumulation), for a person
    // to look at; the README's screenshot is this one.
    {
        const std::size_t now = charts->lossChart()->rawStore().rawCount();
        QTRY_VERIFY_WITH_TIMEOUT(charts->lossChart()->rawStore().rawCount() >= now + 3, kTimeout);
    }
    charts->redrawNow();
    QTest::qWait(50);  // let the scene lay out what the redraw changed (axis ticks) before the grab
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-light.png"))));
    w.resize(1600, 1000);  // the size a person looks at it on a desktop
    QTest::qWait(50);
    charts->redrawNow();
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-1600x1000.png"))));
    // The fastest-micro-batch search decides within the run's first seconds, and the tab shows it.
    QTRY_VERIFY_WITH_TIMEOUT(charts->speedChart()->chosenMicroBatch() > 0, kTimeout);
    QVERIFY2(charts->speedChart()->caption().contains(QString::number(charts->speedChart()->chosenMicroBatch())),
             qPrintable(charts->speedChart()->caption()));
    charts->tabs()->setCurrentWidget(charts->speedChart());
    charts->redrawNow();
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-fastest.png"))));
    charts->tabs()->setCurrentIndex(0);
    w.resize(1280, 800);

    // A larger virtual GPU mid-run: the micro-batch grows, accumulation steps shrink.
    const auto before = *lastProbe(w);
    w.runPanel()->virtualSizeEdit()->setText(QStringLiteral("512MiB"));
    Q_EMIT w.runPanel()->virtualSizeEdit()->editingFinished();
    QTRY_VERIFY_WITH_TIMEOUT(hasEvent(w,
                                      [](const core::Event& e) {
                                          const auto* s = std::get_if<core::DeviceSwitched>(&e);
                                          return s && s->to == "virtual:512MiB";
                                      }),
                             kTimeout);
    QTRY_VERIFY_WITH_TIMEOUT(lastProbe(w)->sequence > before.sequence, kTimeout);
    const auto after = *lastProbe(w);
    QVERIFY2(after.microBatch > before.microBatch,
             qPrintable(QStringLiteral("%1 -> %2").arg(before.microBatch).arg(after.microBatch)));
    QVERIFY(after.accumulationSteps < before.accumulationSteps);
    const std::size_t stepsBefore = charts->lossChart()->rawStore().rawCount();
    QTRY_VERIFY_WITH_TIMEOUT(charts->lossChart()->rawStore().rawCount() > stepsBefore + 1, kTimeout);
    // Then the fastest search after that probe decides, and the accumulation view shows its choice
    // (it may start from the size chosen before and never run the probe's largest).
    QTRY_VERIFY_WITH_TIMEOUT(
        lastEvent<core::ThroughputChosen>(w).value_or(core::ThroughputChosen{}).sequence == after.sequence, kTimeout);
    const auto chosenAfter = *lastEvent<core::ThroughputChosen>(w);
    QVERIFY(chosenAfter.microBatch <= after.microBatch);
    QTRY_VERIFY_WITH_TIMEOUT(
        w.accumulationView()->caption().contains(QStringLiteral("micro-batch %1,").arg(chosenAfter.microBatch)),
        kTimeout);

    // The same window in the dark palette, after the switch.
    w.setTheme(ui::Theme::Dark);
    charts->redrawNow();
    QTest::qWait(100);
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-dark.png"))));
    w.setTheme(ui::Theme::Light);

    // Coalescing: the GUI got the events in a few batches per frame, not one call per event.
    const double seconds = clock.elapsed() / 1000.0;
    qsizetype events = 0;
    for (const auto& args : std::as_const(batches)) events += args.first().value<QList<core::Event>>().size();
    QVERIFY2(batches.size() <= seconds * 40 + 10,
             qPrintable(QStringLiteral("%1 batches in %2 s").arg(batches.size()).arg(seconds)));
    QVERIFY(events > batches.size());

    // Stop, and start again.
    QTest::mouseClick(w.runPanel()->stopButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    QVERIFY(w.runPanel()->startButton()->isEnabled());
    QVERIFY(hasEvent(w, [](const core::Event& e) {
        const auto* s = std::get_if<core::RunStateChanged>(&e);
        return s && s->state == core::RunState::Finished;
    }));
    QVERIFY(w.errorText().isEmpty());
    QTest::mouseClick(w.runPanel()->startButton(), Qt::LeftButton);
    QVERIFY(w.controller()->isRunning());
    QTRY_VERIFY_WITH_TIMEOUT(charts->lossChart()->rawStore().rawCount() >= 1, kTimeout);
    QTest::mouseClick(w.runPanel()->stopButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
}

void TestMainWindow::modelTooBigKeepsWindowUsable() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    core::TrainerOptions options = ui::demoOptions();
    options.device = "virtual:256KiB";
    w.runPanel()->setOptions(options);
    QVERIFY2(w.runPanel()->isValid(), qPrintable(w.runPanel()->problem()));
    QVERIFY(w.start());
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    // The caching allocator's 2 MiB segment stops even the parameters: "… do not fit on virtual:256KiB".
    QVERIFY2(w.errorText().contains(QLatin1String("not fit on virtual:256KiB")), qPrintable(w.errorText()));
    w.eventLog()->setKindFilter(QStringLiteral("error"));
    QVERIFY(w.eventLog()->visibleRowCount() >= 1);
    w.eventLog()->setKindFilter(QString());
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-error.png"))));

    // Still usable: a run on a budget that fits starts and trains.
    QVERIFY(w.runPanel()->startButton()->isEnabled());
    w.runPanel()->virtualSizeEdit()->setText(QStringLiteral("64MiB"));
    QVERIFY(w.start());
    QVERIFY(w.errorText().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(w.chartsPanel()->lossChart()->rawStore().rawCount() >= 1, kTimeout);
    w.controller()->stop();
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
}

void TestMainWindow::invalidInputsDisableStart() {
    ui::MainWindow w;
    w.show();
    w.runPanel()->setOptions(ui::demoOptions());
    QVERIFY(w.startAction()->isEnabled());
    w.runPanel()->targetBatchBox()->setValue(0);
    QVERIFY(!w.startAction()->isEnabled());
    QVERIFY(!w.runPanel()->startButton()->isEnabled());
    QVERIFY2(w.startAction()->toolTip().contains(QLatin1String("target batch"), Qt::CaseInsensitive),
             qPrintable(w.startAction()->toolTip()));
    QVERIFY(!w.start());  // F5 does nothing either
    QVERIFY(!w.controller()->isRunning());
    w.runPanel()->targetBatchBox()->setValue(256);
    w.runPanel()->virtualSizeEdit()->setText(QStringLiteral("abc"));
    QVERIFY(!w.startAction()->isEnabled());
    QVERIFY2(w.runPanel()->startButton()->toolTip().contains(QLatin1String("abc")),
             qPrintable(w.runPanel()->startButton()->toolTip()));
    w.runPanel()->virtualSizeEdit()->setText(QStringLiteral("64MiB"));
    QVERIFY(w.startAction()->isEnabled());
}

void TestMainWindow::exportsFiles() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    startDemo(w, /*steps=*/3);
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    QCOMPARE(w.record().stepCount(), std::size_t(3));
    QTemporaryDir dir;
    const QString csv = dir.filePath(QStringLiteral("metrics.csv"));
    const QString jsonl = dir.filePath(QStringLiteral("events.jsonl"));
    QVERIFY(w.exportMetricsCsv(csv));
    QVERIFY(w.exportEventsJsonl(jsonl));
    QFile csvFile(csv);
    QVERIFY(csvFile.open(QIODevice::ReadOnly));
    const QList<QByteArray> rows = csvFile.readAll().trimmed().split('\n');
    QCOMPARE(rows.size(), 4);  // header + 3 steps
    QVERIFY(rows[0].startsWith("step,epoch,time_s"));
    QFile jsonFile(jsonl);
    QVERIFY(jsonFile.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = jsonFile.readAll().trimmed().split('\n');
    QVERIFY(lines.size() >= 5);
    for (const QByteArray& line : lines) {
        QJsonParseError error;
        QJsonDocument::fromJson(line, &error);
        QCOMPARE(error.error, QJsonParseError::NoError);
    }
    // Every series as one tidy table, from the run's folder: 3 steps' training loss, the demo's
    // validation at the end, memory samples.
    const QString data = dir.filePath(QStringLiteral("series.csv"));
    QVERIFY2(w.exportDataCsv(data), qPrintable(w.errorText()));
    QFile dataFile(data);
    QVERIFY(dataFile.open(QIODevice::ReadOnly));
    const QList<QByteArray> table = dataFile.readAll().trimmed().split('\n');
    QCOMPARE(table.front(), QByteArray("series,step,samples_seen,time_s,micro_batch,value"));
    int losses = 0, validations = 0, memory = 0;
    for (const QByteArray& row : table) {
        if (row.startsWith("train_loss,")) ++losses;
        if (row.startsWith("val_accuracy,")) ++validations;
        if (row.startsWith("memory_allocated_bytes,")) ++memory;
    }
    QCOMPARE(losses, 3);
    QCOMPARE(validations, 1);
    QVERIFY(memory > 0);
    // The memory chart's menu exports its own series: the same rows the whole table holds for them.
    const QStringList memorySeries = w.chartsPanel()->memoryChart()->dataSeries();
    QList<QByteArray> expected;
    for (const QByteArray& row : table.mid(1))
        if (memorySeries.contains(QString::fromUtf8(row.left(row.indexOf(','))))) expected.append(row);
    const QString memoryData = dir.filePath(QStringLiteral("device_memory.csv"));
    QVERIFY2(w.exportDataCsv(memoryData, memorySeries), qPrintable(w.errorText()));
    QFile memoryFile(memoryData);
    QVERIFY(memoryFile.open(QIODevice::ReadOnly));
    const QList<QByteArray> memoryTable = memoryFile.readAll().trimmed().split('\n');
    QCOMPARE(memoryTable.front(), table.front());
    QVERIFY(expected.size() >= memory);
    QCOMPARE(memoryTable.mid(1), expected);
    QVERIFY(w.controller()->runFolder().startsWith(qEnvironmentVariable("BATCHPILOT_RUNS_DIR")));
    QCOMPARE(w.exportCharts(dir.path()).size(), 7);
    QVERIFY2(w.errorText().isEmpty(), qPrintable(w.errorText()));  // every file written, nothing to report
}

void TestMainWindow::configurationsAndResume() {
    ui::MainWindow w;
    w.show();
    QTemporaryDir dir;
    core::TrainerOptions options = ui::demoOptions();
    options.targetBatch = 96;
    options.steps = 2;
    w.runPanel()->setOptions(options);
    const QString config = dir.filePath(QStringLiteral("run.json"));
    QVERIFY(w.saveConfiguration(config));

    // A different panel, then the file brings the saved values back.
    w.runPanel()->targetBatchBox()->setValue(512);
    QVERIFY(w.openConfiguration(config));
    QCOMPARE(w.runPanel()->options().targetBatch, qint64(96));

    // A broken file is an error in the window; the panel keeps its values.
    QFile broken(dir.filePath(QStringLiteral("broken.json")));
    QVERIFY(broken.open(QIODevice::WriteOnly));
    broken.write(R"({"probe": {"headroom": 3}})");
    broken.close();
    QVERIFY(!w.openConfiguration(broken.fileName()));
    QVERIFY2(w.errorText().contains(QLatin1String("probe.headroom")), qPrintable(w.errorText()));
    QCOMPARE(w.runPanel()->options().targetBatch, qint64(96));

    // Values core accepts are shown as written (a target batch of 300 million and 50 million
    // samples were clamped to the fields' old maximums of 100 million and 10 million); a value no
    // field can hold (a seed above 2^31 - 1) is refused, never clamped, and the panel keeps its values.
    QFile large(dir.filePath(QStringLiteral("large.json")));
    QVERIFY(large.open(QIODevice::WriteOnly));
    large.write(R"({"target_batch": 300000000, "data": {"samples": 50000000}, "optimizer": {"learning_rate": 1e-7}})");
    large.close();
    QVERIFY2(w.openConfiguration(large.fileName()), qPrintable(w.errorText()));
    QCOMPARE(w.runPanel()->options().targetBatch, qint64(300'000'000));
    QCOMPARE(w.runPanel()->options().data.samples, qint64(50'000'000));
    QCOMPARE(w.runPanel()->options().optimizer.learningRate, 1e-7);
    QFile seed(dir.filePath(QStringLiteral("seed.json")));
    QVERIFY(seed.open(QIODevice::WriteOnly));
    seed.write(R"({"seed": 5000000000, "target_batch": 32})");
    seed.close();
    QVERIFY(!w.openConfiguration(seed.fileName()));
    QVERIFY2(w.errorText().contains(QLatin1String("seed is 5000000000, which the window cannot show")),
             qPrintable(w.errorText()));
    QCOMPARE(w.runPanel()->options().targetBatch, qint64(300'000'000));
    QVERIFY(w.openConfiguration(config));

    // Resume: a run that saved a checkpoint is continued from it.
    const QString checkpoints = dir.filePath(QStringLiteral("ckpt"));
    core::TrainerOptions first = w.runPanel()->options();
    first.checkpoint.directory = checkpoints.toStdString();
    QVERIFY(w.startWith(first));
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    QVERIFY(QFile::exists(checkpoints + QStringLiteral("/checkpoint.pt")));
    w.runPanel()->stepLimitBox()->setValue(3);
    QVERIFY(w.resumeFrom(checkpoints));
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    QVERIFY2(w.errorText().isEmpty(), qPrintable(w.errorText()));
    QCOMPARE(w.record().stepCount(), std::size_t(1));  // step 3 only: 1 and 2 came from the checkpoint

    // Dropped files: a model file that does not exist disables Start with the reason; a file of
    // another kind is refused with a message.
    QVERIFY(w.openDroppedFile(dir.filePath(QStringLiteral("gone.pt"))));
    QVERIFY(!w.startAction()->isEnabled());
    QVERIFY2(w.runPanel()->problem().contains(QLatin1String("gone.pt")), qPrintable(w.runPanel()->problem()));
    QVERIFY(!w.openDroppedFile(dir.filePath(QStringLiteral("notes.txt"))));
    QVERIFY(w.errorText().contains(QLatin1String("TorchScript model")));
    w.runPanel()->modelBox()->setCurrentText(QStringLiteral("cnn"));
    QVERIFY(w.startAction()->isEnabled());
    // A dataset that reads files needs an existing path.
    w.runPanel()->datasetBox()->setCurrentIndex(w.runPanel()->datasetBox()->findData(QStringLiteral("csv")));
    QVERIFY(!w.startAction()->isEnabled());
    QVERIFY(w.runPanel()->problem().contains(QLatin1String("needs a data path")));
}

void TestMainWindow::savesAMemorySnapshotOfTheVirtualGpu() {
    // File > Save memory snapshot after a run on a virtual GPU with PyTorch's caching model: the
    // file is PyTorch's snapshot pickle, read back by Python's own pickle (not by this project's
    // code): segments whose blocks fill them, within the device's budget. While the window shows a
    // run it did not start (its virtual GPU is elsewhere) it refuses, saying why.
    QTemporaryDir dir;
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    w.controller()->setRunsDirectory(dir.filePath(QStringLiteral("runs")));
    core::TrainerOptions options = ui::demoOptions();
    options.device = "virtual:32MiB/caching";
    options.steps = 3;
    QVERIFY(w.startWith(options));
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    const QString path = dir.filePath(QStringLiteral("snapshot.pickle"));
    QVERIFY2(w.saveMemorySnapshot(path), qPrintable(w.errorText()));
    QProcess python;
    python.start(QStringLiteral(BATCHPILOT_TEST_PYTHON),
                 {QStringLiteral("-c"),
                  QStringLiteral("import pickle, sys\n"
                                 "s = pickle.load(open(sys.argv[1], 'rb'))['segments']\n"
                                 "fill = all(sum(b['size'] for b in g['blocks']) == g['total_size'] for g in s)\n"
                                 "print(len(s), sum(g['total_size'] for g in s), int(fill))\n"),
                  path});
    QVERIFY(python.waitForFinished(60'000));
    const QStringList read = QString::fromUtf8(python.readAllStandardOutput()).split(QLatin1Char(' '));
    QVERIFY2(python.exitCode() == 0 && read.size() == 3, python.readAllStandardError().constData());
    QVERIFY2(read[0].toInt() >= 1, qPrintable(read.join(QLatin1Char(' '))));                        // segments
    QVERIFY2(read[1].toLongLong() > 0 && read[1].toLongLong() <= (32 << 20), qPrintable(read[1]));  // reserved
    QCOMPARE(read[2].trimmed(), QStringLiteral("1"));  // every segment's blocks add up to it
    // The Segments tab showed the same state while the run trained here: the last OOM's, else the latest.
    ui::SegmentsView* segments = w.chartsPanel()->segmentsView();
    segments->showState(segments->stateCount() - 1);
    QVERIFY(segments->shown() != nullptr);
    QCOMPARE(static_cast<int>(segments->shown()->segments.size()), read[0].toInt());
    QCOMPARE(segments->shown()->reservedBytes(), read[1].toLongLong());

    QVERIFY(w.openRun(w.controller()->runFolder()));
    QVERIFY(!w.saveMemorySnapshot(dir.filePath(QStringLiteral("other.pickle"))));
    QVERIFY2(w.errorText().contains(QLatin1String("trains elsewhere")), qPrintable(w.errorText()));
    QVERIFY(!QFileInfo::exists(dir.filePath(QStringLiteral("other.pickle"))));
}

void TestMainWindow::comparesRunsWithDifferentTargetBatches() {
    // Issue 13's "done": two runs with different target batches, each recorded in its folder,
    // overlaid in the Compare runs tab on the samples-seen axis.
    QTemporaryDir runs;
    ui::MainWindow w;
    w.resize(1600, 1000);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    w.controller()->setRunsDirectory(runs.path());
    ui::RunsPanel* panel = w.chartsPanel()->runsPanel();
    panel->setRunsDirectory(runs.path());
    QStringList folders;
    for (const int64_t target : {256, 1024}) {
        core::TrainerOptions options = ui::demoOptions();
        options.targetBatch = target;
        options.device = "virtual:256MiB";
        options.steps = 6;
        options.validation.everySteps = 2;
        options.probe.objective = core::ProbeObjective::Largest;
        QVERIFY(w.startWith(options));
        QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
        folders << w.controller()->runFolder();
        QVERIFY2(folders.back().startsWith(runs.path()), qPrintable(folders.back()));
    }
    QCOMPARE(panel->folders().size(), 2);  // listed again when each run ended
    w.chartsPanel()->tabs()->setCurrentWidget(panel);
    for (const QString& folder : folders) panel->setCompared(folder, true);
    ui::CompareChart* chart = panel->chart();
    chart->setMetric(ui::CompareChart::Metric::ValidationAccuracy);
    chart->setXAxis(ui::CompareChart::XAxis::Samples);
    QCOMPARE(chart->overlayCount(), std::size_t{2});
    // Table order is newest first: the 1024-sample run, then the 256-sample one.
    const QStringList order = panel->folders();
    for (std::size_t i = 0; i < 2; ++i) {
        const int64_t target = order[static_cast<int>(i)] == folders[1] ? 1024 : 256;
        const auto points = chart->overlayPoints(i);
        QCOMPARE(points.size(), std::size_t{3});  // validated after steps 2, 4 and 6
        for (std::size_t k = 0; k < points.size(); ++k) {
            QCOMPARE(points[k].x(), static_cast<double>(2 * (k + 1) * target));
            QVERIFY(points[k].y() >= 0 && points[k].y() <= 1);
        }
    }
    QTest::qWait(200);  // let the event loop draw the new series (and delete the replaced ones)
    chart->redraw();
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-compare.png"))));
}

void TestMainWindow::memorySaversPanelMeasuresAndApplies() {
    // Run → Measure memory savers during a run: the panel appears with a row per saver, measured
    // on the run's model; Apply on the checkpointing row turns it on at the next batch, and the
    // panel then says what the probe found against the prediction.
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    core::TrainerOptions options = ui::demoOptions();
    options.device = "virtual:12MiB";
    options.steps = 100000;
    w.runPanel()->setOptions(options);
    QVERIFY(w.start());
    QTRY_VERIFY_WITH_TIMEOUT(w.chartsPanel()->lossChart()->rawStore().rawCount() >= 1, kTimeout);
    auto* measure = w.findChild<QAction*>(QStringLiteral("surveySaversAction"));
    QVERIFY(measure != nullptr);
    QVERIFY(measure->isEnabled());
    measure->trigger();
    ui::SaversView* view = w.saversView();
    QTRY_VERIFY_WITH_TIMEOUT(view->isVisible() && view->table()->rowCount() == 4 &&
                                 view->captionText().contains(QStringLiteral("asked for")),
                             kTimeout);
    QVERIFY(view->table()->item(0, 0)->text().contains(QStringLiteral("(in use)")));
    for (int row = 0; row < 4; ++row) QVERIFY(view->table()->item(row, 1)->text().toLongLong() > 0);
    view->table()->selectRow(1);
    QCOMPARE(view->selectedSavers(), std::optional(core::MemorySavers::Checkpoint));
    QVERIFY(view->applyButton()->isEnabled());
    QCOMPARE(view->applyButton()->text(), QStringLiteral("Apply activation checkpointing"));
    const qint64 predicted = view->table()->item(1, 1)->text().toLongLong();
    QTest::mouseClick(view->applyButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(view->captionText().contains(QStringLiteral("the probe found micro-batch")), kTimeout);
    QVERIFY2(view->captionText().contains(QStringLiteral("(predicted %1,").arg(predicted)),
             qPrintable(view->captionText()));
    QVERIFY(!view->applyButton()->isEnabled());  // the selected row is in use now
    QVERIFY(view->table()->item(1, 0)->text().contains(QStringLiteral("(in use)")));
    QVERIFY(!view->table()->item(0, 0)->text().contains(QStringLiteral("(in use)")));
    w.grab().save(screenshotPath(QStringLiteral("screenshot-savers.png")));
    w.resize(1600, 1000);
    QTest::qWait(100);
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-savers-1600x1000.png"))));
    w.controller()->stop();
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
}

}  // namespace tst_main_window

BATCHPILOT_TEST_MAIN(tst_main_window::TestMainWindow)
#include "tst_main_window.moc"
