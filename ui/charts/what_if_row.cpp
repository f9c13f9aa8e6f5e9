#include "ui/charts/what_if_row.h"

#include <algorithm>
#include <limits>

#include <QHBoxLayout>
#include <QLabel>
#include <QSlider>
#include <QSpinBox>
#include <QVBoxLayout>

#include "core/plan/memory_report.h"
#include "ui/session/event_text.h"

namespace batchpilot::ui {

namespace {

QString mibText(double bytes) {
    return WhatIfRow::tr("%1 MiB").arg(bytes / (1024.0 * 1024.0), 0, 'f', 1);
}

}  // namespace

WhatIfRow::WhatIfRow(QWidget* parent) : QWidget(parent) {
    m_slider = new QSlider(Qt::Horizontal);
    m_slider->setObjectName(QStringLiteral("whatIfSlider"));
    m_slider->setRange(1, 1);
    m_slider->setToolTip(tr("Pick a micro-batch size to see what the fitted memory model predicts for it"));
    m_spin = new QSpinBox;
    m_spin->setObjectName(QStringLiteral("whatIfBox"));
    m_spin->setRange(1, 1);
    m_spin->setSuffix(tr(" samples"));
    m_spin->setToolTip(m_slider->toolTip());
    m_text = new QLabel;
    m_text->setObjectName(QStringLiteral("whatIfText"));
    m_text->setWordWrap(true);
    m_text->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_verdictLabel = new QLabel;
    m_verdictLabel->setObjectName(QStringLiteral("whatIfVerdict"));
    QFont bold = m_verdictLabel->font();
    bold.setBold(true);
    m_verdictLabel->setFont(bold);
    m_colors[0] = QColor(0x1b, 0x9e, 0x4b);
    m_colors[1] = QColor(0xc9, 0x8a, 0x00);
    m_colors[2] = QColor(0xd6, 0x27, 0x28);

    connect(m_slider, &QSlider::valueChanged, this, [this](int value) {
        {
            const QSignalBlocker blocker(m_spin);
            m_spin->setValue(value);
        }
        predict();
    });
    connect(m_spin, &QSpinBox::valueChanged, this, [this](int value) {
        {
            const QSignalBlocker blocker(m_slider);
            m_slider->setValue(value);
        }
        predict();
    });

    auto* pick = new QHBoxLayout;
    pick->setContentsMargins(0, 0, 0, 0);
    pick->addWidget(new QLabel(tr("What if the micro-batch were")));
    pick->addWidget(m_slider, 1);
    pick->addWidget(m_spin);
    auto* result = new QHBoxLayout;
    result->setContentsMargins(0, 0, 0, 0);
    result->addWidget(m_verdictLabel, 0, Qt::AlignTop);
    result->addWidget(m_text, 1);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(6, 0, 6, 4);
    layout->setSpacing(2);
    layout->addLayout(pick);
    layout->addLayout(result);
    predict();
}

void WhatIfRow::setModel(const std::optional<core::MemoryModel>& model, qint64 targetBatch, qint64 usableBytes,
                         qint64 capacityBytes) {
    m_model = model;
    m_target = targetBatch;
    m_usable = usableBytes;
    m_capacity = capacityBytes;
    predict();
}

void WhatIfRow::setMaximum(qint64 maximum) {
    const int top = static_cast<int>(std::clamp<qint64>(maximum, 1, std::numeric_limits<int>::max()));
    {
        const QSignalBlocker sliderBlocker(m_slider);
        const QSignalBlocker spinBlocker(m_spin);
        m_slider->setRange(1, top);
        m_spin->setRange(1, top);
    }
    predict();
}

void WhatIfRow::setMicroBatch(qint64 microBatch) {
    const int value = static_cast<int>(std::clamp<qint64>(microBatch, m_spin->minimum(), m_spin->maximum()));
    if (value == m_spin->value())
        predict();
    else
        m_spin->setValue(value);  // moves the slider and updates the text
}

qint64 WhatIfRow::microBatch() const {
    return m_spin->value();
}

QString WhatIfRow::text() const {
    return m_verdictLabel->text().isEmpty() ? m_text->text()
                                            : m_verdictLabel->text() + QStringLiteral(" — ") + m_text->text();
}

void WhatIfRow::setVerdictColors(const QColor& fits, const QColor& pastHeadroom, const QColor& doesNotFit) {
    m_colors[0] = fits;
    m_colors[1] = pastHeadroom;
    m_colors[2] = doesNotFit;
    applyVerdictColor();
}

void WhatIfRow::predict() {
    m_slider->setEnabled(m_model.has_value());
    m_spin->setEnabled(m_model.has_value());
    if (!m_model) {
        m_verdict = Verdict::Unknown;
        m_verdictLabel->setText(QString());
        m_text->setText(tr("Needs a memory model: at least two probe trials that fit."));
        Q_EMIT changed();
        return;
    }
    const qint64 n = m_spin->value();
    // Unknown capacity (no memory sample yet): judge by the usable line alone.
    const qint64 capacity = m_capacity > 0 ? m_capacity : m_usable;
    const core::WhatIf w = core::predictWhatIf(*m_model, n, m_target, m_usable, capacity);
    m_verdict = w.fitsUsable ? Verdict::Fits : w.fitsCapacity ? Verdict::PastHeadroom : Verdict::DoesNotFit;
    switch (m_verdict) {
    case Verdict::Fits: m_verdictLabel->setText(tr("fits")); break;
    case Verdict::PastHeadroom: m_verdictLabel->setText(tr("fits, but past the headroom line")); break;
    case Verdict::DoesNotFit: m_verdictLabel->setText(tr("does not fit")); break;
    case Verdict::Unknown: break;
    }
    applyVerdictColor();
    QString text = tr("micro-batch %1: predicted peak %2 (usable %3, capacity %4)")
                       .arg(n)
                       .arg(mibText(w.predictedPeakBytes), mibText(static_cast<double>(m_usable)),
                            mibText(static_cast<double>(capacity)));
    if (m_verdict == Verdict::DoesNotFit)
        text += tr(", %1 over capacity").arg(mibText(w.predictedPeakBytes - static_cast<double>(capacity)));
    if (m_target > 0) {
        text += tr("; plan %1").arg(planCaption(m_target, std::min(n, m_target)));
        if (n > m_target) text += tr(", capped at the target batch");
    }
    m_text->setText(text);
    Q_EMIT changed();
}

void WhatIfRow::applyVerdictColor() {
    const QColor color = m_verdict == Verdict::Fits           ? m_colors[0]
                         : m_verdict == Verdict::PastHeadroom ? m_colors[1]
                                                              : m_colors[2];
    if (color == m_shown) return;
    m_shown = color;
    m_verdictLabel->setStyleSheet(QStringLiteral("color: %1;").arg(color.name()));
}

}  // namespace batchpilot::ui
