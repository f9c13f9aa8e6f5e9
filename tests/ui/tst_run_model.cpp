// The GUI's one run model and the run commands: what the model makes of the controller's signals
// and the trainer's events, and that the actions (shared by menus and the run panel's buttons)
// follow it. Each expectation is the event's own field or a rule the user sees, written out here.

#include <QtTest>
#include "tests/test_main.h"

#include <QAction>
#include <QCheckBox>
#include <QLabel>
#include <QPushButton>
#include <QStatusBar>

#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"
#include "ui/window/run_status.h"

namespace tst_run_model {

using namespace batchpilot;

namespace {

core::TrainerOptions options(qint64 target, const std::string& device) {
    core::TrainerOptions o;
    o.targetBatch = target;
    o.device = device;
    return o;
}

core::ProbeFinished probeFinished(qint64 micro, qint64 steps, qint64 target) {
    core::ProbeFinished f;
    f.sequence = 1;
    f.microBatch = micro;
    f.accumulationSteps = steps;
    f.targetBatch = target;
    return f;
}

core::StepMetrics stepMetrics(qint64 step, qint64 micro, qint64 steps, qint64 target) {
    core::StepMetrics m;
    m.step = step;
    m.microBatch = micro;
    m.accumulationSteps = steps;
    m.targetBatch = target;
    return m;
}

core::ProbeTrial trial(qint64 micro, bool fit) {
    core::ProbeTrial t;
    t.microBatch = micro;
    t.fit = fit;
    return t;
}

core::OomEvent oom(qint64 micro, core::Phase phase) {
    core::OomEvent o;
    o.microBatch = micro;
    o.phase = phase;
    o.recovered = true;
    o.newMicroBatch = micro / 2;
    return o;
}

core::StepModeWaiting waiting(qint64 step, qint64 index, qint64 size) {
    return core::StepModeWaiting{0, step, index, index * size, size, 64, false};
}

}  // namespace

class TestRunModel : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void startResetsAndTakesTheOptions();
    void planFollowsProbeStepsAndTargetChanges();
    void statusBarShowsThePlanAsASum();
    void deviceFollowsTheTrainer();
    void countsOnlyTrainingOoms();
    void stepModeWaitsUntilTheNextMicroBatch();
    void frequentEventsDoNotSignal();
    void actionsFollowTheModel();
    void nextRunsOneMicroBatchPerWait();
    void buttonsPressTheActions();
};

void TestRunModel::startResetsAndTakesTheOptions() {
    ui::RunModel model;
    QVERIFY(!model.hasRun());
    model.runStarted(options(96, "virtual:64MiB"));
    model.handle({probeFinished(32, 3, 96), core::OptimizerStepped{1.0, 1, 3}});
    model.setPaused(true);
    model.runFinished();
    QVERIFY(!model.isRunning());
    QVERIFY(!model.isPaused());          // a finished run is not paused
    QCOMPARE(model.steps(), qint64(1));  // its facts stay for the report
    QCOMPARE(model.plan().microBatch, qint64(32));

    QSignalSpy changed(&model, &ui::RunModel::changed);
    model.runStarted(options(512, "cpu"));
    QCOMPARE(changed.count(), 1);
    QVERIFY(model.isRunning());
    QCOMPARE(model.targetBatch(), qint64(512));  // before the trainer says anything
    QCOMPARE(model.device(), QStringLiteral("cpu"));
    QCOMPARE(model.plan().microBatch, qint64(0));
    QCOMPARE(model.steps(), qint64(0));
    QCOMPARE(model.probes(), 0);
    QVERIFY(!model.digest().probeFinished);
    QCOMPARE(model.state(), core::RunState::Idle);
}

void TestRunModel::planFollowsProbeStepsAndTargetChanges() {
    ui::RunModel model;
    model.runStarted(options(256, "cpu"));
    model.handle({core::RunStateChanged{0.1, core::RunState::Probing, {}}, probeFinished(64, 4, 256)});
    QCOMPARE(model.plan(), (ui::RunPlan{64, 4, 256}));
    QCOMPARE(model.state(), core::RunState::Probing);
    QCOMPARE(model.probes(), 1);

    core::TargetBatchChanged changedTarget;
    changedTarget.oldTarget = 256;
    changedTarget.newTarget = 100;
    model.handle({changedTarget});
    QCOMPARE(model.targetBatch(), qint64(100));

    // The fastest-micro-batch search chose a smaller size than the probe's.
    core::ThroughputChosen chosen;
    chosen.microBatch = 32;
    chosen.largestMicroBatch = 64;
    chosen.accumulationSteps = 4;
    chosen.targetBatch = 100;
    model.handle({chosen});
    QCOMPARE(model.plan(), (ui::RunPlan{32, 4, 100}));

    // A step reports the plan it used: 100 at micro-batch 64 is two micro-batches (50 + 50).
    model.handle({stepMetrics(2, 50, 2, 100)});
    QCOMPARE(model.plan(), (ui::RunPlan{50, 2, 100}));
}

