#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <tl/expected.hpp>

#include "core/events/events.h"

namespace batchpilot::core {

/// The event as one JSON object: {"type": eventName(e), ...fields in snake_case}.
nlohmann::json toJson(const Event& event);

/// toJson(event) on one line, without a trailing newline (a JSON Lines record).
std::string toJsonLine(const Event& event);

/// Longest line of an events file that is read as an event (BatchPilot's are a few KiB): a longer
/// one is skipped without being held in memory.
inline constexpr size_t kMaxEventLineBytes = size_t{16} << 20;
/// Deepest nesting of an event that is read (BatchPilot's nest 3 levels): deeper values are
/// dropped while parsing and the line is skipped.
inline constexpr int kMaxEventDepth = 16;

/// What reading an event does with a field toJson always writes that is absent.
enum class MissingFields {
    Default,  ///< keeps the field's default: an events file written before the field existed
    Error,    ///< an error naming it: text this build wrote (a rank's report)
};

/// The event toJson wrote: the type named by "type", every field read back. Keys it does not know
/// are passed over (a newer BatchPilot's). An error names the event type and the field that is
/// wrong, and how (`oom "phase": unknown phase "sideways"`), or the unknown type.
tl::expected<Event, std::string> eventFromJson(const nlohmann::json& j, MissingFields missing = MissingFields::Default);

/// One line of an events file (toJsonLine's) read back: eventFromJson of the parsed line, or why
/// the line is not an event (not JSON — a line cut off —, nested deeper than kMaxEventDepth).
tl::expected<Event, std::string> eventFromJsonLine(std::string_view line);

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
