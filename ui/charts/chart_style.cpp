#include "ui/charts/chart_style.h"

#include <utility>

#include <QCoreApplication>
#include <QScatterSeries>

namespace batchpilot::ui {

ChartColors ChartColors::forTheme(bool dark) {
    ChartColors c;
    if (dark) {
        c.primary = QColor(0x4f, 0xa3, 0xf7);
        c.secondary = QColor(0xf2, 0xa3, 0x3a);
        c.tertiary = QColor(0xb3, 0x8c, 0xf2);
        c.faint = QColor(0x4f, 0xa3, 0xf7, 90);
        c.fit = QColor(0x4c, 0xd1, 0x7a);
        c.tight = QColor(0xf2, 0xc9, 0x4c);
        c.oom = QColor(0xff, 0x5c, 0x5c);
        c.limit = QColor(0xe0, 0xe0, 0xe0);
        c.headroom = QColor(0xa0, 0xa0, 0xa0);
        c.chosen = QColor(0x4f, 0xa3, 0xf7);
    } else {
        c.primary = QColor(0x1f, 0x5f, 0xbf);
        c.secondary = QColor(0xd9, 0x73, 0x06);
        c.tertiary = QColor(0x7b, 0x3f, 0xc4);
        c.faint = QColor(0x1f, 0x5f, 0xbf, 70);
        c.fit = QColor(0x1b, 0x9e, 0x4b);
        c.tight = QColor(0xc9, 0x8a, 0x00);
        c.oom = QColor(0xd6, 0x27, 0x28);
        c.limit = QColor(0x30, 0x30, 0x30);
        c.headroom = QColor(0x80, 0x80, 0x80);
        c.chosen = QColor(0x1f, 0x5f, 0xbf);
    }
    return c;
}

QPen linePen(const QColor& color, qreal width, Qt::PenStyle style) {
    QPen pen(color);
    pen.setWidthF(width);
    pen.setStyle(style);
    return pen;
}

void TrialMarkers::applyColors(const ChartColors& c) const {
    for (const auto& [series, color] : {std::pair{fits, c.fit}, std::pair{tight, c.tight}, std::pair{ooms, c.oom}}) {
        series->setColor(color);
        series->setBorderColor(color.darker(130));
    }
}

TrialMarkers TrialMarkers::create() {
    const auto marker = [](const QString& name, QScatterSeries::MarkerShape shape, qreal size) {
        auto* series = new QScatterSeries;
        series->setName(name);
        series->setMarkerShape(shape);
        series->setMarkerSize(size);
        return series;
    };
    return {
        marker(QCoreApplication::translate("TrialMarkers", "fit"), QScatterSeries::MarkerShapeCircle, 9),
        marker(QCoreApplication::translate("TrialMarkers", "past headroom"), QScatterSeries::MarkerShapeTriangle, 10),
        marker(QCoreApplication::translate("TrialMarkers", "OOM"), QScatterSeries::MarkerShapeRectangle, 9)};
}

}  // namespace batchpilot::ui
