#pragma once

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/events.h"

namespace batchpilot::core {
class Trainer;
}

namespace batchpilot::app {

/// Prints the run for a person — probe trials, the chosen plan, a progress line per step with
/// loss, samples/s, peak memory and ETA — and writes every event as JSON Lines when asked.
/// On a terminal the step line is rewritten in place; when piped, each step is its own line.
class ConsoleReporter final : public core::EventSink {
public:
    ConsoleReporter(std::FILE* out, bool interactive, bool quiet);

    /// Opens the JSON Lines file; returns false with `error` set when it cannot.
    bool openEvents(const std::string& path, std::string& error);
    /// Lets Ctrl-C stop the run cleanly: checked on every event.
    void watchInterrupt(core::Trainer* trainer, const std::atomic<bool>* interrupted);

    void onEvent(const core::Event& event) override;

    /// The last step's metrics line, for the final summary.
    const core::StepMetrics& lastStep() const { return m_lastStep; }
    int oomCount() const { return m_ooms; }

private:
    void line(const std::string& text);

    std::FILE* m_out;
    bool m_interactive;
    bool m_quiet;
    bool m_openLine = false;
    std::ofstream m_events;
    core::Trainer* m_trainer = nullptr;
    const std::atomic<bool>* m_interrupted = nullptr;
    bool m_stopSent = false;
    core::StepMetrics m_lastStep;
    int m_ooms = 0;
};

}  // namespace batchpilot::app
