#pragma once

#include <QString>

namespace batchpilot::ui {

class ChartsPanel;
class RunModel;

/// Help > How this works: probing, accumulation and OOM recovery in plain words (HTML). With a
/// run, every part also says what happened in that run, with its numbers.
QString howItWorksHtml(const RunModel& run);
QString howItWorksHtml();
/// Help > About (HTML).
QString aboutHtml();
/// Tooltips for a student on the four live charts (charts that already have one keep it).
void explainCharts(ChartsPanel& charts);

}  // namespace batchpilot::ui
