#include <QtTest>

#include <atomic>

#include <QAbstractSpinBox>
#include <QAction>
#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QPushButton>
#include <QSemaphore>
#include <QSettings>
#include <QSpinBox>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTableWidget>
#include <QTextBrowser>
#include <QThread>

#include "core/events/events.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/throughput_chart.h"
#include "ui/teaching/equivalence_dialog.h"
#include "ui/log/event_log.h"
#include "ui/window/help_text.h"
#include "ui/window/main_window.h"
#include "ui/teaching/micro_batch_table.h"
#include "ui/config/run_panel.h"
#include "ui/window/teaching_tools.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"

using namespace batchpilot;

namespace {

constexpr int kTimeout = 180'000;  // ms; real training on the CPU of a shared test machine

QString screenshotPath(const QString& name) {
    // The build tree, next to the test executable, so a person can open it after a run.
    return QDir(QCoreApplication::applicationDirPath()).filePath(name);
}

/// A small run whose first training batch has several micro-batches: target 64, at most 16 per
/// micro-batch, the probe starting at 4 (trials 4, 8, 16, then 12 + 12 + 12).
core::TrainerOptions smallRun() {
    core::TrainerOptions o;
    o.model.name = "mlp";
    o.model.width = 8;
    o.data.name = "synthetic";
    o.data.samples = 512;
    o.data.height = 16;
    o.data.width = 16;
    o.device = "virtual:64MiB";
    o.targetBatch = 64;
    o.probe.initialMicroBatch = 4;
    o.probe.maxMicroBatch = 16;
    o.optimizer.kind = core::OptimizerKind::Sgd;
    o.optimizer.learningRate = 0.05;
    o.steps = 10000;
    o.seed = 1;
    return o;
}

/// Every event the window received, in order (the record may thin high-rate ones).
struct EventTape {
    QList<core::Event> events;

    explicit EventTape(ui::TrainerController* controller) {
        QObject::connect(controller, &ui::TrainerController::eventsReceived, controller,
                         [this](const QList<core::Event>& batch) { events.append(batch); });
    }
    template <class T>
    int count() const {
        return static_cast<int>(std::count_if(events.begin(), events.end(),
                                              [](const core::Event& e) { return std::holds_alternative<T>(e); }));
    }
    template <class T>
    std::optional<T> last() const {
        for (auto it = events.rbegin(); it != events.rend(); ++it)
            if (const auto* e = std::get_if<T>(&*it)) return *e;
        return std::nullopt;
    }
    /// Micro-batches that ran: committed or out of memory.
    int ran() const { return count<core::MicroBatchDone>() + count<core::OomEvent>(); }
};

void startRun(ui::MainWindow& w, const core::TrainerOptions& options) {
    w.runPanel()->setOptions(options);
    QVERIFY2(w.runPanel()->isValid(), qPrintable(w.runPanel()->problem()));
    QTest::mouseClick(w.runPanel()->startButton(), Qt::LeftButton);
    QVERIFY(w.controller()->isRunning());
}

void stopRun(ui::MainWindow& w) {
    QTest::mouseClick(w.runPanel()->stopButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
}

}  // namespace

class TestTeaching : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void lossWeightText_data();
    void lossWeightText();
    void helpExplainsTheFastestChoice();
    void accumulationViewShowsMicroBatches();
    void equivalenceDialogVerdicts();
    void everyControlExplainsItself();
    void stepByStep();
    void commandsBeforeTheRunBeginsAreKept();
    void checkEquivalence_data();
    void checkEquivalence();
};

void TestTeaching::initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotTests"));
    QCoreApplication::setApplicationName(QStringLiteral("tst_teaching"));
    QSettings().clear();
}

void TestTeaching::lossWeightText_data() {
    QTest::addColumn<qint64>("size");
    QTest::addColumn<qint64>("target");
    QTest::addColumn<QString>("text");
    QTest::newRow("power of two") << qint64(32) << qint64(1024) << QStringLiteral("32/1024 = 0.03125");
    QTest::newRow("uneven split") << qint64(11) << qint64(64) << QStringLiteral("11/64 = 0.171875");
    QTest::newRow("rounded") << qint64(1) << qint64(3) << QStringLiteral("1/3 ≈ 0.333333");
    QTest::newRow("whole batch") << qint64(64) << qint64(64) << QStringLiteral("64/64 = 1");
}

