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
        c.ranks = {QColor(0x4d, 0xb6, 0xac), QColor(0xf0, 0x62, 0x92), QColor(0xd4, 0xe1, 0x57),
                   QColor(0x9f, 0xa8, 0xda), QColor(0xbc, 0xaa, 0xa4), QColor(0x4d, 0xd0, 0xe1)};
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
        c.ranks = {QColor(0x00, 0x89, 0x7b), QColor(0xc2, 0x18, 0x5b), QColor(0x82, 0x77, 0x17),
                   QColor(0x3f, 0x51, 0xb5), QColor(0x6d, 0x4c, 0x41), QColor(0x00, 0x83, 0x8f)};
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

void TrialMarkers::applyRankColors(const ChartColors& c, int rank) const {
    for (const auto& [series, color] : {std::pair{fits, c.fit}, std::pair{tight, c.tight}, std::pair{ooms, c.oom}}) {
        series->setColor(c.rank(rank));
        QPen border(color, 2.0);
        series->setPen(border);
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
