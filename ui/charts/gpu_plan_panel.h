#pragma once

#include <vector>

#include <QString>
#include <QWidget>

#include "core/events/events.h"
#include "core/plan/gpu_plan.h"

class QLabel;
class QTableWidget;

namespace batchpilot::ui {

/// The "Every GPU" tab: after each probe, on any device (a virtual one on a laptop included), the
/// plan each GPU preset would give — the largest micro-batch its usable memory holds by the probe's
/// memory line, the accumulation for the target batch, or that the model does not fit at all: the
/// table `batchpilot-cli --plan-for all` prints (core::planForGpus), for the person who does not
/// know which GPU they will get. Fed by events only, so it works for runs this window did not
/// start (opened or connected) as well.
///
/// Thread rules: GUI thread only.
class GpuPlanPanel : public QWidget {
    Q_OBJECT
public:
    explicit GpuPlanPanel(QWidget* parent = nullptr);

    /// Takes ProbeFinished (the memory line, the target batch), MemorySample (the headroom),
    /// MemoryBreakdown (the probe device's workspace) and RunSummary (its name).
    void handle(const core::Event& event);
    void clear();

    /// The rows shown, one per preset (empty before a probe with a memory line finished).
    const std::vector<core::GpuPlanRow>& rows() const { return m_rows; }
    /// The line above the table: what the plan was predicted from.
    QString caption() const;
    QTableWidget* table() const { return m_table; }

private:
    void recompute();

    std::vector<core::GpuPlanTarget> m_targets;
    std::vector<core::GpuPlanRow> m_rows;
    std::string m_device;
    double m_headroom = 0;
    int64_t m_workspaceBytes = 0;
    bool m_haveProbe = false;
    core::ProbeFinished m_probe;
    QLabel* m_caption;
    QTableWidget* m_table;
};

}  // namespace batchpilot::ui