void TestTeaching::lossWeightText() {
    QFETCH(qint64, size);
    QFETCH(qint64, target);
    QFETCH(QString, text);
    QCOMPARE(ui::lossWeightText(size, target), text);
}

void TestTeaching::helpExplainsTheFastestChoice() {
    // Help > How this works quotes the search's decision: faster than the largest by a factor
    // measured in turns; a search that started from the size chosen before and never timed the
    // largest claims no factor; a kept largest says smaller sizes were not faster.
    const auto help = [](int64_t chosenSize, double speedOverLargest, double stepSpeedOverLargest = 0,
                         std::vector<double> batchRatios = {}, double low = 0, double high = 0) {
        ui::RunModel model;
        core::ProbeFinished probed;  // the search follows a probe
        probed.sequence = 1;
        probed.microBatch = 1024;
        probed.accumulationSteps = 1;
        probed.targetBatch = 1024;
        core::ThroughputTimed timed{1.0, 1, 128, 3000, 3};
        core::ThroughputChosen chosen;
        chosen.sequence = 1;
        chosen.microBatch = chosenSize;
        chosen.largestMicroBatch = 1024;
        chosen.targetBatch = 1024;
        chosen.samplesPerSecond = 3000;
        chosen.largestSamplesPerSecond = 2000;
        chosen.speedOverLargest = speedOverLargest;
        chosen.stepSpeedOverLargest = stepSpeedOverLargest;
        chosen.accumulationSteps = 8;
        chosen.stepSeconds = 0.040;
        chosen.microBatchSeconds = 0.001;
        chosen.microBatchesTimed = 12;
        chosen.batchRatios = std::move(batchRatios);
        chosen.batchGainLow = low;
        chosen.batchGainHigh = high;
        chosen.checkSeconds = 61;
        model.handle({probed, timed, chosen});
        return ui::howItWorksHtml(model);
    };
    const QString faster = help(128, 1.46, 1.31);
    QVERIFY2(faster.contains(QStringLiteral("It chose <b>128</b> rather than the largest that fits, 1024: its "
                                            "micro-batches ran 1.46×")),
             qPrintable(faster));
    // The gain per whole training batch, with its 40 ms step and 8 × 1 ms besides the micro-batches.
    QVERIFY2(faster.contains(QStringLiteral("(48 ms besides the micro-batches), runs about <b>1.31×</b>")),
             qPrintable(faster));
    QVERIFY(!help(128, 1.46).contains(QLatin1String("whole training batch")));
    const QString notTimed = help(128, 0);
    QVERIFY2(notTimed.contains(QLatin1String("the largest that fits, 1024, was not timed")), qPrintable(notTimed));
    QVERIFY(!notTimed.contains(QLatin1String("kept the largest")));
    const QString kept = help(1024, 1.0);
    QVERIFY2(kept.contains(QLatin1String("It kept the largest that fits, <b>1024</b>")), qPrintable(kept));
    // Checked on whole batches: the turns, their time and the claim with its 95% interval; an
    // events file written before the interval existed says none rather than "0.00× and 0.00×".
    const std::vector<double> turns(19, 1.04);
    const QString checked = help(128, 1.46, 1.04, turns, 1.02, 1.10);
    QVERIFY2(checked.contains(QStringLiteral("timed in 19 turns over 61 s before the decision, ran <b>1.04×</b> as "
                                             "fast (with 95% confidence between 1.02× and 1.10×).")),
             qPrintable(checked));
    const QString older = help(128, 1.46, 1.04, turns);
    QVERIFY2(older.contains(QStringLiteral("ran <b>1.04×</b> as fast.")), qPrintable(older));
    QVERIFY(!older.contains(QLatin1String("95% confidence")));
    // Only a warm-up so far: no empty list of sizes.
    ui::RunModel warming;
    core::ProbeFinished probed;
    probed.sequence = 1;
    probed.microBatch = 1024;
    warming.handle({probed, core::ThroughputTimed{1.0, 1, 1024, 0, 0}});
    const QString early = ui::howItWorksHtml(warming);
    QVERIFY2(early.contains(QLatin1String("no size has a counted timing yet")), qPrintable(early));
    QVERIFY(!early.contains(QLatin1String("timed so far: .")));
}

