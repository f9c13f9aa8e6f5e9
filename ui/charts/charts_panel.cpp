#include "ui/charts/charts_panel.h"

#include <QDir>
#include <QGridLayout>
#include <QTimer>

#include "ui/charts/live_chart.h"
#include "ui/charts/loss_chart.h"
#include "ui/charts/memory_chart.h"
#include "ui/charts/probe_chart.h"
#include "ui/charts/throughput_chart.h"

namespace batchpilot::ui {

ChartsPanel::ChartsPanel(QWidget* parent)
    : QWidget(parent),
      m_loss(new LossChart),
      m_probe(new ProbeChart),
      m_memory(new MemoryChart),
      m_throughput(new ThroughputChart),
      m_timer(new QTimer(this))
{
    m_loss->setObjectName(QStringLiteral("lossChart"));
    m_probe->setObjectName(QStringLiteral("probeChart"));
    m_memory->setObjectName(QStringLiteral("memoryChart"));
    m_throughput->setObjectName(QStringLiteral("throughputChart"));
    auto* grid = new QGridLayout(this);
    grid->setContentsMargins(0, 0, 0, 0);
    grid->setSpacing(4);
    grid->addWidget(m_loss, 0, 0);
    grid->addWidget(m_probe, 0, 1);
    grid->addWidget(m_memory, 1, 0);
    grid->addWidget(m_throughput, 1, 1);
    grid->setColumnStretch(0, 1);
    grid->setColumnStretch(1, 1);
    grid->setRowStretch(0, 1);
    grid->setRowStretch(1, 1);
    for (LiveChart* chart : charts())
        connect(chart, &LiveChart::followLiveChanged, this,
                [this] { Q_EMIT followLiveChanged(followLive()); });
    m_timer->setInterval(16);
    connect(m_timer, &QTimer::timeout, this, &ChartsPanel::redrawNext);
    m_timer->start();
}

QList<LiveChart*> ChartsPanel::charts() const
{
    return {m_loss, m_probe, m_memory, m_throughput};
}

void ChartsPanel::handle(const core::Event& event)
{
    for (LiveChart* chart : charts())
        chart->handle(event);
}

void ChartsPanel::clear()
{
    for (LiveChart* chart : charts()) {
        chart->clear();
        chart->setFollowLive(true);
    }
}

void ChartsPanel::redrawNow()
{
    for (LiveChart* chart : charts())
        chart->redraw();
}

void ChartsPanel::redrawNext()
{
    const QList<LiveChart*> all = charts();
    for (int i = 0; i < all.size(); ++i) {
        const int index = (m_nextChart + i) % all.size();
        if (all[index]->isDirty()) {
            all[index]->redraw();
            m_nextChart = (index + 1) % all.size();
            return;
        }
    }
}

void ChartsPanel::setFollowLive(bool follow)
{
    for (LiveChart* chart : charts())
        chart->setFollowLive(follow);
}

bool ChartsPanel::followLive() const
{
    for (LiveChart* chart : charts())
        if (!chart->followLive())
            return false;
    return true;
}

void ChartsPanel::setDarkTheme(bool dark)
{
    for (LiveChart* chart : charts())
        chart->setDarkTheme(dark);
}

QStringList ChartsPanel::exportAll(const QString& directory)
{
    QStringList written;
    const QDir dir(directory);
    const QList<std::pair<LiveChart*, QString>> files = {
        {m_loss, QStringLiteral("loss.png")},
        {m_probe, QStringLiteral("probe.png")},
        {m_memory, QStringLiteral("memory.png")},
        {m_throughput, QStringLiteral("throughput.png")},
    };
    for (const auto& [chart, name] : files) {
        const QString path = dir.filePath(name);
        if (chart->exportPng(path))
            written << path;
    }
    return written;
}

}  // namespace batchpilot::ui
