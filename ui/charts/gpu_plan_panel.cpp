#include "ui/charts/gpu_plan_panel.h"

#include <cmath>

#include <QHeaderView>
#include <QLabel>
#include <QLocale>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/base/byte_size.h"
#include "ui/style/table_cell.h"

namespace batchpilot::ui {

namespace {

QString bytes(int64_t value) {
    return QString::fromStdString(core::formatBytes(value));
}

}  // namespace

GpuPlanPanel::GpuPlanPanel(QWidget* parent)
    : QWidget(parent),
      m_targets(core::gpuPlanTargets("all").value_or(std::vector<core::GpuPlanTarget>{})),
      m_caption(new QLabel),
      m_table(new QTableWidget) {
    m_caption->setObjectName(QStringLiteral("gpuPlanCaption"));
    m_caption->setWordWrap(true);
    m_caption->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_table->setObjectName(QStringLiteral("gpuPlanTable"));
    m_table->setColumnCount(6);
    m_table->setHorizontalHeaderLabels(
        {tr("GPU"), tr("Memory"), tr("Usable"), tr("Micro-batch"), tr("Predicted peak"), tr("Target batch =")});
    m_table->horizontalHeaderItem(3)->setToolTip(tr("The largest micro-batch that fits, at most the target batch"));
    m_table->horizontalHeaderItem(5)->setToolTip(tr("How the target batch is accumulated from micro-batches"));
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setStretchLastSection(true);
    m_table->verticalHeader()->hide();
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setToolTip(
        tr("Predicted from the probe's memory line (peak ≈ fixed + per sample × micro-batch, in "
           "reserved bytes) carried to each GPU's usable memory: its capacity as PyTorch reports "
           "it, less the CUDA context, less the headroom; the cuBLAS workspace of each GPU "
           "replaces the probe device's"));
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->addWidget(m_caption);
    layout->addWidget(m_table, 1);
    recompute();
}

void GpuPlanPanel::handle(const core::Event& event) {
    if (const auto* probe = std::get_if<core::ProbeFinished>(&event)) {
        if (probe->bytesPerSample <= 0) return;  // no memory line (a probe that found the target at once)
        m_probe = *probe;
        m_haveProbe = true;
        recompute();
    } else if (const auto* sample = std::get_if<core::MemorySample>(&event)) {
        if (sample->capacityBytes <= 0) return;
        // The headroom is a percentage the user typed: 4 decimals hold it exactly.
        const double headroom =
            1.0 - static_cast<double>(sample->headroomBytes) / static_cast<double>(sample->capacityBytes);
        const double rounded = std::round(headroom * 1e4) / 1e4;
        if (rounded != m_headroom) {
            m_headroom = rounded;
            if (m_haveProbe) recompute();
        }
    } else if (const auto* breakdown = std::get_if<core::MemoryBreakdown>(&event)) {
        if (breakdown->workspaceBytes != m_workspaceBytes || breakdown->device != m_device) {
            m_workspaceBytes = breakdown->workspaceBytes;
            m_device = breakdown->device;
            if (m_haveProbe) recompute();
        }
    } else if (const auto* summary = std::get_if<core::RunSummary>(&event)) {
        m_device = summary->device;
    }
}

void GpuPlanPanel::clear() {
    m_haveProbe = false;
    m_device.clear();
    m_headroom = 0;
    m_workspaceBytes = 0;
    recompute();
}

QString GpuPlanPanel::caption() const {
    if (!m_haveProbe) {
        return tr(
            "After the probe: the plan on each GPU you might get, predicted from the memory this run's "
            "model needs on this device (any device, a virtual one included).");
    }
    return tr("Predicted from the probe on %1: memory ≈ %2 + %3 per sample; it chose micro-batch %4 there. Target "
              "batch %5, headroom %6%.")
        .arg(QString::fromStdString(m_device), bytes(static_cast<int64_t>(m_probe.fixedBytes)),
             bytes(static_cast<int64_t>(m_probe.bytesPerSample)))
        .arg(m_probe.microBatch)
        .arg(m_probe.targetBatch)
        .arg(m_headroom * 100, 0, 'g', 4);
}

void GpuPlanPanel::recompute() {
    m_rows.clear();
    if (m_haveProbe) {
        m_rows = core::planForGpus(m_targets, m_probe.fixedBytes, m_probe.bytesPerSample, m_workspaceBytes,
                                   m_probe.targetBatch, m_headroom);
    }
    m_caption->setText(caption());
    m_table->setRowCount(static_cast<int>(m_targets.size()));
    for (int r = 0; r < static_cast<int>(m_targets.size()); ++r) {
        const core::GpuPlanTarget& target = m_targets[r];
        auto* name = readOnlyCell(QString::fromStdString(target.device), Qt::AlignLeft | Qt::AlignVCenter);
        name->setToolTip(QString::fromStdString(target.description));
        m_table->setItem(r, 0, name);
        m_table->setItem(r, 1, readOnlyCell(bytes(target.capacityBytes)));
        if (r >= static_cast<int>(m_rows.size())) {
            for (int c = 2; c < 6; ++c) m_table->setItem(r, c, readOnlyCell(QStringLiteral("–")));
            continue;
        }
        const core::GpuPlanRow& row = m_rows[r];
        m_table->setItem(r, 2, readOnlyCell(bytes(row.usableBytes)));
        if (row.microBatch > 0) {
            m_table->setItem(r, 3, readOnlyCell(QLocale().toString(static_cast<qlonglong>(row.microBatch))));
            m_table->setItem(r, 4, readOnlyCell(bytes(row.peakBytes)));
            m_table->setItem(r, 5, readOnlyCell(QString::fromStdString(row.plan), Qt::AlignLeft | Qt::AlignVCenter));
        } else {
            m_table->setItem(r, 3, readOnlyCell(tr("does not fit")));
            auto* why = readOnlyCell(tr("one sample needs about %1").arg(bytes(row.neededBytes)),
                                     Qt::AlignLeft | Qt::AlignVCenter);
            why->setForeground(QColor(0xc6, 0x28, 0x28));
            m_table->setItem(r, 4, readOnlyCell(QStringLiteral("–")));
            m_table->setItem(r, 5, why);
        }
    }
}

}  // namespace batchpilot::ui
