#pragma once

namespace batchpilot::ui {

/// Colour scheme of the window and its charts.
enum class Theme { System, Light, Dark };

/// Applies a light or dark palette to the application (Fusion style for both, so they look the
/// same everywhere); System keeps the platform's palette. Returns true when the result is dark.
bool applyTheme(Theme theme);

/// True when the application's current palette is dark.
bool paletteIsDark();

}  // namespace batchpilot::ui
