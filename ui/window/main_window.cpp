#include "ui/window/main_window.h"

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QCloseEvent>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QMimeData>
#include <QDir>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QLineEdit>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QScrollArea>
#include <QSettings>
#include <QStatusBar>
#include <QTextBrowser>
#include <QToolButton>
#include <QVBoxLayout>

#include "core/base/durable_file.h"
#include "core/config/run_config.h"
#include "core/memory/memory_snapshot.h"
#include "core/records/run_folder.h"
#include "core/records/series_export.h"
#include "core/train/trainer.h"
#include "ui/teaching/accumulation_view.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/runs_panel.h"
#include "ui/config/demo_options.h"
#include "ui/log/event_log.h"
#include "ui/window/help_text.h"
#include "ui/config/run_panel.h"
#include "ui/window/ranks_view.h"
#include "ui/window/run_status.h"
#include "ui/window/savers_view.h"
#include "ui/window/teaching_tools.h"
#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/session/remote_run.h"
#include "ui/session/run_watcher.h"
#include "ui/session/trainer_controller.h"

namespace batchpilot::ui {

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent),
      m_controller(new TrainerController(this)),
      m_watcher(new RunWatcher(this)),
      m_remote(new RemoteRun(this)),
      m_run(new RunModel(this)),
      m_commands(new RunCommands(m_controller, m_run, this)),
      m_runPanel(new RunPanel(m_commands)),
      m_charts(new ChartsPanel),
      m_accumulation(new AccumulationView),
      m_eventLog(new EventLog) {
    setWindowTitle(tr("BatchPilot"));
    setObjectName(QStringLiteral("mainWindow"));
    setDockOptions(QMainWindow::AnimatedDocks | QMainWindow::AllowNestedDocks);
    // The run panel is tall: give it the whole left side, the bottom docks sit under the charts.
    setCorner(Qt::BottomLeftCorner, Qt::LeftDockWidgetArea);

    // Centre: an error banner (hidden until the engine reports a problem) above the charts.
    m_errorBox = new QWidget;
    m_errorBox->setObjectName(QStringLiteral("errorBox"));
    m_errorBox->setAutoFillBackground(true);
    m_errorBox->setStyleSheet(errorBoxStyleSheet(paletteIsDark()));
    m_errorBanner = new QLabel;
    m_errorBanner->setObjectName(QStringLiteral("errorBanner"));
    m_errorBanner->setWordWrap(true);
    m_errorBanner->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto* dismiss = new QToolButton;
    dismiss->setText(tr("Dismiss"));
    dismiss->setAutoRaise(true);
    connect(dismiss, &QToolButton::clicked, m_errorBox, &QWidget::hide);
    auto* errorLayout = new QHBoxLayout(m_errorBox);
    errorLayout->setContentsMargins(8, 4, 4, 4);
    errorLayout->addWidget(m_errorBanner, 1);
    errorLayout->addWidget(dismiss, 0, Qt::AlignTop);
    m_errorBox->hide();

    // A run read from its folder: which one, that it is steered where it runs, and a way out.
    m_watchBox = new QWidget;
    m_watchBox->setObjectName(QStringLiteral("watchBox"));
    m_watchBanner = new QLabel;
    m_watchBanner->setObjectName(QStringLiteral("watchBanner"));
    m_watchBanner->setWordWrap(true);
    m_watchBanner->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto* closeRunButton = new QToolButton;
    closeRunButton->setText(tr("Close run"));
    closeRunButton->setObjectName(QStringLiteral("closeRunButton"));
    closeRunButton->setToolTip(tr("Stop reading the run's folder (the run itself goes on where it runs)"));
    closeRunButton->setAutoRaise(true);
    connect(closeRunButton, &QToolButton::clicked, this, &MainWindow::closeRun);
    closeRunButton->setToolTip(tr("Stop showing this run (it goes on where it runs)"));
    auto* watchLayout = new QHBoxLayout(m_watchBox);
    watchLayout->setContentsMargins(8, 2, 4, 2);
    watchLayout->addWidget(m_watchBanner, 1);
    watchLayout->addWidget(closeRunButton, 0, Qt::AlignTop);
    m_watchBox->hide();
    m_watchState = new QLabel;
    m_watchState->setObjectName(QStringLiteral("watchState"));
    statusBar()->addPermanentWidget(m_watchState);
    m_watchState->hide();

    auto* centre = new QWidget;
    auto* centreLayout = new QVBoxLayout(centre);
    centreLayout->setContentsMargins(4, 4, 4, 0);
    centreLayout->setSpacing(4);
    centreLayout->addWidget(m_errorBox);
    centreLayout->addWidget(m_watchBox);
    m_ranks = new RanksView;  // several devices only: hidden until a run on several reports
    centreLayout->addWidget(m_ranks);
    m_savers = new SaversView;  // hidden until a memory-saver survey reports
    centreLayout->addWidget(m_savers);
    // A connected run's savers are its own; otherwise this window's run's.
    connect(m_savers, &SaversView::applyRequested, this, [this](core::MemorySavers savers) {
        if (m_remote->isOpen())
            m_remote->setMemorySavers(savers);
        else
            m_controller->setMemorySavers(savers);
    });
    connect(m_savers, &SaversView::surveyRequested, m_controller, &TrainerController::surveySavers);
    centreLayout->addWidget(m_charts, 1);
    setCentralWidget(centre);

    auto* scroll = new QScrollArea;
    scroll->setWidget(m_runPanel);
    scroll->setWidgetResizable(true);
    scroll->setFrameShape(QFrame::NoFrame);
    scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    scroll->setMinimumWidth(m_runPanel->sizeHint().width() + 16);
    m_runDock = new QDockWidget(tr("Run"));
    m_runDock->setObjectName(QStringLiteral("runDock"));
    m_runDock->setWidget(scroll);
    m_runDock->setFeatures(QDockWidget::DockWidgetClosable | QDockWidget::DockWidgetMovable);
    addDockWidget(Qt::LeftDockWidgetArea, m_runDock);

    m_batchDock = new QDockWidget(tr("Training batch"));
    m_batchDock->setObjectName(QStringLiteral("batchDock"));
    m_batchDock->setWidget(m_accumulation);
    m_batchDock->setFeatures(QDockWidget::DockWidgetClosable | QDockWidget::DockWidgetMovable);
    addDockWidget(Qt::BottomDockWidgetArea, m_batchDock);

    m_logDock = new QDockWidget(tr("Event log"));
    m_logDock->setObjectName(QStringLiteral("logDock"));
    m_logDock->setWidget(m_eventLog);
    m_logDock->setFeatures(QDockWidget::DockWidgetClosable | QDockWidget::DockWidgetMovable);
    addDockWidget(Qt::BottomDockWidgetArea, m_logDock);
    splitDockWidget(m_batchDock, m_logDock, Qt::Vertical);
    resizeDocks({m_batchDock, m_logDock}, {170, 120}, Qt::Vertical);

    m_status = new RunStatus(statusBar(), m_run, this);
    m_teaching = new TeachingTools(m_commands, this);
    explainCharts(*m_charts);

    // The model follows the controller first, so every widget below reads a model that has
    // already seen the batch of events it is handed.
    m_run->follow(m_controller);
    connect(m_run, &RunModel::changed, this, [this] {
        m_charts->setTargetBatch(m_run->targetBatch());
        m_accumulation->setPlan(m_run->plan());
    });
    connect(m_controller, &TrainerController::eventsReceived, this, &MainWindow::onEvents);
    // A run read from its folder reaches the same views the same way (the model first).
    connect(m_watcher, &RunWatcher::eventsReceived, m_run, &RunModel::handle);
    connect(m_watcher, &RunWatcher::eventsReceived, this, &MainWindow::onEvents);
    connect(m_watcher, &RunWatcher::stateChanged, this, &MainWindow::updateWatchState);
    connect(m_watcher, &RunWatcher::problem, this,
            [this](const QString& message) { m_eventLog->addNote(tr("run folder"), message, true); });
    // A served run, the same way; with the control token the commands act on it.
    connect(m_remote, &RemoteRun::eventsReceived, m_run, &RunModel::handle);
    connect(m_remote, &RemoteRun::eventsReceived, this, &MainWindow::onEvents);
    connect(m_remote, &RemoteRun::stateChanged, this, &MainWindow::updateWatchState);
    // The served run's configuration in the run panel, so that its fields show (and steer) that run.
    // Read as a configuration file is: bounded, no key twice, nothing nested deep.
    connect(m_remote, &RemoteRun::configurationReceived, this, [this](const QByteArray& text) {
        const std::string named = "the configuration of the run at " + m_remote->address().toStdString();
        showOptions(core::readRunConfigText(std::string_view(text.constData(), static_cast<size_t>(text.size())), named,
                                            m_runPanel->options()),
                    QString());
    });
    connect(m_remote, &RemoteRun::problem, this,
            [this](const QString& message) { m_eventLog->addNote(tr("connection"), message, true); });
    connect(m_controller, &TrainerController::runFinished, this, &MainWindow::onRunFinished);
    connect(m_controller, &TrainerController::runRecorded, this, [this](const QString& path, const QString& error) {
        if (error.isEmpty())
            note(tr("run folder: %1").arg(path));
        else
            note(tr("the run is not recorded: %1").arg(error));
        if (!path.isEmpty() && m_controller->isRunning()) {
            m_charts->runsPanel()->setLiveFolder(path);
            m_charts->runsPanel()->refresh();
        }
    });
    // The runs list: what is recorded now, and again when a run has ended.
    m_charts->runsPanel()->refresh();
    connect(m_controller, &TrainerController::runFinished, this, [this] {
        m_charts->runsPanel()->setLiveFolder(QString());
        m_charts->runsPanel()->refresh();
    });
    connect(m_commands, &RunCommands::startRequested, this, &MainWindow::start);
    connect(m_commands, &RunCommands::note, this, &MainWindow::note);

    setAcceptDrops(true);
    createMenus();
    loadSettings();
}

