#include "ui/charts/runs_panel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QLineSeries>
#include <QMessageBox>
#include <QPushButton>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QValueAxis>

#include "core/records/run_folder.h"

namespace batchpilot::ui {

namespace {

/// Distinct colours for compared runs (the live run uses the theme's primary colour).
const QColor kRunColours[] = {QColor(0xd9, 0x5f, 0x02), QColor(0x1b, 0x9e, 0x77), QColor(0x75, 0x70, 0xb3),
                              QColor(0xe7, 0x29, 0x8a), QColor(0x66, 0xa6, 0x1e), QColor(0xe6, 0xab, 0x02),
                              QColor(0xa6, 0x76, 0x1d), QColor(0x66, 0x66, 0x66)};

QString text(const nlohmann::json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? QString::fromStdString(it->get<std::string>()) : QString();
}

double number(const nlohmann::json& j, const char* key, double otherwise = std::numeric_limits<double>::quiet_NaN()) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : otherwise;
}

/// A metric's best or last value from summary.json's "metrics".
double summaryMetric(const nlohmann::json& summary, const char* name, const char* which) {
    const auto metrics = summary.find("metrics");
    if (metrics == summary.end() || !metrics->is_object()) return std::numeric_limits<double>::quiet_NaN();
    const auto m = metrics->find(name);
    return m == metrics->end() || !m->is_object() ? std::numeric_limits<double>::quiet_NaN() : number(*m, which);
}

/// A table cell that shows text ("93.1%") but sorts by its number; cells without one sort first.
class NumberItem : public QTableWidgetItem {
public:
    NumberItem(double value, const QString& shown)
        : QTableWidgetItem(std::isfinite(value) ? shown : QStringLiteral("–")), m_value(value) {
        setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    }
    bool operator<(const QTableWidgetItem& other) const override {
        const auto* number = dynamic_cast<const NumberItem*>(&other);
        if (!number) return QTableWidgetItem::operator<(other);
        const double a = std::isfinite(m_value) ? m_value : -std::numeric_limits<double>::infinity();
        const double b = std::isfinite(number->m_value) ? number->m_value : -std::numeric_limits<double>::infinity();
        return a < b;
    }

private:
    double m_value;
};

QTableWidgetItem* numberItem(double value, const QString& shown) {
    return new NumberItem(value, shown);
}

enum RunColumn { Compare = 0, Name, Started, Model, Data, Target, Steps, BestAccuracy, LastLoss, State, Columns };

}  // namespace

CompareChart::CompareChart(QWidget* parent) : LiveChart(tr("Compare runs"), parent) {
    auto* y = new QValueAxis;
    y->setLabelFormat(QStringLiteral("%.3g"));
    m_yAxis = y;
    chart()->addAxis(m_yAxis, Qt::AlignLeft);
    m_metricCombo = new QComboBox;
    m_metricCombo->addItems({tr("Training loss"), tr("Validation loss"), tr("Validation accuracy")});
    m_metricCombo->setToolTip(tr("What to compare"));
    connect(m_metricCombo, &QComboBox::currentIndexChanged, this, [this](int i) { setMetric(static_cast<Metric>(i)); });
    m_xCombo = new QComboBox;
    m_xCombo->addItems({tr("Step"), tr("Samples seen"), tr("Wall time")});
    m_xCombo->setCurrentIndex(static_cast<int>(m_x));
    m_xCombo->setToolTip(
        tr("Samples seen compares runs with different target batches fairly: each step of a "
           "larger batch sees more samples"));
    connect(m_xCombo, &QComboBox::currentIndexChanged, this, [this](int i) { setXAxis(static_cast<XAxis>(i)); });
    controls()->addWidget(m_metricCombo);
    controls()->addWidget(m_xCombo);
    m_liveSeries = new QLineSeries;
    m_liveSeries->setName(tr("this run"));
    chart()->addSeries(m_liveSeries);
    m_liveSeries->attachAxis(xAxis());
    m_liveSeries->attachAxis(m_yAxis);
    xAxis()->setTitleText(axisTitle());
    m_yAxis->setTitleText(m_metricCombo->currentText().toLower());
    applyColors(colors());
}

QString CompareChart::axisTitle() const {
    switch (m_x) {
    case XAxis::Step: return tr("optimizer step");
    case XAxis::Samples: return tr("samples seen");
    case XAxis::WallTime: return tr("wall time (s)");
    }
    return {};
}

void CompareChart::handle(const core::Event& event) {
    if (const auto* m = std::get_if<core::StepMetrics>(&event)) {
        m_liveTrain.add({m->step, m->samplesSeen, m->time, m->loss});
        markDirty();
    } else if (const auto* v = std::get_if<core::ValidationDone>(&event)) {
        m_liveValLoss.add({v->step, v->samplesSeen, v->time, v->loss});
        if (v->accuracy >= 0) m_liveValAccuracy.add({v->step, v->samplesSeen, v->time, v->accuracy});
        markDirty();
    }
}

