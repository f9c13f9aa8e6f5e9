#pragma once

#include <QString>
#include <string>

namespace batchpilot::ui {

/// Text from core (UTF-8 std::string) as Qt's.
inline QString str(const std::string& text) {
    return QString::fromStdString(text);
}

}  // namespace batchpilot::ui