MainWindow::~MainWindow() = default;

void MainWindow::createMenus() {
    createFileMenu();
    createRunMenu();
    createViewMenu();
    createHelpMenu();
}

void MainWindow::createFileMenu() {
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&Open configuration…"), QKeySequence::Open, this, [this] {
        const QString path = QFileDialog::getOpenFileName(this, tr("Open run configuration"), QString(),
                                                          tr("Run configurations (*.json)"));
        if (!path.isEmpty()) openConfiguration(path);
    });
    file->addAction(tr("&Save configuration…"), QKeySequence::Save, this, [this] {
        const QString path = QFileDialog::getSaveFileName(
            this, tr("Save run configuration"), QStringLiteral("run.json"), tr("Run configurations (*.json)"));
        if (!path.isEmpty()) saveConfiguration(path);
    });
    QAction* openRunAction = file->addAction(tr("Open &run folder…"), QKeySequence(tr("Ctrl+Shift+O")), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Open a run folder"),
                                                              QString::fromStdString(core::defaultRunsDirectory()));
        if (!dir.isEmpty()) openRun(dir);
    });
    openRunAction->setObjectName(QStringLiteral("openRunAction"));
    openRunAction->setToolTip(
        tr("Show a run from its folder — one batchpilot-cli wrote, here or on a server whose folder is mounted "
           "(sshfs, NFS) — and follow it while it trains"));
    QAction* connectAction = file->addAction(tr("&Connect to run…"), QKeySequence(tr("Ctrl+Shift+K")), this, [this] {
        bool ok = false;
        const QString url =
            QInputDialog::getText(this, tr("Connect to a run"),
                                  tr("The URL batchpilot-cli --serve printed (also in the run folder's serve.json):"),
                                  QLineEdit::Normal, QString(), &ok);
        if (ok && !url.trimmed().isEmpty()) connectToRun(QUrl(url.trimmed()));
    });
    connectAction->setObjectName(QStringLiteral("connectAction"));
    connectAction->setToolTip(
        tr("Show a run batchpilot-cli serves (--serve), on this machine or through an SSH tunnel, and steer it"));
    file->addAction(tr("&Resume from checkpoint…"), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Resume from the checkpoint in"));
        if (!dir.isEmpty()) resumeFrom(dir);
    });
    file->addSeparator();
    file->addAction(tr("Export &data (every series, one CSV table)…"), QKeySequence(tr("Ctrl+Shift+E")), this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Export data"), QStringLiteral("series.csv"),
                                                          tr("CSV files (*.csv)"));
        if (!path.isEmpty()) exportDataCsv(path);
    });
    file->addAction(tr("Export &metrics as CSV…"), QKeySequence(tr("Ctrl+E")), this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Export metrics"), QStringLiteral("metrics.csv"),
                                                          tr("CSV files (*.csv)"));
        if (!path.isEmpty()) exportMetricsCsv(path);
    });
    file->addAction(tr("Export &events as JSON Lines…"), this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Export events"), QStringLiteral("events.jsonl"),
                                                          tr("JSON Lines (*.jsonl)"));
        if (!path.isEmpty()) exportEventsJsonl(path);
    });
    QAction* snapshot = file->addAction(tr("Save memory &snapshot…"), this, [this] {
        const QString path = QFileDialog::getSaveFileName(this, tr("Save memory snapshot"),
                                                          QStringLiteral("snapshot.pickle"), tr("Pickle (*.pickle)"));
        if (!path.isEmpty()) saveMemorySnapshot(path);
    });
    snapshot->setObjectName(QStringLiteral("memorySnapshotAction"));
    snapshot->setToolTip(
        tr("The virtual GPU's segments and blocks as PyTorch's memory snapshot (at the last out-of-memory error, else "
           "now), for pytorch.org/memory_viz"));
    file->addAction(tr("Export all &charts as PNG…"), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Export charts to"));
        if (!dir.isEmpty()) exportCharts(dir);
    });
    file->addAction(tr("Save re&port…"), this, [this] {
        const QString path =
            QFileDialog::getSaveFileName(this, tr("Save report"), QStringLiteral("batchpilot-report.html"),
                                         tr("HTML report (*.html);;PDF report (*.pdf)"));
        if (!path.isEmpty()) saveReport(path);
    });
    file->addSeparator();
    QAction* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
    quit->setShortcut(QKeySequence::Quit);
    quit->setMenuRole(QAction::QuitRole);
}

