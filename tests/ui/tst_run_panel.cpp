#include <QtTest>
#include "tests/test_main.h"

#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLineEdit>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QTemporaryDir>

#include "ui/config/demo_options.h"
#include "ui/config/run_panel.h"
#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"

namespace tst_run_panel {

using namespace batchpilot;

namespace {

/// A run panel as the window builds it: the controller, the run model following it, the commands
/// whose actions the panel's buttons press.
struct Session {
    ui::TrainerController controller;
    ui::RunModel model;
    ui::RunCommands commands{&controller, &model};
    ui::RunPanel panel{&commands};

    Session() { model.follow(&controller); }
    /// What the model hears when a run starts with the panel's values (no trainer runs).
    void runStarted() { model.runStarted(panel.options()); }
};

}  // namespace

class TestRunPanel : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void defaultsAreValid();
    void eachOptimizerBringsItsLearningRate();
    void invalidInputDisablesStart_data();
    void offersCoresModelsAndDatasets();
    void offersTheGpuPresets();
    void invalidInputDisablesStart();
    void optionsRoundTrip();
    void validationFields();
    void settingsRoundTrip();
    void runLocksStartOnlyFields();
    void midRunChangesBecomeCommands();

private:
    static void selectVirtual(ui::RunPanel& panel, const QString& size) {
        panel.deviceBox()->setCurrentIndex(panel.deviceBox()->findData(QStringLiteral("virtual")));
        panel.virtualSizeEdit()->setText(size);
    }
};

void TestRunPanel::defaultsAreValid() {
    Session session;
    ui::RunPanel& panel = session.panel;
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
    QVERIFY(panel.startButton()->isEnabled());
    QVERIFY(!panel.stopButton()->isEnabled());
}

void TestRunPanel::eachOptimizerBringsItsLearningRate() {
    // As on the command line: Adam and AdamW start at PyTorch's 0.001, SGD at 0.05; a rate typed
    // by hand stays when the optimizer changes.
    Session session;
    ui::RunPanel& panel = session.panel;
    auto* optimizer = panel.findChild<QComboBox*>(QStringLiteral("optimizerCombo"));
    auto* rate = panel.findChild<QDoubleSpinBox*>(QStringLiteral("learningRate"));
    QVERIFY(optimizer && rate);
    QCOMPARE(panel.options().optimizer.learningRate, 0.05);
    optimizer->setCurrentIndex(optimizer->findData(static_cast<int>(core::OptimizerKind::Adam)));
    QCOMPARE(panel.options().optimizer.learningRate, 0.001);
    optimizer->setCurrentIndex(optimizer->findData(static_cast<int>(core::OptimizerKind::Sgd)));
    QCOMPARE(panel.options().optimizer.learningRate, 0.05);
    rate->setValue(0.02);
    optimizer->setCurrentIndex(optimizer->findData(static_cast<int>(core::OptimizerKind::AdamW)));
    QCOMPARE(panel.options().optimizer.learningRate, 0.02);
}

void TestRunPanel::invalidInputDisablesStart_data() {
    QTest::addColumn<int>("target");
    QTest::addColumn<QString>("budget");
    QTest::addColumn<QString>("reason");
    QTest::newRow("target batch 0") << 0 << QStringLiteral("64MiB") << QStringLiteral("Target batch");
    QTest::newRow("budget abc") << 256 << QStringLiteral("abc") << QStringLiteral("abc");
    QTest::newRow("budget empty") << 256 << QString() << QStringLiteral("budget");
    QTest::newRow("budget negative") << 256 << QStringLiteral("-5MiB") << QStringLiteral("budget");
}

