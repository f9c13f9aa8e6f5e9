#include "core/records/run_folder.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/base/durable_file.h"
#include "core/events/event_json.h"
#include "core/config/run_config.h"

namespace batchpilot::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// Steps between two rewrites of summary.json while nothing else asks for one.
constexpr int64_t kStepsPerSummary = 50;
/// events.jsonl is flushed at least this often, so that a window following the run (File → Open
/// run folder, possibly over sshfs or NFS) sees its events within about this time.
constexpr auto kEventsFlushInterval = std::chrono::milliseconds(250);
/// summary.json is a few KiB; anything much larger is not one.
constexpr std::uintmax_t kMaxSummaryBytes = 1 << 20;

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::string(value) : std::string();
}

/// Letters, digits, '-' and '_' only; at most 40 characters.
std::string slug(const std::string& text) {
    std::string out;
    for (const char c : text) {
        const bool plain =
            (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (plain)
            out += c;
        else if (!out.empty() && out.back() != '-')
            out += '-';
        if (out.size() >= 40) break;
    }
    while (!out.empty() && out.back() == '-') out.pop_back();
    return out.empty() ? std::string("run") : out;
}

std::string localTime(std::time_t when, const char* format) {
    std::tm parts{};
    localtime_r(&when, &parts);
    char text[64];
    std::strftime(text, sizeof text, format, &parts);
    return text;
}

}  // namespace

std::string defaultRunsDirectory() {
    if (std::string dir = environment("BATCHPILOT_RUNS_DIR"); !dir.empty()) return dir;
    if (std::string data = environment("XDG_DATA_HOME"); !data.empty()) return data + "/batchpilot/runs";
    if (std::string home = environment("HOME"); !home.empty()) return home + "/.local/share/batchpilot/runs";
    return {};
}

std::string runFolderName(const TrainerOptions& options, std::time_t when) {
    const std::string model =
        isModelFile(options.model.name) ? fs::path(options.model.name).stem().string() : options.model.name;
    return localTime(when, "%Y%m%d-%H%M%S") + "-" + slug(model) + "-" + slug(options.data.name);
}

bool checkpointsInRunFolder(const TrainerOptions& options) {
    return options.checkpoint.directory.empty() &&
           (options.checkpoint.everySteps > 0 || !options.checkpoint.keepBest.empty());
}

std::string resumedCheckpointDirectory(const std::string& resumeFrom) {
    fs::path from(resumeFrom);
    if (!from.has_filename()) from = from.parent_path();  // "…/best/"
    if (from.filename() == "best" && from.has_parent_path()) return from.parent_path().string();
    return resumeFrom;
}

void MetricTrack::add(double value, int64_t step) {
    last = value;
    lastStep = step;
    const bool better = higherIsBetter ? value > best : value < best;
    if (count == 0 || better) {
        best = value;
        bestStep = step;
    }
    ++count;
}

void RunSummaryBuilder::handle(const Event& event) {
    const auto track = [this](const char* name, bool higherIsBetter, double value, int64_t step) {
        MetricTrack& t = m_metrics[name];
        t.higherIsBetter = higherIsBetter;
        t.add(value, step);
    };
    std::visit([this](const auto& e) { m_seconds = std::max(m_seconds, e.time); }, event);
    if (const auto* s = std::get_if<RunSummary>(&event)) {
        m_run = *s;
        m_device = s->device;
        m_targetBatch = s->targetBatch;
    } else if (const auto* m = std::get_if<StepMetrics>(&event)) {
        m_steps = m->step;
        m_samplesSeen = m->samplesSeen;
        m_epoch = m->epoch;
        m_microBatch = m->microBatch;
        m_accumulationSteps = m->accumulationSteps;
        m_targetBatch = m->targetBatch;
        track("train_loss", false, m->loss, m->step);
        track("samples_per_second", true, m->samplesPerSecond, m->step);
    } else if (const auto* v = std::get_if<ValidationDone>(&event)) {
        for (const std::string& name : validationMetricNames()) {
            if (const std::optional<double> value = validationMetric(*v, name))
                track(name.c_str(), higherIsBetter(name), *value, v->step);
        }
    } else if (const auto* c = std::get_if<CheckpointSaved>(&event)) {
        (c->metric.empty() ? m_checkpoint : m_bestCheckpoint) = *c;
    } else if (std::holds_alternative<OomEvent>(event)) {
        ++m_ooms;
    } else if (const auto* rank = std::get_if<RankProbed>(&event)) {
        m_ooms += static_cast<int64_t>(rank->ooms.size());  // several devices: the job's, every rank's
    } else if (const auto* d = std::get_if<DeviceSwitched>(&event)) {
        if (d->rank == 0) m_device = d->to;  // several devices: the job's device is rank 0's
    } else if (const auto* err = std::get_if<ErrorEvent>(&event)) {
        m_error = err->message;
    } else if (const auto* state = std::get_if<RunStateChanged>(&event)) {
        if (state->state == RunState::Finished) m_state = state->detail == "done" ? "finished" : "stopped";
        if (state->state == RunState::Failed) m_state = "failed";
    }
}