void CompareChart::clear() {
    m_liveTrain.reset();
    m_liveValLoss.reset();
    m_liveValAccuracy.reset();
    m_liveSeries->clear();
    markDirty();
}

void CompareChart::setRuns(std::vector<Run> runs) {
    m_runs = std::move(runs);
    rebuildSeries();
    setFollowLive(true);
    markDirty();
    redraw();
}

void CompareChart::rebuildSeries() {
    for (QLineSeries* s : m_series) {
        chart()->removeSeries(s);
        delete s;
    }
    m_series.clear();
    // The live run is added last, so it is drawn on top.
    chart()->removeSeries(m_liveSeries);
    for (std::size_t i = 0; i < m_runs.size(); ++i) {
        auto* s = new QLineSeries;
        s->setName(m_runs[i].name);
        s->setPointsVisible(m_metric != Metric::TrainLoss);
        chart()->addSeries(s);
        s->attachAxis(xAxis());
        s->attachAxis(m_yAxis);
        s->setPen(linePen(kRunColours[i % std::size(kRunColours)], 1.5));
        m_series.push_back(s);
    }
    chart()->addSeries(m_liveSeries);
    m_liveSeries->attachAxis(xAxis());
    m_liveSeries->attachAxis(m_yAxis);
    m_liveSeries->setPointsVisible(m_metric != Metric::TrainLoss);
    applyColors(colors());
}

void CompareChart::setMetric(Metric metric) {
    if (metric == m_metric) return;
    m_metric = metric;
    {
        const QSignalBlocker blocker(m_metricCombo);
        m_metricCombo->setCurrentIndex(static_cast<int>(metric));
    }
    m_yAxis->setTitleText(m_metricCombo->currentText().toLower());
    for (QLineSeries* s : m_series) s->setPointsVisible(metric != Metric::TrainLoss);
    m_liveSeries->setPointsVisible(metric != Metric::TrainLoss);
    setFollowLive(true);
    markDirty();
}

void CompareChart::setXAxis(XAxis axis) {
    if (axis == m_x) return;
    m_x = axis;
    {
        const QSignalBlocker blocker(m_xCombo);
        m_xCombo->setCurrentIndex(static_cast<int>(axis));
    }
    xAxis()->setTitleText(axisTitle());
    setFollowLive(true);
    markDirty();
}

const std::vector<core::CurvePoint>& CompareChart::curve(const core::RunCurves& curves) const {
    switch (m_metric) {
    case Metric::TrainLoss: return curves.trainLoss;
    case Metric::ValidationLoss: return curves.valLoss;
    case Metric::ValidationAccuracy: return curves.valAccuracy;
    }
    return curves.trainLoss;
}

std::vector<QPointF> CompareChart::points(const std::vector<core::CurvePoint>& curve) const {
    std::vector<QPointF> out;
    out.reserve(curve.size());
    for (const core::CurvePoint& p : curve) {
        const double x = m_x == XAxis::Step      ? static_cast<double>(p.step)
                         : m_x == XAxis::Samples ? static_cast<double>(p.samplesSeen)
                                                 : p.time;
        out.emplace_back(x, p.value);
    }
    return out;
}

std::vector<QPointF> CompareChart::overlayPoints(std::size_t index) const {
    return index < m_runs.size() ? points(curve(m_runs[index].curves)) : std::vector<QPointF>{};
}

std::vector<QPointF> CompareChart::livePoints() const {
    return points(curve(m_live));
}

void CompareChart::refresh(bool follow) {
    double xMin = std::numeric_limits<double>::infinity(), xMax = -xMin;
    double yMin = xMin, yMax = -xMin;
    const auto widen = [&](const std::vector<QPointF>& pts) {
        for (const QPointF& p : pts) {
            if (!std::isfinite(p.y())) continue;
            xMin = std::min(xMin, p.x());
            xMax = std::max(xMax, p.x());
            yMin = std::min(yMin, p.y());
            yMax = std::max(yMax, p.y());
        }
    };
    std::vector<std::vector<QPointF>> all;
    for (std::size_t i = 0; i < m_runs.size(); ++i) all.push_back(overlayPoints(i));
    const std::vector<QPointF> live = livePoints();
    for (const auto& pts : all) widen(pts);
    widen(live);
    if (follow) {
        setPaddedRange(xAxis(), std::isfinite(xMin) ? xMin : 0, std::isfinite(xMax) ? xMax : 1, /*fromZero=*/true);
        setPaddedRange(m_yAxis, std::isfinite(yMin) ? yMin : 0, std::isfinite(yMax) ? yMax : 1, /*fromZero=*/true);
    }
    // At most kCurvePoints per curve: drawn whole.
    for (std::size_t i = 0; i < m_series.size() && i < all.size(); ++i)
        m_series[i]->replace(QList<QPointF>(all[i].begin(), all[i].end()));
    m_liveSeries->replace(QList<QPointF>(live.begin(), live.end()));
}

