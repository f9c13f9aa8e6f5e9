#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/events/events.h"

namespace batchpilot::core {

/// The event as one JSON object: {"type": eventName(e), ...fields in snake_case}.
nlohmann::json toJson(const Event& event);

/// toJson(event) on one line, without a trailing newline (a JSON Lines record).
std::string toJsonLine(const Event& event);

/// Several devices: the events a rank other than 0 reports to rank 0 (its probes and OOMs:
/// ProbeStarted, ProbeTrial, ProbeFinished, OomEvent).
bool isRankReported(const Event& event);

/// Several devices: what a rank tells rank 0 of its probes and OOMs (the ProbeStarted,
/// ProbeTrial, ProbeFinished and OomEvent among `events`; the others are left out), as JSON
/// text, each event's time given as its age at `now` (the ranks' clocks start apart). Empty
/// when there is none of them.
std::string rankReportText(const std::vector<Event>& events, double now);

/// Reads rankReportText's text back, the ages turned into times on this process's clock at
/// `now`; the caller sets the report's time, rank and device. An error names the event that is
/// malformed and what is wrong with it.
tl::expected<RankProbed, std::string> readRankReport(const std::string& text, double now);

}  // namespace batchpilot::core
