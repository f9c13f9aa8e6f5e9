#pragma once

#include <QColor>

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

}  // namespace batchpilot::ui