json RunSummaryBuilder::toJson(const std::string& name, const std::string& started) const {
    json metrics = json::object();
    for (const auto& [key, t] : m_metrics) {
        metrics[key] = {{"last", t.last},          {"last_step", t.lastStep}, {"best", t.best},
                        {"best_step", t.bestStep}, {"count", t.count},        {"higher_is_better", t.higherIsBetter}};
    }
    json j = {{"name", name},
              {"started", started},
              {"state", m_state},
              {"seconds", m_seconds},
              {"model", m_run ? m_run->model : std::string()},
              {"dataset", m_run ? m_run->dataset : std::string()},
              {"dataset_size", m_run ? m_run->datasetSize : 0},
              {"device", m_device},
              {"target_batch", m_targetBatch},
              {"micro_batch", m_microBatch},
              {"accumulation_steps", m_accumulationSteps},
              {"steps", m_steps},
              {"samples_seen", m_samplesSeen},
              {"epoch", m_epoch},
              {"ooms", m_ooms},
              {"metrics", metrics}};
    if (!m_error.empty()) j["error"] = m_error;
    if (m_checkpoint) j["checkpoint"] = {{"path", m_checkpoint->path}, {"step", m_checkpoint->step}};
    if (m_bestCheckpoint) {
        j["best_checkpoint"] = {{"path", m_bestCheckpoint->path},
                                {"step", m_bestCheckpoint->step},
                                {"metric", m_bestCheckpoint->metric},
                                {"value", m_bestCheckpoint->value}};
    }
    return j;
}

tl::expected<std::unique_ptr<RunFolder>, std::string> RunFolder::create(const std::string& runsDirectory,
                                                                        TrainerOptions& options, std::time_t when) {
    if (runsDirectory.empty()) {
        return tl::unexpected(std::string(
            "no runs folder: neither BATCHPILOT_RUNS_DIR, XDG_DATA_HOME nor HOME is set; give one with --runs-dir"));
    }
    std::error_code ec;
    fs::create_directories(runsDirectory, ec);
    if (ec || !fs::is_directory(runsDirectory, ec)) {
        return tl::unexpected("cannot create the runs folder " + runsDirectory +
                              ": choose a writable folder with --runs-dir (or --no-run-folder)");
    }
    std::unique_ptr<RunFolder> folder(new RunFolder);
    const std::string base = runFolderName(options, when);
    for (int n = 1; n <= 1000 && folder->m_path.empty(); ++n) {
        const std::string name = n == 1 ? base : base + "-" + std::to_string(n);
        const fs::path path = fs::path(runsDirectory) / name;
        // create_directory is false for a folder that exists: another run's, never reused.
        if (fs::create_directory(path, ec)) {
            folder->m_path = path.string();
            folder->m_name = name;
        } else if (ec) {
            return tl::unexpected("cannot create a run folder in " + runsDirectory + " (" + ec.message() +
                                  "): choose a writable folder with --runs-dir (or --no-run-folder)");
        }
    }
    if (folder->m_path.empty()) return tl::unexpected("the runs folder " + runsDirectory + " has no free name left");
    folder->m_started = localTime(when, "%Y-%m-%dT%H:%M:%S%z");
    // `options` change only once the folder is complete: a run whose folder failed must not save
    // into a half-made one.
    TrainerOptions recorded = options;
    if (checkpointsInRunFolder(options)) {
        recorded.checkpoint.directory = (fs::path(folder->m_path) / kRunCheckpointFolder).string();
    }
    if (auto written = replaceFileAtomically(folder->m_path + "/config.json", jsonText(toRunConfig(recorded), 2) + "\n",
                                             folder->m_path + "/config.json");
        !written) {
        return tl::unexpected("cannot write the run's configuration in " + folder->m_path + ": " + written.error());
    }
    folder->m_events.open(folder->m_path + "/events.jsonl", std::ios::out | std::ios::trunc);
    if (!folder->m_events) return tl::unexpected("cannot write the run's events in " + folder->m_path);
    folder->writeSummary();
    if (!folder->m_error.empty()) return tl::unexpected(folder->m_error);
    options.checkpoint.directory = recorded.checkpoint.directory;
    options.runFolder = folder->m_path;  // the memory snapshots at OOMs go here
    return folder;
}

