#pragma once

#include <optional>

#include <QWidget>

#include "core/events/events.h"
#include "core/config/options.h"

class QLabel;
class QPushButton;
class QTableWidget;

namespace batchpilot::ui {

/// The "Memory savers" panel: the last survey (core::SaverSurvey) side by side — per saver the
/// predicted micro-batch, accumulation steps, samples/s (and against the savers in use), peak and
/// memory per sample — with the suggestion selected, one click to apply the selected row at the
/// next training batch, and a button to measure again. After a change it compares the prediction
/// with what the probe then found. Hidden until a survey arrives (one follows a small micro-batch,
/// or Run → Measure memory savers).
class SaversView : public QWidget {
    Q_OBJECT
public:
    explicit SaversView(QWidget* parent = nullptr);
    void handle(const core::Event& event);
    void clear();
    /// Non-empty: the run shown cannot be steered from here (it is read from its folder), and why;
    /// Measure again and Apply are off and say it. Empty: they act on the run.
    void setReadOnly(const QString& why);
    QTableWidget* table() const { return m_table; }
    QPushButton* applyButton() const { return m_apply; }
    QPushButton* measureButton() const { return m_measure; }
    QString captionText() const;
    /// The savers of the selected row; nullopt when none is selected.
    std::optional<core::MemorySavers> selectedSavers() const;

Q_SIGNALS:
    void applyRequested(core::MemorySavers savers);
    void surveyRequested();

private:
    void updateApply();
    void updateCaption();
    /// The saver names with "(in use)" and "— suggested" where they apply now.
    void markRows();

    QLabel* m_caption;
    QTableWidget* m_table;
    QPushButton* m_measure;
    QPushButton* m_apply;
    QString m_readOnly;
    std::optional<core::SaverSurvey> m_survey;
    std::string m_current;                              ///< the savers in use, as the last event said
    std::optional<core::MemorySaversChanged> m_change;  ///< the last change, until its probe ends
    QString m_outcome;                                  ///< the last change against its probe, in words
};

}  // namespace batchpilot::ui
