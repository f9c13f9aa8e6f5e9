#pragma once

#include <cstdint>

namespace batchpilot::core {

/// The micro-batch of validation passes. Without gradients no activation is kept for backward,
/// so a micro-batch several times training's fits: a pass starts at training's (or where the last
/// pass ended), which fits next to the gradients and optimizer state, and doubles while a
/// micro-batch's memory would still fit twice over, up to four times training's (at least 256):
/// larger ones buy no speed. An out-of-memory error halves it and is remembered: no later pass
/// goes back to a size that ran out. (Starting at twice training's ran out of memory on a real GPU
/// whenever training ran close to its limit.)
class ValidationSizes {
public:
    /// A pass over `total` held-out samples (≥ 1) begins, training's micro-batch being `training`:
    /// size() is its first micro-batch's.
    void begin(int64_t total, int64_t training);
    /// The size to evaluate now.
    int64_t size() const { return m_size; }
    /// A micro-batch of `n` samples ran out of memory: false when `n` was 1 (validation does not
    /// fit at all), else size() is halved.
    bool outOfMemory(int64_t n);
    /// A micro-batch of `n` samples ran: its own memory `activations` bytes, next to `resident`
    /// bytes held, of `usable`. size() doubles where twice the activations fit and no size that
    /// large ran out.
    void ran(int64_t n, int64_t resident, int64_t activations, int64_t usable);
    /// The pass is over: the next one begins at size().
    void end() { m_next = m_size; }

private:
    int64_t m_next = 0;     ///< where the next pass begins (0: none ran yet)
    int64_t m_ceiling = 0;  ///< the smallest size that ran out of memory (0: none)
    int64_t m_size = 0;
    int64_t m_cap = 0;
};

}  // namespace batchpilot::core