RunFolder::~RunFolder() {
    if (m_error.empty()) flush();
}

void RunFolder::fail(const std::string& what) {
    if (m_error.empty()) m_error = what;
}

void RunFolder::onEvent(const Event& event) {
    m_summary.handle(event);
    if (!m_error.empty()) return;
    m_events << toJsonLine(event) << '\n';
    if (!m_events) {
        fail("writing " + m_path + "/events.jsonl failed (disk full?); the run goes on, but its folder is incomplete");
        return;
    }
    bool summaryDue = std::holds_alternative<ValidationDone>(event) || std::holds_alternative<CheckpointSaved>(event);
    if (std::holds_alternative<StepMetrics>(event)) summaryDue = ++m_stepsSinceSummary >= kStepsPerSummary;
    if (const auto* state = std::get_if<RunStateChanged>(&event))
        summaryDue = state->state == RunState::Finished || state->state == RunState::Failed;
    // A state change (paused, …) or a wait for the next step-by-step micro-batch may be followed by
    // no event for a long time: written out now, so that a follower sees the run as it is.
    const bool quietAfter =
        std::holds_alternative<RunStateChanged>(event) || std::holds_alternative<StepModeWaiting>(event);
    if (summaryDue) {
        flush();
        m_lastFlush = std::chrono::steady_clock::now();
    } else if (const auto now = std::chrono::steady_clock::now();
               quietAfter || now - m_lastFlush >= kEventsFlushInterval) {
        m_lastFlush = now;
        m_events.flush();  // a write error shows at the next write
    }
}

void RunFolder::flush() {
    if (!m_error.empty()) return;
    m_events.flush();
    if (!m_events) {
        fail("writing " + m_path + "/events.jsonl failed (disk full?); the run goes on, but its folder is incomplete");
        return;
    }
    writeSummary();
}

void RunFolder::writeSummary() {
    m_stepsSinceSummary = 0;
    if (auto written =
            replaceFileAtomically(m_path + "/summary.json", jsonText(m_summary.toJson(m_name, m_started), 2) + "\n",
                                  m_path + "/summary.json");
        !written) {
        fail("writing " + m_path + "/summary.json failed: " + written.error());
    }
}

tl::expected<json, std::string> readRunSummary(const std::string& runFolder) {
    const std::string path = runFolder + "/summary.json";
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return tl::unexpected(path + " cannot be read: not a run folder?");
    if (size > kMaxSummaryBytes)
        return tl::unexpected(path + " is " + std::to_string(size) + " bytes: not a run summary");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return tl::unexpected(path + " is not a JSON object: the file is damaged");
    return j;
}

}  // namespace batchpilot::core