void TestRunModel::statusBarShowsThePlanAsASum() {
    ui::RunModel model;
    QStatusBar bar;
    ui::RunStatus status(&bar, &model);
    auto* plan = bar.findChild<QLabel*>(QStringLiteral("statusPlan"));
    QVERIFY(plan != nullptr);
    model.runStarted(options(1024, "virtual:64MiB"));
    QCOMPARE(plan->text(), QStringLiteral("micro-batch —"));
    // The probe found 271: 1024 is four micro-batches of 256, not "271 × 4" (1084 samples).
    model.handle({probeFinished(271, 4, 1024)});
    QCOMPARE(plan->text(), QStringLiteral("1024 = 4 × 256"));
    // Sizes that differ by one are written as the two runs of them.
    model.handle({probeFinished(96, 11, 1000)});
    QCOMPARE(plan->text(), QStringLiteral("1000 = 10 × 91 + 1 × 90"));
    // A step whose micro-batches differed (the probe's trials in step 1): only the largest is known.
    model.handle({stepMetrics(1, 132, 12, 1000)});
    QCOMPARE(plan->text(), QStringLiteral("1000 in 12 × ≤132"));
    model.handle({stepMetrics(2, 125, 8, 1000)});
    QCOMPARE(plan->text(), QStringLiteral("1000 = 8 × 125"));
}

void TestRunModel::deviceFollowsTheTrainer() {
    ui::RunModel model;
    model.runStarted(options(64, "virtual:64MiB"));
    QCOMPARE(model.device(), QStringLiteral("virtual:64MiB"));
    model.handle({core::DeviceSwitched{2.0, "virtual:64MiB", "virtual:256MiB"}});
    QCOMPARE(model.device(), QStringLiteral("virtual:256MiB"));
    core::ProbeStarted probe;
    probe.device = "cpu";
    model.handle({probe});
    QCOMPARE(model.device(), QStringLiteral("cpu"));
}

void TestRunModel::countsOnlyTrainingOoms() {
    ui::RunModel model;
    model.runStarted(options(64, "virtual:8MiB"));
    // The probe's failed trial reports its OOM too: that is how the probe finds the limit.
    model.handle({trial(16, true), trial(32, false), oom(32, core::Phase::Forward), probeFinished(16, 4, 64)});
    QCOMPARE(model.trainingOoms(), 0);
    QCOMPARE(model.samplesReplayed(), qint64(0));
    // Training: a backward OOM replays its 16 samples; one in the optimizer step replays none.
    model.handle({oom(16, core::Phase::Backward), oom(8, core::Phase::OptimizerStep)});
    QCOMPARE(model.trainingOoms(), 2);
    QCOMPARE(model.samplesReplayed(), qint64(16));
    QCOMPARE(model.digest().trials.size(), size_t(2));
}

void TestRunModel::stepModeWaitsUntilTheNextMicroBatch() {
    ui::RunModel model;
    model.runStarted(options(64, "cpu"));
    model.handle({waiting(1, 0, 32)});
    QVERIFY(!model.isWaiting());  // step mode is off: a stale wait is not shown as waiting
    model.setStepMode(true);
    model.handle({waiting(1, 0, 32)});
    QVERIFY(model.isWaiting());
    QCOMPARE(model.waiting()->size, qint64(32));
    core::MicroBatchDone done;
    done.step = 1;
    done.size = 32;
    model.handle({done});
    QVERIFY(!model.isWaiting());
    model.handle({waiting(1, 1, 32)});
    model.releaseWait();  // a command let it go on
    QVERIFY(!model.isWaiting());
    model.handle({waiting(2, 0, 32)});
    model.runFinished();
    QVERIFY(!model.isWaiting());
    QVERIFY(model.stepMode());  // remembered for the next run
}

void TestRunModel::frequentEventsDoNotSignal() {
    ui::RunModel model;
    model.runStarted(options(64, "cpu"));
    QSignalSpy changed(&model, &ui::RunModel::changed);
    core::MemorySample sample;
    core::MicroBatchDone done;
    model.handle({sample, done, sample, done});
    QCOMPARE(changed.count(), 0);
    // A batch with something new signals once, however many events it holds.
    model.handle({sample, probeFinished(32, 2, 64), core::OptimizerStepped{1, 1, 2}, core::OptimizerStepped{2, 2, 2}});
    QCOMPARE(changed.count(), 1);
}

