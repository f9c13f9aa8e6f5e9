#pragma once

#include <QColor>
#include <QPen>

class QScatterSeries;

namespace batchpilot::ui {

/// Colours shared by the charts, picked to read well on the light and the dark chart theme.
struct ChartColors {
    QColor primary;     ///< main line (smoothed loss, allocated memory, throughput)
    QColor secondary;   ///< second line (peak memory, micro-batch)
    QColor tertiary;    ///< third line (reserved memory, accumulation steps)
    QColor faint;       ///< raw data under a smoothed line
    QColor fit;         ///< probe trial that fit
    QColor tight;       ///< probe trial that fit but went past the headroom line
    QColor oom;         ///< out of memory
    QColor limit;       ///< capacity line
    QColor headroom;    ///< usable-memory line
    QColor chosen;      ///< chosen micro-batch

    static ChartColors forTheme(bool dark);
};

/// A pen for a chart line: `color`, `width` pixels, `style`.
QPen linePen(const QColor& color, qreal width, Qt::PenStyle style = Qt::SolidLine);

/// The three markers of probe trials, named for the legend, the same in every chart: fit (circle),
/// fit but past the headroom line (triangle), out of memory (square). The caller adds them to
/// its chart, which owns them from then on.
struct TrialMarkers {
    QScatterSeries* fits;
    QScatterSeries* tight;
    QScatterSeries* ooms;

    static TrialMarkers create();
    /// Fills each marker with its colour and a darker border.
    void applyColors(const ChartColors& colors) const;
};

}  // namespace batchpilot::ui