void MainWindow::createRunMenu() {
    QMenu* run = menuBar()->addMenu(tr("&Run"));
    run->addActions(
        {m_commands->startAction(), m_commands->pauseAction(), m_commands->stopAction(), m_commands->reprobeAction()});
    QAction* survey = run->addAction(tr("Measure &memory savers"), m_controller, &TrainerController::surveySavers);
    survey->setObjectName(QStringLiteral("surveySaversAction"));
    survey->setToolTip(
        tr("At the next training batch, measure what activation checkpointing and bfloat16 "
           "autocast do to the micro-batch and the speed (the Memory savers panel)"));
    survey->setEnabled(false);
    connect(m_run, &RunModel::changed, survey, [this, survey] { survey->setEnabled(m_run->isRunning()); });
    run->addSeparator();
    run->addAction(tr("Start the &demo"), QKeySequence(tr("Ctrl+D")), this, &MainWindow::startDemo);
    run->addSeparator();
    m_teaching->addActions(run);
}

void MainWindow::createViewMenu() {
    QMenu* view = menuBar()->addMenu(tr("&View"));
    QAction* runPanel = m_runDock->toggleViewAction();
    runPanel->setText(tr("Run &panel"));
    view->addAction(runPanel);
    QAction* batch = m_batchDock->toggleViewAction();
    batch->setText(tr("&Training batch"));
    view->addAction(batch);
    QAction* log = m_logDock->toggleViewAction();
    log->setText(tr("&Event log"));
    view->addAction(log);
    view->addSeparator();
    m_followAction = view->addAction(tr("&Follow live"));
    m_followAction->setCheckable(true);
    m_followAction->setChecked(true);
    m_followAction->setShortcut(QKeySequence(tr("Ctrl+L")));
    m_followAction->setToolTip(tr("Keep every chart showing the whole run as it grows"));
    connect(m_followAction, &QAction::toggled, m_charts, &ChartsPanel::setFollowLive);
    connect(m_charts, &ChartsPanel::exportDataRequested, this,
            [this](const QStringList& series, const QString& suggestedName) {
                const QString path =
                    QFileDialog::getSaveFileName(this, tr("Export chart data"), suggestedName, tr("CSV files (*.csv)"));
                if (!path.isEmpty()) exportDataCsv(path, series);
            });
    connect(m_charts, &ChartsPanel::followLiveChanged, this, [this](bool following) {
        const QSignalBlocker blocker(m_followAction);
        m_followAction->setChecked(following);
    });
    QMenu* theme = view->addMenu(tr("&Colours"));
    auto* themeGroup = new QActionGroup(this);
    const QList<std::pair<QString, Theme>> themes = {
        {tr("&System"), Theme::System}, {tr("&Light"), Theme::Light}, {tr("&Dark"), Theme::Dark}};
    for (const auto& [name, value] : themes) {
        QAction* action = theme->addAction(name);
        action->setCheckable(true);
        action->setData(static_cast<int>(value));
        themeGroup->addAction(action);
        connect(action, &QAction::triggered, this, [this, value = value] { setTheme(value); });
        m_themeActions << action;
    }
}

