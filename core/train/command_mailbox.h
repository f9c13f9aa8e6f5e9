#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/config/options.h"

namespace batchpilot::core {

/// The trainer's commands: posted from any thread (the Trainer's public methods), taken by the
/// run thread where they apply: stop, pause and step mode at micro-batch boundaries; target batch,
/// device, re-probe, the equivalence check and memory savers at the next training batch (take()).
///
/// Thread rules: every method may be called from any thread; the wait*() methods and take() are
/// called by the run thread only.
class CommandMailbox {
public:
    /// The batch-boundary commands posted since the last take().
    struct Batch {
        std::optional<std::pair<int64_t, LrScaling>> target;
        /// Device switches by rank (rank 0 alone on one device; later requests replace earlier ones).
        std::map<int, std::string> devices;
        std::optional<int64_t> equivalence;  ///< samples of the equivalence check (0: the whole batch)
        bool reprobe = false;
        bool surveySavers = false;           ///< measure every memory saver (SaverSurvey)
        std::optional<MemorySavers> savers;  ///< use these memory savers from now on
    };

    explicit CommandMailbox(bool stepMode) : m_stepMode(stepMode) {}

    // Posted by the Trainer's public methods.
    void stop();
    void pause();
    void resume();
    void setTarget(int64_t target, LrScaling rule);
    void reprobe();
    void switchDevice(const std::string& device, int rank);
    void checkEquivalence(int64_t samples);
    void surveySavers();
    void setMemorySavers(MemorySavers savers);
    void setStepMode(bool on);
    void advance();
    void finishBatch();

    bool stopRequested() const;
    /// A pause was asked for and not yet resumed (several devices vote on it at a batch boundary).
    bool pauseRequested() const;
    /// Set with stop(); read without the lock by the data loaders (core/base/cancel.h).
    std::atomic<bool>& cancelFlag() { return m_cancel; }
    bool stepMode() const;

    /// Takes the batch-boundary commands.
    Batch take();
    /// Takes a pending equivalence check only.
    std::optional<int64_t> takeEquivalence();
    /// Blocks while paused; `paused` and `resumed` run outside the lock when the wait starts and
    /// ends (not when stopped meanwhile). False when the run is to stop.
    bool waitWhilePaused(const std::function<void()>& paused, const std::function<void()>& resumed);
    /// In step mode, blocks until the user allows the next micro-batch (advance), lets the batch
    /// finish (finishBatch) or leaves step mode; `announce` runs outside the lock before it waits.
    /// False when the run is to stop.
    bool waitForAdvance(const std::function<void()>& announce);
    /// The training batch is done: finishBatch() no longer applies.
    void batchDone();

private:
    mutable std::mutex m_mutex;
    std::condition_variable m_wake;
    std::atomic<bool> m_cancel{false};
    bool m_stop = false;
    bool m_pause = false;
    bool m_stepMode = false;        ///< step-by-step: wait before each micro-batch
    int64_t m_advanceTokens = 0;    ///< micro-batches the user allowed to run
    bool m_finishingBatch = false;  ///< run the rest of the current batch without waiting
    Batch m_batch;
};

}  // namespace batchpilot::core
