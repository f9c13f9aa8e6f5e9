#pragma once

#include <QString>

namespace batchpilot::ui {

/// Colour scheme of the window and its charts.
enum class Theme { System, Light, Dark };

/// Applies a light or dark palette to the application (Fusion style for both, so they look the
/// same everywhere); System keeps the platform's palette. Returns true when the result is dark.
bool applyTheme(Theme theme);

/// True when the application's current palette is dark.
bool paletteIsDark();

// The app's few style sheets, in one place (the palette does the rest).

/// The window's error banner (#errorBox, with a QLabel inside), for a light or dark palette.
QString errorBoxStyleSheet(bool dark);
/// A form field whose value cannot start a run.
QString invalidFieldStyleSheet();
/// Text that says what is wrong (the run panel's problem line, a failed check); bold when `strong`.
QString problemTextStyleSheet(bool strong = false);

}  // namespace batchpilot::ui
