// Several devices in the window: the run panel takes a list of devices, the window trains rank 0
// and starts the other ranks as batchpilot-cli processes, and the ranks view and the status bar
// show every rank's share, micro-batches, speed and wait. Screenshots for a person to look at.

#include <QtTest>
#include "tests/test_main.h"

#include <cmath>
#include <map>
#include <memory>

#include <QComboBox>
#include <QDir>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTableWidget>

#include "core/events/events.h"
#include "core/config/run_config.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/config/demo_options.h"
#include "ui/config/run_panel.h"
#include "ui/log/event_log.h"
#include "ui/session/trainer_controller.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/window/main_window.h"
#include "ui/window/ranks_view.h"
#include "ui/window/run_status.h"

namespace tst_ranks {

using namespace batchpilot;

namespace {

constexpr int kTimeout = 300'000;

QString screenshotPath(const QString& name) {
    return QDir(QCoreApplication::applicationDirPath()).filePath(name);
}

void chooseSeveral(ui::RunPanel& panel, const QString& list) {
    QComboBox* device = panel.deviceBox();
    device->setCurrentIndex(device->findData(QStringLiteral("several")));
    panel.deviceListEdit()->setText(list);
}

template <class T>
int countOf(const QList<core::Event>& events) {
    return static_cast<int>(
        std::count_if(events.begin(), events.end(), [](const core::Event& e) { return std::holds_alternative<T>(e); }));
}

/// The first event of type T, or nullptr.
template <class T>
const T* firstOf(const QList<core::Event>& events) {
    for (const core::Event& e : events)
        if (const auto* found = std::get_if<T>(&e)) return found;
    return nullptr;
}

/// How often the run entered the Paused state.
int pausedStates(const QList<core::Event>& events) {
    return static_cast<int>(std::count_if(events.begin(), events.end(), [](const core::Event& e) {
        const auto* state = std::get_if<core::RunStateChanged>(&e);
        return state != nullptr && state->state == core::RunState::Paused;
    }));
}

/// Starts a two-rank job that runs until stopped (cnn, batch 64, virtual:12MiB + virtual:48MiB)
/// on `controller`, whose events are appended to `events`.
bool startEndlessJob(ui::TrainerController& controller, QList<core::Event>& events) {
    QObject::connect(&controller, &ui::TrainerController::eventsReceived, &controller,
                     [&events](const QList<core::Event>& batch) { events.append(batch); });
    core::TrainerOptions options = ui::demoOptions();
    options.model.name = "cnn";
    options.targetBatch = 64;
    options.steps = 100000;
    return controller.start(options, {QStringLiteral("virtual:12MiB"), QStringLiteral("virtual:48MiB")});
}

}  // namespace

class TestRanks : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() {
        QStandardPaths::setTestModeEnabled(true);
        QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotTests"));
        QCoreApplication::setApplicationName(QStringLiteral("tst_ranks"));
        QSettings().clear();
        qputenv("BATCHPILOT_CLI", BATCHPILOT_CLI_PATH);
    }

    void deviceListIsChecked() {
        ui::MainWindow w;
        ui::RunPanel& panel = *w.runPanel();
        chooseSeveral(panel, QStringLiteral("virtual:48MiB"));
        QVERIFY(!panel.isValid());
        QVERIFY2(panel.problem().contains(QStringLiteral("two or more")), qPrintable(panel.problem()));
        chooseSeveral(panel, QStringLiteral("virtual:48MiB, virtual:lots"));
        QVERIFY(!panel.isValid());
        QVERIFY2(panel.problem().contains(QStringLiteral("virtual:lots")), qPrintable(panel.problem()));
        QVERIFY(panel.deviceListEdit()->property("invalid").toBool());
        chooseSeveral(panel, QStringLiteral("virtual:48MiB, virtual:192MiB"));
        QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
        QCOMPARE(panel.devices(), (QStringList{QStringLiteral("virtual:48MiB"), QStringLiteral("virtual:192MiB")}));
        QCOMPARE(QString::fromStdString(panel.options().device), QStringLiteral("virtual:48MiB"));
    }

