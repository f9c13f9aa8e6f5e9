#include "ui/charts/throughput_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QLineSeries>
#include <QValueAxis>

namespace batchpilot::ui {

namespace {

double perThousand(double y) {
    return y / 1000.0;
}

}  // namespace

ThroughputChart::ThroughputChart(QWidget* parent) : LiveChart(tr("Throughput and plan"), parent) {
    m_rateAxis = new QValueAxis;
    m_rateAxis->setTitleText(tr("samples / s"));
    m_rateAxis->setLabelFormat(QStringLiteral("%.0f"));
    m_planAxis = new QValueAxis;
    // Short titles: Qt elides an axis title longer than the plot is high.
    m_planAxis->setTitleText(tr("size"));  // the micro-batch line's axis, in its colour
    m_planAxis->setLabelFormat(QStringLiteral("%.0f"));
    m_stepsAxis = new QValueAxis;
    m_stepsAxis->setTitleText(tr("steps"));
    m_stepsAxis->setLabelFormat(QStringLiteral("%.0f"));
    chart()->addAxis(m_rateAxis, Qt::AlignLeft);
    chart()->addAxis(m_planAxis, Qt::AlignRight);
    chart()->addAxis(m_stepsAxis, Qt::AlignRight);
    xAxis()->setTitleText(tr("wall time (s)"));

    m_throughputSeries = new QLineSeries;
    m_throughputSeries->setName(tr("samples/s"));
    m_microBatchSeries = new QLineSeries;
    m_microBatchSeries->setName(tr("micro-batch"));
    m_accumulationSeries = new QLineSeries;
    m_accumulationSeries->setName(tr("accumulation"));
    chart()->addSeries(m_throughputSeries);
    chart()->addSeries(m_microBatchSeries);
    chart()->addSeries(m_accumulationSeries);
    m_throughputSeries->attachAxis(xAxis());
    m_throughputSeries->attachAxis(m_rateAxis);
    m_microBatchSeries->attachAxis(xAxis());
    m_microBatchSeries->attachAxis(m_planAxis);
    m_accumulationSeries->attachAxis(xAxis());
    m_accumulationSeries->attachAxis(m_stepsAxis);
    showTipsFor(m_throughputSeries, [this](const QPointF& p) {
        return tr("%1 samples/s at %2 s").arg(p.y() * m_rateUnit, 0, 'f', 0).arg(p.x(), 0, 'f', 1);
    });
    showTipsFor(m_microBatchSeries, [](const QPointF& p) {
        return tr("micro-batch %1 at %2 s").arg(std::llround(p.y())).arg(p.x(), 0, 'f', 1);
    });
    showTipsFor(m_accumulationSeries, [](const QPointF& p) {
        return tr("%1 accumulation steps at %2 s").arg(std::llround(p.y())).arg(p.x(), 0, 'f', 1);
    });
    applyColors(colors());
}

void ThroughputChart::handle(const core::Event& event) {
    const auto* metrics = std::get_if<core::StepMetrics>(&event);
    if (!metrics) return;
    m_throughput.append(metrics->time, metrics->samplesPerSecond);
    m_microBatch.append(metrics->time, static_cast<double>(metrics->microBatch));
    m_accumulation.append(metrics->time, static_cast<double>(metrics->accumulationSteps));
    markDirty();
}

void ThroughputChart::clear() {
    m_throughput.clear();
    m_rateUnit = 1;
    m_rateAxis->setLabelFormat(QStringLiteral("%.0f"));
    m_microBatch.clear();
    m_accumulation.clear();
    m_throughputSeries->clear();
    m_microBatchSeries->clear();
    m_accumulationSeries->clear();
    markDirty();
}

void ThroughputChart::refresh(bool follow) {
    double x0 = xAxis()->min();
    double x1 = xAxis()->max();
    if (follow) {
        setPaddedRange(xAxis(), 0, m_throughput.isEmpty() ? 1 : m_throughput.maxX(),
                       /*fromZero=*/true);
        x0 = xAxis()->min();
        x1 = xAxis()->max();
    }
    const int columns = plotColumns();
    double rateMin = 0;
    double rateMax = -std::numeric_limits<double>::infinity();
    double planMin = 0;
    double planMax = -std::numeric_limits<double>::infinity();
    double stepsMin = 0;
    double stepsMax = -std::numeric_limits<double>::infinity();
    if (follow) {
        // The unit follows the whole run's largest rate, so that it does not change while zoomed.
        const double unit = !m_throughput.isEmpty() && m_throughput.maxY() >= 1000 ? 1000 : 1;
        if (unit != m_rateUnit) {
            m_rateUnit = unit;
            m_rateAxis->setLabelFormat(unit > 1 ? QStringLiteral("%.0fk") : QStringLiteral("%.0f"));
        }
    }
    replaceThinned(m_throughputSeries, m_throughput, x0, x1, columns, &rateMin, &rateMax,
                   m_rateUnit > 1 ? &perThousand : nullptr);
    replaceThinned(m_microBatchSeries, m_microBatch, x0, x1, columns, &planMin, &planMax);
    replaceThinned(m_accumulationSeries, m_accumulation, x0, x1, columns, &stepsMin, &stepsMax);
    if (follow) {
        setPaddedRange(m_rateAxis, 0, std::isfinite(rateMax) ? rateMax : 1, /*fromZero=*/true);
        if (m_rateUnit > 1) {
            // Ticks on whole thousands (1, 2, 5, 10, 20, 50 … k), at most five intervals.
            const double top = 1.04 * rateMax;
            double step = 1;
            for (double scale = 1; top / step > 5; scale *= 10) {
                for (double factor : {1.0, 2.0, 5.0}) {
                    step = factor * scale;
                    if (top / step <= 5) break;
                }
            }
            const int intervals = std::max(1, static_cast<int>(std::ceil(top / step - 1e-9)));
            m_rateAxis->setRange(0, intervals * step);
            m_rateAxis->setTickCount(intervals + 1);
        }
        setPaddedRange(m_planAxis, 0, std::isfinite(planMax) ? planMax : 1, /*fromZero=*/true);
        setPaddedRange(m_stepsAxis, 0, std::isfinite(stepsMax) ? std::max(stepsMax, 1.0) : 1, /*fromZero=*/true);
    }
}

void ThroughputChart::applyColors(const ChartColors& c) {
    m_throughputSeries->setPen(linePen(c.primary, 2.0));
    m_microBatchSeries->setPen(linePen(c.secondary, 1.5));
    m_accumulationSeries->setPen(linePen(c.tertiary, 1.5, Qt::DashLine));
    m_rateAxis->setLabelFormat(m_rateUnit > 1 ? QStringLiteral("%.0fk") : QStringLiteral("%.0f"));
    m_planAxis->setLabelFormat(QStringLiteral("%.0f"));
    m_stepsAxis->setLabelFormat(QStringLiteral("%.0f"));
    // Each right axis in its line's colour, so that which line reads on which axis is plain.
    m_planAxis->setLinePenColor(c.secondary);
    m_planAxis->setLabelsColor(c.secondary);
    m_stepsAxis->setLinePenColor(c.tertiary);
    m_stepsAxis->setLabelsColor(c.tertiary);
}

}  // namespace batchpilot::ui
