// Several devices (issue 14): what the gradient all-reduce costs in a step, and how evenly the
// ranks finish their shares, for 1, 2 and 3 ranks of unequal virtual budgets on this machine —
// BatchPilot's balanced shares against an equal split of the target batch (what DDP-style tools
// do), measured side by side. Each job is batchpilot-cli as a user runs it; the numbers come from
// rank 0's events (ranks_step and step).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_util.h"

using namespace batchpilot::bench;
using json = nlohmann::json;

namespace {

struct Setup {
    std::string label;
    std::string devices;  ///< one device, or a comma-separated list for --devices
    bool equalShares = false;
};

struct Outcome {
    bool ok = false;
    int ranks = 1;
    double samplesPerSecond = 0;  ///< the measured steps' samples over their seconds
    double allReduceShare = 0;    ///< median of all-reduce seconds over step seconds
    double imbalance = 1;         ///< median of slowest over fastest compute time
    double waitShare = 0;         ///< median over steps of the ranks' mean wait over step seconds
    std::vector<int64_t> lastShares;
    std::vector<int64_t> lastMicroBatches;
    int shareChanges = 0;
};

Outcome runJob(const Setup& setup, int steps, int measured, const std::string& scratch) {
    const std::string events = scratch + "/events.jsonl";
    std::filesystem::remove(events);
    const bool several = setup.devices.find(',') != std::string::npos;
    std::string command = std::string(BATCHPILOT_CLI_PATH) + (several ? " --devices " : " --device ") + setup.devices +
                          " --model cnn --samples 8192 --target-batch 512 --steps " + std::to_string(steps) +
                          " --validation-split 0 --no-run-folder --quiet --events " + events +
                          (setup.equalShares ? " --equal-shares" : "") + " > /dev/null";
    Outcome outcome;
    if (std::system(command.c_str()) != 0) {
        std::fprintf(stderr, "bench-data-parallel: the job \"%s\" failed: %s\n", setup.label.c_str(), command.c_str());
        return outcome;
    }
    std::map<int64_t, double> stepSeconds;
    std::vector<json> rankSteps;
    std::ifstream in(events);
    for (std::string line; std::getline(in, line);) {
        const json event = json::parse(line, nullptr, false);
        if (event.is_discarded()) continue;
        if (event["type"] == "step") stepSeconds[event["step"].get<int64_t>()] = event["step_seconds"].get<double>();
        if (event["type"] == "ranks_step") {
            rankSteps.push_back(event);
            if (event.contains("next_shares")) ++outcome.shareChanges;
        }
    }
    const int64_t first = steps - measured + 1;  // the last `measured` steps: after probe and timing
    double samples = 0;
    double seconds = 0;
    std::vector<double> reduceShares;
    std::vector<double> imbalances;
    std::vector<double> waitShares;
    for (const auto& [step, s] : stepSeconds) {
        if (step < first) continue;
        samples += 512;
        seconds += s;
    }
    for (const json& event : rankSteps) {
        const int64_t step = event["step"].get<int64_t>();
        if (step < first || !stepSeconds.count(step)) continue;
        const double s = stepSeconds[step];
        reduceShares.push_back(event["all_reduce_seconds"].get<double>() / s);
        imbalances.push_back(event["imbalance"].get<double>());
        double wait = 0;
        outcome.lastShares.clear();
        outcome.lastMicroBatches.clear();
        for (const json& rank : event["ranks"]) {
            wait += rank["wait_seconds"].get<double>();
            outcome.lastShares.push_back(rank["share"].get<int64_t>());
            outcome.lastMicroBatches.push_back(rank["micro_batch"].get<int64_t>());
        }
        waitShares.push_back(wait / static_cast<double>(event["ranks"].size()) / s);
        outcome.ranks = static_cast<int>(event["ranks"].size());
    }
    outcome.ok = seconds > 0;
    outcome.samplesPerSecond = seconds > 0 ? samples / seconds : 0;
    outcome.allReduceShare = median(reduceShares);
    outcome.imbalance = imbalances.empty() ? 1.0 : median(imbalances);
    outcome.waitShare = median(waitShares);
    return outcome;
}

std::string joined(const std::vector<int64_t>& values) {
    std::string text;
    for (const int64_t v : values) text += (text.empty() ? "" : "+") + std::to_string(v);
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    const BenchArgs args = parseArgs(argc, argv, "batchpilot-bench-data-parallel",
                                     "all-reduce share and balance of the ranks, balanced against equal shares");
    const int steps = args.quick ? 10 : 24;
    const int measured = args.quick ? 4 : 12;
    char pattern[] = "/tmp/batchpilot-bench-dp-XXXXXX";
    const char* scratch = ::mkdtemp(pattern);
    if (scratch == nullptr) {
        std::perror("mkdtemp");
        return 1;
    }
    // A 4 MiB device trains in small micro-batches, slower per sample than a 48 MiB one on the
    // same cores: what a slower GPU is to a faster one.
    const std::vector<Setup> setups{
        {"1 rank (virtual:48MiB)", "virtual:48MiB/exact"},
        {"2 ranks, balanced", "virtual:4MiB/exact,virtual:48MiB/exact"},
        {"2 ranks, equal shares", "virtual:4MiB/exact,virtual:48MiB/exact", true},
        {"3 ranks, balanced", "virtual:4MiB/exact,virtual:12MiB/exact,virtual:48MiB/exact"},
        {"3 ranks, equal shares", "virtual:4MiB/exact,virtual:12MiB/exact,virtual:48MiB/exact", true},
    };
    // Repetitions interleaved (every setup once per round), so that a machine's slow minute
    // weighs on every setup alike; the medians are reported.
    const int rounds = args.quick ? 1 : 3;
    std::vector<std::vector<Outcome>> outcomes(setups.size());
    for (int round = 0; round < rounds; ++round) {
        for (size_t i = 0; i < setups.size(); ++i) {
            std::fprintf(stderr, "bench-data-parallel: round %d/%d, %s\n", round + 1, rounds, setups[i].label.c_str());
            outcomes[i].push_back(runJob(setups[i], steps, measured, scratch));
        }
    }
    json results = json::array();
    std::vector<std::string> rows;
    for (size_t i = 0; i < setups.size(); ++i) {
        const Setup& setup = setups[i];
        const auto medianOf = [&](double Outcome::*field) {
            std::vector<double> values;
            for (const Outcome& o : outcomes[i])
                if (o.ok) values.push_back(o.*field);
            return median(values);
        };
        Outcome o = outcomes[i].back();
        o.ok = true;
        for (const Outcome& each : outcomes[i]) o.ok = o.ok && each.ok;
        o.samplesPerSecond = medianOf(&Outcome::samplesPerSecond);
        o.allReduceShare = medianOf(&Outcome::allReduceShare);
        o.imbalance = medianOf(&Outcome::imbalance);
        o.waitShare = medianOf(&Outcome::waitShare);
        results.push_back({{"label", setup.label},
                           {"devices", setup.devices},
                           {"equal_shares", setup.equalShares},
                           {"ok", o.ok},
                           {"ranks", o.ranks},
                           {"rounds", rounds},
                           {"samples_per_s", o.samplesPerSecond},
                           {"all_reduce_share", o.allReduceShare},
                           {"imbalance", o.imbalance},
                           {"wait_share", o.waitShare},
                           {"last_shares", o.lastShares},
                           {"last_micro_batches", o.lastMicroBatches},
                           {"share_changes", o.shareChanges}});
        rows.push_back("\"" + setup.label + "\"," + std::to_string(o.ranks) + "," +
                       (setup.equalShares ? "equal" : "balanced") + "," + fixed(o.samplesPerSecond, 1) + "," +
                       fixed(o.allReduceShare, 4) + "," + fixed(o.imbalance, 3) + "," + fixed(o.waitShare, 3) + "," +
                       joined(o.lastShares) + "," + joined(o.lastMicroBatches));
    }
    std::filesystem::remove_all(scratch);
    writeCsv(args.outDir, "data_parallel.csv",
             "setup,ranks,shares,samples_per_s,all_reduce_share,imbalance,wait_share,last_shares,last_micro_batches",
             rows);
    writeJson(args.outDir, "data_parallel.json",
              {{"machine", machineDescription()},
               {"steps", steps},
               {"measured_steps", measured},
               {"rounds", rounds},
               {"target_batch", 512},
               {"model", "cnn"},
               {"setups", results}});
    return 0;
}