void TestRunPanel::invalidInputDisablesStart() {
    QFETCH(int, target);
    QFETCH(QString, budget);
    QFETCH(QString, reason);
    Session session;
    ui::RunPanel& panel = session.panel;
    panel.show();
    QSignalSpy validity(&panel, &ui::RunPanel::validityChanged);
    selectVirtual(panel, budget);
    panel.targetBatchBox()->setValue(target);
    QVERIFY(!panel.isValid());
    QVERIFY(!panel.startButton()->isEnabled());
    QVERIFY2(panel.problem().contains(reason, Qt::CaseInsensitive), qPrintable(panel.problem()));
    // Start's tooltip says why.
    QVERIFY2(panel.startButton()->toolTip().contains(panel.problem()), qPrintable(panel.startButton()->toolTip()));
    QVERIFY(!validity.isEmpty());
    QCOMPARE(validity.last().first().toBool(), false);
    // The offending field is marked.
    QWidget* field =
        target < 1 ? static_cast<QWidget*>(panel.targetBatchBox()) : static_cast<QWidget*>(panel.virtualSizeEdit());
    QVERIFY(field->property("invalid").toBool());

    // Fixing it enables Start again.
    panel.targetBatchBox()->setValue(256);
    panel.virtualSizeEdit()->setText(QStringLiteral("128MiB"));
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
    QVERIFY(panel.startButton()->isEnabled());
    QVERIFY(!field->property("invalid").toBool());
    QCOMPARE(validity.last().first().toBool(), true);
}

void TestRunPanel::offersCoresModelsAndDatasets() {
    Session session;
    ui::RunPanel& panel = session.panel;
    for (const std::string& name : core::datasetNames())
        QVERIFY2(panel.datasetBox()->findData(QString::fromStdString(name)) >= 0, name.c_str());
    QCOMPARE(panel.datasetBox()->count(), int(core::datasetNames().size()));
    for (const std::string& name : core::builtinModelNames())
        QVERIFY2(panel.modelBox()->findText(QString::fromStdString(name)) >= 0, name.c_str());
}

void TestRunPanel::offersTheGpuPresets() {
    // The device menu offers each GPU people are handed, as --list-devices does; choosing one
    // trains on it (its budget is the card's, not the size field's), and a configuration naming
    // one comes back to it.
    Session session;
    ui::RunPanel& panel = session.panel;
    const QStringList expected{QStringLiteral("virtual:T4"),        QStringLiteral("virtual:L4"),
                               QStringLiteral("virtual:RTX4090"),   QStringLiteral("virtual:A100-40GB"),
                               QStringLiteral("virtual:A100-80GB"), QStringLiteral("virtual:H100-80GB"),
                               QStringLiteral("virtual:H200")};
    for (const QString& id : expected) QVERIFY2(panel.deviceBox()->findData(id) >= 0, qPrintable(id));
    const int t4 = panel.deviceBox()->findData(QStringLiteral("virtual:T4"));
    QVERIFY2(panel.deviceBox()->itemText(t4).contains(QStringLiteral("NVIDIA T4")),
             qPrintable(panel.deviceBox()->itemText(t4)));
    panel.deviceBox()->setCurrentIndex(t4);
    QVERIFY(!panel.virtualSizeEdit()->isEnabled());
    QCOMPARE(panel.options().device, std::string("virtual:T4"));
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
    core::TrainerOptions o = ui::demoOptions();
    o.device = "virtual:H200";
    panel.setOptions(o);
    QCOMPARE(panel.deviceBox()->currentData().toString(), QStringLiteral("virtual:H200"));
    QCOMPARE(panel.options().device, std::string("virtual:H200"));
}

void TestRunPanel::optionsRoundTrip() {
    Session session;
    ui::RunPanel& panel = session.panel;
    core::TrainerOptions demo = ui::demoOptions();
    demo.probe.objective = core::ProbeObjective::Largest;  // not the default: the field must carry it
    panel.setOptions(demo);
    const core::TrainerOptions back = panel.options();
    QCOMPARE(back.probe.objective, core::ProbeObjective::Largest);
    QCOMPARE(back.model.name, demo.model.name);
    QCOMPARE(back.device, demo.device);
    QCOMPARE(back.targetBatch, demo.targetBatch);
    QCOMPARE(back.data.samples, demo.data.samples);
    QCOMPARE(back.probe.headroom, demo.probe.headroom);
    QCOMPARE(back.steps, demo.steps);
    QCOMPARE(back.optimizer.learningRate, demo.optimizer.learningRate);
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
}

