#pragma once

#include <QList>
#include <QMainWindow>
#include <QUrl>

#include "core/events/events.h"
#include "core/train/trainer.h"
#include "ui/report/report_writer.h"
#include "ui/report/run_record.h"
#include "ui/style/theme.h"

class QAction;
class QLabel;
class QDockWidget;

namespace batchpilot::ui {

class AccumulationView;
class ChartsPanel;
class EventLog;
class RunCommands;
class RunModel;
class RunPanel;
class RanksView;
class SaversView;
class RemoteRun;
class RunStatus;
class RunWatcher;
class TeachingTools;
class TrainerController;

/// The BatchPilot window: run panel (left), the four live charts (centre), the training batch
/// being accumulated and the event log (bottom), status bar, menus. Owns the TrainerController.
class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    /// Starts a run with the run panel's values; false when they are invalid or a run is going.
    bool start();
    /// Starts a run with the given options (the run panel's, possibly with resume settings).
    /// `devices`: several devices (TrainerController::start); empty: options.device alone.
    bool startWith(const core::TrainerOptions& options, const QStringList& devices = {});
    /// Loads the built-in demo configuration into the run panel and starts it.
    bool startDemo();
    void setTheme(Theme theme);

    /// Loads a JSON run configuration into the run panel; a bad file is shown as an error and
    /// leaves the panel as it was.
    bool openConfiguration(const QString& path);
    /// Writes the run panel's values as a JSON run configuration.
    bool saveConfiguration(const QString& path);
    /// Shows the run in `folder` (a run folder, this machine's or a mounted one), read from its
    /// events.jsonl into every view, and follows it while it grows — a run this window did not
    /// start, e.g. batchpilot-cli's on a GPU server. Read-only: the run trains elsewhere. False
    /// (shown as an error) when a run of this window's is going or the folder is not a run's.
    bool openRun(const QString& folder);
    /// Shows the run that `batchpilot-cli --serve` serves at `url` (http://HOST:PORT/?token=…):
    /// its events from the start, live, and — with the control token — the run panel's commands
    /// act on it. False (shown as an error) when a run of this window's is going or the URL is not
    /// a served run's.
    bool connectToRun(const QUrl& url);
    /// Stops showing the run read from its folder or connected to (the views keep what they show).
    void closeRun();
    /// The folder of the run shown: the one read (openRun), or this window's current or last run's.
    QString shownRunFolder() const;
    /// Starts a run that continues from the checkpoint in `directory` (and keeps saving there).
    bool resumeFrom(const QString& directory);
    /// What a file dropped on the window does: a TorchScript model (.pt, .pth) becomes the model,
    /// a run configuration (.json) is opened; anything else is an error message.
    bool openDroppedFile(const QString& path);

    bool exportMetricsCsv(const QString& path);
    /// Every series of every chart of the current or last run as one tidy CSV table (the CLI's
    /// --export-csv format, read from the run's folder); `series` limits it to those (a chart's
    /// own, from its right-click menu).
    bool exportDataCsv(const QString& path, const QStringList& series = {});
    bool exportEventsJsonl(const QString& path);
    /// Writes the virtual GPU's segments as PyTorch's memory snapshot (at the last OOM, else now).
    bool saveMemorySnapshot(const QString& path);
    QStringList exportCharts(const QString& directory);
    /// Writes the run report: self-contained HTML, or PDF when `path` ends in ".pdf". A file
    /// that cannot be written is shown as an error and returns false.
    bool saveReport(const QString& path);

    RunPanel* runPanel() const { return m_runPanel; }
    ChartsPanel* chartsPanel() const { return m_charts; }
    AccumulationView* accumulationView() const { return m_accumulation; }
    EventLog* eventLog() const { return m_eventLog; }
    RunStatus* runStatus() const { return m_status; }
    RanksView* ranksView() const { return m_ranks; }
    SaversView* saversView() const { return m_savers; }
    TrainerController* controller() const { return m_controller; }
    /// Reads a run's folder (openRun).
    RunWatcher* watcher() const { return m_watcher; }
    /// Connects to a served run (connectToRun).
    RemoteRun* remote() const { return m_remote; }
    /// The line above the charts while a run is shown from its folder (empty when none).
    QString watchText() const;
    /// The run as every widget reads it (state, plan, device, what it reported).
    const RunModel* runModel() const { return m_run; }
    /// The run commands: the Run menu's actions, also pressed by the run panel's buttons.
    RunCommands* commands() const { return m_commands; }
    /// The Run menu's teaching entries and the equivalence dialog.
    TeachingTools* teaching() const { return m_teaching; }
    const RunRecord& record() const { return m_record; }
    QAction* startAction() const;
    /// The error message shown above the charts (empty when none).
    QString errorText() const;

protected:
    void closeEvent(QCloseEvent* event) override;
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;

private:
    void createMenus();
    void createFileMenu();
    void createRunMenu();
    void createViewMenu();
    void createHelpMenu();
    void onEvents(const QList<core::Event>& events);
    void onRunFinished(const core::RunResult& result);
    void showError(const QString& message);
    /// Empties every view for the next run (a run started here, or one read from its folder).
    void clearViews();
    void updateWatchState();
    /// The run panel shows the configuration the run in `folder` recorded (its config.json).
    void showRunConfiguration(const QString& folder);
    /// The run panel shows `options`, a run's shown from elsewhere (never its checkpoint folder
    /// below `ownFolder`, nor resuming); `why` says in the log why they cannot be shown.
    void showOptions(tl::expected<core::TrainerOptions, std::string> options, const QString& ownFolder);
    void note(const QString& details);
    void saveSettings();
    void loadSettings();
    void showHowItWorks();
    void showAbout();

    TrainerController* m_controller;
    RunWatcher* m_watcher;
    RemoteRun* m_remote;
    RunModel* m_run;
    RunCommands* m_commands;
    RunPanel* m_runPanel;
    ChartsPanel* m_charts;
    AccumulationView* m_accumulation;
    EventLog* m_eventLog;
    RunStatus* m_status;
    RanksView* m_ranks = nullptr;
    SaversView* m_savers = nullptr;
    TeachingTools* m_teaching;
    QLabel* m_errorBanner;
    QWidget* m_errorBox;
    QLabel* m_watchBanner;
    QWidget* m_watchBox;
    QLabel* m_watchState;  ///< in the status bar: how the reading of the run folder goes
    QDockWidget* m_runDock;
    QDockWidget* m_batchDock;
    QDockWidget* m_logDock;
    RunRecord m_record;
    ReportWriter m_report;
    Theme m_theme = Theme::System;

    QAction* m_followAction = nullptr;
    QList<QAction*> m_themeActions;
};

}  // namespace batchpilot::ui
