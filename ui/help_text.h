#pragma once

#include <QString>

namespace batchpilot::ui {

/// Help > How this works: probing and accumulation in plain words (HTML).
QString howItWorksHtml();
/// Help > About (HTML).
QString aboutHtml();

}  // namespace batchpilot::ui
