#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/cli_args.h"
#include "app/cli_progress.h"
#include "core/byte_size.h"
#include "core/checkpoint.h"
#include "core/counting_allocator.h"
#include "core/device.h"
#include "core/math_libraries.h"
#include "core/run_config.h"
#include "core/run_folder.h"
#include "core/series_export.h"
#include "core/trainer.h"

namespace {

using namespace batchpilot;

/// Exit statuses (README, "Exit status").
constexpr int kExitFailed = 1;    ///< training failed (an error the run could not recover from)
constexpr int kExitBadInput = 2;  ///< bad flags, configuration, data, model or checkpoint
constexpr int kExitNotSaved = 4;  ///< trained, but a checkpoint or the events file could not be written

/// The signal that asked to stop (0: none). A second one ends the process at once.
std::atomic<int> g_signal{0};

void onSignal(int number) {
    if (g_signal.exchange(number) != 0) {
        constexpr char kMessage[] = "\nbatchpilot-cli: second interrupt: exiting now without saving\n";
        [[maybe_unused]] const auto written = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
        ::_exit(128 + number);
    }
}

/// Stops the trainer as soon as a signal arrives, whatever the trainer is doing; before training
/// has started (loading data, building the model) nothing can be lost, so the process ends at once.
class InterruptWatcher {
public:
    InterruptWatcher(core::Trainer& trainer, const std::atomic<bool>& training)
        : m_thread([this, &trainer, &training] {
              std::unique_lock lock(m_mutex);
              while (!m_done) {
                  m_wake.wait_for(lock, std::chrono::milliseconds(50));
                  const int number = g_signal.load();
                  if (number == 0 || m_stopSent) continue;
                  m_stopSent = true;
                  if (!training.load()) {
                      std::fprintf(
                          stderr,
                          "\nbatchpilot-cli: interrupted (signal %d) before training started; nothing to save\n",
                          number);
                      std::fflush(nullptr);
                      ::_exit(128 + number);
                  }
                  std::fprintf(stderr,
                               "\nbatchpilot-cli: interrupted (signal %d): stopping after the current micro-batch "
                               "(interrupt again to quit at once)\n",
                               number);
                  trainer.stop();
              }
          }) {}
    ~InterruptWatcher() {
        {
            std::lock_guard lock(m_mutex);
            m_done = true;
        }
        m_wake.notify_all();
        m_thread.join();
    }

private:
    std::mutex m_mutex;
    std::condition_variable m_wake;
    bool m_done = false;
    bool m_stopSent = false;
    std::thread m_thread;
};

/// Tells the watcher when training has begun (the first probe or training state), and hands
/// every event to the reporter and the run folder.
class TrainingStarted final : public core::EventSink {
public:
    TrainingStarted(core::EventSink& next, core::EventSink* folder, std::atomic<bool>& training)
        : m_next(next), m_folder(folder), m_training(training) {}
    void onEvent(const core::Event& event) override {
        if (const auto* s = std::get_if<core::RunStateChanged>(&event);
            s && (s->state == core::RunState::Probing || s->state == core::RunState::Training)) {
            m_training.store(true);
        }
        if (m_folder) m_folder->onEvent(event);
        m_next.onEvent(event);
    }

private:
    core::EventSink& m_next;
    core::EventSink* m_folder;
    std::atomic<bool>& m_training;
};

}  // namespace

