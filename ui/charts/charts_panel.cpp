#include "ui/charts/charts_panel.h"

#include <QChartView>
#include <QDir>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QTabWidget>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/charts/gpu_plan_panel.h"
#include "ui/charts/live_chart.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/memory_fit_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/runs_panel.h"
#include "ui/charts/segments_view.h"
#include "ui/charts/speed_chart.h"
#include "ui/charts/throughput_chart.h"
#include "ui/charts/memory_breakdown_bar.h"

namespace batchpilot::ui {

ChartsPanel::ChartsPanel(QWidget* parent)
    : QWidget(parent),
      m_loss(new LossChart),
      m_probe(new ProbeChart),
      m_memory(new MemoryChart),
      m_throughput(new ThroughputChart),
      m_memoryFit(new MemoryFitChart),
      m_speed(new SpeedChart),
      m_breakdownBar(new MemoryBreakdownBar),
      m_runs(new RunsPanel),
      m_segments(new SegmentsView),
      m_gpuPlan(new GpuPlanPanel),
      m_tabs(new QTabWidget),
      m_timer(new QTimer(this)) {
    m_loss->setObjectName(QStringLiteral("lossChart"));
    m_probe->setObjectName(QStringLiteral("probeChart"));
    m_memory->setObjectName(QStringLiteral("memoryChart"));
    m_throughput->setObjectName(QStringLiteral("throughputChart"));
    m_memoryFit->setObjectName(QStringLiteral("memoryFitChart"));
    m_speed->setObjectName(QStringLiteral("speedChart"));
    m_breakdownBar->setObjectName(QStringLiteral("memoryBreakdownBar"));
    auto* live = new QWidget;
    auto* grid = new QGridLayout(live);
    grid->setContentsMargins(0, 0, 0, 0);
    grid->setSpacing(4);
    grid->addWidget(m_loss, 0, 0);
    grid->addWidget(m_probe, 0, 1);
    // The breakdown bar next to the memory chart: the same memory, over time and split by use.
    auto* memoryRow = new QHBoxLayout;
    memoryRow->setContentsMargins(0, 0, 0, 0);
    memoryRow->setSpacing(2);
    memoryRow->addWidget(m_memory, 1);
    memoryRow->addWidget(m_breakdownBar);
    grid->addLayout(memoryRow, 1, 0);
    grid->addWidget(m_throughput, 1, 1);
    grid->setColumnStretch(0, 1);
    grid->setColumnStretch(1, 1);
    grid->setRowStretch(0, 1);
    grid->setRowStretch(1, 1);
    m_tabs->setDocumentMode(true);
    m_tabs->addTab(live, tr("Live"));
    m_tabs->addTab(m_memoryFit, tr("Memory fit && what-if"));
    m_tabs->addTab(m_speed, tr("Fastest micro-batch"));
    m_runs->setObjectName(QStringLiteral("runsPanel"));
    m_tabs->addTab(m_runs, tr("Compare runs"));
    m_segments->setObjectName(QStringLiteral("segmentsView"));
    m_tabs->addTab(m_segments, tr("Segments"));
    m_gpuPlan->setObjectName(QStringLiteral("gpuPlanPanel"));
    m_tabs->addTab(m_gpuPlan, tr("Every GPU"));
    m_tabs->setTabToolTip(4, tr("The caching allocator's segments and the blocks in them, after the latest step "
                                "and as they were at each OOM: where the memory is, and whether an OOM was "
                                "exhaustion or fragmentation (virtual GPUs that model PyTorch's allocator)"));
    m_tabs->setTabToolTip(5, tr("After each probe: the largest micro-batch and the accumulation each GPU you "
                                "might get would give for the target batch, predicted from this run's memory line"));
    m_tabs->setTabToolTip(3, tr("Every recorded run: tick runs to draw their loss or validation curves next to "
                                "this one, on the samples-seen axis when their target batches differ"));
    m_tabs->setTabToolTip(0, tr("Loss, probe trials, device memory with its breakdown, throughput"));
    m_tabs->setTabToolTip(1, tr("Peak memory against micro-batch for the latest probe, the fitted "
                                "line, and a slider to ask what another micro-batch would need"));
    m_tabs->setTabToolTip(2, tr("Samples per second of each micro-batch size the trainer timed after the "
                                "probe, and the one it chose"));
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_tabs);
    for (LiveChart* chart : charts())
        connect(chart, &LiveChart::followLiveChanged, this, [this] { Q_EMIT followLiveChanged(followLive()); });
    // The charts whose x axis is wall time show the same span: zooming or panning one moves the
    // others, and following live again in one resumes them all.
    for (LiveChart* source : charts()) {
        connect(source, &LiveChart::xRangeChosen, this, [this, source](double x0, double x1) {
            if (!source->timeAxis()) return;
            for (LiveChart* other : charts())
                if (other != source && other->timeAxis()) other->showXRange(x0, x1);
        });
        connect(source, &LiveChart::followLiveChanged, this, [this, source](bool follow) {
            if (!follow || !source->timeAxis()) return;
            for (LiveChart* other : charts())
                if (other != source && other->timeAxis()) other->setFollowLive(true);
        });
    }
    for (LiveChart* chart : drawnCharts())
        connect(chart, &LiveChart::exportDataRequested, this, &ChartsPanel::exportDataRequested);
    m_timer->setInterval(16);
    connect(m_timer, &QTimer::timeout, this, &ChartsPanel::redrawNext);
    m_timer->start();
}

