#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/events.h"

namespace batchpilot::core {

/// The event as one JSON object: {"type": eventName(e), ...fields in snake_case}.
nlohmann::json toJson(const Event& event);

/// toJson(event) on one line, without a trailing newline (a JSON Lines record).
std::string toJsonLine(const Event& event);

}  // namespace batchpilot::core