void TestRunPanel::validationFields() {
    Session session;
    ui::RunPanel& panel = session.panel;
    // Untouched, the held-out share stays core's default choice (data from a DatasetFactory is
    // then not split) and validation follows the epochs.
    QCOMPARE(panel.heldOutBox()->value(), 10.0);
    QCOMPARE(panel.options().validation.split, std::optional<double>());
    QCOMPARE(panel.options().validation.everySteps, std::optional<int64_t>());

    core::TrainerOptions chosen = ui::demoOptions();
    chosen.validation.split = 0.25;
    chosen.validation.everySteps = 7;
    panel.setOptions(chosen);
    QCOMPARE(panel.heldOutBox()->value(), 25.0);
    QCOMPARE(panel.validateEveryBox()->value(), 7);
    core::TrainerOptions back = panel.options();
    QCOMPARE(back.validation.split, std::optional<double>(0.25));
    QCOMPARE(back.validation.everySteps, std::optional<int64_t>(7));
    QVERIFY(back.validation.path.empty());

    // 0 % is "no validation", not "the default".
    panel.heldOutBox()->setValue(0);
    QCOMPARE(panel.heldOutBox()->text(), panel.heldOutBox()->specialValueText());
    QCOMPARE(panel.options().validation.split, std::optional<double>(0.0));
    panel.validateEveryBox()->setValue(0);
    QCOMPARE(panel.options().validation.everySteps, std::optional<int64_t>());

    // Validation data for the synthetic set is refused by core's rule, and the field is marked.
    panel.validationPathEdit()->setText(QStringLiteral("digits-test.csv"));
    QVERIFY(!panel.isValid());
    QVERIFY2(panel.problem().contains(QStringLiteral("validation data")), qPrintable(panel.problem()));
    QVERIFY(panel.validationPathEdit()->property("invalid").toBool());
    QVERIFY(!panel.startButton()->isEnabled());
    panel.validationPathEdit()->clear();
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
    QVERIFY(!panel.validationPathEdit()->property("invalid").toBool());

    // Keeping the best model: the metric goes to the options (the run folder keeps the
    // checkpoint); without validation core refuses it, and the field is marked.
    QCOMPARE(panel.keepBestBox()->currentText(), QStringLiteral("no"));
    QVERIFY(panel.options().checkpoint.keepBest.empty());
    panel.keepBestBox()->setCurrentIndex(panel.keepBestBox()->findData(QStringLiteral("val_accuracy")));
    QCOMPARE(panel.options().checkpoint.keepBest, std::string("val_accuracy"));
    QVERIFY(panel.options().checkpoint.directory.empty());
    QVERIFY(!panel.isValid());  // the held-out share is 0 % from above
    QVERIFY2(panel.problem().contains(QStringLiteral("needs validation")), qPrintable(panel.problem()));
    QVERIFY(panel.keepBestBox()->property("invalid").toBool());
    panel.heldOutBox()->setValue(10);
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
    QVERIFY(!panel.keepBestBox()->property("invalid").toBool());
    // A regression metric for the demo's classifier is refused too.
    panel.keepBestBox()->setCurrentIndex(panel.keepBestBox()->findData(QStringLiteral("val_mse")));
    QVERIFY(!panel.isValid());
    QVERIFY2(panel.problem().contains(QStringLiteral("regression")), qPrintable(panel.problem()));
    chosen.checkpoint.keepBest = "val_loss";
    panel.setOptions(chosen);
    QCOMPARE(panel.keepBestBox()->currentData().toString(), QStringLiteral("val_loss"));
    QVERIFY2(panel.isValid(), qPrintable(panel.problem()));

    // Memory savers: off by default, each choice reaches the options, and a configuration's shows.
    QCOMPARE(panel.options().memorySavers, core::MemorySavers::Off);
    for (const core::MemorySavers savers : {core::MemorySavers::Auto, core::MemorySavers::Checkpoint,
                                            core::MemorySavers::Bf16, core::MemorySavers::Both}) {
        panel.memorySaversBox()->setCurrentIndex(panel.memorySaversBox()->findData(int(savers)));
        QCOMPARE(panel.options().memorySavers, savers);
    }
    chosen.memorySavers = core::MemorySavers::Checkpoint;
    panel.setOptions(chosen);
    QCOMPARE(panel.memorySaversBox()->currentText(), QStringLiteral("activation checkpointing"));

    // Locked while a run uses them.
    session.runStarted();
    QVERIFY(!panel.keepBestBox()->isEnabled());
    QVERIFY(!panel.heldOutBox()->isEnabled());
    QVERIFY(!panel.validationPathEdit()->isEnabled());
    QVERIFY(!panel.validateEveryBox()->isEnabled());
}

