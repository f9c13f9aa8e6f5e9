#pragma once

#include <optional>

#include <QColor>
#include <QWidget>

#include "core/plan/probe_search.h"

class QLabel;
class QSlider;
class QSpinBox;

namespace batchpilot::ui {

/// "What if the micro-batch were n": a slider and a spin box for n, and for that n what the
/// fitted memory model predicts (core::predictWhatIf): the peak, the plan for the target batch
/// ("1024 = 4 × 256 …") and a coloured verdict — fits, fits but past the headroom line, or does
/// not fit. Disabled until there is a memory model.
///
/// Thread rules: GUI thread only.
class WhatIfRow : public QWidget {
    Q_OBJECT
public:
    enum class Verdict { Unknown, Fits, PastHeadroom, DoesNotFit };

    explicit WhatIfRow(QWidget* parent = nullptr);

    /// What predictions use. Without a model the row is disabled. `capacityBytes` 0: unknown,
    /// the usable line alone decides.
    void setModel(const std::optional<core::MemoryModel>& model, qint64 targetBatch, qint64 usableBytes,
                  qint64 capacityBytes);
    /// Sizes from 1 to `maximum`.
    void setMaximum(qint64 maximum);
    /// Moves the slider and the spin box to `microBatch` (clamped to the range).
    void setMicroBatch(qint64 microBatch);
    qint64 microBatch() const;

    /// Verdict and prediction as one line, e.g. "fits — micro-batch 100: predicted peak …".
    QString text() const;
    Verdict verdict() const { return m_verdict; }
    void setVerdictColors(const QColor& fits, const QColor& pastHeadroom, const QColor& doesNotFit);

    QSlider* slider() const { return m_slider; }
    QSpinBox* spinBox() const { return m_spin; }

Q_SIGNALS:
    /// The size or the prediction changed.
    void changed();

private:
    void predict();
    void applyVerdictColor();

    std::optional<core::MemoryModel> m_model;
    qint64 m_target = 0;
    qint64 m_usable = 0;
    qint64 m_capacity = 0;
    Verdict m_verdict = Verdict::Unknown;
    QColor m_colors[3];
    QColor m_shown;  ///< the verdict's colour set last: a style sheet costs a restyle, per probe trial

    QSlider* m_slider = nullptr;
    QSpinBox* m_spin = nullptr;
    QLabel* m_text = nullptr;
    QLabel* m_verdictLabel = nullptr;
};

}  // namespace batchpilot::ui
