// A run this window did not start, shown from its folder (File → Open run folder, batchpilot
// --open): a finished run gives the views exactly what the live run gave them, a run still going
// is followed as its file grows, a damaged file is read around the damage and says so, and the
// run cannot be steered from here. The runs are real: this window's own trainer, and
// batchpilot-cli processes.

#include <QtTest>
#include "tests/test_main.h"

#include <algorithm>
#include <fstream>
#include <string>

#include <QAction>
#include <QComboBox>
#include <QSpinBox>
#include <QDir>
#include <QDirIterator>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QRegularExpression>
#include <QTabWidget>
#include <QPushButton>
#include <QSettings>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTableWidget>
#include <QTcpServer>
#include <QTemporaryDir>

#include <nlohmann/json.hpp>

#include "core/events/events.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/gpu_plan_panel.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/segments_view.h"
#include "ui/charts/speed_chart.h"
#include "ui/charts/throughput_chart.h"
#include "ui/config/demo_options.h"
#include "ui/config/run_panel.h"
#include "ui/log/event_log.h"
#include "ui/session/remote_run.h"
#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/session/run_watcher.h"
#include "ui/session/trainer_controller.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/teaching/micro_batch_table.h"
#include "ui/window/main_window.h"
#include "ui/window/ranks_view.h"
#include "ui/window/savers_view.h"

namespace tst_open_run {

using namespace batchpilot;

namespace {

constexpr int kTimeout = 300'000;  // ms; runs train on the CPU of a shared test machine

QString points(const ui::SeriesStore& store) {
    QStringList text;
    for (const QPointF& p : store.points())
        text << QStringLiteral("%1,%2").arg(p.x(), 0, 'g', 17).arg(p.y(), 0, 'g', 17);
    return text.join(QLatin1Char(' '));
}

/// What the window's views hold of a run, as text: every chart's stored points, the probe's
/// trials, the OOM markers, the captions, the run model's counts. Two windows that were given the
/// same events hold the same.
QStringList viewsOf(const ui::MainWindow& w) {
    const ui::ChartsPanel& c = *w.chartsPanel();
    const ui::RunModel& run = *w.runModel();
    QStringList facts;
    facts << QStringLiteral("loss: ") + points(c.lossChart()->rawStore())
          << QStringLiteral("smoothed: ") + points(c.lossChart()->smoothedStore())
          << QStringLiteral("validation: ") + points(c.lossChart()->validationStore())
          << QStringLiteral("probe: %1 trials, %2 probes, chosen %3")
                 .arg(c.probeChart()->trialCount())
                 .arg(c.probeChart()->sequenceCount())
                 .arg(c.probeChart()->chosenMicroBatch())
          << QStringLiteral("memory: ") + points(c.memoryChart()->allocatedStore())
          << QStringLiteral("ooms: %1").arg(c.memoryChart()->oomMarkerCount())
          << QStringLiteral("memory caption: ") + c.memoryChart()->captionText()
          << QStringLiteral("throughput: ") + points(c.throughputChart()->throughputStore())
          << QStringLiteral("micro-batch: ") + points(c.throughputChart()->microBatchStore())
          << QStringLiteral("speed: %1 candidates, chosen %2")
                 .arg(c.speedChart()->candidates().size())
                 .arg(c.speedChart()->chosenMicroBatch())
          << QStringLiteral("batch view: ") + w.accumulationView()->caption()
          << QStringLiteral("batch table: %1 rows, %2 samples filled, %3 replays, badge %4")
                 .arg(w.accumulationView()->table()->tableModel()->rows().size())
                 .arg(w.accumulationView()->filledSamples())
                 .arg(w.accumulationView()->replays())
                 .arg(w.accumulationView()->stepBadge())
          << QStringLiteral("model: %1 steps, %2 probes, %3 OOMs, %4 samples replayed, micro-batch %5 × %6 = %7, %8")
                 .arg(run.steps())
                 .arg(run.probes())
                 .arg(run.trainingOoms())
                 .arg(run.samplesReplayed())
                 .arg(run.plan().microBatch)
                 .arg(run.plan().accumulationSteps)
                 .arg(run.plan().targetBatch)
                 .arg(run.device())
          << QStringLiteral("record: %1 steps, %2 events").arg(w.record().stepCount()).arg(w.record().events().size());
    return facts;
}

/// The lines of an events file, parsed here (not by BatchPilot's reader): the reference.
std::vector<nlohmann::json> eventsIn(const QString& folder) {
    std::vector<nlohmann::json> events;
    std::ifstream in(QDir(folder).filePath(QStringLiteral("events.jsonl")).toStdString());
    for (std::string line; std::getline(in, line);) {
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object()) events.push_back(j);
    }
    return events;
}

std::vector<double> stepLosses(const std::vector<nlohmann::json>& events) {
    std::vector<double> losses;
    for (const auto& e : events)
        if (e.value("type", std::string()) == "step") losses.push_back(e.at("loss").get<double>());
    return losses;
}

std::vector<double> lossesShown(const ui::MainWindow& w) {
    std::vector<double> losses;
    for (const QPointF& p : w.chartsPanel()->lossChart()->rawStore().points()) losses.push_back(p.y());
    return losses;
}

/// The one run folder under `runs` (empty until a run made it).
QString onlyRunFolder(const QString& runs) {
    const QStringList folders = QDir(runs).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
    return folders.size() == 1 ? QDir(runs).filePath(folders.front()) : QString();
}

bool logSays(const ui::MainWindow& w, const QString& text) {
    const QAbstractItemModel* log = w.eventLog()->model();
    for (int row = 0; row < log->rowCount(); ++row)
        for (int column = 0; column < log->columnCount(); ++column)
            if (log->index(row, column).data().toString().contains(text)) return true;
    return false;
}

QString cliPath() {
    return QStringLiteral(BATCHPILOT_CLI_PATH);
}

/// A batchpilot-cli run into `runs`, as someone on a server would start it.
QStringList cliRun(const QString& runs, int steps) {
    return {QStringLiteral("--model"),
            QStringLiteral("cnn"),
            QStringLiteral("--device"),
            QStringLiteral("virtual:24MiB"),
            QStringLiteral("--target-batch"),
            QStringLiteral("256"),
            QStringLiteral("--samples"),
            QStringLiteral("2048"),
            QStringLiteral("--steps"),
            QString::number(steps),
            QStringLiteral("--threads"),
            QStringLiteral("1"),
            QStringLiteral("--quiet"),
            QStringLiteral("--runs-dir"),
            runs};
}

}  // namespace