void TestRunModel::actionsFollowTheModel() {
    ui::TrainerController controller;
    ui::RunModel model;
    model.follow(&controller);
    ui::RunCommands commands(&controller, &model);
    QVERIFY(commands.startAction()->isEnabled());
    QVERIFY(!commands.stopAction()->isEnabled());
    QVERIFY(!commands.checkAction()->isEnabled());

    commands.setStartProblem(QStringLiteral("Target batch must be at least 1"));
    QVERIFY(!commands.startAction()->isEnabled());
    QVERIFY(commands.startAction()->toolTip().contains(QLatin1String("Target batch must be at least 1")));
    commands.setStartProblem({});

    QSignalSpy started(&commands, &ui::RunCommands::startRequested);
    commands.startAction()->trigger();
    QCOMPARE(started.count(), 1);

    model.runStarted(options(64, "cpu"));
    QVERIFY(!commands.startAction()->isEnabled());
    commands.startAction()->trigger();  // a shortcut while running: nothing
    QCOMPARE(started.count(), 1);
    QVERIFY(commands.pauseAction()->isEnabled());
    QVERIFY(commands.stopAction()->isEnabled());
    QVERIFY(commands.reprobeAction()->isEnabled());
    QVERIFY(commands.checkAction()->isEnabled());
    QVERIFY(!commands.nextAction()->isEnabled());  // not in step mode

    model.setPaused(true);
    QCOMPARE(commands.pauseAction()->text(), QStringLiteral("&Resume"));
    QVERIFY(!commands.reprobeAction()->isEnabled());

    // Step mode: the action gives it to the controller (remembered for the next run too).
    commands.stepModeAction()->setChecked(true);
    QVERIFY(controller.stepMode());
    QVERIFY(model.stepMode());
    controller.setStepMode(false);  // from elsewhere: the action follows
    QVERIFY(!commands.stepModeAction()->isChecked());

    model.runFinished();
    QVERIFY(commands.startAction()->isEnabled());
    QCOMPARE(commands.pauseAction()->text(), QStringLiteral("&Pause"));
    QVERIFY(!commands.pauseAction()->isEnabled());
}

void TestRunModel::nextRunsOneMicroBatchPerWait() {
    ui::TrainerController controller;
    ui::RunModel model;
    model.follow(&controller);
    ui::RunCommands commands(&controller, &model);
    commands.stepModeAction()->setChecked(true);
    model.runStarted(options(64, "cpu"));
    QVERIFY(!commands.nextAction()->isEnabled());  // running, not yet waiting
    model.handle({waiting(1, 0, 32)});
    QVERIFY(commands.nextAction()->isEnabled());
    QVERIFY(commands.finishAction()->isEnabled());
    commands.nextAction()->trigger();
    // Released at once: a held N cannot run a second micro-batch before the trainer waits again.
    QVERIFY(!model.isWaiting());
    QVERIFY(!commands.nextAction()->isEnabled());
    QVERIFY(!commands.finishAction()->isEnabled());
    model.handle({waiting(1, 1, 32)});
    QVERIFY(commands.nextAction()->isEnabled());
}

void TestRunModel::buttonsPressTheActions() {
    ui::TrainerController controller;
    ui::RunModel model;
    model.follow(&controller);
    ui::RunCommands commands(&controller, &model);
    QPushButton start;
    ui::bindButton(&start, commands.startAction());
    QCheckBox stepMode;
    ui::bindButton(&stepMode, commands.stepModeAction());
    QCOMPARE(start.text(), QStringLiteral("Start"));  // the action's text without its mnemonic
    QCOMPARE(stepMode.text(), QStringLiteral("Step by step"));
    QCOMPARE(start.toolTip(), commands.startAction()->toolTip());

    QSignalSpy started(&commands, &ui::RunCommands::startRequested);
    start.click();
    QCOMPARE(started.count(), 1);
    commands.setStartProblem(QStringLiteral("bad budget"));
    QVERIFY(!start.isEnabled());
    QVERIFY(start.toolTip().contains(QLatin1String("bad budget")));

    stepMode.click();
    QVERIFY(commands.stepModeAction()->isChecked());
    QVERIFY(controller.stepMode());
    commands.stepModeAction()->setChecked(false);  // the menu entry
    QVERIFY(!stepMode.isChecked());
    QVERIFY(!controller.stepMode());
}

}  // namespace tst_run_model

BATCHPILOT_TEST_MAIN(tst_run_model::TestRunModel)
#include "tst_run_model.moc"