void MainWindow::createHelpMenu() {
    QMenu* help = menuBar()->addMenu(tr("&Help"));
    help->addAction(tr("&How this works"), QKeySequence::HelpContents, this, &MainWindow::showHowItWorks);
    help->addAction(tr("&About BatchPilot"), this, &MainWindow::showAbout);
}

bool MainWindow::start() {
    if (m_run->isRunning()) return false;
    if (!m_runPanel->isValid()) {
        showError(tr("Cannot start: %1").arg(m_runPanel->problem()));
        return false;
    }
    return startWith(m_runPanel->options(), m_runPanel->devices());
}

void MainWindow::clearViews() {
    m_errorBox->hide();
    m_charts->clear();
    m_accumulation->clear();
    m_eventLog->clear();
    m_status->clear();
    m_ranks->clear();
    m_savers->clear();
    m_record.clear();
    m_report.clear();
}

bool MainWindow::startWith(const core::TrainerOptions& options, const QStringList& devices) {
    if (m_run->isRunning()) return false;
    closeRun();
    clearViews();
    saveSettings();
    if (!m_controller->start(options, devices)) return false;
    note(tr("start: %1 on %2, target batch %3")
             .arg(QString::fromStdString(options.model.name),
                  devices.size() >= 2 ? devices.join(QStringLiteral(" + ")) : QString::fromStdString(options.device))
             .arg(options.targetBatch));
    return true;
}

