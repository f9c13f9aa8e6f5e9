#include "core/base/durable_file.h"
#include "core/records/series_export.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/records/run_history.h"
#include "core/base/text_format.h"

namespace batchpilot::core {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// A number as the table writes it: whole numbers exactly, others with 9 significant digits;
/// anything else (null, a NaN written as null) is an empty field.
std::string field(const json& value) {
    if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
    if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
    if (value.is_number_float()) {
        const double v = value.get<double>();
        return std::isfinite(v) ? formatText("%.9g", v) : std::string();
    }
    return {};
}

const json& member(const json& event, const char* key) {
    static const json null;
    const auto it = event.find(key);
    return it == event.end() ? null : *it;
}

}  // namespace

const std::vector<std::string>& exportedSeries() {
    static const std::vector<std::string> names = {
        "train_loss",
        "learning_rate",
        "samples_per_second",
        "micro_batch",
        "accumulation_steps",
        "target_batch",
        "step_peak_bytes",
        "val_loss",
        "val_accuracy",
        "val_top5_accuracy",
        "val_mse",
        "val_mae",
        "memory_allocated_bytes",
        "memory_reserved_bytes",
        "memory_peak_bytes",
        "memory_capacity_bytes",
        "probe_fit_peak_bytes",
        "probe_oom_micro_batch",
        "timed_samples_per_second",
        "oom_requested_bytes",
    };
    return names;
}

SeriesCsvWriter::SeriesCsvWriter(std::ostream& out, std::vector<std::string> only)
    : m_out(out), m_only(std::move(only)) {
    m_out << "series,step,samples_seen,time_s,micro_batch,value\n";
}

void SeriesCsvWriter::row(const char* series, const json& value, bool withStep, const json* micro) {
    if (!m_only.empty() && std::find(m_only.begin(), m_only.end(), series) == m_only.end()) return;
    const std::string v = field(value);
    if (v.empty()) return;
    m_out << series << ',';
    if (withStep)
        m_out << m_step << ',' << m_samplesSeen;
    else
        m_out << ',';
    m_out << ',' << formatText("%.4f", m_time) << ',' << (micro ? field(*micro) : std::string()) << ',' << v << '\n';
    ++m_rows;
}

void SeriesCsvWriter::add(const json& event) {
    if (!event.is_object()) return;
    const std::string type = member(event, "type").is_string() ? member(event, "type").get<std::string>() : "";
    if (const json& t = member(event, "time"); t.is_number()) m_time = t.get<double>();
    if (type == "step") {
        if (const json& s = member(event, "step"); s.is_number_integer()) m_step = s.get<int64_t>();
        if (const json& s = member(event, "samples_seen"); s.is_number_integer()) m_samplesSeen = s.get<int64_t>();
        row("train_loss", member(event, "loss"));
        row("learning_rate", member(event, "learning_rate"));
        row("samples_per_second", member(event, "samples_per_second"));
        row("micro_batch", member(event, "micro_batch"));
        row("accumulation_steps", member(event, "accumulation_steps"));
        row("target_batch", member(event, "target_batch"));
        row("step_peak_bytes", member(event, "peak_bytes"));
    } else if (type == "validation") {
        row("val_loss", member(event, "loss"));
        row("val_accuracy", member(event, "accuracy"));
        row("val_top5_accuracy", member(event, "top5_accuracy"));
        row("val_mse", member(event, "mse"));
        row("val_mae", member(event, "mae"));
    } else if (type == "memory") {
        row("memory_allocated_bytes", member(event, "allocated_bytes"));
        row("memory_reserved_bytes", member(event, "reserved_bytes"));
        row("memory_peak_bytes", member(event, "peak_bytes"));
        row("memory_capacity_bytes", member(event, "capacity_bytes"));
    } else if (type == "probe_trial") {
        const json& micro = member(event, "micro_batch");
        const bool fit = member(event, "fit").is_boolean() && member(event, "fit").get<bool>();
        if (fit)
            row("probe_fit_peak_bytes", member(event, "peak_bytes"), true, &micro);
        else
            row("probe_oom_micro_batch", micro, true, &micro);
    } else if (type == "throughput_timed") {
        const json& micro = member(event, "micro_batch");
        if (const json& r = member(event, "repetitions"); r.is_number_integer() && r.get<int64_t>() > 0)
            row("timed_samples_per_second", member(event, "samples_per_second"), true, &micro);
    } else if (type == "oom") {
        const json& micro = member(event, "micro_batch");
        row("oom_requested_bytes", member(event, "requested_bytes"), true, &micro);
    }
}

tl::expected<SeriesExport, std::string> exportRunCsv(const std::string& runFolder, std::string outPath,
                                                     const std::vector<std::string>& only,
                                                     const std::function<bool()>& stop) {
    const std::string eventsPath = runFolder + "/events.jsonl";
    std::error_code ec;
    if (!fs::is_regular_file(eventsPath, ec)) {
        return tl::unexpected(runFolder +
                              " is not a run folder: it has no events.jsonl (run folders are under "
                              "the runs directory, see --runs-dir)");
    }
    if (outPath.empty()) outPath = runFolder + "/series.csv";
    if (std::string why = whyNotWritable(outPath, "the CSV \"" + outPath + "\""); !why.empty())
        return tl::unexpected(std::move(why));
    const fs::path target(outPath);
    const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string temporary = (folder / ("." + target.filename().string() + ".XXXXXX")).string();
    const int fd = ::mkstemp(temporary.data());
    if (fd < 0)
        return tl::unexpected("cannot write in " + folder.string() + ": choose a writable place with --csv-out");
    ::close(fd);
    SeriesExport result;
    {
        std::ofstream out(temporary, std::ios::out | std::ios::trunc);
        SeriesCsvWriter writer(out, only);
        const auto skipped = forEachEvent(
            eventsPath,
            [&](const json& event) {
                ++result.events;
                writer.add(event);
            },
            stop);
        if (!skipped) {
            std::remove(temporary.c_str());
            return tl::unexpected(skipped.error());
        }
        result.skipped = *skipped;
        out.flush();
        if (!out) {
            std::remove(temporary.c_str());
            return tl::unexpected("writing " + outPath + " failed (disk full?); nothing was replaced");
        }
        result.rows = writer.rows();
    }
    if (std::rename(temporary.c_str(), outPath.c_str()) != 0) {
        std::remove(temporary.c_str());
        return tl::unexpected("cannot write " + outPath + ": is it a folder, or in one that cannot be written?");
    }
    result.path = outPath;
    return result;
}

}  // namespace batchpilot::core