int main(int argc, char** argv) {
    using namespace batchpilot;
    core::installCountingAllocator();
    auto request = app::parseCli(std::vector<std::string>(argv + 1, argv + argc));
    if (!request) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", request.error().c_str());
        return kExitBadInput;
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
        const core::MathLibraries math = core::mathLibraries();
        std::printf("\n%s\n", core::describe(math).c_str());
        if (math.blasLibrary.size() > 0) std::printf("BLAS library: %s\n", math.blasLibrary.c_str());
        if (const std::string warning = core::referenceBlasWarning(math); !warning.empty()) {
            std::fprintf(stderr, "batchpilot-cli: warning: %s\n", warning.c_str());
        }
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
    if (!request->exportCsv.empty()) {
        const auto exported = core::exportRunCsv(request->exportCsv, request->csvOut);
        if (!exported) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", exported.error().c_str());
            return kExitBadInput;
        }
        std::printf("wrote %s: %lld rows from %lld events\n", exported->path.c_str(),
                    static_cast<long long>(exported->rows), static_cast<long long>(exported->events));
        if (exported->skipped > 0) {
            std::fprintf(stderr,
                         "batchpilot-cli: warning: %lld line(s) of %s/events.jsonl were not JSON events and were "
                         "skipped (a run cut off mid-line?)\n",
                         static_cast<long long>(exported->skipped), request->exportCsv.c_str());
        }
        return 0;
    }
    std::unique_ptr<core::RunFolder> folder;
    // Checkpoints asked for without a directory go into the run folder, which names it now.
    const bool checkpointsInFolder = core::checkpointsInRunFolder(request->options);
    if (!request->noRunFolder) {
        const std::string runs = request->runsDirectory.empty() ? core::defaultRunsDirectory() : request->runsDirectory;
        auto made = core::RunFolder::create(runs, request->options);
        if (!made) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", made.error().c_str());
            return kExitBadInput;
        }
        folder = std::move(*made);
    }
    app::ConsoleReporter reporter(stdout, isatty(fileno(stdout)) != 0, request->quiet);
    if (!request->eventsPath.empty()) {
        std::string error;
        if (!reporter.openEvents(request->eventsPath, error)) {
            std::fprintf(stderr, "batchpilot-cli: %s\n", error.c_str());
            return 2;
        }
    }
    {
        const core::MathLibraries math = core::mathLibraries(request->options.intraOpThreads);
        if (!request->quiet) std::printf("%s\n", core::describe(math).c_str());
        if (const std::string warning = core::referenceBlasWarning(math); !warning.empty()) {
            std::fprintf(stderr, "batchpilot-cli: warning: %s\n", warning.c_str());
        }
    }
    if (request->checkpointReplacesResumed && !request->quiet) {
        std::printf("checkpoints replace %s/%s as training goes on (--checkpoint-dir DIR keeps it)\n",
                    request->options.checkpoint.directory.c_str(), core::kCheckpointFile);
    }
    std::atomic<bool> training{false};
    if (folder && !request->quiet) std::printf("run folder: %s\n", folder->path().c_str());
    if (checkpointsInFolder && !request->quiet) {
        std::printf("checkpoints: %s\n", request->options.checkpoint.directory.c_str());
    }
    TrainingStarted sink(reporter, folder.get(), training);
    core::Trainer trainer(request->options, sink);
    reporter.setTrainer(&trainer);
    reporter.setMemoryReport(request->memoryReport);
    reporter.setKeepBest(request->options.checkpoint.keepBest);
    if (request->checkEquivalence >= 0) reporter.requestEquivalenceCheck(request->checkEquivalence);
    std::signal(SIGINT, onSignal);
    std::signal(SIGTERM, onSignal);
    core::RunResult result;
    {
        InterruptWatcher watcher(trainer, training);
        result = trainer.run();
    }
    std::string eventsError = reporter.closeEvents();
    if (folder) {
        folder->flush();
        if (eventsError.empty()) eventsError = folder->error();
    }
    if (result.state == core::RunState::Failed) {
        std::fprintf(stderr, "batchpilot-cli: %s\n", result.error.c_str());
        if (!eventsError.empty()) std::fprintf(stderr, "batchpilot-cli: %s\n", eventsError.c_str());
        return result.badInput ? kExitBadInput : kExitFailed;
    }
    const auto& last = reporter.lastStep();
    std::printf("\n%s after %lld steps: loss %.4f, micro-batch %lld, %d OOM event(s) recovered, peak %.1f MiB\n",
                result.stopped ? "stopped" : "done", static_cast<long long>(result.steps), last.loss,
                static_cast<long long>(result.microBatch), reporter.oomCount(), core::toMiB(last.peakBytes));
    if (const std::string validation = reporter.validationSummary(); !validation.empty())
        std::printf("%s\n", validation.c_str());
    std::fflush(stdout);
    // Whatever --quiet says: a run whose results were not saved must not look like a success.
    int status = 0;
    if (!result.checkpointError.empty()) {
        std::fprintf(stderr, "batchpilot-cli: error: %s\n", result.checkpointError.c_str());
        status = kExitNotSaved;
    }
    if (!eventsError.empty()) {
        std::fprintf(stderr, "batchpilot-cli: error: %s\n", eventsError.c_str());
        status = kExitNotSaved;
    }
    if (const int number = g_signal.load(); number != 0 && result.stopped) {
        std::fprintf(stderr, "batchpilot-cli: stopped by signal %d after %lld steps%s\n", number,
                     static_cast<long long>(result.steps),
                     request->options.checkpoint.directory.empty() ? "" : "; the checkpoint holds the last step");
        if (status == 0) status = 128 + number;
    }
    return status;
}
