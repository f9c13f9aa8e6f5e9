#include "ui/teaching/equivalence_dialog.h"

#include <QDialogButtonBox>
#include <QGridLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "ui/style/theme.h"
#include "ui/style/text.h"

namespace batchpilot::ui {

namespace {

QString scientific(double value) {
    return QString::number(value, 'g', 3);
}

/// A table cell that shows a formatted number and sorts by its value.
class NumberItem : public QTableWidgetItem {
public:
    NumberItem(double value, const QString& text) : QTableWidgetItem(text), m_value(value) {
        setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    }
    bool operator<(const QTableWidgetItem& other) const override {
        if (const auto* number = dynamic_cast<const NumberItem*>(&other)) return m_value < number->m_value;
        return QTableWidgetItem::operator<(other);
    }

private:
    double m_value;
};

/// One of the three large figures: a caption over a big number.
QLabel* figure(QGridLayout* grid, int column, const QString& caption, const QString& tip) {
    auto* name = new QLabel(caption);
    name->setAlignment(Qt::AlignCenter);
    name->setToolTip(tip);
    auto* value = new QLabel;
    value->setAlignment(Qt::AlignCenter);
    value->setToolTip(tip);
    value->setTextInteractionFlags(Qt::TextSelectableByMouse);
    QFont big = value->font();
    big.setPointSizeF(big.pointSizeF() * 1.9);
    big.setBold(true);
    value->setFont(big);
    grid->addWidget(value, 0, column);
    grid->addWidget(name, 1, column);
    return value;
}

QLabel* paragraph() {
    auto* label = new QLabel;
    label->setTextFormat(Qt::PlainText);  // the engine's words, never markup
    label->setWordWrap(true);
    label->setTextInteractionFlags(Qt::TextSelectableByMouse);
    return label;
}

}  // namespace

EquivalenceDialog::EquivalenceDialog(QWidget* parent) : QDialog(parent) {
    setObjectName(QStringLiteral("equivalenceDialog"));
    setWindowTitle(tr("Accumulation against one full pass"));
    setModal(false);

    m_verdict = new QLabel;
    m_verdict->setObjectName(QStringLiteral("equivalenceVerdict"));
    m_verdict->setAlignment(Qt::AlignCenter);
    m_verdict->setWordWrap(true);
    QFont verdictFont = m_verdict->font();
    verdictFont.setPointSizeF(verdictFont.pointSizeF() * 1.5);
    verdictFont.setBold(true);
    m_verdict->setFont(verdictFont);
    m_verdict->setToolTip(
        tr("Whether summing the weighted micro-batch gradients gave the same "
           "gradient as one pass over the whole batch, as far as float32 "
           "arithmetic can tell (relative difference at most 1e-4)."));
    m_summary = paragraph();
    m_summary->setAlignment(Qt::AlignCenter);

    auto* figures = new QGridLayout;
    m_maxAbs = figure(figures, 0, tr("largest |difference|"),
                      tr("The largest difference between any single gradient entry computed the "
                         "two ways."));
    m_relative = figure(figures, 1, tr("relative difference"),
                        tr("Length of (accumulated − full) divided by the length of the full-batch "
                           "gradient. float32 rounding alone gives about 1e-7 to 2e-5: both ways add "
                           "the same numbers in a different order."));
    m_cosine = figure(figures, 2, tr("cosine similarity"),
                      tr("How well the two gradients point the same way: 1 means exactly the same "
                         "direction."));

    m_table = new QTableWidget(0, 5);
    m_table->setObjectName(QStringLiteral("equivalenceTable"));
    m_table->setHorizontalHeaderLabels(
        {tr("Parameter tensor"), tr("Elements"), tr("Max |difference|"), tr("Relative"), tr("Cosine")});
    m_table->verticalHeader()->hide();
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 6);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setAlternatingRowColors(true);
    m_table->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
    for (int column = 1; column < 5; ++column)
        m_table->horizontalHeader()->setSectionResizeMode(column, QHeaderView::ResizeToContents);
    // No sort column until the user clicks one: the model's own order (input to output) first.
    m_table->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
    m_table->setSortingEnabled(true);
    m_table->setToolTip(
        tr("The same comparison for every weight tensor of the model. Click a "
           "column header to sort, e.g. by relative difference to find the "
           "layers that differ most."));

    m_explanation = paragraph();
    m_explanation->setObjectName(QStringLiteral("equivalenceExplanation"));
    m_batchNorm = paragraph();
    m_batchNorm->setObjectName(QStringLiteral("equivalenceBatchNorm"));
    m_batchNorm->setTextFormat(Qt::RichText);
    m_budgetNote = paragraph();
    m_budgetNote->setObjectName(QStringLiteral("equivalenceBudgetNote"));
    m_budgetNote->setTextFormat(Qt::RichText);
    m_error = paragraph();
    m_error->setObjectName(QStringLiteral("equivalenceError"));
    m_error->setStyleSheet(problemTextStyleSheet(true));

    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::close);
    buttons->button(QDialogButtonBox::Close)->setDefault(true);

    // The words first (what a student reads), the per-tensor detail below.
    auto* layout = new QVBoxLayout(this);
    layout->addWidget(m_verdict);
    layout->addWidget(m_summary);
    layout->addLayout(figures);
    layout->addWidget(m_error);
    layout->addWidget(m_explanation);
    layout->addWidget(m_batchNorm);
    layout->addWidget(m_budgetNote);
    layout->addWidget(m_table, 1);
    layout->addWidget(buttons);
    buttons->button(QDialogButtonBox::Close)->setFocus();
    resize(720, 600);
}