    void twoRanksShowTheirShares() {
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(QTest::qWaitForWindowExposed(&w));
        core::TrainerOptions options = ui::demoOptions();
        options.model.name = "cnn";
        options.targetBatch = 512;
        options.steps = 30;
        w.runPanel()->setOptions(options);
        chooseSeveral(*w.runPanel(), QStringLiteral("virtual:12MiB, virtual:48MiB"));
        QVERIFY2(w.runPanel()->isValid(), qPrintable(w.runPanel()->problem()));
        QTest::mouseClick(w.runPanel()->startButton(), Qt::LeftButton);
        QVERIFY(w.controller()->isRunning());
        QList<core::Event> events;
        connect(w.controller(), &ui::TrainerController::eventsReceived, this,
                [&events](const QList<core::Event>& batch) { events.append(batch); });

        // Both ranks appear, each with its share of the 512 samples and its own micro-batch.
        QTableWidget* table = w.ranksView()->table();
        QTRY_VERIFY_WITH_TIMEOUT(w.ranksView()->isVisible() && table->rowCount() == 2, kTimeout);
        QTRY_VERIFY_WITH_TIMEOUT(w.ranksView()->captionText().contains(QStringLiteral("step 6")), kTimeout);
        // Paused from here to the new target batch: the checks below read a run that stands still
        // (a running one adds events between a count and the view it is compared with, and on a
        // loaded machine could reach its step limit before the target changes).
        QSignalSpy pausedChanged(w.controller(), &ui::TrainerController::pausedChanged);
        w.controller()->pause();
        QTRY_VERIFY_WITH_TIMEOUT(!pausedChanged.isEmpty() && pausedChanged.last().at(0).toBool(), kTimeout);
        QVERIFY(w.controller()->isRunning());
        QVERIFY2(w.ranksView()->captionText().contains(QStringLiteral("gradients summed by Gloo")),
                 qPrintable(w.ranksView()->captionText()));
        int64_t shared = 0;
        for (int row = 0; row < 2; ++row) {
            auto* bar = qobject_cast<QProgressBar*>(table->cellWidget(row, 2));
            QVERIFY(bar != nullptr);
            QCOMPARE(bar->maximum(), 512);
            shared += bar->value();
        }
        QCOMPARE(shared, int64_t{512});
        QCOMPARE(table->item(1, 1)->text(), QStringLiteral("virtual:48MiB"));
        QVERIFY2(table->item(0, 3)->text() != table->item(1, 3)->text(),
                 qPrintable(table->item(0, 3)->text() + QStringLiteral(" vs ") + table->item(1, 3)->text()));
        // The status bar: every rank's speed in the last step and the rank that waited longest.
        const QString status = w.runStatus()->ranksText();
        const auto lastRanks = std::find_if(events.rbegin(), events.rend(), [](const core::Event& e) {
            return std::holds_alternative<core::RanksStepped>(e);
        });
        QVERIFY(lastRanks != events.rend());
        const auto& stepped = std::get<core::RanksStepped>(*lastRanks);
        const core::RankStep* waitedMost = &stepped.ranks.front();
        for (const core::RankStep& r : stepped.ranks) {
            QVERIFY2(status.contains(QStringLiteral("#%1 %2/s").arg(r.rank).arg(std::lround(r.samplesPerSecond))),
                     qPrintable(status));
            if (r.waitSeconds > waitedMost->waitSeconds) waitedMost = &r;
        }
        QVERIFY2(status.contains(waitedMost->waitSeconds >= 0.005 ? QStringLiteral("#%1 waited").arg(waitedMost->rank)
                                                                  : QStringLiteral("no rank waited")),
                 qPrintable(status));
        QVERIFY2(status.contains(QStringLiteral("all-reduce")), qPrintable(status));
        // The training-batch view splits the batch between the ranks; this window fills rank 0's.
        const auto& parts = w.accumulationView()->ranks();
        QCOMPARE(static_cast<int>(parts.size()), 2);
        QCOMPARE(parts[0].share + parts[1].share, int64_t{512});
        QVERIFY2(w.accumulationView()->caption().contains(QStringLiteral("rank 1: %1").arg(parts[1].share)),
                 qPrintable(w.accumulationView()->caption()));
        // The probe and memory charts give rank 1 a lane of its own beside rank 0's lines.
        ui::ChartsPanel* charts = w.chartsPanel();
        QTRY_VERIFY_WITH_TIMEOUT(charts->probeChart()->rankMicroBatch(1) > 0 &&
                                     charts->memoryChart()->rankPeaks(1) != nullptr &&
                                     !charts->memoryChart()->rankPeaks(1)->isEmpty(),
                                 kTimeout);
        QCOMPARE(charts->probeChart()->rankLaneCount(), 1);
        QCOMPARE(charts->memoryChart()->rankLaneCount(), 1);
        QVERIFY2(charts->probeChart()->rankLaneName(1).contains(QStringLiteral("virtual:48MiB")),
                 qPrintable(charts->probeChart()->rankLaneName(1)));
        // Rank 1's own probe trials, which its process ran, are drawn in its lane: those rank 0
        // received from it (RankProbed), each with its size and outcome, and a line in the log.
        QList<QPair<qint64, bool>> received;
        for (const core::Event& e : events) {
            if (const auto* report = std::get_if<core::RankProbed>(&e)) {
                QCOMPARE(report->rank, 1);
                QCOMPARE(report->device, std::string("virtual:48MiB"));
                for (const core::ProbeTrial& t : report->trials) received.append({t.microBatch, t.fit});
            }
        }
        QVERIFY(!received.isEmpty());
        QCOMPARE(charts->probeChart()->rankTrials(1), received);
        // Its OOMs (trials that ran out of memory, and OOMs it recovered from) are marked in the
        // memory chart too, named by the rank.
        int rankOoms = 0;
        for (const core::Event& e : events) {
            if (const auto* report = std::get_if<core::RankProbed>(&e)) {
                rankOoms += static_cast<int>(report->ooms.size());
                for (const core::ProbeTrial& t : report->trials) rankOoms += t.fit ? 0 : 1;
            }
        }
        int marked = 0;
        for (int i = 0; i < charts->memoryChart()->oomMarkerCount(); ++i)
            marked += charts->memoryChart()->oomText(i).startsWith(QStringLiteral("rank 1 (virtual:48MiB): ")) ? 1 : 0;
        qInfo("rank 1 reported %d OOM(s); the memory chart marks %d", rankOoms, marked);
        QCOMPARE(marked, rankOoms);
        QVERIFY(!charts->probeChart()->rankTrials(0).isEmpty());
        const ui::EventLogModel& log = *w.eventLog()->model();
        bool logged = false;
        for (int row = 0; row < log.rowCount(); ++row)
            logged = logged || (log.row(row).kind == QStringLiteral("rank 1 probe") &&
                                log.row(row).details.contains(QStringLiteral("rank 1 (virtual:48MiB): ")) &&
                                log.row(row).details.contains(QStringLiteral("tried %1").arg(received.front().first)));
        QVERIFY(logged);
        charts->redrawNow();
        w.grab().save(screenshotPath(QStringLiteral("screenshot-ranks.png")));
        w.resize(1600, 1000);
        QTest::qWait(100);
        QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-ranks-1600x1000.png"))));

        // A new target batch from the window: every rank changes at the same batch, the shares
        // keep their proportions.
        w.runPanel()->targetBatchBox()->setValue(256);
        w.controller()->resume();
        const auto shareBarMaximum = [&] {
            const auto* bar = w.ranksView()->table()->rowCount() == 2
                                  ? qobject_cast<QProgressBar*>(w.ranksView()->table()->cellWidget(0, 2))
                                  : nullptr;
            return bar != nullptr ? bar->maximum() : -1;  // no bar yet: wait, never dereference
        };
        QTRY_VERIFY_WITH_TIMEOUT(w.accumulationView()->targetBatch() == 256 && shareBarMaximum() == 256, kTimeout);

        // The run ends on every rank at the step limit; the window can start again.
        QSignalSpy finished(w.controller(), &ui::TrainerController::runFinished);
        QVERIFY(finished.wait(kTimeout));
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
        QCOMPARE(result.steps, int64_t{30});
        QVERIFY(!w.controller()->isRunning());
    }