QAction* MainWindow::startAction() const {
    return m_commands->startAction();
}

bool MainWindow::startDemo() {
    if (m_run->isRunning()) return false;
    m_runPanel->setOptions(demoOptions());
    return start();
}

void MainWindow::onEvents(const QList<core::Event>& events) {
    for (const core::Event& event : events) {
        m_charts->handle(event);
        m_teaching->handle(event);
        m_status->handle(event);
        if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) {
            QStringList devices;
            for (const core::RankStep& rank : ranks->ranks) devices << QString::fromStdString(rank.device);
            m_runPanel->showRankDevices(devices);
        }
        m_savers->handle(event);
        m_record.handle(event);
        m_report.handle(event);
        if (const auto* error = std::get_if<core::ErrorEvent>(&event))
            showError(QString::fromStdString(error->message));
    }
    m_ranks->handleEvents(events);  // once per delivery: the table shows its last step
    m_accumulation->handleEvents(events);
    m_eventLog->addEvents(events);
    m_status->refresh();
}

void MainWindow::onRunFinished(const core::RunResult& result) {
    if (result.state == core::RunState::Failed) {
        if (!result.error.empty() && errorText().isEmpty()) showError(QString::fromStdString(result.error));
        note(tr("run failed after %1 steps").arg(result.steps));
    } else {
        note(result.stopped ? tr("stopped after %1 steps").arg(result.steps)
                            : tr("finished after %1 steps").arg(result.steps));
    }
}

bool MainWindow::openRun(const QString& folder) {
    if (m_run->isRunning()) {
        showError(tr("Cannot open %1 while a run of this window's is going: stop it first (the window shows one "
                     "run at a time)")
                      .arg(folder));
        return false;
    }
    // Checked before the views are cleared: a wrong folder leaves the last run on show.
    QString error = RunWatcher::whyNotARun(folder);
    if (!error.isEmpty()) {
        showError(tr("Cannot open the run: %1").arg(error));
        return false;
    }
    closeRun();
    clearViews();
    m_run->watchStarted(QFileInfo(folder).absoluteFilePath());
    if (!m_watcher->open(folder, &error)) {
        m_run->watchEnded();
        showError(tr("Cannot open the run: %1").arg(error));
        return false;
    }
    showRunConfiguration(m_watcher->folder());
    const QString why =
        tr("The run shown is read from its folder: it trains in another process, which this window "
           "cannot steer");
    m_savers->setReadOnly(why);
    m_eventLog->addNote(tr("run folder"), tr("showing %1").arg(m_watcher->folder()));
    updateWatchState();
    return true;
}

void MainWindow::showRunConfiguration(const QString& folder) {
    const QString path = QDir(folder).filePath(QStringLiteral("config.json"));
    if (!QFileInfo(path).isFile()) return;  // a folder some other tool wrote: the panel stays
    showOptions(core::loadRunConfig(path.toStdString(), m_runPanel->options()), folder);
}