void TestTeaching::accumulationViewShowsMicroBatches() {
    ui::AccumulationView view;
    view.resize(900, 220);
    view.show();
    view.setPlan(ui::RunPlan{32, 2, 64});  // from the run model
    view.handle(core::StepModeWaiting{0, 1, 0, 0, 32, 64, false});
    QVERIFY(view.pending().has_value());
    auto* model = view.table()->tableModel();
    QCOMPARE(model->rowCount(), 1);  // only the pending row
    QVERIFY(model->data(model->index(0, ui::MicroBatchTableModel::IndexColumn), Qt::DisplayRole)
                .toString()
                .contains(QLatin1String("next")));

    core::MicroBatchDone first;
    first.step = 1;
    first.size = 32;
    first.targetBatch = 64;
    first.lossWeight = 0.5;
    first.gradientNorm = 0.8;
    for (int64_t i = 0; i < 32; ++i) first.sampleIndices.push_back(100 + i);
    view.handle(first);
    QVERIFY(!view.pending().has_value());
    QCOMPARE(model->rowCount(), 1);
    QCOMPARE(model->data(model->index(0, ui::MicroBatchTableModel::WeightColumn), Qt::DisplayRole).toString(),
             QStringLiteral("32/64 = 0.5"));
    const QString samples =
        model->data(model->index(0, ui::MicroBatchTableModel::SamplesColumn), Qt::DisplayRole).toString();
    QVERIFY2(
        samples.startsWith(QStringLiteral("100, 101, 102, 103, …")) && samples.contains(QLatin1String("32 samples")),
        qPrintable(samples));
    QVERIFY(model->data(model->index(0, ui::MicroBatchTableModel::SamplesColumn), Qt::ToolTipRole)
                .toString()
                .contains(QLatin1String("131")));  // the full list
    QCOMPARE(view.gradientNorm(), 0.8);

    view.handle(core::StepModeWaiting{0, 1, 1, 32, 32, 64, false});
    QCOMPARE(model->rowCount(), 2);
    core::MicroBatchDone second = first;
    second.index = 1;
    second.offset = 32;
    second.gradientNorm = 1.1;
    view.handle(second);
    QCOMPARE(model->rowCount(), 2);
    // Bars are relative to the largest norm so far.
    QCOMPARE(
        model->data(model->index(1, ui::MicroBatchTableModel::NormColumn), ui::MicroBatchTableModel::NormFractionRole)
            .toDouble(),
        1.0);
    QVERIFY(
        model->data(model->index(0, ui::MicroBatchTableModel::NormColumn), ui::MicroBatchTableModel::NormFractionRole)
            .toDouble() < 1.0);

    // The optimizer step's badge stays while the trainer waits before the next batch, and goes
    // when the next batch starts.
    QVERIFY(view.stepBadge().isEmpty());
    view.handle(core::OptimizerStepped{0, 1, 2});
    QVERIFY2(view.stepBadge().contains(QLatin1String("optimizer step 1")), qPrintable(view.stepBadge()));
    view.handle(core::StepModeWaiting{0, 2, 0, 0, 32, 64, false});
    QVERIFY(!view.stepBadge().isEmpty());
    QCOMPARE(model->rowCount(), 3);  // the finished batch and the next batch's first micro-batch
    QVERIFY(model->data(model->index(2, 0), Qt::DisplayRole).toString().contains(QLatin1String("step 2")));
    core::MicroBatchDone next = first;
    next.step = 2;
    view.handle(next);
    QVERIFY(view.stepBadge().isEmpty());
    QCOMPARE(model->rowCount(), 1);
    view.repaint();
}