    /// A device switch with several devices, from the window's device list: the rank whose
    /// entry changed moves at the next batch (every rank agrees), probes again within its new
    /// budget, and the shares follow it; a switch its device refuses leaves it where it was;
    /// another number of ranks is refused. Training stays exact: every step's loss equals that
    /// of one process training the whole batch on one device.
    void deviceSwitchMovesOneRank() {
        core::TrainerOptions options = ui::demoOptions();
        options.model.name = "cnn";
        options.targetBatch = 256;
        options.steps = 60;
        // SGD: Adam divides every gradient by its own size, so the last bits of gradients that nearly
        // cancel (which depend on the order of the sums: micro-batches, ranks) become whole steps.
        options.optimizer.kind = core::OptimizerKind::Sgd;
        options.optimizer.learningRate = 0.02;
        options.validation.split = 0;
        const auto lossesOf = [](const QList<core::Event>& events) {
            std::map<int64_t, double> losses;
            for (const core::Event& e : events)
                if (const auto* m = std::get_if<core::StepMetrics>(&e)) losses[m->step] = m->loss;
            return losses;
        };
        std::map<int64_t, double> reference;
        {
            ui::TrainerController one;
            QList<core::Event> events;
            connect(&one, &ui::TrainerController::eventsReceived, this,
                    [&events](const QList<core::Event>& batch) { events.append(batch); });
            QSignalSpy finished(&one, &ui::TrainerController::runFinished);
            core::TrainerOptions whole = options;
            whole.device = "virtual:256MiB";
            QVERIFY(one.start(whole));
            QVERIFY(finished.wait(kTimeout));
            reference = lossesOf(events);
        }
        QCOMPARE(static_cast<int>(reference.size()), 60);

        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(QTest::qWaitForWindowExposed(&w));
        ui::RunPanel& panel = *w.runPanel();
        panel.setOptions(options);
        chooseSeveral(panel, QStringLiteral("virtual:12MiB, virtual:48MiB"));
        QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
        QList<core::Event> events;
        connect(w.controller(), &ui::TrainerController::eventsReceived, this,
                [&events](const QList<core::Event>& batch) { events.append(batch); });
        QSignalSpy finished(w.controller(), &ui::TrainerController::runFinished);
        QTest::mouseClick(panel.startButton(), Qt::LeftButton);
        QTRY_VERIFY_WITH_TIMEOUT(countOf<core::RanksStepped>(events) >= 2 || !w.controller()->isRunning(), kTimeout);
        QVERIFY(w.controller()->isRunning());
        QLineEdit* list = panel.deviceListEdit();
        QVERIFY(list->isEnabled());

        // Another number of ranks: the field says why, nothing is asked of the ranks.
        list->setText(QStringLiteral("virtual:12MiB, virtual:48MiB, virtual:48MiB"));
        QVERIFY2(panel.problem().contains(QStringLiteral("has 2 ranks")), qPrintable(panel.problem()));
        Q_EMIT list->editingFinished();
        // A budget below what rank 1 already holds: its process refuses, it stays, rank 0 says so.
        list->setText(QStringLiteral("virtual:12MiB, virtual:64KiB"));
        QVERIFY2(panel.isValid(), qPrintable(panel.problem()));
        Q_EMIT list->editingFinished();
        const auto warned = [&](const std::string& text) {
            for (const core::Event& e : events)
                if (const auto* warning = std::get_if<core::Warning>(&e);
                    warning != nullptr && warning->message.find(text) != std::string::npos)
                    return true;
            return false;
        };
        QTRY_VERIFY_WITH_TIMEOUT(warned("rank 1 stays on virtual:48MiB") || !w.controller()->isRunning(), kTimeout);
        QVERIFY(w.controller()->isRunning());
        QCOMPARE(countOf<core::DeviceSwitched>(events), 0);
        // The list goes back to where rank 1 is.
        QTRY_COMPARE_WITH_TIMEOUT(list->text(), QStringLiteral("virtual:12MiB, virtual:48MiB"), kTimeout);

        // A smaller device for rank 1: it moves, probes again within 24 MiB, the shares follow.
        list->setText(QStringLiteral("virtual:12MiB, virtual:24MiB"));
        Q_EMIT list->editingFinished();
        const auto moved = [&] { return firstOf<core::DeviceSwitched>(events); };
        QTRY_VERIFY_WITH_TIMEOUT(moved() != nullptr || !w.controller()->isRunning(), kTimeout);
        // A run that ended without moving rank 1 is a failure to report, not a null to follow.
        QVERIFY2(moved() != nullptr, "the run ended without moving rank 1 to virtual:24MiB");
        QCOMPARE(moved()->rank, 1);
        QCOMPARE(moved()->from, std::string("virtual:48MiB"));
        QCOMPARE(moved()->to, std::string("virtual:24MiB"));
        QTRY_VERIFY_WITH_TIMEOUT(w.ranksView()->table()->item(1, 1)->text() == QStringLiteral("virtual:24MiB") ||
                                     !w.controller()->isRunning(),
                                 kTimeout);
        w.resize(1600, 1000);
        w.chartsPanel()->redrawNow();
        QTest::qWait(100);
        QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-ranks-switch-1600x1000.png"))));
        QVERIFY(finished.wait(kTimeout));
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
        QCOMPARE(result.steps, int64_t{60});

        // Rank 1 probed again for the switch, within its new budget, and every step it trained
        // there stayed within it.
        constexpr int64_t kNewBudget = int64_t{24} << 20;
        int64_t usableBefore = 0;
        int64_t usableAfter = 0;
        int stepsAfter = 0;
        for (const core::Event& e : events) {
            if (const auto* report = std::get_if<core::RankProbed>(&e)) {
                for (const core::ProbeStarted& p : report->probes) {
                    if (report->rank == 1 && p.reason == core::ProbeReason::Initial) usableBefore = p.usableBytes;
                    if (report->rank == 1 && p.reason == core::ProbeReason::DeviceSwitch &&
                        report->device == "virtual:24MiB")
                        usableAfter = p.usableBytes;
                }
            }
            if (const auto* step = std::get_if<core::RanksStepped>(&e)) {
                const core::RankStep& rank1 = step->ranks.at(1);
                if (rank1.device != "virtual:24MiB") continue;
                ++stepsAfter;
                QVERIFY2(rank1.peakBytes <= kNewBudget, qPrintable(QString::number(rank1.peakBytes)));
            }
        }
        qInfo("rank 1's usable memory: %.1f MiB on virtual:48MiB, %.1f MiB on virtual:24MiB; %d steps there",
              static_cast<double>(usableBefore) / (1 << 20), static_cast<double>(usableAfter) / (1 << 20), stepsAfter);
        QVERIFY(usableAfter > 0 && usableAfter < kNewBudget && usableAfter < usableBefore);
        QVERIFY(stepsAfter > 0);
        QCOMPARE(w.ranksView()->table()->item(1, 1)->text(), QStringLiteral("virtual:24MiB"));
        QCOMPARE(w.chartsPanel()->probeChart()->rankLaneName(1), QStringLiteral("rank 1 (virtual:24MiB)"));
        const ui::EventLogModel& log = *w.eventLog()->model();
        bool logged = false;
        for (int row = 0; row < log.rowCount(); ++row)
            logged = logged || log.row(row).details == QStringLiteral("rank 1: virtual:48MiB → virtual:24MiB");
        QVERIFY(logged);

        // Exact: the same losses as one process with the whole batch, to the rounding of sums
        // taken in another order, from the start to 15 steps after the switch (rank 1's new probe
        // and shares included). Later the synthetic task's fast descent amplifies that rounding
        // (2e-5 by step 50 with PyPI's LibTorch), as it does between any two orders of the sums.
        int64_t switchedAt = 0;  // steps done when rank 0 reported the switch
        for (const core::Event& e : events) {
            if (std::holds_alternative<core::DeviceSwitched>(e)) break;
            if (const auto* m = std::get_if<core::StepMetrics>(&e)) switchedAt = m->step;
        }
        const std::map<int64_t, double> losses = lossesOf(events);
        QCOMPARE(losses.size(), reference.size());
        double largest = 0;
        for (const auto& [step, loss] : reference) {
            if (step > switchedAt + 15) break;
            const double difference = std::abs(losses.at(step) - loss) / std::abs(loss);
            largest = std::max(largest, difference);
            QVERIFY2(difference <= 1e-5, qPrintable(QStringLiteral("step %1: loss %2, one process %3")
                                                        .arg(step)
                                                        .arg(losses.at(step), 0, 'g', 9)
                                                        .arg(loss, 0, 'g', 9)));
        }
        qInfo("switched after step %lld; losses of steps 1 to %lld: largest relative difference from one process %.3g",
              static_cast<long long>(switchedAt), static_cast<long long>(switchedAt + 15), largest);
    }

