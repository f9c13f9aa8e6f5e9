#pragma once

// Core's value types that travel in Qt signals (queued from the worker thread, or read by moc):
// declared once, before any header's moc code instantiates them.

#include <QMetaType>

#include "core/events.h"
#include "core/options.h"
#include "core/trainer.h"

Q_DECLARE_METATYPE(batchpilot::core::Event)
Q_DECLARE_METATYPE(batchpilot::core::RunResult)
Q_DECLARE_METATYPE(batchpilot::core::TrainerOptions)
