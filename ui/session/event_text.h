#pragma once

#include <QString>

#include "core/events/events.h"

namespace batchpilot::ui {

/// One event as a row of the event log.
struct EventRow {
    double time = 0;       ///< seconds since the run started
    QString kind;          ///< "probe trial", "OOM", "device switch", ...
    QString details;       ///< one line for people
    bool problem = false;  ///< OOMs, warnings and errors (drawn in red)
};

/// True for events that belong in the log (probe, OOM, state, device and target changes,
/// checkpoints, warnings, errors); false for the high-rate ones that only feed the charts.
bool isLogged(const core::Event& event);

/// Describes an event for the log.
EventRow describeEvent(const core::Event& event);

/// A validation result in words: "after step 40: loss 0.2113, accuracy 93.1%, top-5 99.4% on 180
/// held-out samples (micro-batch 180, 0.05 s)"; metrics that do not apply are left out.
QString validationText(const core::ValidationDone& e);

/// Text for a plan: "4096 = 32 × 128 (micro-batch 128, 32 accumulation steps)" or, when the
/// target does not divide evenly, "1000 = 10 × 91 + 1 × 90 (micro-batch 96, 11 accumulation
/// steps)" — micro-batches differ by at most one sample.
QString planCaption(qint64 targetBatch, qint64 microBatch);

}  // namespace batchpilot::ui