void TestTeaching::equivalenceDialogVerdicts() {
    ui::EquivalenceDialog dialog;
    core::EquivalenceChecked r;
    r.step = 3;
    r.samples = 64;
    r.microBatchSizes = {16, 16, 16, 16};
    r.tensors = {{"fc1.weight", 1000, 2e-9, 3e-8, 1.0}, {"fc1.bias", 10, 1e-9, 9e-8, 1.0}};
    r.overall = {"all", 1010, 2e-9, 4e-8, 1.0};
    r.explanation = "Accumulating gives the full-batch gradient.";
    dialog.setResult(r);
    QCOMPARE(dialog.verdict(), QStringLiteral("Equal up to float rounding"));
    QCOMPARE(dialog.tensorTable()->rowCount(), 2);
    QVERIFY(dialog.tensorTable()->isSortingEnabled());
    dialog.tensorTable()->sortItems(3, Qt::DescendingOrder);  // by relative difference
    QCOMPARE(dialog.tensorTable()->item(0, 0)->text(), QStringLiteral("fc1.bias"));
    QVERIFY(dialog.text().contains(QLatin1String("full-batch gradient")));
    QVERIFY(!dialog.text().contains(QLatin1String("BatchNorm comparison")));
    QVERIFY2(dialog.text().contains(QLatin1String("accumulated as 16 + 16 + 16 + 16 (4 micro-batches)")),
             qPrintable(dialog.text()));

    // Several devices: every rank's part in its own micro-batches, all of them counted.
    core::EquivalenceChecked ranks = r;
    ranks.microBatchSizes = {8, 8};
    ranks.rankMicroBatchSizes = {{8, 8}, {24, 24}};
    ranks.rankDevices = {"virtual:12MiB", "virtual:48MiB"};
    dialog.setResult(ranks);
    QVERIFY2(dialog.text().contains(QLatin1String("accumulated as rank 0 (virtual:12MiB) 8 + 8, rank 1 "
                                                  "(virtual:48MiB) 24 + 24, summed over the ranks (4 micro-batches)")),
             qPrintable(dialog.text()));

    r.batchStatistics = true;
    r.overall.relativeDifference = 0.02;
    r.runningStatisticsRelativeDifference = 3e-8;
    r.fullPassOutsideBudget = true;
    dialog.setResult(r);
    QVERIFY2(dialog.verdict().contains(QLatin1String("BatchNorm")), qPrintable(dialog.verdict()));
    QVERIFY(dialog.text().contains(QLatin1String("BatchNorm comparison")));
    QVERIFY(dialog.text().contains(QLatin1String("outside the budget")));

    r.error = "the equivalence check could not run: out of memory";
    r.tensors.clear();
    dialog.setResult(r);
    QCOMPARE(dialog.verdict(), QStringLiteral("The check could not run"));
    QVERIFY(dialog.text().contains(QLatin1String("out of memory")));
}

void TestTeaching::everyControlExplainsItself() {
    ui::MainWindow w;
    w.resize(1280, 800);
    int checked = 0;
    for (QWidget* widget : w.runPanel()->findChildren<QWidget*>()) {
        const bool input = qobject_cast<QAbstractButton*>(widget) || qobject_cast<QComboBox*>(widget) ||
                           qobject_cast<QAbstractSpinBox*>(widget) || qobject_cast<QLineEdit*>(widget);
        // The line edit inside a spin box or combo box is part of that control.
        const bool part =
            qobject_cast<QLineEdit*>(widget) && (qobject_cast<QAbstractSpinBox*>(widget->parentWidget()) ||
                                                 qobject_cast<QComboBox*>(widget->parentWidget()));
        if (!input || part) continue;
        ++checked;
        const QString name = widget->objectName().isEmpty() ? QString::fromLatin1(widget->metaObject()->className())
                                                            : widget->objectName();
        QVERIFY2(!widget->toolTip().trimmed().isEmpty(), qPrintable(name + QStringLiteral(" has no tooltip")));
    }
    QVERIFY(checked >= 20);
    QVERIFY(!w.runPanel()->nextMicroBatchButton()->toolTip().isEmpty());

    // The charts, the training batch, the event log and the status bar explain themselves too.
    QStringList unexplained;
    QList<QWidget*> widgets{w.accumulationView(), w.accumulationView()->table()};
    ui::ChartsPanel* charts = w.chartsPanel();
    widgets << charts->lossChart() << charts->probeChart() << charts->memoryChart() << charts->throughputChart();
    for (QWidget* widget : w.eventLog()->findChildren<QWidget*>(QString(), Qt::FindDirectChildrenOnly))
        if (qobject_cast<QAbstractItemView*>(widget) || qobject_cast<QLineEdit*>(widget) ||
            qobject_cast<QComboBox*>(widget))
            widgets << widget;
    for (QLabel* label : w.statusBar()->findChildren<QLabel*>())
        if (label->objectName().startsWith(QLatin1String("status"))) widgets << label;
    for (QWidget* widget : std::as_const(widgets))
        if (widget->toolTip().trimmed().isEmpty())
            unexplained << (widget->objectName().isEmpty() ? QString::fromLatin1(widget->metaObject()->className())
                                                           : widget->objectName());
    QVERIFY2(unexplained.isEmpty(), qPrintable(unexplained.join(QStringLiteral(", "))));
}

