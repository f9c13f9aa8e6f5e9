#pragma once

// Core's value types that travel in Qt signals (queued from the worker thread, or read by moc):
// declared once, before any header's moc code instantiates them.

#include <QMetaType>

#include "core/events/events.h"
#include "core/config/options.h"
#include "core/train/trainer.h"

Q_DECLARE_METATYPE(batchpilot::core::Event)
Q_DECLARE_METATYPE(batchpilot::core::RunResult)
Q_DECLARE_METATYPE(batchpilot::core::TrainerOptions)