class TestOpenRun : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() {
        QStandardPaths::setTestModeEnabled(true);
        QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotTests"));
        QCoreApplication::setApplicationName(QStringLiteral("tst_open_run"));
        QSettings().clear();
    }

    void aFinishedRunShowsAsItDidLive() {
        // A run of this window's, with its OOMs and probe, watched live; then its folder opened in
        // another window: every view holds the same.
        QTemporaryDir runs;
        ui::MainWindow live;
        live.resize(1280, 800);
        live.show();
        live.controller()->setRunsDirectory(runs.path());
        core::TrainerOptions options = ui::demoOptions();
        options.device = "virtual:24MiB";
        options.targetBatch = 256;
        options.data.samples = 2048;
        options.steps = 12;
        QVERIFY(live.startWith(options));
        QTRY_VERIFY_WITH_TIMEOUT(!live.controller()->isRunning(), kTimeout);
        const QString folder = live.controller()->runFolder();
        QVERIFY(!folder.isEmpty());
        QCOMPARE(live.controller()->droppedEvents(), qint64{0});
        const QStringList shownLive = viewsOf(live);
        QVERIFY2(live.chartsPanel()->probeChart()->trialCount() > 0, "the run probed nothing");
        QCOMPARE(live.runModel()->steps(), qint64{12});

        ui::MainWindow opened;
        opened.resize(1280, 800);
        opened.show();
        QVERIFY(opened.openRun(folder));
        QTRY_VERIFY_WITH_TIMEOUT(opened.watcher()->caughtUp(), kTimeout);
        QVERIFY(opened.watcher()->runEnded());
        const QStringList shownOpened = viewsOf(opened);
        for (int i = 0; i < shownLive.size(); ++i) QCOMPARE(shownOpened.at(i), shownLive.at(i));
        QCOMPARE(opened.watcher()->skippedLines(), qint64{0});
        QVERIFY2(opened.watchText().contains(QLatin1String("the run has ended")), qPrintable(opened.watchText()));
        QVERIFY(opened.windowTitle().contains(QFileInfo(folder).fileName()));
    }

    void aCliRunIsShownReadOnly() {
        // batchpilot-cli's run folder, opened: the loss of every step the file holds (read here
        // by a plain JSON parser), and no control that would pretend to act on it.
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(), cliRun(runs.path(), 6));
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 0);
        const QString folder = onlyRunFolder(runs.path());
        QVERIFY(!folder.isEmpty());
        const auto events = eventsIn(folder);

        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(w.openRun(folder));
        QTRY_VERIFY_WITH_TIMEOUT(w.watcher()->caughtUp(), kTimeout);
        QCOMPARE(lossesShown(w), stepLosses(events));
        QCOMPARE(w.runModel()->steps(), qint64{6});
        int trials = 0;
        for (const auto& e : events) trials += e.value("type", std::string()) == "probe_trial";
        QVERIFY(trials > 0);
        QCOMPARE(w.chartsPanel()->probeChart()->trialCount(), trials);
        QCOMPARE(w.watcher()->events(), static_cast<qint64>(events.size()));

        // Read-only, and saying why.
        QVERIFY(w.runModel()->isWatching());
        QVERIFY(!w.runModel()->isRunning());
        for (QAction* action : {w.commands()->pauseAction(), w.commands()->stopAction(), w.commands()->reprobeAction(),
                                w.commands()->checkAction()}) {
            QVERIFY2(!action->isEnabled(), qPrintable(action->text()));
            QVERIFY2(action->toolTip().contains(QLatin1String("cannot steer")), qPrintable(action->toolTip()));
        }
        QVERIFY(!w.saversView()->measureButton()->isEnabled());
        QVERIFY(w.saversView()->measureButton()->toolTip().contains(QLatin1String("cannot steer")));
        // The run panel shows what the run was started with (its config.json), so Start would train
        // it here; not the panel's own values.
        QCOMPARE(w.runPanel()->options().model.name, std::string("cnn"));
        QCOMPARE(w.runPanel()->options().targetBatch, int64_t{256});
        QCOMPARE(w.runPanel()->options().device, std::string("virtual:24MiB"));
        const auto* state = w.statusBar()->findChild<QLabel*>(QStringLiteral("watchState"));
        QVERIFY(state != nullptr && state->isVisible());
        QVERIFY2(state->text().contains(QLatin1String("the run ended")), qPrintable(state->text()));
        QTest::qWait(300);  // the charts redraw on their own timer, as for a person looking
        QVERIFY(w.grab().save(
            QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("screenshot-open-run.png"))));
        w.resize(1600, 1000);
        QTest::qWait(300);
        QVERIFY(w.grab().save(QDir(QCoreApplication::applicationDirPath())
                                  .filePath(QStringLiteral("screenshot-open-run-1600x1000.png"))));

        // Closing it gives the controls back to this window's own runs; the views keep the run.
        w.closeRun();
        QVERIFY(!w.runModel()->isWatching());
        QVERIFY(w.saversView()->measureButton()->isEnabled());
        QVERIFY(!w.commands()->pauseAction()->toolTip().contains(QLatin1String("cannot steer")));
        QCOMPARE(lossesShown(w), stepLosses(events));
        QVERIFY(w.watchText().isEmpty());
    }

    void aRunStillGoingIsFollowed() {
        // Opened while batchpilot-cli trains: steps appear while it runs, and at its end the window
        // holds every step the file holds.
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(), cliRun(runs.path(), 30));
        QVERIFY(cli.waitForStarted());
        QTRY_VERIFY_WITH_TIMEOUT(!onlyRunFolder(runs.path()).isEmpty(), kTimeout);
        const QString folder = onlyRunFolder(runs.path());
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        w.watcher()->setPollInterval(100);
        QVERIFY(w.openRun(folder));
        // Some steps shown while the process still trains.
        QTRY_VERIFY_WITH_TIMEOUT(!lossesShown(w).empty() || cli.state() == QProcess::NotRunning, kTimeout);
        const bool sawItLive = cli.state() != QProcess::NotRunning;
        QVERIFY2(sawItLive, "the run ended before the window showed a step (a too short run, or no following)");
        QVERIFY(!w.watcher()->runEnded());
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 0);
        QTRY_VERIFY_WITH_TIMEOUT(w.watcher()->runEnded(), 30'000);
        QTRY_COMPARE_WITH_TIMEOUT(lossesShown(w).size(), size_t{30}, 30'000);
        QCOMPARE(lossesShown(w), stepLosses(eventsIn(folder)));
        QTRY_VERIFY(w.watchText().contains(QLatin1String("the run has ended")));
    }

    void aRunOnSeveralDevicesShowsEveryRank() {
        // batchpilot-cli on two devices (two processes; rank 0 records the run): its folder opened,
        // the ranks view shows both ranks as it does for a run started here, and the probe chart
        // holds rank 1's trials beside rank 0's.
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(),
                  {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--devices"),
                   QStringLiteral("virtual:64MiB,virtual:128MiB"), QStringLiteral("--target-batch"),
                   QStringLiteral("256"), QStringLiteral("--steps"), QStringLiteral("4"), QStringLiteral("--threads"),
                   QStringLiteral("1"), QStringLiteral("--quiet"), QStringLiteral("--runs-dir"), runs.path()});
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 0);
        const QString folder = onlyRunFolder(runs.path());
        QVERIFY(!folder.isEmpty());
        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(w.openRun(folder));
        QTRY_VERIFY_WITH_TIMEOUT(w.watcher()->caughtUp(), kTimeout);
        QTRY_VERIFY_WITH_TIMEOUT(w.ranksView()->isVisible() && w.ranksView()->table()->rowCount() == 2, kTimeout);
        QVERIFY2(w.ranksView()->captionText().contains(QLatin1String("step 4")),
                 qPrintable(w.ranksView()->captionText()));
        QCOMPARE(w.chartsPanel()->probeChart()->rankLaneCount(), 1);  // rank 1's lane beside rank 0's trials
        QCOMPARE(lossesShown(w), stepLosses(eventsIn(folder)));
    }

    void aDamagedFileIsReadAroundTheDamage() {
        // A run's file with a damaged line in the middle, a line from a newer version and a last
        // line cut off (the run was killed while writing it): every other event is shown, and the
        // log says what was skipped.
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(), cliRun(runs.path(), 4));
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 0);
        const QString source = onlyRunFolder(runs.path());
        const auto events = eventsIn(source);
        QTemporaryDir damaged;
        {
            std::ofstream out(QDir(damaged.path()).filePath(QStringLiteral("events.jsonl")).toStdString());
            for (size_t i = 0; i < events.size(); ++i) {
                out << events[i].dump() << '\n';
                if (i == events.size() / 2) out << "{\"type\":\"step\",\"loss\":\x01garbage\n{\"type\":\"teleport\"}\n";
            }
            out << "{\"type\":\"step\",\"step\":5,\"lo";
        }
        ui::MainWindow w;
        w.show();
        QVERIFY(w.openRun(damaged.path()));
        QTRY_VERIFY_WITH_TIMEOUT(w.watcher()->caughtUp(), kTimeout);
        QCOMPARE(lossesShown(w), stepLosses(events));
        QCOMPARE(w.watcher()->skippedLines(), qint64{2});
        const int damagedLine = static_cast<int>(events.size() / 2) + 2;
        QVERIFY(logSays(w, QStringLiteral("line %1: not JSON").arg(damagedLine)));
        QVERIFY(logSays(w, QStringLiteral("line %1: an event of unknown type \"teleport\"").arg(damagedLine + 1)));
        QTRY_VERIFY_WITH_TIMEOUT(logSays(w, QStringLiteral("ends in an incomplete line")), 10'000);
    }

    void aServedRunIsWatchedAndSteered() {
        // batchpilot-cli --serve, and this window connected to it: the charts fill, Pause, Resume,
        // a new target batch and Stop act on that process (seen in its events), a cut connection
        // comes back without losing or repeating an event, and a watch token cannot steer.
        constexpr int kNetwork = 60'000;  // a served run answers within a second; a minute on a loaded machine
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(), cliRun(runs.path(), 100000) << QStringLiteral("--serve") << QStringLiteral("0"));
        QVERIFY(cli.waitForStarted());
        QString served;
        QTRY_VERIFY_WITH_TIMEOUT(!(served = onlyRunFolder(runs.path())).isEmpty() &&
                                     QFileInfo::exists(QDir(served).filePath(QStringLiteral("serve.json"))),
                                 kNetwork);
        QTest::qWait(200);  // serve.json is written whole before the run starts; read it once it is there
        std::ifstream in(QDir(served).filePath(QStringLiteral("serve.json")).toStdString());
        const nlohmann::json urls = nlohmann::json::parse(in);
        const QUrl control(QString::fromStdString(urls.at("url")));
        const QUrl watch(QString::fromStdString(urls.at("watch_url")));

        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(w.connectToRun(control));
        QTRY_VERIFY_WITH_TIMEOUT(w.remote()->canControl() && lossesShown(w).size() >= 3, kNetwork);
        QVERIFY(w.commands()->pauseAction()->isEnabled());
        QVERIFY2(w.watchText().contains(QLatin1String("act on it")), qPrintable(w.watchText()));
        // The run panel shows the served run's configuration (GET /config), not its own values.
        QTRY_COMPARE_WITH_TIMEOUT(w.runPanel()->options().model.name, std::string("cnn"), kNetwork);
        QCOMPARE(w.runPanel()->options().targetBatch, int64_t{256});

        w.commands()->pauseAction()->trigger();
        QTRY_COMPARE_WITH_TIMEOUT(w.runModel()->state(), core::RunState::Paused, kNetwork);
        QCOMPARE(w.commands()->pauseAction()->text(), QStringLiteral("&Resume"));
        w.commands()->pauseAction()->trigger();
        QTRY_VERIFY_WITH_TIMEOUT(w.runModel()->state() != core::RunState::Paused, kNetwork);
        // The run panel's target batch field, as a person would change it; the fields fixed at a
        // run's start are locked as for a run of this window's.
        QTRY_VERIFY_WITH_TIMEOUT(!w.runPanel()->modelBox()->isEnabled(), kNetwork);
        w.runPanel()->targetBatchBox()->setValue(512);
        QTRY_COMPARE_WITH_TIMEOUT(w.runModel()->targetBatch(), qint64{512}, kNetwork);

        // A second window with the watch token sees the run and cannot steer it.
        ui::MainWindow watcher;
        QVERIFY(watcher.connectToRun(watch));
        QTRY_VERIFY_WITH_TIMEOUT(!lossesShown(watcher).empty(), kNetwork);
        QVERIFY(!watcher.remote()->canControl());
        QVERIFY(!watcher.commands()->pauseAction()->isEnabled());
        QVERIFY2(watcher.commands()->pauseAction()->toolTip().contains(QLatin1String("watch-only")),
                 qPrintable(watcher.commands()->pauseAction()->toolTip()));
        watcher.closeRun();

        // A token the run does not know: refused, said, and not tried again.
        QUrl forged = control;
        forged.setQuery(QStringLiteral("token=") + QString(32, QLatin1Char('a')));
        ui::MainWindow refused;
        QVERIFY(refused.connectToRun(forged));
        QTRY_COMPARE_WITH_TIMEOUT(refused.remote()->state(), ui::RemoteRun::State::Failed, kNetwork);
        QVERIFY(logSays(refused, QStringLiteral("refused the connection")));
        QVERIFY(lossesShown(refused).empty());
        QVERIFY(!refused.commands()->pauseAction()->isEnabled());
        // A server that has gone away (nothing listens on its port any more): tried again, said so.
        QUrl gone = control;
        {
            QTcpServer closed;
            QVERIFY(closed.listen(QHostAddress::LocalHost));
            gone.setPort(closed.serverPort());
        }
        ui::MainWindow waiting;
        QVERIFY(waiting.connectToRun(gone));
        QTRY_COMPARE_WITH_TIMEOUT(waiting.remote()->state(), ui::RemoteRun::State::Reconnecting, kNetwork);
        QVERIFY2(waiting.remote()->stateText().contains(QLatin1String("reconnecting")),
                 qPrintable(waiting.remote()->stateText()));
        waiting.closeRun();

        // The connection cut mid-run: reconnected from the last event received.
        const qint64 before = w.remote()->events();
        w.remote()->dropConnection();
        QTRY_COMPARE_WITH_TIMEOUT(w.remote()->state(), ui::RemoteRun::State::Live, kNetwork);
        QTRY_VERIFY_WITH_TIMEOUT(w.remote()->events() > before + 20, kNetwork);
        QVERIFY(w.grab().save(
            QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("screenshot-connected.png"))));

        w.commands()->stopAction()->trigger();
        // The event loop runs meanwhile: the command is sent from it.
        QTRY_VERIFY_WITH_TIMEOUT(cli.state() == QProcess::NotRunning, kNetwork);
        QCOMPARE(cli.exitCode(), 0);
        QTRY_VERIFY_WITH_TIMEOUT(w.remote()->runEnded() && w.remote()->state() == ui::RemoteRun::State::Ended,
                                 kNetwork);
        // Every step the process wrote, once each, in order — across the cut.
        QTRY_COMPARE_WITH_TIMEOUT(lossesShown(w), stepLosses(eventsIn(served)), 30'000);
        QCOMPARE(w.remote()->events(), static_cast<qint64>(eventsIn(served).size()));
        QVERIFY(!w.commands()->pauseAction()->isEnabled());
        const QByteArray said = cli.readAllStandardError();
        QVERIFY2(said.contains("remote command: pause") && said.contains("remote command: target batch -> 512") &&
                     said.contains("remote command: stop"),
                 said.constData());
        // Showing the run's configuration in the run panel sent nothing.
        QVERIFY2(!said.contains("target batch -> 256") && !said.contains("device of rank"), said.constData());
    }

    void aServedRunOnSeveralDevicesShowsEveryRankAndMovesOne() {
        // batchpilot-cli --devices … --serve: rank 0 serves the whole job. A connected window shows
        // both ranks as for a run of its own, and moving rank 1 from the run panel's device list
        // moves that rank of the remote job.
        constexpr int kNetwork = 60'000;
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(),
                  {QStringLiteral("--model"), QStringLiteral("mlp"), QStringLiteral("--devices"),
                   QStringLiteral("virtual:64MiB,virtual:128MiB"), QStringLiteral("--target-batch"),
                   QStringLiteral("256"), QStringLiteral("--steps"), QStringLiteral("100000"),
                   QStringLiteral("--threads"), QStringLiteral("1"), QStringLiteral("--quiet"),
                   QStringLiteral("--runs-dir"), runs.path(), QStringLiteral("--serve"), QStringLiteral("0")});
        QVERIFY(cli.waitForStarted());
        QString served;
        QTRY_VERIFY_WITH_TIMEOUT(!(served = onlyRunFolder(runs.path())).isEmpty() &&
                                     QFileInfo::exists(QDir(served).filePath(QStringLiteral("serve.json"))),
                                 kNetwork);
        QTest::qWait(200);
        std::ifstream in(QDir(served).filePath(QStringLiteral("serve.json")).toStdString());
        const QUrl control(QString::fromStdString(nlohmann::json::parse(in).at("url")));

        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(w.connectToRun(control));
        QTRY_VERIFY_WITH_TIMEOUT(w.ranksView()->isVisible() && w.ranksView()->table()->rowCount() == 2, kNetwork);
        QTRY_COMPARE_WITH_TIMEOUT(w.ranksView()->table()->item(1, 1)->text(), QStringLiteral("virtual:128MiB"),
                                  kNetwork);
        QLineEdit* list = w.runPanel()->deviceListEdit();
        QTRY_VERIFY_WITH_TIMEOUT(list->isEnabled() && list->text() == QStringLiteral("virtual:64MiB, virtual:128MiB"),
                                 kNetwork);
        QVERIFY2(w.runPanel()->deviceInfoText().contains(QLatin1String("served job")),
                 qPrintable(w.runPanel()->deviceInfoText()));
        list->setText(QStringLiteral("virtual:64MiB, virtual:96MiB"));
        Q_EMIT list->editingFinished();
        QTRY_COMPARE_WITH_TIMEOUT(w.ranksView()->table()->item(1, 1)->text(), QStringLiteral("virtual:96MiB"),
                                  kNetwork);
        const auto events = eventsIn(served);
        QVERIFY2(std::any_of(events.begin(), events.end(),
                             [](const nlohmann::json& e) {
                                 return e.value("type", std::string()) == "device_switch" && e.value("rank", -1) == 1 &&
                                        e.value("to", std::string()) == "virtual:96MiB";
                             }),
                 "the run's events have no device_switch of rank 1 to virtual:96MiB");
        w.resize(1600, 1000);
        w.chartsPanel()->redrawNow();
        QTest::qWait(100);
        QVERIFY(w.grab().save(QDir(QCoreApplication::applicationDirPath())
                                  .filePath(QStringLiteral("screenshot-connected-ranks-1600x1000.png"))));

        w.commands()->stopAction()->trigger();
        QTRY_VERIFY_WITH_TIMEOUT(cli.state() == QProcess::NotRunning, kNetwork);
        QCOMPARE(cli.exitCode(), 0);
        QTRY_VERIFY_WITH_TIMEOUT(w.remote()->runEnded(), kNetwork);
        QTRY_COMPARE_WITH_TIMEOUT(lossesShown(w), stepLosses(eventsIn(served)), 30'000);
        const QByteArray said = cli.readAllStandardError();
        QVERIFY2(said.contains("remote command: device of rank 1 -> virtual:96MiB"), said.constData());
    }

    void aCliRunsSegmentsAndItsPlanOnEveryGpu() {
        // A batchpilot-cli run on a virtual GPU that models PyTorch's caching allocator, opened:
        // the Segments tab holds the allocator's latest state and every OOM's, as the run's file
        // says (read here by a plain JSON parser) and as PyTorch's rules require; the Every GPU tab
        // shows the table the CLI printed for --plan-for all.
        QTemporaryDir runs;
        QProcess cli;
        cli.start(cliPath(),
                  {QStringLiteral("--model"), QStringLiteral("cnn"), QStringLiteral("--device"),
                   QStringLiteral("virtual:64MiB/caching"), QStringLiteral("--target-batch"), QStringLiteral("512"),
                   QStringLiteral("--samples"), QStringLiteral("2048"), QStringLiteral("--steps"), QStringLiteral("4"),
                   QStringLiteral("--threads"), QStringLiteral("1"), QStringLiteral("--quiet"),
                   QStringLiteral("--plan-for"), QStringLiteral("all"), QStringLiteral("--runs-dir"), runs.path()});
        QVERIFY(cli.waitForFinished(kTimeout));
        QCOMPARE(cli.exitCode(), 0);
        const QString printed = QString::fromUtf8(cli.readAllStandardOutput());
        const QString folder = onlyRunFolder(runs.path());
        QVERIFY(!folder.isEmpty());
        const auto events = eventsIn(folder);
        std::vector<nlohmann::json> ooms;
        nlohmann::json latest;
        int oomEvents = 0;
        for (const auto& e : events) {
            const std::string type = e.value("type", std::string());
            oomEvents += type == "oom";
            if (type != "allocator_segments") continue;
            if (e.at("at_oom").get<bool>())
                ooms.push_back(e);
            else
                latest = e;
        }
        QVERIFY2(!latest.is_null(), "the run reported no segments");
        // Every OOM of the run was the allocator's (nothing injected): each has its state.
        QVERIFY(oomEvents > 0);
        QCOMPARE(static_cast<int>(ooms.size()), oomEvents);

        ui::MainWindow w;
        w.resize(1280, 800);
        w.show();
        QVERIFY(w.openRun(folder));
        QTRY_VERIFY_WITH_TIMEOUT(w.watcher()->caughtUp(), kTimeout);
        ui::SegmentsView* view = w.chartsPanel()->segmentsView();
        QCOMPARE(view->stateCount(), 1 + oomEvents);

        // A state shown as the file has it, and as PyTorch's allocator makes segments: a small
        // pool's are 2 MiB; a large pool's 20 MiB for requests of 1–10 MiB, else the request rounded
        // up to 2 MiB (so a multiple of 2 MiB); blocks tile their segment, 512-byte multiples.
        const auto checkState = [&](const core::AllocatorSegments& shown, const nlohmann::json& file) {
            QCOMPARE(shown.segments.size(), file.at("segments").size());
            int64_t reserved = 0;
            for (size_t i = 0; i < shown.segments.size(); ++i) {
                const core::SegmentView& segment = shown.segments[i];
                const auto& expected = file.at("segments")[i];
                QCOMPARE(segment.bytes, expected.at("bytes").get<int64_t>());
                QCOMPARE(segment.blocks.size(), expected.at("blocks").size());
                if (segment.smallPool)
                    QCOMPARE(segment.bytes, int64_t{2} << 20);
                else
                    QVERIFY2(segment.bytes % (int64_t{2} << 20) == 0 && segment.bytes >= (int64_t{10} << 20),
                             qPrintable(QString::number(segment.bytes)));
                int64_t offset = 0;
                for (size_t b = 0; b < segment.blocks.size(); ++b) {
                    QCOMPARE(segment.blocks[b].offset, offset);
                    QCOMPARE(segment.blocks[b].bytes % 512, int64_t{0});
                    QCOMPARE(segment.blocks[b].allocated, expected.at("blocks")[b].at("allocated").get<bool>());
                    offset += segment.blocks[b].bytes;
                }
                QCOMPARE(offset, segment.bytes);
                reserved += segment.bytes;
            }
            QVERIFY2(reserved <= file.at("limit_bytes").get<int64_t>(), "segments beyond the device's limit");
        };
        QVERIFY(view->shown() != nullptr);
        QVERIFY(!view->shown()->atOom);
        checkState(*view->shown(), latest);
        QVERIFY2(view->stateName(0).contains(QStringLiteral("after step %1").arg(latest.at("step").get<int>())),
                 qPrintable(view->stateName(0)));

        // Each OOM frozen as it was: what was tried did not fit. Exhaustion: a new segment of that
        // size would pass the limit and the cache held no block large enough. Fragmentation: the
        // same, though the limit less what tensors held was enough for the request.
        for (int i = 0; i < oomEvents; ++i) {
            view->showState(1 + i);
            const core::AllocatorSegments& state = *view->shown();
            QVERIFY(state.atOom);
            checkState(state, ooms[i]);
            const int64_t limit = state.limitBytes;
            QVERIFY2(state.reservedBytes() + state.segmentBytes > limit, qPrintable(view->summaryText()));
            int64_t largestCached = 0;
            for (const auto& segment : state.segments)
                for (const auto& block : segment.blocks)
                    if (!block.allocated) largestCached = std::max(largestCached, block.bytes);
            QVERIFY2(largestCached < state.requestedBytes, qPrintable(view->summaryText()));
            QCOMPARE(state.fragmentation, limit - state.allocatedBytes() >= state.requestedBytes);
            const QString kind = state.fragmentation ? QStringLiteral("Fragmentation") : QStringLiteral("Exhaustion");
            QVERIFY2(view->summaryText().contains(kind), qPrintable(view->summaryText()));
            QVERIFY(!view->map()->triedRect().isEmpty());
        }

        // Drawn to scale: in every segment's bar the allocated colour covers the allocated share
        // of the bar (counted in the painted pixels; a 1-pixel gap separates neighbouring blocks).
        w.chartsPanel()->tabs()->setCurrentWidget(view);
        QTRY_VERIFY(view->map()->isVisible());
        const auto checkPainted = [&](int stateIndex) {
            view->showState(stateIndex);
            const core::AllocatorSegments& state = *view->shown();
            const QImage image = view->map()->grab().toImage();
            const QColor allocatedColor = ui::SegmentMap::allocatedColor(false);
            for (size_t i = 0; i < state.segments.size(); ++i) {
                const QRectF bar = view->map()->segmentRect(static_cast<int>(i));
                const int y = static_cast<int>(bar.center().y() * image.devicePixelRatio());
                int painted = 0;
                for (int x = static_cast<int>(bar.left()) + 1; x < static_cast<int>(bar.right()); ++x)
                    painted += image.pixelColor(x, y) == allocatedColor;
                int64_t allocatedBytes = 0;
                for (const auto& block : state.segments[i].blocks) allocatedBytes += block.allocated ? block.bytes : 0;
                const double expected =
                    bar.width() * static_cast<double>(allocatedBytes) / static_cast<double>(state.segments[i].bytes);
                QVERIFY2(std::abs(painted - expected) <= 2.0 + static_cast<double>(state.segments[i].blocks.size()),
                         qPrintable(QStringLiteral("state %1, segment %2: %3 pixels painted as allocated, %4 expected")
                                        .arg(stateIndex)
                                        .arg(i)
                                        .arg(painted)
                                        .arg(expected)));
            }
        };
        for (int i = 0; i < view->stateCount(); ++i) checkPainted(i);

        // Every GPU: the CLI's table, row by row (device, usable memory, micro-batch, plan).
        const ui::GpuPlanPanel* plan = w.chartsPanel()->gpuPlanPanel();
        QVERIFY(!plan->rows().empty());
        const QRegularExpression row(QStringLiteral(R"(^\s+(virtual:\S+)\s+(\d+(?:\.\d+)? \S+)\s+(\d+|-)\s+(.+)$)"));
        int matched = 0;
        for (const QString& line : printed.split(QLatin1Char('\n'))) {
            const auto m = row.match(line);
            if (!m.hasMatch()) continue;
            const auto found = std::find_if(plan->rows().begin(), plan->rows().end(), [&](const core::GpuPlanRow& r) {
                return QString::fromStdString(r.target.device) == m.captured(1);
            });
            QVERIFY2(found != plan->rows().end(), qPrintable(line));
            const int index = static_cast<int>(found - plan->rows().begin());
            QCOMPARE(plan->table()->item(index, 0)->text(), m.captured(1));
            QCOMPARE(plan->table()->item(index, 2)->text(), m.captured(2));
            if (m.captured(3) == QLatin1String("-")) {
                QCOMPARE(plan->table()->item(index, 3)->text(), QStringLiteral("does not fit"));
            } else {
                QCOMPARE(found->microBatch, m.captured(3).toLongLong());
                QCOMPARE(plan->table()->item(index, 5)->text(), m.captured(4).trimmed());
            }
            ++matched;
        }
        QCOMPARE(matched, static_cast<int>(plan->rows().size()));
        QVERIFY2(plan->caption().contains(QLatin1String("virtual:64MiB/caching")), qPrintable(plan->caption()));

        // For a person to look at: the Segments tab at an OOM, and Every GPU.
        view->showState(1);
        QTest::qWait(50);  // the summary's new height is laid out
        QVERIFY(w.grab().save(
            QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("screenshot-segments.png"))));
        w.resize(1600, 1000);
        QTest::qWait(50);
        QVERIFY(w.grab().save(QDir(QCoreApplication::applicationDirPath())
                                  .filePath(QStringLiteral("screenshot-segments-1600x1000.png"))));
        w.resize(1280, 800);
        w.chartsPanel()->tabs()->setCurrentWidget(w.chartsPanel()->gpuPlanPanel());
        QTest::qWait(50);
        QVERIFY(w.grab().save(
            QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("screenshot-every-gpu.png"))));
    }

    void wrongFoldersAreRefused() {
        ui::MainWindow w;
        w.show();
        QTemporaryDir dir;
        QVERIFY(!w.openRun(dir.filePath(QStringLiteral("missing"))));
        QVERIFY2(w.errorText().contains(QLatin1String("does not exist")), qPrintable(w.errorText()));
        QVERIFY(!w.openRun(dir.path()));
        QVERIFY2(w.errorText().contains(QLatin1String("has no events.jsonl")), qPrintable(w.errorText()));
        std::ofstream(QDir(dir.path()).filePath(QStringLiteral("file")).toStdString()) << "x";
        QVERIFY(!w.openRun(dir.filePath(QStringLiteral("file"))));
        QVERIFY2(w.errorText().contains(QLatin1String("is not a folder")), qPrintable(w.errorText()));
        QVERIFY(!w.runModel()->isWatching());

        // While a run of this window's goes, it stays on show.
        w.controller()->setRunsDirectory(dir.path());
        core::TrainerOptions options = ui::demoOptions();
        options.steps = 100000;
        QVERIFY(w.startWith(options));
        std::ofstream(QDir(dir.path()).filePath(QStringLiteral("events.jsonl")).toStdString()) << "";
        QVERIFY(!w.openRun(dir.path()));
        QVERIFY2(w.errorText().contains(QLatin1String("stop it first")), qPrintable(w.errorText()));
        QVERIFY(w.controller()->isRunning());
        w.controller()->stop();
        QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    }
};

}  // namespace tst_open_run

BATCHPILOT_TEST_MAIN(tst_open_run::TestOpenRun)
#include "tst_open_run.moc"
