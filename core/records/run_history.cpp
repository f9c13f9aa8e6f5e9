#include "core/records/run_history.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/base/durable_file.h"
#include "core/records/run_folder.h"

namespace batchpilot::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double number(const json& event, const char* key, double otherwise = 0) {
    const auto it = event.find(key);
    return it != event.end() && it->is_number() ? it->get<double>() : otherwise;
}

int64_t whole(const json& event, const char* key) {
    const auto it = event.find(key);
    return it != event.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

std::vector<RunListing> listRuns(const std::string& runsDirectory, std::size_t limit) {
    std::vector<RunListing> runs;
    std::error_code ec;
    if (runsDirectory.empty() || !fs::is_directory(runsDirectory, ec)) return runs;
    for (fs::directory_iterator it(runsDirectory, ec), end; !ec && it != end; it.increment(ec)) {
        if (!it->is_directory(ec)) continue;
        auto summary = readRunSummary(it->path().string());
        if (!summary) continue;
        runs.push_back({it->path().string(), std::move(*summary)});
    }
    const auto started = [](const RunListing& r) {
        const auto it = r.summary.find("started");
        return it != r.summary.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    std::sort(runs.begin(), runs.end(), [&](const RunListing& a, const RunListing& b) {
        const std::string sa = started(a), sb = started(b);
        return sa != sb ? sa > sb : a.folder > b.folder;
    });
    if (runs.size() > limit) runs.resize(limit);
    return runs;
}

namespace {

/// The next line of `in` (without its newline) into `line`, at most `limit` bytes of it; the rest
/// of a longer line is read past, not kept. False at the end of the file; `tooLong` says whether
/// the line was cut.
bool readBoundedLine(std::istream& in, std::string& line, size_t limit, bool& tooLong) {
    line.clear();
    tooLong = false;
    bool any = false;
    char buffer[64 * 1024];
    for (;;) {
        in.getline(buffer, sizeof buffer);
        const auto got = static_cast<size_t>(in.gcount());
        if (got == 0 && in.fail()) return any;  // the end of the file
        any = true;
        // getline counts the newline it took; a full buffer without one sets failbit, the end of
        // the file without one eofbit.
        const bool newline = !in.fail() && !in.eof();
        const size_t bytes = newline ? got - 1 : got;
        if (!tooLong && line.size() + bytes <= limit) {
            line.append(buffer, bytes);
        } else {
            tooLong = true;
            line.clear();
        }
        if (newline || in.eof()) return true;
        in.clear();  // the buffer filled: the line goes on
    }
}

}  // namespace

tl::expected<int64_t, std::string> forEachEvent(const std::string& eventsPath,
                                                const std::function<void(const json&)>& visit,
                                                const std::function<bool()>& stop) {
    std::ifstream in(eventsPath);
    if (!in) return tl::unexpected(eventsPath + " cannot be read");
    int64_t skipped = 0;
    std::string line;
    bool tooLong = false;
    bool tooDeep = false;
    const json::parser_callback_t depthLimit = [&](int depth, json::parse_event_t, json&) {
        if (depth > kMaxEventDepth) tooDeep = true;
        return depth <= kMaxEventDepth;
    };
    while (readBoundedLine(in, line, kMaxEventLineBytes, tooLong)) {
        if (stop && stop()) return tl::unexpected(std::string("stopped"));
        if (line.empty() && !tooLong) continue;
        tooDeep = false;
        const json event = tooLong ? json() : json::parse(line, depthLimit, /*allow_exceptions=*/false);
        if (tooLong || tooDeep || !event.is_object()) {
            ++skipped;
            continue;
        }
        visit(event);
    }
    return skipped;
}

void BoundedCurve::add(const CurvePoint& p) {
    if (m_seen++ % m_stride != 0) return;
    m_points.push_back(p);
    if (m_points.size() >= m_limit) {
        std::vector<CurvePoint> half;
        half.reserve(m_points.size() / 2 + 1);
        for (std::size_t i = 0; i < m_points.size(); i += 2) half.push_back(m_points[i]);
        m_points.swap(half);
        m_stride *= 2;
    }
}

void BoundedCurve::reset() {
    m_points.clear();
    m_stride = 1;
    m_seen = 0;
}

tl::expected<RunCurves, std::string> readRunCurves(const std::string& runFolder, std::size_t maxPoints) {
    RunCurves curves;
    BoundedCurve train(curves.trainLoss, maxPoints), valLoss(curves.valLoss, maxPoints),
        valAccuracy(curves.valAccuracy, maxPoints);
    const auto skipped = forEachEvent(runFolder + "/events.jsonl", [&](const json& event) {
        const auto type = event.find("type");
        if (type == event.end() || !type->is_string()) return;
        const CurvePoint at{whole(event, "step"), whole(event, "samples_seen"), number(event, "time")};
        if (*type == "step") {
            if (const auto loss = event.find("loss"); loss != event.end() && loss->is_number())
                train.add({at.step, at.samplesSeen, at.time, loss->get<double>()});
        } else if (*type == "validation") {
            if (const auto loss = event.find("loss"); loss != event.end() && loss->is_number())
                valLoss.add({at.step, at.samplesSeen, at.time, loss->get<double>()});
            if (const auto acc = event.find("accuracy"); acc != event.end() && acc->is_number())
                valAccuracy.add({at.step, at.samplesSeen, at.time, acc->get<double>()});
        }
    });
    if (!skipped) return tl::unexpected(skipped.error() + ": is " + runFolder + " a run folder?");
    curves.skipped = *skipped;
    return curves;
}

tl::expected<void, std::string> renameRun(const std::string& runFolder, const std::string& name) {
    if (name.empty() || name.size() > 200)
        return tl::unexpected(std::string("a run's name must have 1 to 200 characters"));
    auto summary = readRunSummary(runFolder);
    if (!summary) return tl::unexpected(summary.error());
    (*summary)["name"] = name;
    return replaceFileAtomically(runFolder + "/summary.json", summary->dump(2) + "\n", runFolder + "/summary.json");
}

tl::expected<void, std::string> deleteRun(const std::string& runFolder) {
    static const std::set<std::string> runFiles = {"summary.json", "events.jsonl",  "config.json",
                                                   "series.csv",   "checkpoint.pt", "best.pt"};
    std::error_code ec;
    if (!fs::is_regular_file(runFolder + "/summary.json", ec) || !fs::is_regular_file(runFolder + "/events.jsonl", ec))
        return tl::unexpected(runFolder + " is not a run folder (no summary.json and events.jsonl): nothing deleted");
    for (fs::directory_iterator it(runFolder, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const bool hidden = !name.empty() && name.front() == '.';
        if (it->is_directory(ec) || it->is_symlink(ec) || (!hidden && runFiles.count(name) == 0)) {
            return tl::unexpected(runFolder + " holds " + name +
                                  ", which a run does not write: nothing deleted (remove the folder yourself)");
        }
    }
    if (ec) return tl::unexpected("cannot read " + runFolder + ": " + ec.message());
    fs::remove_all(runFolder, ec);
    if (ec) return tl::unexpected("deleting " + runFolder + " failed: " + ec.message());
    return {};
}

}  // namespace batchpilot::core