void TestTeaching::stepByStep() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    w.activateWindow();
    QVERIFY(QTest::qWaitForWindowActive(&w));
    EventTape tape(w.controller());
    ui::RunPanel* panel = w.runPanel();
    QPushButton* next = panel->nextMicroBatchButton();
    QPushButton* finish = panel->finishBatchButton();

    // Checked before Start: the run waits before its very first micro-batch.
    const QPoint onBox(8, panel->stepModeBox()->height() / 2);  // the box itself, not the row
    QTest::mouseClick(panel->stepModeBox(), Qt::LeftButton, {}, onBox);
    QVERIFY(panel->stepModeBox()->isChecked());
    QVERIFY(w.controller()->stepMode());
    QVERIFY(!next->isEnabled());
    startRun(w, smallRun());
    QTRY_VERIFY_WITH_TIMEOUT(next->isEnabled(), kTimeout);
    QVERIFY(finish->isEnabled());
    QCOMPARE(tape.ran(), 0);
    QCOMPARE(tape.count<core::StepModeWaiting>(), 1);
    QVERIFY(w.accumulationView()->pending().has_value());

    // One click, one micro-batch.
    for (int click = 1; click <= 4; ++click) {
        const int waits = tape.count<core::StepModeWaiting>();
        QTest::mouseClick(next, Qt::LeftButton);
        QVERIFY(!next->isEnabled());  // until the trainer waits again
        QTRY_VERIFY_WITH_TIMEOUT(tape.count<core::StepModeWaiting>() == waits + 1, kTimeout);
        QTRY_VERIFY_WITH_TIMEOUT(next->isEnabled(), kTimeout);
        QCOMPARE(tape.ran(), click);
        QCOMPARE(tape.count<core::OptimizerStepped>(), 0);
    }

    // The N key does the same: Next has the keyboard focus back, so no field swallows the key.
    QTRY_COMPARE_WITH_TIMEOUT(QApplication::focusWidget(), static_cast<QWidget*>(next), kTimeout);
    {
        const int waits = tape.count<core::StepModeWaiting>();
        QTest::keyClick(QApplication::focusWidget(), Qt::Key_N);
        QTRY_VERIFY_WITH_TIMEOUT(tape.count<core::StepModeWaiting>() == waits + 1, kTimeout);
        QTRY_VERIFY_WITH_TIMEOUT(next->isEnabled(), kTimeout);
        QCOMPARE(tape.ran(), 5);
    }

    // The accumulation view lists the committed micro-batches with their weights, samples and
    // the running gradient norm, and the next one as pending.
    ui::AccumulationView* view = w.accumulationView();
    auto* model = view->table()->tableModel();
    const int committed = tape.count<core::MicroBatchDone>();
    QCOMPARE(model->committedCount(), committed);
    QCOMPARE(model->rowCount(), committed + 1);
    QVERIFY(model->hasPending());
    const auto done = *tape.last<core::MicroBatchDone>();
    QVERIFY(!done.sampleIndices.empty());
    QVERIFY(done.gradientNorm > 0);
    QVERIFY(view->gradientNorm() > 0);
    const int lastRow = committed - 1;
    const QString weight =
        model->data(model->index(lastRow, ui::MicroBatchTableModel::WeightColumn), Qt::DisplayRole).toString();
    QVERIFY2(weight.startsWith(QStringLiteral("%1/64 ").arg(done.size)), qPrintable(weight));
    const QString samples =
        model->data(model->index(lastRow, ui::MicroBatchTableModel::SamplesColumn), Qt::DisplayRole).toString();
    QVERIFY2(samples.startsWith(QString::number(done.sampleIndices.front())), qPrintable(samples));
    const QString norm =
        model->data(model->index(lastRow, ui::MicroBatchTableModel::NormColumn), Qt::DisplayRole).toString();
    QVERIFY2(norm.toDouble() > 0, qPrintable(norm));
    QVERIFY(view->stepBadge().isEmpty());

    // Mid-batch, waiting for the next micro-batch: for a person to look at.
    w.chartsPanel()->redrawNow();
    QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-step-mode.png"))));

    // Finish batch: the rest of the batch, one optimizer step, then a wait before the next batch.
    QTest::mouseClick(finish, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(tape.count<core::OptimizerStepped>() == 1, kTimeout);
    QTRY_VERIFY_WITH_TIMEOUT(next->isEnabled(), kTimeout);
    const auto stepped = *tape.last<core::OptimizerStepped>();
    QCOMPARE(stepped.step, qint64(1));
    QCOMPARE(stepped.microBatches, qint64(tape.count<core::MicroBatchDone>()));
    QCOMPARE(tape.last<core::StepModeWaiting>()->step, qint64(2));
    QVERIFY2(view->stepBadge().contains(QLatin1String("optimizer step 1")), qPrintable(view->stepBadge()));
    QCOMPARE(view->filledSamples(), qint64(64));

    // Help > How this works explains this run with its own numbers.
    const auto probe = *tape.last<core::ProbeFinished>();
    QCOMPARE(probe.microBatch, qint64(16));
    const QString html = ui::howItWorksHtml(*w.runModel());
    QVERIFY2(html.contains(QLatin1String("micro-batch of <b>16</b>")), qPrintable(html));
    QVERIFY2(html.contains(QLatin1String("<b>T = 64</b>")), qPrintable(html));
    QVERIFY2(html.contains(QStringLiteral("64 = 4 × 16")), qPrintable(html));
    QVERIFY(html.contains(QLatin1String("16/64 = 0.25")));
    QAction* help = nullptr;
    for (QAction* menu : w.menuBar()->actions())
        for (QAction* action : menu->menu() ? menu->menu()->actions() : QList<QAction*>{})
            if (action->text().contains(QLatin1String("How this works"))) help = action;
    QVERIFY(help != nullptr);
    help->trigger();
    auto* browser = w.findChild<QTextBrowser*>(QStringLiteral("howItWorksText"));
    QVERIFY(browser != nullptr);
    QVERIFY(browser->toPlainText().contains(QStringLiteral("64 = 4 × 16")));
    QVERIFY(browser->window()->grab().save(screenshotPath(QStringLiteral("screenshot-how-it-works.png"))));
    browser->window()->close();

    // The next batch starts with the next click: the badge goes.
    const int ran = tape.ran();
    QTest::mouseClick(next, Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(tape.ran() == ran + 1 && next->isEnabled(), kTimeout);
    QVERIFY(view->stepBadge().isEmpty());
    QCOMPARE(model->committedCount(), 1);

    // Step mode off: training runs on by itself.
    QTest::mouseClick(panel->stepModeBox(), Qt::LeftButton, {}, onBox);
    QVERIFY(!w.controller()->stepMode());
    QVERIFY(!next->isEnabled());
    QTRY_VERIFY_WITH_TIMEOUT(tape.count<core::OptimizerStepped>() >= 3, kTimeout);
    stopRun(w);
    QVERIFY(w.errorText().isEmpty());
}

/// Commands given right after Start, before the worker thread has begun the run, reach the
/// trainer (they used to be dropped when the trainer did not exist yet): the new target batch
/// applies at the first training-batch boundary, and a stop ends the run.
///
/// The worker thread is held until the commands are posted: left to the scheduler, a loaded
/// machine could run the worker's whole three-step run before this thread posts them (seen once
/// in CI), and the test would no longer be about commands that come first.
void TestTeaching::commandsBeforeTheRunBeginsAreKept() {
    ui::TrainerController controller;
    auto* workerThread = controller.findChild<QThread*>();
    QVERIFY(workerThread != nullptr);
    // The held call takes no captures: Qt hands a queued call to the other thread under its own
    // (uninstrumented) lock, which ThreadSanitizer cannot see, so a capture the worker read would
    // be reported as a race with its construction here. The gate goes through an atomic instead.
    static QSemaphore gate;
    static std::atomic<QObject*> held{nullptr};
    const auto holdWorker = [&] {
        auto* holder = new QObject;
        holder->moveToThread(workerThread);
        held.store(holder);
        QMetaObject::invokeMethod(holder, [] {
            gate.acquire();
            held.exchange(nullptr)->deleteLater();
        });
    };
    EventTape tape(&controller);
    QSignalSpy finished(&controller, &ui::TrainerController::runFinished);
    core::TrainerOptions o = smallRun();
    o.steps = 3;
    holdWorker();  // queued before the run: the worker takes it first
    QVERIFY(controller.start(o));
    controller.setTargetBatch(32, core::LrScaling::Linear);
    controller.reprobe();
    gate.release();
    QVERIFY(finished.wait(kTimeout));
    const auto result = finished.last().first().value<core::RunResult>();
    QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
    const auto changed = tape.last<core::TargetBatchChanged>();
    QVERIFY(changed.has_value());
    QCOMPARE(changed->newTarget, qint64(32));
    QCOMPARE(changed->newLearningRate, changed->oldLearningRate * 0.5);
    const auto steps = tape.last<core::StepMetrics>();
    QVERIFY(steps.has_value());
    QCOMPARE(steps->targetBatch, qint64(32));

    holdWorker();
    QVERIFY(controller.start(o));
    controller.stop();
    gate.release();
    QVERIFY(finished.wait(kTimeout));
    QVERIFY(finished.last().first().value<core::RunResult>().stopped);
    // The stop came before the first batch: none was trained.
    QCOMPARE(finished.last().first().value<core::RunResult>().steps, qint64(0));
}

void TestTeaching::checkEquivalence_data() {
    QTest::addColumn<int>("norm");
    QTest::addColumn<bool>("equal");
    QTest::newRow("GroupNorm: exact") << static_cast<int>(core::NormKind::Group) << true;
    QTest::newRow("BatchNorm: differs") << static_cast<int>(core::NormKind::Batch) << false;
}

void TestTeaching::checkEquivalence() {
    QFETCH(int, norm);
    QFETCH(bool, equal);
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    EventTape tape(w.controller());
    core::TrainerOptions options = smallRun();
    options.model.name = "resnet";
    options.model.norm = static_cast<core::NormKind>(norm);
    options.probe.maxMicroBatch = 8;
    options.targetBatch = 32;
    options.device = "virtual:256MiB";
    startRun(w, options);
    QTRY_VERIFY_WITH_TIMEOUT(tape.count<core::OptimizerStepped>() >= 1, kTimeout);
    QVERIFY(w.runPanel()->checkEquivalenceButton()->isEnabled());
    QCOMPARE(w.runPanel()->checkBatchBox()->value(), 0);  // the whole batch
    QCOMPARE(w.runPanel()->checkBatchBox()->text(), QStringLiteral("whole batch"));
    QTest::mouseClick(w.runPanel()->checkEquivalenceButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(w.teaching()->equivalenceDialog() != nullptr, kTimeout);
    ui::EquivalenceDialog* dialog = w.teaching()->equivalenceDialog();
    QVERIFY(dialog->isVisible());
    QVERIFY(!dialog->isModal());
    const core::EquivalenceChecked& r = dialog->result();
    QVERIFY2(r.error.empty(), r.error.c_str());
    QCOMPARE(r.samples, qint64(32));
    QVERIFY(r.microBatchSizes.size() >= 4);
    QVERIFY(dialog->tensorTable()->rowCount() > 4);
    if (equal) {
        QVERIFY2(r.overall.relativeDifference <= 1e-5, qPrintable(QString::number(r.overall.relativeDifference)));
        QCOMPARE(dialog->verdict(), QStringLiteral("Equal up to float rounding"));
        QCOMPARE(r.runningStatisticsRelativeDifference, -1.0);
        QVERIFY(!dialog->text().contains(QLatin1String("BatchNorm comparison")));
        dialog->resize(900, 700);
        QVERIFY(dialog->grab().save(screenshotPath(QStringLiteral("screenshot-equivalence.png"))));
    } else {
        QVERIFY(r.batchStatistics);
        QVERIFY2(r.overall.relativeDifference > 1e-5, qPrintable(QString::number(r.overall.relativeDifference)));
        QVERIFY(r.runningStatisticsRelativeDifference >= 0);
        QVERIFY2(dialog->verdict().contains(QLatin1String("BatchNorm")), qPrintable(dialog->verdict()));
        QVERIFY(dialog->text().contains(QLatin1String("BatchNorm comparison")));
        QVERIFY2(dialog->text().contains(QLatin1String("micro-batch is normalised with its own mean")),
                 qPrintable(dialog->text()));
        dialog->resize(900, 700);
        QVERIFY(dialog->grab().save(screenshotPath(QStringLiteral("screenshot-equivalence-batchnorm.png"))));
    }
    // The last result stays reachable, and Help > How this works quotes it.
    QVERIFY(w.runModel()->digest().equivalence.has_value());
    QVERIFY(ui::howItWorksHtml(*w.runModel()).contains(QLatin1String("relative difference of")));
    stopRun(w);
}

QTEST_MAIN(TestTeaching)
#include "tst_teaching.moc"
