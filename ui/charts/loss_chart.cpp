#include "ui/charts/loss_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineSeries>
#include <QSlider>
#include <QValueAxis>

namespace batchpilot::ui {

LossChart::LossChart(QWidget* parent) : LiveChart(tr("Loss per optimizer step"), parent) {
    m_rawSeries = new QLineSeries;
    m_rawSeries->setName(tr("raw"));
    m_smoothSeries = new QLineSeries;
    m_smoothSeries->setName(tr("smoothed"));
    m_validationSeries = new QLineSeries;
    m_validationSeries->setName(tr("validation"));
    m_validationSeries->setPointsVisible(true);
    chart()->addSeries(m_rawSeries);
    chart()->addSeries(m_smoothSeries);
    chart()->addSeries(m_validationSeries);
    m_rawSeries->attachAxis(xAxis());
    m_smoothSeries->attachAxis(xAxis());
    m_validationSeries->attachAxis(xAxis());
    xAxis()->setTitleText(xTitle());
    setLogScale(false);

    m_xCombo = new QComboBox;
    m_xCombo->addItem(tr("Step"));
    m_xCombo->addItem(tr("Samples seen"));
    m_xCombo->addItem(tr("Wall time"));
    m_xCombo->setToolTip(tr("Quantity on the x axis"));
    connect(m_xCombo, &QComboBox::currentIndexChanged, this,
            [this](int index) { setXAxis(static_cast<XAxis>(index)); });

    m_slider = new QSlider(Qt::Horizontal);
    m_slider->setRange(0, 99);
    m_slider->setValue(90);
    m_slider->setFixedWidth(90);
    m_slider->setToolTip(
        tr("Smoothing of the bold line (debiased exponential moving average). "
           "0 shows the raw loss."));
    m_sliderLabel = new QLabel;
    connect(m_slider, &QSlider::valueChanged, this, [this](int value) { setSmoothing(value / 100.0); });

    m_logBox = new QCheckBox(tr("Log"));
    m_logBox->setToolTip(tr("Logarithmic loss axis"));
    connect(m_logBox, &QCheckBox::toggled, this, &LossChart::setLogScale);

    controls()->addWidget(m_xCombo);
    controls()->addWidget(new QLabel(tr("Smoothing")));
    controls()->addWidget(m_slider);
    controls()->addWidget(m_sliderLabel);
    controls()->addWidget(m_logBox);
    m_sliderLabel->setText(QString::number(m_smoothing, 'f', 2));

    showTipsFor(m_rawSeries, [this](const QPointF& p) {
        const double loss = m_log ? std::pow(10.0, p.y()) : p.y();
        return tr("%1 %2\nloss %3").arg(xTitle()).arg(p.x(), 0, 'g', 6).arg(loss, 0, 'g', 4);
    });
    showTipsFor(m_smoothSeries, [this](const QPointF& p) {
        const double loss = m_log ? std::pow(10.0, p.y()) : p.y();
        return tr("%1 %2\nsmoothed loss %3").arg(xTitle()).arg(p.x(), 0, 'g', 6).arg(loss, 0, 'g', 4);
    });
    showTipsFor(m_validationSeries, [this](const QPointF& p) {
        // The validation nearest to the point (there are few).
        const SeriesStore& store = validationStore();
        const auto& points = store.points();
        size_t best = 0;
        for (size_t i = 1; i < points.size(); ++i)
            if (std::abs(points[i].x() - p.x()) < std::abs(points[best].x() - p.x())) best = i;
        if (best >= m_validations.size()) return QString();
        const core::ValidationDone& v = m_validations[best];
        QString text = tr("validation after step %1\nloss %2").arg(v.step).arg(v.loss, 0, 'g', 4);
        if (v.accuracy >= 0) text += tr("\naccuracy %1%").arg(100.0 * v.accuracy, 0, 'f', 1);
        if (v.top5Accuracy >= 0) text += tr("\ntop-5 %1%").arg(100.0 * v.top5Accuracy, 0, 'f', 1);
        if (v.meanAbsoluteError >= 0) text += tr("\nMAE %1").arg(v.meanAbsoluteError, 0, 'g', 4);
        return text;
    });
    applyColors(colors());
}

QString LossChart::xTitle() const {
    switch (m_xKind) {
    case XAxis::Step: return tr("optimizer step");
    case XAxis::Samples: return tr("samples seen");
    case XAxis::WallTime: return tr("wall time (s)");
    }
    return {};
}

void LossChart::handle(const core::Event& event) {
    if (const auto* v = std::get_if<core::ValidationDone>(&event)) {
        m_validation[0].append(static_cast<double>(v->step), v->loss);
        m_validation[1].append(static_cast<double>(v->samplesSeen), v->loss);
        m_validation[2].append(v->time, v->loss);
        m_validations.push_back(*v);
        markDirty();
        return;
    }
    const auto* metrics = std::get_if<core::StepMetrics>(&event);
    if (!metrics) return;
    m_raw[0].append(static_cast<double>(metrics->step), metrics->loss);
    m_raw[1].append(static_cast<double>(metrics->samplesSeen), metrics->loss);
    m_raw[2].append(metrics->time, metrics->loss);
    const QPointF p = rawStore().last();
    m_smoothed.append(p.x(), m_ema.add(p.x(), p.y()));
    markDirty();
}

void LossChart::clear() {
    for (auto& store : m_raw) store.clear();
    for (auto& store : m_validation) store.clear();
    m_validations.clear();
    m_validationSeries->clear();
    m_smoothed.clear();
    m_ema.reset();
    m_rawSeries->clear();
    m_smoothSeries->clear();
    markDirty();
}

void LossChart::rebuildSmoothed() {
    // Smooth the raw (full-resolution) history, never the thinned points that are drawn.
    m_ema.setSmoothing(m_smoothing);
    m_smoothed.clear();
    for (const QPointF& p : rawStore().points()) m_smoothed.append(p.x(), m_ema.add(p.x(), p.y()));
    markDirty();
}

void LossChart::setXAxis(XAxis axis) {
    if (axis == m_xKind) return;
    m_xKind = axis;
    {
        const QSignalBlocker blocker(m_xCombo);
        m_xCombo->setCurrentIndex(static_cast<int>(axis));
    }
    xAxis()->setTitleText(xTitle());
    rebuildSmoothed();
    setFollowLive(true);
}

void LossChart::setSmoothing(double smoothing) {
    smoothing = std::clamp(smoothing, 0.0, 0.99);
    if (smoothing == m_smoothing) return;
    m_smoothing = smoothing;
    {
        const QSignalBlocker blocker(m_slider);
        m_slider->setValue(static_cast<int>(std::lround(smoothing * 100)));
    }
    m_sliderLabel->setText(QString::number(m_smoothing, 'f', 2));
    rebuildSmoothed();
}

void LossChart::setLogScale(bool on) {
    if (m_yAxis && on == m_log) return;
    m_log = on;
    if (m_logBox) {
        const QSignalBlocker blocker(m_logBox);
        m_logBox->setChecked(on);
    }
    // Log scale draws log10(loss) on a plain value axis: Qt 6.4's QLogValueAxis elides its labels
    // to "…" once its range changes after the chart is shown.
    if (!m_yAxis) {
        auto* axis = new QValueAxis;
        m_yAxis = axis;
        chart()->addAxis(m_yAxis, Qt::AlignLeft);
        m_rawSeries->attachAxis(m_yAxis);
        m_smoothSeries->attachAxis(m_yAxis);
        m_validationSeries->attachAxis(m_yAxis);
    }
    m_yAxis->setTitleText(on ? tr("log₁₀ loss") : tr("loss"));
    setFollowLive(true);
    markDirty();
    redraw();
}

void LossChart::refresh(bool follow) {
    const SeriesStore& raw = rawStore();
    double x0 = xAxis()->min();
    double x1 = xAxis()->max();
    if (follow) {
        x0 = raw.isEmpty() ? 0 : raw.minX();
        x1 = raw.isEmpty() ? 1 : raw.maxX();
        setPaddedRange(xAxis(), x0, x1, /*fromZero=*/true);
        x0 = xAxis()->min();
        x1 = xAxis()->max();
    }
    double yMin = std::numeric_limits<double>::infinity();
    double yMax = -yMin;
    const int columns = plotColumns();
    const auto log10 = [](double y) { return std::log10(std::max(y, 1e-12)); };
    double (*transform)(double) = m_log ? +log10 : nullptr;
    replaceThinned(m_rawSeries, raw, x0, x1, columns, &yMin, &yMax, transform);
    replaceThinned(m_smoothSeries, m_smoothed, x0, x1, columns, nullptr, nullptr, transform);
    replaceThinned(m_validationSeries, validationStore(), x0, x1, columns, &yMin, &yMax, transform);
    if (follow && !raw.isEmpty()) setPaddedRange(m_yAxis, yMin, yMax, /*fromZero=*/!m_log);
}

int LossChart::drawnPointCount() const {
    return static_cast<int>(m_rawSeries->count());
}

void LossChart::applyColors(const ChartColors& c) {
    m_rawSeries->setPen(linePen(c.faint, 1.0));
    m_smoothSeries->setPen(linePen(c.primary, 2.0));
    m_validationSeries->setPen(linePen(c.secondary, 1.5, Qt::DashLine));
    m_validationSeries->setColor(c.secondary);
    if (auto* axis = qobject_cast<QValueAxis*>(m_yAxis))
        axis->setLabelFormat(QStringLiteral("%.3g"));  // also fine for log10 values
}

}  // namespace batchpilot::ui
