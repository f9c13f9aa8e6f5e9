#include "ui/window/ranks_view.h"

#include <algorithm>
#include <limits>

#include <QHeaderView>
#include <QLabel>
#include <QProgressBar>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/base/byte_size.h"

namespace batchpilot::ui {

namespace {

enum RankColumn {
    kRankColumn,
    kDeviceColumn,
    kShareColumn,
    kPlanColumn,
    kSpeedColumn,
    kWaitColumn,
    kOomsColumn,
    kPeakColumn,
    kRankColumns
};

QTableWidgetItem* cell(const QString& text) {
    auto* item = new QTableWidgetItem(text);
    item->setFlags(Qt::ItemIsEnabled);
    item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    return item;
}

}  // namespace

RanksView::RanksView(QWidget* parent) : QWidget(parent) {
    setObjectName(QStringLiteral("ranksView"));
    m_caption = new QLabel;
    m_caption->setObjectName(QStringLiteral("ranksCaption"));
    m_caption->setWordWrap(true);
    m_table = new QTableWidget(0, kRankColumns);
    m_table->setObjectName(QStringLiteral("ranksTable"));
    m_table->setHorizontalHeaderLabels({tr("Rank"), tr("Device"), tr("Share of the batch"), tr("Micro-batches"),
                                        tr("Samples/s"), tr("Waited"), tr("OOMs"), tr("Peak")});
    m_table->verticalHeader()->hide();
    m_table->setSelectionMode(QAbstractItemView::NoSelection);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(kShareColumn, QHeaderView::Stretch);
    m_table->setToolTip(
        tr("Every device of the job, one process each. Each trains its share of every training batch "
           "with its own probed micro-batch; the ranks then sum their gradients once (the all-reduce) "
           "and take the same optimizer step. Shares follow each device's memory, probed micro-batch "
           "and measured speed, so that no rank waits long for the others."));
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(m_caption);
    layout->addWidget(m_table);
    hide();
}

void RanksView::clear() {
    m_table->setRowCount(0);
    m_caption->clear();
    m_lastChange.clear();
    hide();
}

QString RanksView::captionText() const {
    return m_caption->text();
}

void RanksView::handle(const core::Event& event) {
    if (const auto* step = std::get_if<core::RanksStepped>(&event)) {
        noteShareChange(*step);
        showStep(*step);
    }
}

void RanksView::handleEvents(const QList<core::Event>& events) {
    const core::RanksStepped* last = nullptr;
    for (const core::Event& event : events) {
        if (const auto* step = std::get_if<core::RanksStepped>(&event)) {
            noteShareChange(*step);
            last = step;
        }
    }
    if (last != nullptr) showStep(*last);
}

void RanksView::noteShareChange(const core::RanksStepped& step) {
    if (step.nextShares.empty()) return;
    QStringList shares;
    for (const int64_t share : step.nextShares) shares << QString::number(share);
    m_lastChange = tr("after step %1 the shares became %2 (%3)")
                       .arg(step.step)
                       .arg(shares.join(QStringLiteral(" + ")), QString::fromStdString(step.shareReason));
}

void RanksView::showStep(const core::RanksStepped& stepped) {
    const core::RanksStepped* step = &stepped;
    int64_t total = 0;
    for (const core::RankStep& rank : step->ranks) total += rank.share;
    // A bar counts in int: a batch past 2^31 - 1 samples (shares reach 2^31 each) is drawn in
    // units of this many samples, its text saying the samples themselves.
    const int64_t unit =
        std::max<int64_t>(1, (total + std::numeric_limits<int>::max() - 1) / std::numeric_limits<int>::max());
    // Sized to the contents once the rows are filled: sized at every cell, 256 ranks took minutes.
    QHeaderView* header = m_table->horizontalHeader();
    header->setSectionResizeMode(QHeaderView::Interactive);
    m_table->setRowCount(static_cast<int>(step->ranks.size()));
    for (int row = 0; row < static_cast<int>(step->ranks.size()); ++row) {
        const core::RankStep& rank = step->ranks[static_cast<size_t>(row)];
        m_table->setItem(row, kRankColumn, cell(QString::number(rank.rank)));
        auto* device = cell(QString::fromStdString(rank.device));
        device->setTextAlignment(Qt::AlignLeft | Qt::AlignVCenter);
        m_table->setItem(row, kDeviceColumn, device);
        auto* bar = qobject_cast<QProgressBar*>(m_table->cellWidget(row, kShareColumn));
        if (bar == nullptr) {
            bar = new QProgressBar;
            m_table->setCellWidget(row, kShareColumn, bar);
        }
        bar->setRange(0, static_cast<int>(std::max<int64_t>(total / unit, 1)));
        bar->setValue(static_cast<int>(rank.share / unit));
        bar->setFormat(tr("%1 of %2 samples").arg(rank.share).arg(total));
        m_table->setItem(row, kPlanColumn, cell(tr("%1 × ≤%2").arg(rank.microBatches).arg(rank.microBatch)));
        m_table->setItem(row, kSpeedColumn, cell(QString::number(rank.samplesPerSecond, 'f', 0)));
        m_table->setItem(row, kWaitColumn, cell(tr("%1 s").arg(rank.waitSeconds, 0, 'f', 2)));
        m_table->setItem(row, kOomsColumn, cell(QString::number(rank.ooms)));
        m_table->setItem(row, kPeakColumn, cell(QString::fromStdString(core::formatBytes(rank.peakBytes))));
    }
    header->setSectionResizeMode(QHeaderView::ResizeToContents);
    header->setSectionResizeMode(kShareColumn, QHeaderView::Stretch);
    m_caption->setText(
        tr("<b>%1 devices</b>, step %2: gradients summed by %6 in %3 ms; the slowest rank "
           "computed %4× as long as the fastest%5.")
            .arg(step->ranks.size())
            .arg(step->step)
            .arg(step->allReduceSeconds * 1000, 0, 'f', 1)
            .arg(step->imbalance, 0, 'f', 2)
            .arg(m_lastChange.isEmpty() ? QString() : QStringLiteral("; ") + m_lastChange)
            .arg(step->collectives.empty() ? tr("the ranks") : QString::fromStdString(step->collectives)));
    m_caption->setToolTip(step->collectivesWhy.empty()
                              ? QString()
                              : tr("Gloo, not NCCL: %1").arg(QString::fromStdString(step->collectivesWhy)));
    m_table->setFixedHeight(m_table->horizontalHeader()->height() + 2 * m_table->frameWidth() +
                            m_table->rowCount() * m_table->verticalHeader()->defaultSectionSize());
    show();
}

}  // namespace batchpilot::ui