    /// Pause with several devices: every rank waits at the same training batch, for longer than
    /// the ranks' timeout (a pause is no failure), and goes on together when resumed; a stop
    /// during a pause ends every rank.
    void pauseHoldsEveryRank() {
        constexpr int kRankTimeoutSeconds = 10;
        ui::TrainerController controller;
        controller.setRankTimeout(kRankTimeoutSeconds);
        QList<core::Event> events;
        const auto steps = [&] { return countOf<core::RanksStepped>(events); };
        QSignalSpy finished(&controller, &ui::TrainerController::runFinished);
        QVERIFY(startEndlessJob(controller, events));
        QTRY_VERIFY_WITH_TIMEOUT(steps() >= 2 || !controller.isRunning(), kTimeout);
        QVERIFY2(controller.isRunning(),
                 finished.isEmpty() ? "" : finished.first().at(0).value<core::RunResult>().error.c_str());

        controller.pause();
        QTRY_VERIFY_WITH_TIMEOUT(pausedStates(events) == 1, kTimeout);
        const auto before = steps();
        // Longer than any rank waits in a collective: none gives up, none takes a step.
        QTest::qWait((kRankTimeoutSeconds + 2) * 1000);
        QCOMPARE(steps(), before);
        QVERIFY(controller.isRunning());
        QCOMPARE(countOf<core::ErrorEvent>(events), 0);

        controller.resume();
        QTRY_VERIFY_WITH_TIMEOUT(steps() >= before + 2, kTimeout);
        const auto* last =
            std::get_if<core::RanksStepped>(&*std::find_if(events.rbegin(), events.rend(), [](const core::Event& e) {
                return std::holds_alternative<core::RanksStepped>(e);
            }));
        QCOMPARE(static_cast<int>(last->ranks.size()), 2);
        for (const core::RankStep& rank : last->ranks) QVERIFY(rank.share > 0);

        // Stopped while paused: every rank ends, rank 1's process with status 0 (no warning).
        controller.pause();
        QTRY_VERIFY_WITH_TIMEOUT(pausedStates(events) == 2, kTimeout);
        controller.stop();
        QVERIFY(finished.wait(kTimeout));
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
        QVERIFY(result.stopped);
        for (const core::Event& e : events)
            if (const auto* warning = std::get_if<core::Warning>(&e))
                QVERIFY2(warning->message.find("rank 1") == std::string::npos, warning->message.c_str());
    }