void CompareChart::applyColors(const ChartColors& c) {
    m_liveSeries->setPen(linePen(c.primary, 2.5));
    for (std::size_t i = 0; i < m_series.size(); ++i)
        m_series[i]->setPen(linePen(kRunColours[i % std::size(kRunColours)], 1.5));
}

RunsPanel::RunsPanel(QWidget* parent) : QWidget(parent) {
    m_table = new QTableWidget(0, Columns);
    m_table->setObjectName(QStringLiteral("runsTable"));
    m_table->setHorizontalHeaderLabels({tr("Compare"), tr("Name"), tr("Started"), tr("Model"), tr("Data"),
                                        tr("Target batch"), tr("Steps"), tr("Best val. accuracy"),
                                        tr("Last train loss"), tr("State")});
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->verticalHeader()->hide();
    m_table->setWordWrap(false);
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(Name, QHeaderView::Stretch);
    m_table->setSortingEnabled(true);
    m_table->setToolTip(
        tr("Every run recorded under the runs folder; tick runs to draw them next to this one, "
           "click a column title to sort"));
    connect(m_table, &QTableWidget::itemChanged, this, [this](QTableWidgetItem* item) {
        if (!m_filling && item->column() == Compare) updateChart();
    });

    auto* refreshButton = new QPushButton(tr("Refresh"));
    auto* renameButton = new QPushButton(tr("Rename…"));
    auto* deleteButton = new QPushButton(tr("Delete…"));
    connect(refreshButton, &QPushButton::clicked, this, &RunsPanel::refresh);
    connect(renameButton, &QPushButton::clicked, this, [this] {
        const QString folder = selectedFolder();
        if (folder.isEmpty()) return;
        const int row = rowOf(folder);
        bool ok = false;
        const QString name = QInputDialog::getText(this, tr("Rename run"), tr("Name:"), QLineEdit::Normal,
                                                   m_table->item(row, Name)->text(), &ok);
        if (ok && !renameRun(folder, name)) QMessageBox::warning(this, tr("Rename run"), m_error);
    });
    connect(deleteButton, &QPushButton::clicked, this, [this] {
        const QString folder = selectedFolder();
        if (folder.isEmpty()) return;
        if (QMessageBox::question(this, tr("Delete run"),
                                  tr("Delete the run folder %1 and everything in it?").arg(folder)) != QMessageBox::Yes)
            return;
        if (!deleteRun(folder)) QMessageBox::warning(this, tr("Delete run"), m_error);
    });
    m_status = new QLabel;
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    auto* buttons = new QHBoxLayout;
    buttons->addWidget(refreshButton);
    buttons->addWidget(renameButton);
    buttons->addWidget(deleteButton);
    buttons->addWidget(m_status, 1);

    m_chart = new CompareChart;
    auto* top = new QWidget;
    auto* topLayout = new QVBoxLayout(top);
    topLayout->setContentsMargins(0, 0, 0, 0);
    topLayout->addLayout(buttons);
    topLayout->addWidget(m_table);
    auto* split = new QSplitter(Qt::Vertical);
    split->addWidget(top);
    split->addWidget(m_chart);
    split->setStretchFactor(1, 2);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->addWidget(split);
}

void RunsPanel::setRunsDirectory(const QString& directory) {
    m_runsDirectory = directory;
    refresh();
}