QString EquivalenceDialog::verdict() const {
    return m_verdict->text();
}

QString EquivalenceDialog::text() const {
    QStringList parts{m_verdict->text(), m_summary->text()};
    for (const QLabel* label : {m_error, m_explanation, m_batchNorm, m_budgetNote})
        if (!label->isHidden())
            parts << QString(label->text()).remove(QStringLiteral("<b>")).remove(QStringLiteral("</b>"));
    return parts.join(QLatin1Char('\n'));
}

void EquivalenceDialog::setResult(const core::EquivalenceChecked& r) {
    m_result = r;
    const bool failed = !r.error.empty();
    const bool equal = r.equalUpToRounding();
    QString colour;
    if (failed) {
        m_verdict->setText(tr("The check could not run"));
        colour = QStringLiteral("#d62728");
    } else if (equal) {
        m_verdict->setText(tr("Equal up to float rounding"));
        colour = QStringLiteral("#1b9e4b");
    } else if (r.batchStatistics) {
        m_verdict->setText(tr("Different: BatchNorm normalises each micro-batch on its own"));
        colour = QStringLiteral("#d68910");
    } else {
        m_verdict->setText(tr("Different: more than float rounding"));
        colour = QStringLiteral("#d62728");
    }
    m_verdict->setStyleSheet(QStringLiteral("color: %1;").arg(colour));

    m_summary->setText(failed ? QString()
                              : tr("%1 samples of %2, accumulated as %3 (%4 micro-batches), "
                                   "against one pass over all %1. Took %5 s.")
                                    .arg(r.samples)
                                    .arg(r.step > 0 ? tr("the batch of step %1").arg(r.step) : tr("the first batch"))
                                    .arg(QString::fromStdString(core::describeSplit(r)))
                                    .arg(core::microBatchCount(r))
                                    .arg(r.seconds, 0, 'f', 2));
    m_summary->setVisible(!failed);

    m_maxAbs->setText(failed ? QStringLiteral("—") : scientific(r.overall.maxAbsDifference));
    m_relative->setText(failed ? QStringLiteral("—") : scientific(r.overall.relativeDifference));
    m_cosine->setText(failed ? QStringLiteral("—") : QString::number(r.overall.cosineSimilarity, 'f', 9));

    m_table->setSortingEnabled(false);
    m_table->setRowCount(static_cast<int>(r.tensors.size()));
    for (int row = 0; row < static_cast<int>(r.tensors.size()); ++row) {
        const core::TensorDifference& t = r.tensors[static_cast<std::size_t>(row)];
        m_table->setItem(row, 0, new QTableWidgetItem(str(t.name)));
        m_table->setItem(row, 1, new NumberItem(static_cast<double>(t.elements), QString::number(t.elements)));
        m_table->setItem(row, 2, new NumberItem(t.maxAbsDifference, scientific(t.maxAbsDifference)));
        m_table->setItem(row, 3, new NumberItem(t.relativeDifference, scientific(t.relativeDifference)));
        m_table->setItem(row, 4, new NumberItem(t.cosineSimilarity, QString::number(t.cosineSimilarity, 'f', 9)));
    }
    m_table->setSortingEnabled(true);
    m_table->setCurrentCell(-1, -1);
    m_table->setVisible(!r.tensors.empty());

    m_explanation->setText(str(r.explanation));
    m_explanation->setVisible(!r.explanation.empty());
    m_batchNorm->setText(
        r.runningStatisticsRelativeDifference >= 0
            ? tr("<b>BatchNorm comparison:</b> with the running statistics (evaluation mode, "
                 "each sample normalised on its own) the relative difference is %1, against %2 "
                 "with the micro-batch statistics of training mode.")
                  .arg(scientific(r.runningStatisticsRelativeDifference), scientific(r.overall.relativeDifference))
            : QString());
    m_batchNorm->setVisible(r.runningStatisticsRelativeDifference >= 0);
    m_budgetNote->setText(r.fullPassOutsideBudget
                              ? tr("<b>Note:</b> the full batch does not fit in the virtual device's "
                                   "memory budget (that is why the trainer accumulates), so the "
                                   "one-pass gradient was computed in host memory outside the "
                                   "budget.")
                              : QString());
    m_budgetNote->setVisible(r.fullPassOutsideBudget);
    m_error->setText(str(r.error));
    m_error->setVisible(failed);
}

}  // namespace batchpilot::ui