    /// Measuring and changing the memory savers with several devices: every rank measures its
    /// own device at the same batch, and a change applies on every rank at the same batch (each
    /// probes again), the ranks' parameters still identical at the end.
    void saversAreMeasuredAndChangedOnEveryRank() {
        ui::TrainerController controller;
        QList<core::Event> events;
        const auto steps = [&] { return countOf<core::RanksStepped>(events); };
        QSignalSpy finished(&controller, &ui::TrainerController::runFinished);
        QVERIFY(startEndlessJob(controller, events));
        QTRY_VERIFY_WITH_TIMEOUT(steps() >= 2 || !controller.isRunning(), kTimeout);
        QVERIFY(controller.isRunning());

        // Run → Measure memory savers: this window's rank measures its device.
        controller.surveySavers();
        const auto survey = [&] { return firstOf<core::SaverSurvey>(events); };
        QTRY_VERIFY_WITH_TIMEOUT(survey() != nullptr || !controller.isRunning(), kTimeout);
        QVERIFY(controller.isRunning());
        QVERIFY2(survey()->reason.find("asked for on rank 0") != std::string::npos, survey()->reason.c_str());
        QCOMPARE(survey()->device, std::string("virtual:12MiB"));
        QVERIFY(!survey()->options.empty());

        // Apply activation checkpointing: rank 0 changes, and rank 1 probes again under it.
        controller.setMemorySavers(core::MemorySavers::Checkpoint);
        const auto changed = [&] { return firstOf<core::MemorySaversChanged>(events); };
        const auto rank1ProbedForSavers = [&] {
            for (const core::Event& e : events)
                if (const auto* report = std::get_if<core::RankProbed>(&e))
                    for (const core::ProbeStarted& p : report->probes)
                        if (report->rank == 1 && p.reason == core::ProbeReason::MemorySavers) return true;
            return false;
        };
        QTRY_VERIFY_WITH_TIMEOUT((changed() != nullptr && rank1ProbedForSavers()) || !controller.isRunning(), kTimeout);
        QVERIFY(controller.isRunning());
        QCOMPARE(changed()->to, std::string("checkpoint"));
        QVERIFY2(changed()->why.find("applied by every rank") != std::string::npos, changed()->why.c_str());
        const int atChange = steps();
        QTRY_VERIFY_WITH_TIMEOUT(steps() >= atChange + 2 || !controller.isRunning(), kTimeout);

        // The parameters are compared when the run ends: equal, or the run fails.
        controller.stop();
        QVERIFY(finished.wait(kTimeout));
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
        for (const core::Event& e : events)
            if (const auto* warning = std::get_if<core::Warning>(&e))
                QVERIFY2(warning->message.find("not available") == std::string::npos, warning->message.c_str());
    }

