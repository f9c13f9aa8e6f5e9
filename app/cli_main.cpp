#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/cli_args.h"
#include "app/cli_progress.h"
#include "core/byte_size.h"
#include "core/counting_allocator.h"
#include "core/device.h"
#include "core/run_config.h"
#include "core/trainer.h"

namespace {

std::atomic<bool> g_interrupted{false};

void onInterrupt(int) { g_interrupted.store(true); }

}  // namespace

int main(int argc, char** argv) {
    using namespace batchpilot;
    core::installCountingAllocator();
    auto request = app::parseCli(std::vector<std::string>(argv + 1, argv + argc));
    if (!request) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", request.error().c_str());
        return 2;
    }
    if (request->help) {
        std::fputs(app::cliHelp().c_str(), stdout);
        return 0;
    }
    if (request->listDevices) {
        for (const auto& device : core::availableDevices()) {
            std::printf("%-10s %s\n", device.id.c_str(), device.description.c_str());
        }
        std::printf("%-10s %s\n", "virtual:<size>", "a simulated GPU with a memory budget, e.g. virtual:512MiB");
        return 0;
    }
    if (!request->saveConfigPath.empty()) {
        if (auto saved = core::saveRunConfig(request->saveConfigPath, request->options); !saved) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", saved.error().c_str());
            return 2;
        }
        std::printf("wrote %s\n", request->saveConfigPath.c_str());
        return 0;
    }
    app::ConsoleReporter reporter(stdout, isatty(fileno(stdout)) != 0, request->quiet);
    if (!request->eventsPath.empty()) {
        std::string error;
        if (!reporter.openEvents(request->eventsPath, error)) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", error.c_str());
            return 2;
        }
    }
    core::Trainer trainer(request->options, reporter);
    reporter.watchInterrupt(&trainer, &g_interrupted);
    reporter.setMemoryReport(request->memoryReport);
    if (request->checkEquivalence >= 0) reporter.requestEquivalenceCheck(request->checkEquivalence);
    std::signal(SIGINT, onInterrupt);
    std::signal(SIGTERM, onInterrupt);
    const core::RunResult result = trainer.run();
    if (result.state == core::RunState::Failed) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", result.error.c_str());
        return 1;
    }
    const auto& last = reporter.lastStep();
    std::printf("\n%s after %lld steps: loss %.4f, micro-batch %lld, %d OOM event(s) recovered, peak %.1f MiB\n",
                result.stopped ? "stopped" : "done", static_cast<long long>(result.steps), last.loss,
                static_cast<long long>(result.microBatch), reporter.oomCount(), core::toMiB(last.peakBytes));
    return 0;
}
