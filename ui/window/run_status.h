#pragma once

#include <QElapsedTimer>
#include <QObject>

#include "core/events/events.h"

class QLabel;
class QProgressBar;
class QStatusBar;

namespace batchpilot::ui {

class RunModel;

/// Fills the window's status bar: state, device and micro-batch × accumulation = target (read
/// from the RunModel), step/epoch, samples/s, peak memory against capacity, and a progress bar
/// with an ETA when the run has a step limit (from the step events). Cheap per event, text set
/// once per batch.
class RunStatus : public QObject {
    Q_OBJECT
public:
    RunStatus(QStatusBar* bar, const RunModel* run, QObject* parent = nullptr);

    void handle(const core::Event& event);
    /// Applies the texts after a batch of events.
    void refresh();
    void clear();

    QString stateText() const;
    QString planText() const;
    QString memoryText() const;
    /// Several devices: every rank's samples/s and wait at the last step, and the all-reduce time.
    QString ranksText() const { return m_ranksText; }
    int progressPercent() const;

private:
    QLabel* m_state;
    QLabel* m_device;
    QLabel* m_plan;
    QLabel* m_step;
    QLabel* m_rate;
    QLabel* m_memory;
    QLabel* m_ranks;  ///< several devices: every rank's speed and wait
    QString m_ranksText;
    QProgressBar* m_progress;
    QLabel* m_eta;

    const RunModel* m_run;
    qint64 m_stepNumber = 0;
    qint64 m_epoch = 0;
    qint64 m_totalSteps = 0;
    double m_samplesPerSecond = 0;
    double m_stepSeconds = 0;
    double m_time = 0;
    double m_firstStepTime = -1;
    qint64 m_firstStep = 0;
    qint64 m_peak = 0;
    qint64 m_capacity = 0;
};

}  // namespace batchpilot::ui