    void stopDuringADeviceSwitchEndsEveryRank_data() {
        QTest::addColumn<bool>("atTheSwitch");
        QTest::newRow("posted with the switch") << false;
        QTest::newRow("while the rank moves") << true;
    }
    /// Stop (the window's Stop, what Ctrl-C does in the terminal) at the worst moment of a
    /// device switch: with the switch request, or while rank 1 moves and probes its new device.
    /// Every rank ends by itself (rank 1's process with status 0), the checkpoint holds the last
    /// step, and the job resumes from it on the devices the ranks ended on.
    void stopDuringADeviceSwitchEndsEveryRank() {
        QFETCH(bool, atTheSwitch);
        QTemporaryDir directory;
        QVERIFY(directory.isValid());
        ui::TrainerController controller;
        QList<core::Event> events;
        QSignalSpy finished(&controller, &ui::TrainerController::runFinished);
        connect(&controller, &ui::TrainerController::eventsReceived, this, [&](const QList<core::Event>& batch) {
            events.append(batch);
            // Stopped as soon as rank 0 learns that rank 1 moved: rank 1 is probing its new device.
            if (atTheSwitch && firstOf<core::DeviceSwitched>(batch) != nullptr) controller.stop();
        });
        core::TrainerOptions options = ui::demoOptions();
        options.model.name = "cnn";
        options.targetBatch = 64;
        options.steps = 100000;
        options.validation.split = 0;
        options.checkpoint.directory = directory.path().toStdString();
        QVERIFY(controller.start(options, {QStringLiteral("virtual:12MiB"), QStringLiteral("virtual:48MiB")}));
        QTRY_VERIFY_WITH_TIMEOUT(countOf<core::RanksStepped>(events) >= 2 || !controller.isRunning(), kTimeout);
        QVERIFY(controller.isRunning());
        const QList<QProcess*> workers = controller.findChildren<QProcess*>();
        QCOMPARE(workers.size(), 1);
        int exitCode = -1;
        auto exitStatus = QProcess::CrashExit;
        connect(workers.front(), &QProcess::finished, this, [&](int code, QProcess::ExitStatus status) {
            exitCode = code;
            exitStatus = status;
        });

        controller.switchDevice(QStringLiteral("virtual:24MiB"), 1);
        if (!atTheSwitch) controller.stop();
        QVERIFY(finished.wait(kTimeout));
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QVERIFY2(result.state == core::RunState::Finished, result.error.c_str());
        QVERIFY(result.stopped);
        QVERIFY(result.checkpointError.empty());
        QCOMPARE(countOf<core::ErrorEvent>(events), 0);
        for (const core::Event& e : events)
            if (const auto* warning = std::get_if<core::Warning>(&e))
                QVERIFY2(warning->message.find("rank 1") == std::string::npos, warning->message.c_str());
        QTRY_COMPARE_WITH_TIMEOUT(exitStatus, QProcess::NormalExit, kTimeout);
        QCOMPARE(exitCode, 0);
        const core::DeviceSwitched* switched = firstOf<core::DeviceSwitched>(events);
        if (atTheSwitch) QVERIFY(switched != nullptr);
        // The last checkpoint is the last step.
        const core::CheckpointSaved* saved = nullptr;
        for (const core::Event& e : events)
            if (const auto* c = std::get_if<core::CheckpointSaved>(&e); c != nullptr && c->metric.empty()) saved = c;
        QVERIFY(saved != nullptr);
        QCOMPARE(saved->step, result.steps);

        // It resumes on the devices the ranks ended on, two more steps, with the run's options (as
        // its run folder's config.json holds them).
        const QString config = directory.filePath(QStringLiteral("config.json"));
        QVERIFY(core::saveRunConfig(config.toStdString(), options).has_value());
        QProcess resumed;
        resumed.setProcessChannelMode(QProcess::MergedChannels);
        const QString rank1 = switched != nullptr ? QStringLiteral("virtual:24MiB") : QStringLiteral("virtual:48MiB");
        resumed.start(
            QStringLiteral(BATCHPILOT_CLI_PATH),
            {QStringLiteral("--config"), config, QStringLiteral("--devices"), QStringLiteral("virtual:12MiB,") + rank1,
             QStringLiteral("--resume"), directory.path(), QStringLiteral("--steps"), QString::number(result.steps + 2),
             QStringLiteral("--no-run-folder"), QStringLiteral("--quiet")});
        QVERIFY(resumed.waitForFinished(kTimeout));
        const QString output = QString::fromUtf8(resumed.readAll());
        QVERIFY2(resumed.exitStatus() == QProcess::NormalExit && resumed.exitCode() == 0, qPrintable(output));
        QVERIFY2(output.contains(QStringLiteral("after %1 steps").arg(result.steps + 2)), qPrintable(output));
        qInfo("stopped %s after step %lld; rank 1 %s; resumed to step %lld",
              atTheSwitch ? "while rank 1 moved" : "with the switch request", static_cast<long long>(result.steps),
              switched != nullptr ? "had moved" : "had not moved", static_cast<long long>(result.steps + 2));
    }

