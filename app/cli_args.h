#pragma once

#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "core/config/options.h"

namespace batchpilot::app {

/// What the command line asked for.
struct CliRequest {
    core::TrainerOptions options;
    std::string configPath;      ///< --config FILE, read before the flags are applied
    std::string eventsPath;      ///< --events FILE, empty when not asked
    std::string saveConfigPath;  ///< --save-config FILE: write the configuration and exit
    std::string runsDirectory;   ///< --runs-dir DIR; empty: core::defaultRunsDirectory()
    bool noRunFolder = false;    ///< --no-run-folder: record nothing
    std::string exportCsv;       ///< --export-csv RUN_FOLDER: write its series as CSV and exit
    std::string csvOut;          ///< --csv-out FILE: where --export-csv writes (default RUN_FOLDER/series.csv)
    bool help = false;
    bool listDevices = false;
    bool optionsReference = false;  ///< --options-reference: print core::optionsReference() and exit
    bool quiet = false;
    bool memoryReport = false;      ///< --memory-report: print the memory report after each probe
    std::string planFor;            ///< --plan-for all|T4,…: after the first probe, the plan on those GPUs
    std::string memorySnapshot;     ///< --memory-snapshot FILE: the virtual GPU's segments, as PyTorch pickles them
    int64_t checkEquivalence = -1;  ///< --check-equivalence N: samples to check after step 1 (0: whole batch)
    /// --resume DIR without --checkpoint-dir: checkpoints replace DIR/checkpoint.pt (said at start).
    bool checkpointReplacesResumed = false;
    /// --devices A,B,…: one rank per device (app/rank_launcher.h); empty: one device (--device).
    std::vector<std::string> devices;
    /// --rank-timeout S: how long ranks wait for each other before a missing one ends the job.
    int64_t rankTimeoutSeconds = 300;
    /// --serve [ADDR:]PORT: serve the run's events and accept commands (app/run_server.h).
    std::string serve;
    /// --serve-any-address: allow --serve on an address other than loopback.
    bool serveAnyAddress = false;
};

/// Parses argv (without the program name): a configuration file first (--config), then the flags
/// given, then core::resolve(). Every flag is documented in cliHelp(). A bad flag or value is a
/// one-line message naming it and what would be valid.
tl::expected<CliRequest, std::string> parseCli(const std::vector<std::string>& args);

/// The --help text.
std::string cliHelp();

}  // namespace batchpilot::app
