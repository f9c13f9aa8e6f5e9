#include "core/train/command_mailbox.h"

#include <algorithm>
#include <utility>

namespace batchpilot::core {

void CommandMailbox::stop() {
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_cancel.store(true);
    m_wake.notify_all();
}

void CommandMailbox::pause() {
    std::lock_guard lock(m_mutex);
    m_pause = true;
}

void CommandMailbox::resume() {
    {
        std::lock_guard lock(m_mutex);
        m_pause = false;
    }
    m_wake.notify_all();
}

void CommandMailbox::setTarget(int64_t target, LrScaling rule) {
    std::lock_guard lock(m_mutex);
    m_batch.target = std::make_pair(target, rule);
}

void CommandMailbox::reprobe() {
    std::lock_guard lock(m_mutex);
    m_batch.reprobe = true;
}

void CommandMailbox::switchDevice(const std::string& device, int rank) {
    std::lock_guard lock(m_mutex);
    m_batch.devices[rank] = device;
}

void CommandMailbox::checkEquivalence(int64_t samples) {
    std::lock_guard lock(m_mutex);
    m_batch.equivalence = std::max<int64_t>(0, samples);
}

void CommandMailbox::surveySavers() {
    std::lock_guard lock(m_mutex);
    m_batch.surveySavers = true;
}

void CommandMailbox::setMemorySavers(MemorySavers savers) {
    std::lock_guard lock(m_mutex);
    m_batch.savers = savers;
}

void CommandMailbox::setStepMode(bool on) {
    {
        std::lock_guard lock(m_mutex);
        m_stepMode = on;
        m_advanceTokens = 0;
    }
    m_wake.notify_all();
}

void CommandMailbox::advance() {
    {
        std::lock_guard lock(m_mutex);
        if (!m_stepMode) return;
        ++m_advanceTokens;
    }
    m_wake.notify_all();
}

void CommandMailbox::finishBatch() {
    {
        std::lock_guard lock(m_mutex);
        if (!m_stepMode) return;
        m_finishingBatch = true;
        m_advanceTokens = 0;
    }
    m_wake.notify_all();
}

bool CommandMailbox::stopRequested() const {
    std::lock_guard lock(m_mutex);
    return m_stop;
}

bool CommandMailbox::pauseRequested() const {
    std::lock_guard lock(m_mutex);
    return m_pause && !m_stop;
}

bool CommandMailbox::stepMode() const {
    std::lock_guard lock(m_mutex);
    return m_stepMode;
}

CommandMailbox::Batch CommandMailbox::take() {
    std::lock_guard lock(m_mutex);
    return std::exchange(m_batch, Batch{});
}

std::optional<int64_t> CommandMailbox::takeEquivalence() {
    std::lock_guard lock(m_mutex);
    return std::exchange(m_batch.equivalence, std::nullopt);
}

bool CommandMailbox::waitWhilePaused(const std::function<void()>& paused, const std::function<void()>& resumed) {
    std::unique_lock lock(m_mutex);
    if (m_pause && !m_stop) {
        lock.unlock();
        paused();
        lock.lock();
        m_wake.wait(lock, [&] { return !m_pause || m_stop; });
        const bool stopping = m_stop;
        lock.unlock();
        if (!stopping) resumed();
        lock.lock();
    }
    return !m_stop;
}

bool CommandMailbox::waitForAdvance(const std::function<void()>& announce) {
    std::unique_lock lock(m_mutex);
    if (!m_stepMode || m_finishingBatch || m_stop) return !m_stop;
    if (m_advanceTokens > 0) {
        --m_advanceTokens;
        return true;
    }
    lock.unlock();
    announce();
    lock.lock();
    m_wake.wait(lock, [&] { return !m_stepMode || m_advanceTokens > 0 || m_finishingBatch || m_stop; });
    if (m_stepMode && !m_finishingBatch && m_advanceTokens > 0) --m_advanceTokens;
    return !m_stop;
}

void CommandMailbox::batchDone() {
    std::lock_guard lock(m_mutex);
    m_finishingBatch = false;
}

}  // namespace batchpilot::core