    /// Closing the window while several ranks are paused: the controller's end stops the run,
    /// every rank leaves the pause and ends by itself (status 0), none is killed or left behind.
    void closingWhilePausedEndsEveryRank() {
        auto controller = std::make_unique<ui::TrainerController>();
        QList<core::Event> events;
        QVERIFY(startEndlessJob(*controller, events));
        QTRY_VERIFY_WITH_TIMEOUT(countOf<core::RanksStepped>(events) >= 2 || !controller->isRunning(), kTimeout);
        QVERIFY(controller->isRunning());
        controller->pause();
        QTRY_VERIFY_WITH_TIMEOUT(pausedStates(events) == 1, kTimeout);
        const QList<QProcess*> workers = controller->findChildren<QProcess*>();
        QCOMPARE(workers.size(), 1);
        QVERIFY(workers.front()->state() != QProcess::NotRunning);
        int exitCode = -1;
        auto exitStatus = QProcess::CrashExit;
        connect(workers.front(), &QProcess::finished, this, [&](int code, QProcess::ExitStatus status) {
            exitCode = code;
            exitStatus = status;
        });
        controller.reset();  // what closing the window does
        QCOMPARE(exitStatus, QProcess::NormalExit);
        QCOMPARE(exitCode, 0);
    }

    void missingWorkerProgramFailsTheRun() {
        // Never one device in place of several: without the worker program the run fails.
        qputenv("BATCHPILOT_CLI", "/nonexistent/batchpilot-cli");
        ui::MainWindow w;
        core::TrainerOptions options = ui::demoOptions();
        options.steps = 2;
        w.runPanel()->setOptions(options);
        chooseSeveral(*w.runPanel(), QStringLiteral("virtual:48MiB, virtual:48MiB"));
        QSignalSpy finished(w.controller(), &ui::TrainerController::runFinished);
        QTest::mouseClick(w.runPanel()->startButton(), Qt::LeftButton);
        QTRY_VERIFY_WITH_TIMEOUT(finished.count() == 1, 10000);
        const auto result = finished.takeFirst().at(0).value<core::RunResult>();
        QCOMPARE(result.state, core::RunState::Failed);
        QVERIFY2(QString::fromStdString(result.error).contains(QStringLiteral("/nonexistent/batchpilot-cli")),
                 result.error.c_str());
        qputenv("BATCHPILOT_CLI", BATCHPILOT_CLI_PATH);
    }
};

}  // namespace tst_ranks

BATCHPILOT_TEST_MAIN(tst_ranks::TestRanks)
#include "tst_ranks.moc"