void TestRunPanel::settingsRoundTrip() {
    QTemporaryDir dir;
    QSettings settings(dir.filePath(QStringLiteral("settings.ini")), QSettings::IniFormat);
    {
        Session session;
        ui::RunPanel& panel = session.panel;
        selectVirtual(panel, QStringLiteral("96MiB"));
        panel.targetBatchBox()->setValue(4096);
        panel.objectiveBox()->setCurrentIndex(panel.objectiveBox()->findData(int(core::ProbeObjective::Largest)));
        panel.heldOutBox()->setValue(20);
        panel.validateEveryBox()->setValue(50);
        panel.keepBestBox()->setCurrentIndex(panel.keepBestBox()->findData(QStringLiteral("val_loss")));
        panel.memorySaversBox()->setCurrentIndex(panel.memorySaversBox()->findData(int(core::MemorySavers::Auto)));
        panel.saveSettings(settings);
    }
    Session session;
    ui::RunPanel& restored = session.panel;
    restored.loadSettings(settings);
    QCOMPARE(restored.deviceId(), QStringLiteral("virtual:96MiB"));
    QCOMPARE(restored.targetBatchBox()->value(), 4096);
    QCOMPARE(restored.options().probe.objective, core::ProbeObjective::Largest);
    QCOMPARE(restored.options().validation.split, std::optional<double>(0.2));
    QCOMPARE(restored.options().validation.everySteps, std::optional<int64_t>(50));
    QCOMPARE(restored.options().checkpoint.keepBest, std::string("val_loss"));
    QCOMPARE(restored.options().memorySavers, core::MemorySavers::Auto);
}

void TestRunPanel::runLocksStartOnlyFields() {
    Session session;
    ui::RunPanel& panel = session.panel;
    session.runStarted();
    QVERIFY(!panel.startButton()->isEnabled());
    QVERIFY(!session.commands.startAction()->isEnabled());  // the button and the menu agree
    QVERIFY(panel.stopButton()->isEnabled());
    QVERIFY(panel.reprobeButton()->isEnabled());
    QVERIFY(!panel.modelBox()->isEnabled());  // fixed while the run uses it
    QVERIFY(!panel.objectiveBox()->isEnabled());
    QVERIFY(!panel.memorySaversBox()->isEnabled());
    QVERIFY(panel.targetBatchBox()->isEnabled());  // applies at the next batch
    QVERIFY(panel.deviceBox()->isEnabled());
    session.model.setPaused(true);
    QCOMPARE(panel.pauseButton()->text(), QStringLiteral("Resume"));
    QCOMPARE(session.commands.pauseAction()->text(), QStringLiteral("&Resume"));
    QVERIFY(!panel.reprobeButton()->isEnabled());
    session.model.runFinished();
    QVERIFY(panel.startButton()->isEnabled());
    QVERIFY(panel.modelBox()->isEnabled());
    QCOMPARE(panel.pauseButton()->text(), QStringLiteral("Pause"));
    QVERIFY(!panel.pauseButton()->isEnabled());
}

void TestRunPanel::midRunChangesBecomeCommands() {
    Session session;
    ui::RunPanel& panel = session.panel;
    selectVirtual(panel, QStringLiteral("64MiB"));
    QSignalSpy notes(&session.commands, &ui::RunCommands::note);
    panel.targetBatchBox()->setValue(512);
    QCOMPARE(notes.count(), 0);  // not running: nothing to apply to
    session.runStarted();
    panel.targetBatchBox()->setValue(2048);
    QCOMPARE(notes.count(), 1);
    QVERIFY2(notes.last().first().toString().contains(QStringLiteral("target batch → 2048")),
             qPrintable(notes.last().first().toString()));
    panel.virtualSizeEdit()->setText(QStringLiteral("256MiB"));
    Q_EMIT panel.virtualSizeEdit()->editingFinished();
    QCOMPARE(notes.count(), 2);
    QVERIFY2(notes.last().first().toString().contains(QLatin1String("virtual:256MiB")),
             qPrintable(notes.last().first().toString()));
    Q_EMIT panel.virtualSizeEdit()->editingFinished();  // same device again: nothing new
    QCOMPARE(notes.count(), 2);
}

}  // namespace tst_run_panel

BATCHPILOT_TEST_MAIN(tst_run_panel::TestRunPanel)
#include "tst_run_panel.moc"
