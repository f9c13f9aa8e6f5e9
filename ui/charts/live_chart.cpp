#include "ui/charts/live_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <QChart>
#include <QChartView>
#include <QCursor>
#include <QFileDialog>
#include <QGraphicsLayout>
#include <QHBoxLayout>
#include <QMenu>
#include <QMouseEvent>
#include <QToolButton>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>
#include <QWheelEvent>
#include <QXYSeries>

#include "ui/charts/series_store.h"
#include "ui/charts/thinning.h"

namespace batchpilot::ui {

/// QChartView whose rubber-band zoom, wheel zoom and pan pause "follow live", whose double click
/// brings following back, and whose right click opens the chart's menu.
class ZoomableChartView : public QChartView {
public:
    ZoomableChartView(QChart* chart, LiveChart* owner) : QChartView(chart), m_owner(owner) {
        setRenderHint(QPainter::Antialiasing);
        setRubberBand(QChartView::RectangleRubberBand);
        setMouseTracking(true);
        setMinimumSize(200, 150);
    }

protected:
    void mousePressEvent(QMouseEvent* event) override {
        const bool pan = event->button() == Qt::MiddleButton ||
                         (event->button() == Qt::LeftButton && (event->modifiers() & Qt::ShiftModifier));
        if (pan) {
            m_panning = true;
            m_panFrom = event->position();
            setCursor(Qt::ClosedHandCursor);
            event->accept();
            return;
        }
        QChartView::mousePressEvent(event);
    }

    void mouseMoveEvent(QMouseEvent* event) override {
        if (m_panning) {
            const QPointF delta = event->position() - m_panFrom;
            m_panFrom = event->position();
            chart()->scroll(-delta.x(), delta.y());
            m_owner->userZoomed();
            event->accept();
            return;
        }
        QChartView::mouseMoveEvent(event);
    }

    void mouseDoubleClickEvent(QMouseEvent* event) override {
        event->accept();
        m_owner->setFollowLive(true);
    }

    void mouseReleaseEvent(QMouseEvent* event) override {
        if (m_panning) {
            m_panning = false;
            unsetCursor();
            event->accept();
            return;
        }
        if (event->button() == Qt::RightButton) {
            // QChartView would zoom out one step; the menu (follow live, export) is more useful.
            event->accept();
            QMenu* menu = m_owner->createContextMenu(this);
            menu->setAttribute(Qt::WA_DeleteOnClose);
            menu->popup(event->globalPosition().toPoint());
            return;
        }
        const auto before = std::pair(m_owner->xAxis()->min(), m_owner->xAxis()->max());
        QChartView::mouseReleaseEvent(event);
        if (before != std::pair(m_owner->xAxis()->min(), m_owner->xAxis()->max())) m_owner->userZoomed();
    }