void MainWindow::showOptions(tl::expected<core::TrainerOptions, std::string> loaded, const QString& ownFolder) {
    QString why = loaded ? m_runPanel->cannotShow(*loaded) : QString::fromStdString(loaded.error());
    if (!why.isEmpty()) {
        m_eventLog->addNote(tr("run"), tr("its configuration is not shown in the run panel: %1").arg(why), true);
        return;
    }
    // Start would train it here: never into the shown run's own checkpoints, never resuming them.
    core::TrainerOptions options = *loaded;
    const QString checkpoints = QDir::cleanPath(QString::fromStdString(options.checkpoint.directory));
    const QString shown = ownFolder.isEmpty() ? QString() : QDir::cleanPath(QDir(ownFolder).absolutePath());
    if (!checkpoints.isEmpty() &&
        (shown.isEmpty() || checkpoints == shown || checkpoints.startsWith(shown + QLatin1Char('/')) ||
         QDir::isRelativePath(checkpoints)))
        options.checkpoint.directory.clear();
    options.resumeFrom.clear();
    m_commands->holdFieldCommands(true);  // showing a run's values asks it for nothing
    m_runPanel->setOptions(options);
    m_commands->holdFieldCommands(false);
}

bool MainWindow::connectToRun(const QUrl& url) {
    if (m_run->isRunning()) {
        showError(
            tr("Cannot connect while a run of this window's is going: stop it first (the window shows one run "
               "at a time)"));
        return false;
    }
    if (const QString why = RemoteRun::whyNotARunUrl(url); !why.isEmpty()) {
        showError(tr("Cannot connect: %1").arg(why));
        return false;
    }
    closeRun();
    clearViews();
    QString error;
    if (!m_remote->connectTo(url, &error)) {
        showError(tr("Cannot connect: %1").arg(error));
        return false;
    }
    m_run->watchStarted(m_remote->address());
    m_commands->setRemote(m_remote);
    m_eventLog->addNote(tr("connection"), tr("connected to %1").arg(m_remote->address()));
    updateWatchState();
    return true;
}

void MainWindow::closeRun() {
    if (m_remote->isOpen()) {
        const QString address = m_remote->address();
        m_remote->close();
        m_commands->setRemote(nullptr);
        m_run->watchEnded();
        m_savers->setReadOnly(QString());
        m_eventLog->addNote(tr("connection"), tr("closed %1").arg(address));
        updateWatchState();
        return;
    }
    if (!m_watcher->isOpen()) return;
    const QString folder = m_watcher->folder();
    m_watcher->close();
    m_run->watchEnded();
    m_savers->setReadOnly(QString());
    m_eventLog->addNote(tr("run folder"), tr("closed %1").arg(folder));
    updateWatchState();
}

QString MainWindow::shownRunFolder() const {
    return m_watcher->isOpen() ? m_watcher->folder() : m_controller->runFolder();
}

QString MainWindow::watchText() const {
    return m_watchBox->isHidden() ? QString() : m_watchBanner->text();
}

void MainWindow::updateWatchState() {
    const bool remote = m_remote->isOpen();
    const bool open = m_watcher->isOpen() || remote;
    m_watchBox->setVisible(open);
    m_watchState->setVisible(open);
    if (!open) {
        setWindowTitle(tr("BatchPilot"));
        return;
    }
    if (remote) {
        const bool steers = m_commands->steering();
        QString state;
        switch (m_remote->state()) {
        case RemoteRun::State::Connecting: state = tr("connecting"); break;
        case RemoteRun::State::Live: state = tr("live"); break;
        case RemoteRun::State::Reconnecting: state = tr("connection lost, reconnecting"); break;
        case RemoteRun::State::Ended: state = tr("the run has ended"); break;
        case RemoteRun::State::Failed: state = tr("refused"); break;
        case RemoteRun::State::Closed: break;
        }
        m_watchBanner->setText(
            steers ? tr("<b>%1</b> — a run served by batchpilot-cli, %2. Pause, Stop, Re-probe, Check equivalence, the "
                        "run panel's target batch and device and the memory savers' Apply act on it, at its next "
                        "training batch.")
                         .arg(m_remote->address().toHtmlEscaped(), state)
                   : tr("<b>%1</b> — a run served by batchpilot-cli, %2. Watched only (a watch token, or the run has "
                        "ended): the run controls cannot act on it.")
                         .arg(m_remote->address().toHtmlEscaped(), state));
        m_savers->setReadOnly(steers ? QString()
                                     : tr("The run is watched with a watch-only token (or has ended): it cannot be "
                                          "steered from here"));
        m_watchState->setText(m_remote->stateText());
        setWindowTitle(tr("%1 — BatchPilot").arg(m_remote->address()));
        return;
    }
    const QString folder = m_watcher->folder();
    QString state;
    if (!m_watcher->error().isEmpty())
        state = tr("stopped reading: %1").arg(m_watcher->error());
    else if (!m_watcher->caughtUp())
        state = tr("reading its events…");
    else if (m_watcher->runEnded())
        state = tr("the run has ended");
    else
        state = tr("following it live while it grows");
    m_watchBanner->setText(tr("<b>%1</b> — a run read from its folder (%2), %3. It trains in another process: the "
                              "window shows it, Pause, Stop and the other run controls cannot act on it.")
                               .arg(QFileInfo(folder).fileName().toHtmlEscaped(), folder.toHtmlEscaped(), state));
    m_watchState->setText(m_watcher->stateText());
    setWindowTitle(tr("%1 — BatchPilot").arg(QFileInfo(folder).fileName()));
}