QList<LiveChart*> ChartsPanel::charts() const {
    return {m_loss, m_probe, m_memory, m_throughput};
}

QList<LiveChart*> ChartsPanel::drawnCharts() const {
    return {m_loss, m_probe, m_memory, m_throughput, m_memoryFit, m_speed, m_runs->chart()};
}

void ChartsPanel::setTargetBatch(qint64 target) {
    m_memoryFit->setTargetBatch(target);
}

void ChartsPanel::handle(const core::Event& event) {
    for (LiveChart* chart : drawnCharts()) chart->handle(event);
    m_breakdownBar->handle(event);
    m_segments->handle(event);
    m_gpuPlan->handle(event);
}

void ChartsPanel::clear() {
    for (LiveChart* chart : drawnCharts()) {
        chart->clear();
        chart->setFollowLive(true);
    }
    m_breakdownBar->clear();
    m_segments->clear();
    m_gpuPlan->clear();
}

void ChartsPanel::redrawNow() {
    for (LiveChart* chart : drawnCharts()) chart->redraw();
}

void ChartsPanel::redrawNext() {
    const QList<LiveChart*> all = drawnCharts();
    for (int i = 0; i < all.size(); ++i) {
        const int index = (m_nextChart + i) % all.size();
        if (all[index]->isDirty()) {
            all[index]->redraw();
            m_nextChart = (index + 1) % all.size();
            return;
        }
    }
}

void ChartsPanel::setFollowLive(bool follow) {
    for (LiveChart* chart : charts()) chart->setFollowLive(follow);
}

bool ChartsPanel::followLive() const {
    for (LiveChart* chart : charts())
        if (!chart->followLive()) return false;
    return true;
}

void ChartsPanel::setDarkTheme(bool dark) {
    for (LiveChart* chart : drawnCharts()) chart->setDarkTheme(dark);
    m_breakdownBar->setDarkTheme(dark);
    m_segments->setDarkTheme(dark);
}

QImage ChartsPanel::lossImage() {
    m_loss->redraw();
    return m_loss->chartView()->grab().toImage();
}

QImage ChartsPanel::memoryFitImage() {
    m_memoryFit->redraw();
    return m_memoryFit->chartView()->grab().toImage();
}

QImage ChartsPanel::breakdownImage() {
    return m_breakdownBar->grab().toImage();
}

QStringList ChartsPanel::exportAll(const QString& directory, QStringList* failed) {
    QStringList written;
    const QDir dir(directory);
    const QList<std::pair<LiveChart*, QString>> files = {
        {m_loss, QStringLiteral("loss.png")},
        {m_probe, QStringLiteral("probe.png")},
        {m_memory, QStringLiteral("memory.png")},
        {m_throughput, QStringLiteral("throughput.png")},
        {m_speed, QStringLiteral("fastest-micro-batch.png")},
    };
    for (const auto& [chart, name] : files) {
        const QString path = dir.filePath(name);
        if (chart->exportPng(path))
            written << path;
        else if (failed != nullptr)
            *failed << path;
    }
    // The memory views too: the fit with its what-if marker, and the breakdown bar.
    const QList<std::pair<QImage, QString>> images = {
        {memoryFitImage(), QStringLiteral("memory-fit.png")},
        {breakdownImage(), QStringLiteral("memory-breakdown.png")},
    };
    for (const auto& [image, name] : images) {
        const QString path = dir.filePath(name);
        if (!image.isNull() && image.save(path))
            written << path;
        else if (failed != nullptr)
            *failed << path;
    }
    return written;
}

}  // namespace batchpilot::ui