    void wheelEvent(QWheelEvent* event) override {
        const double factor = event->angleDelta().y() > 0 ? 1.25 : 0.8;
        chart()->zoom(factor);
        m_owner->userZoomed();
        event->accept();
    }

private:
    LiveChart* m_owner;
    bool m_panning = false;
    QPointF m_panFrom;
};

LiveChart::LiveChart(const QString& title, QWidget* parent) : QWidget(parent), m_title(title) {
    m_chart = new QChart;
    m_chart->setTitle(title);
    m_chart->setMargins(QMargins(4, 2, 4, 2));
    m_chart->layout()->setContentsMargins(0, 0, 0, 0);
    m_chart->setBackgroundRoundness(0);
    m_chart->legend()->setAlignment(Qt::AlignBottom);
    m_chart->setAnimationOptions(QChart::NoAnimation);
    QFont titleFont = m_chart->titleFont();
    titleFont.setBold(true);
    m_chart->setTitleFont(titleFont);

    m_xAxis = new QValueAxis;
    m_xAxis->setLabelFormat(QStringLiteral("%g"));
    m_chart->addAxis(m_xAxis, Qt::AlignBottom);

    m_view = new ZoomableChartView(m_chart, this);

    m_controls = new QHBoxLayout;
    m_controls->setContentsMargins(4, 0, 4, 0);
    m_controls->setSpacing(6);

    auto* tools = new QHBoxLayout;
    tools->setContentsMargins(0, 0, 0, 0);
    tools->addLayout(m_controls);
    tools->addStretch(1);

    m_followButton = new QToolButton;
    m_followButton->setText(tr("Follow live"));
    m_followButton->setCheckable(true);
    m_followButton->setChecked(true);
    m_followButton->setToolTip(
        tr("Keep the whole run in view as data arrives. Zooming (drag a rectangle or use the "
           "wheel) or panning (drag with the middle button, or with Shift) pauses following while "
           "data keeps arriving; double-click the chart, press this button or choose Follow live "
           "in its right-click menu to resume. The wall-time charts zoom together."));
    m_followButton->setAutoRaise(true);
    connect(m_followButton, &QToolButton::toggled, this, &LiveChart::setFollowLive);
    tools->addWidget(m_followButton);

    auto* exportButton = new QToolButton;
    exportButton->setText(tr("Export PNG…"));
    exportButton->setToolTip(tr("Save this chart as a PNG image"));
    exportButton->setAutoRaise(true);
    connect(exportButton, &QToolButton::clicked, this, &LiveChart::askForPng);
    tools->addWidget(exportButton);

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(0);
    layout->addLayout(tools);
    layout->addWidget(m_view, 1);

    m_colors = ChartColors::forTheme(false);
}

LiveChart::~LiveChart() = default;

void LiveChart::redraw() {
    if (!m_dirty) return;
    m_dirty = false;
    refresh(m_followLive);
}

void LiveChart::setFollowLive(bool follow) {
    if (follow == m_followLive) return;
    m_followLive = follow;
    {
        const QSignalBlocker blocker(m_followButton);
        m_followButton->setChecked(follow);
    }
    m_dirty = true;
    Q_EMIT followLiveChanged(follow);
}

void LiveChart::userZoomed() {
    setFollowLive(false);
    m_dirty = true;  // re-thin to the new range
    redraw();
    Q_EMIT xRangeChosen(m_xAxis->min(), m_xAxis->max());
}

void LiveChart::showXRange(double x0, double x1) {
    if (!(x0 < x1)) return;
    setFollowLive(false);
    m_xAxis->setRange(x0, x1);
    m_dirty = true;
    redraw();
}

void LiveChart::zoomTo(const QRectF& valueRect) {
    setFollowLive(false);
    m_xAxis->setRange(valueRect.left(), valueRect.right());
    const auto vertical = m_chart->axes(Qt::Vertical);
    if (!vertical.isEmpty()) vertical.first()->setRange(valueRect.top(), valueRect.bottom());
    m_dirty = true;
    redraw();
}

QString LiveChart::fileStem() const {
    return m_title.toLower().replace(QLatin1Char(' '), QLatin1Char('_'));
}

void LiveChart::askForPng() {
    const QString path = QFileDialog::getSaveFileName(this, tr("Export chart"), fileStem() + QStringLiteral(".png"),
                                                      tr("PNG images (*.png)"));
    if (!path.isEmpty()) exportPng(path);
}

QMenu* LiveChart::createContextMenu(QWidget* parent) {
    auto* menu = new QMenu(parent);
    QAction* follow = menu->addAction(tr("Follow live"), this, [this] { setFollowLive(true); });
    follow->setCheckable(true);
    follow->setChecked(m_followLive);
    follow->setObjectName(QStringLiteral("followLiveAction"));
    menu->addSeparator();
    const QStringList series = dataSeries();
    if (!series.isEmpty()) {
        QAction* data = menu->addAction(tr("Export data as CSV…"), this, [this, series] {
            Q_EMIT exportDataRequested(series, fileStem() + QStringLiteral(".csv"));
        });
        data->setObjectName(QStringLiteral("exportDataAction"));
        data->setToolTip(tr("This chart's series from the run's events: %1").arg(series.join(QStringLiteral(", "))));
    }
    menu->addAction(tr("Export PNG…"), this, &LiveChart::askForPng)->setObjectName(QStringLiteral("exportPngAction"));
    return menu;
}

bool LiveChart::exportPng(const QString& path) {
    redraw();
    return m_view->grab().save(path, "PNG");
}

void LiveChart::setDarkTheme(bool dark) {
    m_chart->setTheme(dark ? QChart::ChartThemeDark : QChart::ChartThemeLight);
    m_chart->setBackgroundRoundness(0);
    QFont titleFont = m_chart->titleFont();
    titleFont.setBold(true);
    m_chart->setTitleFont(titleFont);
    m_colors = ChartColors::forTheme(dark);
    // The theme resets series pens: apply ours again.
    applyColors(m_colors);
    m_dirty = true;
}

int LiveChart::plotColumns() const {
    return std::max(100, static_cast<int>(m_chart->plotArea().width()));
}

void LiveChart::replaceThinned(QXYSeries* series, const SeriesStore& store, double xMin, double xMax, int columns,
                               double* yMin, double* yMax, double (*transform)(double)) {
    const auto& points = store.points();
    std::vector<QPointF> thinned = thinMinMax(points, xMin, xMax, columns);
    if (transform)
        for (QPointF& p : thinned) p.setY(transform(p.y()));
    if (yMin && yMax) {
        for (const QPointF& p : thinned) {
            if (p.x() < xMin || p.x() > xMax || !std::isfinite(p.y())) continue;
            *yMin = std::min(*yMin, p.y());
            *yMax = std::max(*yMax, p.y());
        }
    }
    series->replace(QList<QPointF>(thinned.begin(), thinned.end()));
}

void LiveChart::setPaddedRange(QAbstractAxis* axis, double lo, double hi, bool fromZero) {
    if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi)) {
        lo = 0;
        hi = 1;
    }
    if (fromZero) lo = std::min(lo, 0.0);
    double span = hi - lo;
    if (span <= 0) span = std::max(std::abs(hi), 1.0);
    const double pad = span * 0.04;
    axis->setRange(fromZero && lo >= 0 ? lo : lo - pad, hi + pad);
    // Round ticks (0, 250, 500 …) instead of the raw data range's odd values.
    if (auto* value = qobject_cast<QValueAxis*>(axis)) {
        value->setTickCount(5);
        value->applyNiceNumbers();
    }
}

void LiveChart::showTipsFor(QXYSeries* series, std::function<QString(const QPointF&)> format) {
    connect(series, &QXYSeries::hovered, this, [this, format = std::move(format)](const QPointF& point, bool state) {
        if (state)
            QToolTip::showText(QCursor::pos(), format(point), m_view);
        else
            QToolTip::hideText();
    });
}

}  // namespace batchpilot::ui