bool MainWindow::openConfiguration(const QString& path) {
    auto loaded = core::loadRunConfig(path.toStdString(), m_runPanel->options());
    if (!loaded) {
        showError(QString::fromStdString(loaded.error()));
        return false;
    }
    // Loaded as written or not at all: a field that cannot hold a value would change it in silence.
    if (const QString why = m_runPanel->cannotShow(*loaded); !why.isEmpty()) {
        showError(tr("Cannot open %1: %2").arg(path, why));
        return false;
    }
    m_runPanel->setOptions(*loaded);
    m_errorBox->hide();
    note(tr("configuration loaded from %1").arg(path));
    return true;
}

bool MainWindow::saveConfiguration(const QString& path) {
    auto saved = core::saveRunConfig(path.toStdString(), m_runPanel->options());
    if (!saved) {
        showError(QString::fromStdString(saved.error()));
        return false;
    }
    note(tr("configuration saved to %1").arg(path));
    return true;
}

bool MainWindow::openDroppedFile(const QString& path) {
    const QString suffix = QFileInfo(path).suffix().toLower();
    if (suffix == QLatin1String("pt") || suffix == QLatin1String("pth")) {
        if (m_run->isRunning()) {
            showError(tr("Stop the run before choosing another model."));
            return false;
        }
        m_runPanel->setModelFile(path);
        note(tr("model file %1").arg(path));
        return true;
    }
    if (suffix == QLatin1String("json")) return openConfiguration(path);
    showError(tr("Cannot open %1: drop a TorchScript model (.pt, .pth) or a run configuration (.json).").arg(path));
    return false;
}

void MainWindow::dragEnterEvent(QDragEnterEvent* event) {
    if (event->mimeData()->hasUrls()) event->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* event) {
    for (const QUrl& url : event->mimeData()->urls()) {
        if (url.isLocalFile()) openDroppedFile(url.toLocalFile());
    }
    event->acceptProposedAction();
}

bool MainWindow::resumeFrom(const QString& directory) {
    if (!m_runPanel->isValid()) {
        showError(tr("Cannot resume: %1").arg(m_runPanel->problem()));
        return false;
    }
    core::TrainerOptions options = m_runPanel->options();
    options.resumeFrom = directory.toStdString();
    options.checkpoint.directory = core::resumedCheckpointDirectory(directory.toStdString());
    return startWith(options);
}

void MainWindow::showError(const QString& message) {
    m_errorBanner->setText(message);
    m_errorBox->show();
}

QString MainWindow::errorText() const {
    return m_errorBox->isVisible() || !m_errorBox->isHidden() ? m_errorBanner->text() : QString();
}

void MainWindow::note(const QString& details) {
    m_eventLog->addNote(tr("command"), details);
}

bool MainWindow::exportMetricsCsv(const QString& path) {
    QString error;
    if (!m_record.writeMetricsCsv(path, &error)) {
        showError(tr("Could not write %1: %2").arg(path, error));
        return false;
    }
    statusBar()->showMessage(tr("Metrics written to %1").arg(path), 4000);
    return true;
}

bool MainWindow::exportDataCsv(const QString& path, const QStringList& series) {
    const QString folder = shownRunFolder();
    if (folder.isEmpty()) {
        showError(
            tr("No run has been recorded yet (a run's data is exported from its run folder): start a run "
               "first"));
        return false;
    }
    // The folder's events file is complete once the run's events were delivered; during a run it
    // holds everything up to the last batch of events.
    std::vector<std::string> only;
    for (const QString& name : series) only.push_back(name.toStdString());
    const auto exported = core::exportRunCsv(folder.toStdString(), path.toStdString(), only);
    if (!exported) {
        showError(QString::fromStdString(exported.error()));
        return false;
    }
    statusBar()->showMessage(tr("%1 rows written to %2").arg(exported->rows).arg(path), 4000);
    return true;
}

