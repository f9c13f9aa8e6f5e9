#include "ui/window/savers_view.h"

#include <cmath>

#include <QFont>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QTableWidget>
#include <QVBoxLayout>

#include "core/base/byte_size.h"
#include "core/plan/saver_survey.h"
#include "ui/style/table_cell.h"

namespace batchpilot::ui {

namespace {

enum SaverColumn {
    kSaverNames,
    kSaverMicroBatch,
    kSaverAccumulation,
    kSaverSpeed,
    kSaverRatio,
    kSaverPeak,
    kSaverPerSample,
    kSaverColumns
};

QString saverName(const std::string& savers) {
    if (savers == "checkpoint") return SaversView::tr("activation checkpointing");
    if (savers == "bf16") return SaversView::tr("bfloat16 autocast");
    if (savers == "both") return SaversView::tr("checkpointing + bfloat16");
    if (savers == "fp16") return SaversView::tr("float16 autocast (loss scaling)");
    if (savers == "checkpoint-fp16") return SaversView::tr("checkpointing + float16");
    return SaversView::tr("none");
}

}  // namespace

SaversView::SaversView(QWidget* parent) : QWidget(parent) {
    setObjectName(QStringLiteral("saversView"));
    m_caption = new QLabel;
    m_caption->setObjectName(QStringLiteral("saversCaption"));
    m_caption->setWordWrap(true);
    m_table = new QTableWidget(0, kSaverColumns);
    m_table->setObjectName(QStringLiteral("saversTable"));
    m_table->setHorizontalHeaderLabels({tr("Memory saver"), tr("Micro-batch"), tr("Accumulation"), tr("Samples/s"),
                                        tr("vs now"), tr("Peak"), tr("Per sample")});
    m_table->verticalHeader()->hide();
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(kSaverNames, QHeaderView::Stretch);
    m_table->setToolTip(
        tr("Every memory saver measured on this model and device: a few micro-batches each, forward and "
           "backward on the data's first samples, nothing kept. Micro-batch: the largest its memory line "
           "predicts within the usable memory. Activation checkpointing keeps only each part's input and "
           "runs the part again in backward (about one more forward pass); bfloat16 autocast halves the "
           "bytes of the layers' outputs and rounds to about 3 digits."));
    m_measure = new QPushButton(tr("Measure again"));
    m_measure->setObjectName(QStringLiteral("saversMeasure"));
    m_measure->setToolTip(tr("Measure every memory saver at the next training batch"));
    m_apply = new QPushButton(tr("Apply"));
    m_apply->setObjectName(QStringLiteral("saversApply"));
    m_apply->setToolTip(tr("Train with the selected memory saver from the next training batch on (with a new probe)"));
    connect(m_measure, &QPushButton::clicked, this, &SaversView::surveyRequested);
    connect(m_apply, &QPushButton::clicked, this, [this] {
        if (const std::optional<core::MemorySavers> savers = selectedSavers()) Q_EMIT applyRequested(*savers);
    });
    connect(m_table, &QTableWidget::itemSelectionChanged, this, &SaversView::updateApply);
    auto* buttons = new QHBoxLayout;
    buttons->addWidget(m_caption, 1);
    buttons->addWidget(m_measure, 0, Qt::AlignTop);
    buttons->addWidget(m_apply, 0, Qt::AlignTop);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addLayout(buttons);
    layout->addWidget(m_table);
    hide();
}

void SaversView::clear() {
    m_table->setRowCount(0);
    m_caption->clear();
    m_survey.reset();
    m_change.reset();
    m_current.clear();
    m_outcome.clear();
    hide();
}

QString SaversView::captionText() const {
    return m_caption->text();
}

std::optional<core::MemorySavers> SaversView::selectedSavers() const {
    const QList<QTableWidgetItem*> selected = m_table->selectedItems();
    if (selected.isEmpty() || !m_survey) return std::nullopt;
    const int row = selected.front()->row();
    if (row < 0 || row >= static_cast<int>(m_survey->options.size())) return std::nullopt;
    const auto parsed = core::parseMemorySavers(m_survey->options[static_cast<size_t>(row)].savers);
    return parsed ? std::optional(*parsed) : std::nullopt;
}

void SaversView::updateApply() {
    bool usable = false;
    const QList<QTableWidgetItem*> selected = m_table->selectedItems();
    if (m_survey && !selected.isEmpty()) {
        const core::SaverOption& o = m_survey->options[static_cast<size_t>(selected.front()->row())];
        usable = o.fits && o.unavailable.empty() && o.savers != m_current;
        m_apply->setText(usable ? tr("Apply %1").arg(saverName(o.savers)) : tr("Apply"));
    }
    m_apply->setEnabled(usable && m_readOnly.isEmpty());
}

void SaversView::setReadOnly(const QString& why) {
    m_readOnly = why;
    m_measure->setEnabled(why.isEmpty());
    m_measure->setToolTip(why.isEmpty() ? tr("Measure every memory saver at the next training batch") : why);
    m_apply->setToolTip(
        why.isEmpty() ? tr("Train with the selected memory saver from the next training batch on (with a new probe)")
                      : why);
    updateApply();
}

void SaversView::updateCaption() {
    if (!m_survey) return;
    QString text = tr("<b>Memory savers</b> on %1 (measured in %2 s after step %3, %4): ")
                       .arg(QString::fromStdString(m_survey->device))
                       .arg(m_survey->seconds, 0, 'f', 1)
                       .arg(m_survey->step)
                       .arg(QString::fromStdString(m_survey->reason).toHtmlEscaped());
    if (!m_outcome.isEmpty()) {
        text += m_outcome;  // a change since the survey: what it did, not what the survey advised
    } else {
        text += m_survey->suggestion.empty()
                    ? tr("keep %1 — no other saver was measured more than 5% faster.").arg(saverName(m_current))
                    : tr("<b>%1</b> is predicted fastest; it is selected: Apply turns it on at the next batch.")
                          .arg(saverName(m_survey->suggestion));
    }
    m_caption->setText(text);
}

void SaversView::markRows() {
    if (!m_survey) return;
    for (int row = 0; row < m_table->rowCount() && row < static_cast<int>(m_survey->options.size()); ++row) {
        const std::string& savers = m_survey->options[static_cast<size_t>(row)].savers;
        QString name = saverName(savers);
        if (savers == m_current) name += tr(" (in use)");
        if (savers == m_survey->suggestion && m_outcome.isEmpty()) name += tr(" — suggested");
        if (QTableWidgetItem* item = m_table->item(row, kSaverNames)) item->setText(name);
    }
}

void SaversView::handle(const core::Event& event) {
    if (const auto* changed = std::get_if<core::MemorySaversChanged>(&event)) {
        m_current = changed->to;
        m_change = *changed;
        m_outcome = tr("Turned on %1 at step %2; probing…").arg(saverName(changed->to)).arg(changed->step);
        markRows();
        updateApply();
        updateCaption();
        return;
    }
    if (const auto* finished = std::get_if<core::ProbeFinished>(&event)) {
        if (!m_change) return;
        const int64_t predicted = m_change->predictedMicroBatch;
        m_outcome =
            predicted > 0
                ? tr("With %1 the probe found micro-batch %2 (predicted %3, %4% off).")
                      .arg(saverName(m_change->to))
                      .arg(finished->microBatch)
                      .arg(predicted)
                      .arg(100.0 * std::abs(static_cast<double>(predicted - finished->microBatch)) /
                               static_cast<double>(std::max<int64_t>(1, finished->microBatch)),
                           0, 'f', 1)
                : tr("With %1 the probe found micro-batch %2.").arg(saverName(m_change->to)).arg(finished->microBatch);
        m_change.reset();
        updateCaption();
        return;
    }
    const auto* survey = std::get_if<core::SaverSurvey>(&event);
    if (survey == nullptr) return;
    m_survey = *survey;
    m_current = survey->current;
    m_outcome.clear();
    const core::SaverOption* inUse = core::findOption(*survey, survey->current);
    const double now = inUse != nullptr ? inUse->samplesPerSecond : 0;
    const QSignalBlocker blocker(m_table);
    m_table->clearSelection();
    m_table->setRowCount(static_cast<int>(survey->options.size()));
    int suggested = -1;
    for (int row = 0; row < static_cast<int>(survey->options.size()); ++row) {
        const core::SaverOption& o = survey->options[static_cast<size_t>(row)];
        if (o.savers == survey->suggestion) suggested = row;
        auto* first = readOnlyCell(saverName(o.savers), Qt::AlignLeft | Qt::AlignVCenter);
        if (o.savers == survey->suggestion) {
            QFont bold = first->font();
            bold.setBold(true);
            first->setFont(bold);
        }
        m_table->setItem(row, kSaverNames, first);
        if (!o.unavailable.empty() || !o.fits) {
            const QString why = !o.unavailable.empty()
                                    ? tr("not available: %1").arg(QString::fromStdString(o.unavailable))
                                    : tr("does not fit even at the smallest micro-batch");
            auto* reason = readOnlyCell(why, Qt::AlignLeft | Qt::AlignVCenter);
            reason->setToolTip(why);
            m_table->setItem(row, kSaverMicroBatch, reason);
            m_table->setSpan(row, kSaverMicroBatch, 1, kSaverColumns - kSaverMicroBatch);
            continue;
        }
        m_table->setSpan(row, kSaverMicroBatch, 1, 1);
        m_table->setItem(row, kSaverMicroBatch, readOnlyCell(QString::number(o.microBatch)));
        m_table->setItem(row, kSaverAccumulation, readOnlyCell(QString::number(o.accumulationSteps)));
        m_table->setItem(row, kSaverSpeed, readOnlyCell(QString::number(o.samplesPerSecond, 'f', 0)));
        m_table->setItem(
            row, kSaverRatio,
            readOnlyCell(now > 0 ? tr("%1×").arg(o.samplesPerSecond / now, 0, 'f', 2) : QStringLiteral("–")));
        m_table->setItem(row, kSaverPeak, readOnlyCell(QString::fromStdString(core::formatBytes(o.peakBytes))));
        m_table->setItem(
            row, kSaverPerSample,
            readOnlyCell(o.bytesPerSample > 0
                             ? QString::fromStdString(core::formatBytes(static_cast<int64_t>(o.bytesPerSample)))
                             : QStringLiteral("–")));
    }
    markRows();
    if (suggested >= 0) m_table->selectRow(suggested);
    m_table->setFixedHeight(m_table->horizontalHeader()->height() + 2 * m_table->frameWidth() +
                            m_table->rowCount() * m_table->verticalHeader()->defaultSectionSize());
    updateApply();
    updateCaption();
    show();
}

}  // namespace batchpilot::ui