void RunsPanel::refresh() {
    QStringList ticked;
    for (int row = 0; row < m_table->rowCount(); ++row)
        if (m_table->item(row, Compare)->checkState() == Qt::Checked)
            ticked << m_table->item(row, Compare)->data(Qt::UserRole).toString();
    const std::string dir = m_runsDirectory.isEmpty() ? core::defaultRunsDirectory() : m_runsDirectory.toStdString();
    const std::vector<core::RunListing> runs = core::listRuns(dir);
    m_curves.clear();  // a run listed as running may have finished since
    m_filling = true;
    m_table->setSortingEnabled(false);
    m_table->setRowCount(static_cast<int>(runs.size()));
    for (int row = 0; row < static_cast<int>(runs.size()); ++row) {
        const core::RunListing& run = runs[static_cast<std::size_t>(row)];
        const QString folder = QString::fromStdString(run.folder);
        auto* tick = new QTableWidgetItem;
        tick->setFlags(Qt::ItemIsUserCheckable | Qt::ItemIsEnabled | Qt::ItemIsSelectable);
        tick->setCheckState(ticked.contains(folder) ? Qt::Checked : Qt::Unchecked);
        tick->setData(Qt::UserRole, folder);
        tick->setToolTip(folder);
        m_table->setItem(row, Compare, tick);
        m_table->setItem(row, Name, new QTableWidgetItem(text(run.summary, "name")));
        m_table->setItem(
            row, Started,
            new QTableWidgetItem(text(run.summary, "started").left(19).replace(QLatin1Char('T'), QLatin1Char(' '))));
        m_table->setItem(row, Model, new QTableWidgetItem(text(run.summary, "model")));
        m_table->setItem(row, Data, new QTableWidgetItem(text(run.summary, "dataset")));
        const double target = number(run.summary, "target_batch");
        m_table->setItem(row, Target, numberItem(target, QString::number(target, 'f', 0)));
        const double steps = number(run.summary, "steps");
        m_table->setItem(row, Steps, numberItem(steps, QString::number(steps, 'f', 0)));
        const double accuracy = summaryMetric(run.summary, "val_accuracy", "best");
        m_table->setItem(row, BestAccuracy,
                         numberItem(accuracy, QString::number(100.0 * accuracy, 'f', 1) + QLatin1Char('%')));
        const double loss = summaryMetric(run.summary, "train_loss", "last");
        m_table->setItem(row, LastLoss, numberItem(loss, QString::number(loss, 'g', 4)));
        m_table->setItem(row, State, new QTableWidgetItem(text(run.summary, "state")));
    }
    m_table->setSortingEnabled(true);
    m_filling = false;
    m_status->setText(tr("%n run(s) in %1", nullptr, static_cast<int>(runs.size())).arg(QString::fromStdString(dir)));
    updateChart();
}

int RunsPanel::rowOf(const QString& folder) const {
    for (int row = 0; row < m_table->rowCount(); ++row)
        if (m_table->item(row, Compare)->data(Qt::UserRole).toString() == folder) return row;
    return -1;
}

QStringList RunsPanel::folders() const {
    QStringList out;
    for (int row = 0; row < m_table->rowCount(); ++row)
        out << m_table->item(row, Compare)->data(Qt::UserRole).toString();
    return out;
}

QString RunsPanel::selectedFolder() const {
    const auto rows = m_table->selectionModel()->selectedRows();
    return rows.isEmpty() ? QString() : m_table->item(rows.front().row(), Compare)->data(Qt::UserRole).toString();
}

void RunsPanel::setCompared(const QString& folder, bool on) {
    const int row = rowOf(folder);
    if (row >= 0) m_table->item(row, Compare)->setCheckState(on ? Qt::Checked : Qt::Unchecked);
}

bool RunsPanel::renameRun(const QString& folder, const QString& name) {
    if (!m_liveFolder.isEmpty() && folder == m_liveFolder) {
        m_error = tr("the run in %1 is still running: rename it when it has ended").arg(folder);
        return false;
    }
    if (auto renamed = core::renameRun(folder.toStdString(), name.trimmed().toStdString()); !renamed) {
        m_error = QString::fromStdString(renamed.error());
        return false;
    }
    m_error.clear();
    refresh();
    return true;
}

bool RunsPanel::deleteRun(const QString& folder) {
    if (!m_liveFolder.isEmpty() && folder == m_liveFolder) {
        m_error = tr("the run in %1 is still running: stop it first").arg(folder);
        return false;
    }
    if (auto deleted = core::deleteRun(folder.toStdString()); !deleted) {
        m_error = QString::fromStdString(deleted.error());
        return false;
    }
    m_error.clear();
    refresh();
    return true;
}

void RunsPanel::updateChart() {
    std::vector<CompareChart::Run> runs;
    QStringList problems;
    for (int row = 0; row < m_table->rowCount(); ++row) {
        QTableWidgetItem* tick = m_table->item(row, Compare);
        if (tick->checkState() != Qt::Checked) continue;
        const std::string folder = tick->data(Qt::UserRole).toString().toStdString();
        auto cached = m_curves.find(folder);
        if (cached == m_curves.end()) {
            auto curves = core::readRunCurves(folder, CompareChart::kCurvePoints);
            if (!curves) {
                problems << QString::fromStdString(curves.error());
                continue;
            }
            cached = m_curves.emplace(folder, std::move(*curves)).first;
        }
        runs.push_back({m_table->item(row, Name)->text(), cached->second});
    }
    if (!problems.isEmpty()) m_status->setText(problems.join(QStringLiteral("; ")));
    m_chart->setRuns(std::move(runs));
}

}  // namespace batchpilot::ui