bool MainWindow::exportEventsJsonl(const QString& path) {
    QString error;
    if (!m_record.writeEventsJsonl(path, &error)) {
        showError(tr("Could not write %1: %2").arg(path, error));
        return false;
    }
    statusBar()->showMessage(tr("Events written to %1").arg(path), 4000);
    return true;
}

bool MainWindow::saveMemorySnapshot(const QString& path) {
    if (m_run->isWatching()) {
        showError(
            tr("A memory snapshot shows this window's virtual GPU; the run shown trains elsewhere. On its "
               "machine: batchpilot-cli … --memory-snapshot FILE."));
        return false;
    }
    bool atOom = false;
    const std::vector<core::SegmentView> segments = core::virtualGpuSegments(&atOom);
    if (segments.empty()) {
        showError(
            tr("No memory snapshot yet: the virtual GPU holds no segment. Train on a virtual device with "
               "PyTorch's caching model (virtual:T4, virtual:64MiB, …; not /exact) first."));
        return false;
    }
    const std::string named = "the memory snapshot \"" + path.toStdString() + "\"";
    if (auto written = core::replaceFileAtomically(path.toStdString(), core::memorySnapshotPickle(segments), named);
        !written) {
        showError(QString::fromStdString(written.error()));
        return false;
    }
    note(tr("memory snapshot %1: %2 (open it at https://pytorch.org/memory_viz)")
             .arg(atOom ? tr("at the last out-of-memory error") : tr("of the virtual GPU now"), path));
    return true;
}

QStringList MainWindow::exportCharts(const QString& directory) {
    QStringList failed;
    const QStringList written = m_charts->exportAll(directory, &failed);
    if (!failed.isEmpty()) showError(tr("Could not write %1").arg(failed.join(QStringLiteral(", "))));
    return written;
}

bool MainWindow::saveReport(const QString& path) {
    const ReportWriter::Images images{m_charts->memoryFitImage(), m_charts->breakdownImage(), m_charts->lossImage()};
    QString error;
    if (!m_report.write(path, images, &error)) {
        showError(tr("Could not write %1: %2").arg(path, error));
        return false;
    }
    statusBar()->showMessage(tr("Report written to %1").arg(path), 4000);
    return true;
}

void MainWindow::setTheme(Theme theme) {
    m_theme = theme;
    const bool dark = applyTheme(theme);
    m_charts->setDarkTheme(dark);
    for (QAction* action : std::as_const(m_themeActions))
        action->setChecked(action->data().toInt() == static_cast<int>(theme));
    m_errorBox->setStyleSheet(errorBoxStyleSheet(dark));
}

void MainWindow::showHowItWorks() {
    auto* dialog = new QDialog(this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->setWindowTitle(tr("How BatchPilot works"));
    auto* text = new QTextBrowser;
    text->setObjectName(QStringLiteral("howItWorksText"));
    text->setHtml(howItWorksHtml(*m_run));
    auto* layout = new QVBoxLayout(dialog);
    layout->addWidget(text);
    dialog->resize(640, 560);
    dialog->show();
}

void MainWindow::showAbout() {
    QMessageBox::about(this, tr("About BatchPilot"), aboutHtml());
}

void MainWindow::saveSettings() {
    QSettings settings;
    settings.setValue(QStringLiteral("window/geometry"), saveGeometry());
    settings.setValue(QStringLiteral("window/state"), saveState());
    settings.setValue(QStringLiteral("window/theme"), static_cast<int>(m_theme));
    m_runPanel->saveSettings(settings);
}

void MainWindow::loadSettings() {
    QSettings settings;
    if (!restoreGeometry(settings.value(QStringLiteral("window/geometry")).toByteArray())) resize(1280, 800);
    restoreState(settings.value(QStringLiteral("window/state")).toByteArray());
    m_runPanel->loadSettings(settings);
    setTheme(static_cast<Theme>(settings.value(QStringLiteral("window/theme"), 0).toInt()));
}

void MainWindow::closeEvent(QCloseEvent* event) {
    saveSettings();
    m_controller->stop();  // the controller's destructor waits for the worker
    event->accept();
}

}  // namespace batchpilot::ui
