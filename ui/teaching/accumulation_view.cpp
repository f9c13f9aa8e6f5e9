#include "ui/teaching/accumulation_view.h"

#include <algorithm>

#include <QLabel>
#include <QPainter>
#include <QPainterPath>
#include <QVBoxLayout>
#include <QVariantAnimation>

#include "core/plan/accumulation_plan.h"
#include "ui/session/event_text.h"
#include "ui/teaching/micro_batch_table.h"

namespace batchpilot::ui {

/// The bar itself; paints from the view's state.
class AccumulationBar : public QWidget {
public:
    explicit AccumulationBar(AccumulationView* view) : QWidget(view), m_view(view) {
        setMinimumHeight(34);
        setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
    }
    QSize sizeHint() const override { return {400, 36}; }

protected:
    void paintEvent(QPaintEvent*) override;

private:
    AccumulationView* m_view;
};

void AccumulationBar::paintEvent(QPaintEvent*) {
    const AccumulationView& v = *m_view;
    QPainter p(this);
    p.setRenderHint(QPainter::Antialiasing);
    const QPalette pal = palette();
    const bool dark = pal.color(QPalette::Window).lightness() < 128;
    const QRectF bar = QRectF(rect()).adjusted(1.5, 1.5, -1.5, -1.5);
    p.setPen(QPen(pal.color(QPalette::Mid), 1));
    p.setBrush(pal.color(QPalette::Base));
    p.drawRoundedRect(bar, 3, 3);
    if (v.m_target <= 0) return;

    const double scale = bar.width() / static_cast<double>(v.m_target);
    const auto span = [&](qint64 offset, qint64 size) {
        const double x0 = bar.left() + std::clamp<double>(offset * scale, 0, bar.width());
        const double x1 = bar.left() + std::clamp<double>((offset + size) * scale, 0, bar.width());
        return QRectF(x0, bar.top(), std::max(x1 - x0, 1.0), bar.height());
    };

    const QColor oom = dark ? QColor(0xff, 0x5c, 0x5c) : QColor(0xd6, 0x27, 0x28);
    // Work lost to an OOM, replayed.
    for (const auto& s : v.m_lost) {
        QColor ghost = oom;
        ghost.setAlpha(60);
        p.fillRect(span(s.offset, s.size), ghost);
        p.fillRect(span(s.offset, s.size), QBrush(oom, Qt::BDiagPattern));
    }
    // Completed micro-batches, alternating shades so each one is visible.
    const QColor fillA = dark ? QColor(0x4f, 0xa3, 0xf7) : QColor(0x1f, 0x5f, 0xbf);
    const QColor fillB = dark ? QColor(0x3a, 0x7d, 0xc4) : QColor(0x4a, 0x86, 0xd9);
    const QColor probe = dark ? QColor(0x4c, 0xd1, 0x7a) : QColor(0x1b, 0x9e, 0x4b);
    for (std::size_t i = 0; i < v.m_segments.size(); ++i) {
        const auto& s = v.m_segments[i];
        p.fillRect(span(s.offset, s.size).adjusted(0, 3, 0, -3), s.probeTrial ? probe : (i % 2 ? fillB : fillA));
    }
    // Several devices: the other ranks' shares, tinted, each split by its own micro-batch, and a
    // boundary between the ranks; this window's micro-batches fill rank 0's share.
    qint64 rankOffset = 0;
    for (const core::RankStep& rank : v.m_ranks) {
        const QRectF share = span(rankOffset, rank.share);
        if (rank.rank > 0) {
            QColor tint = pal.color(QPalette::Highlight);
            tint.setAlpha(45);
            p.fillRect(share.adjusted(0, 3, 0, -3), tint);
            QColor tick = pal.color(QPalette::Text);
            tick.setAlpha(70);
            p.setPen(QPen(tick, 1));
            // A tick per micro-batch where they stand 3 pixels apart, as rank 0's below: denser
            // ones would only fill the share (a share of 2^31 at a micro-batch of 1 took minutes).
            const core::EvenSplit even = core::EvenSplit::of(rank.share, rank.microBatch);
            if (even.parts > 1 && share.width() / static_cast<double>(even.parts) >= 3) {
                for (qint64 i = 1; i < even.parts; ++i) {
                    const double x = bar.left() + static_cast<double>(rankOffset + even.offsetOf(i)) * scale;
                    p.drawLine(QPointF(x, bar.top() + 4), QPointF(x, bar.bottom() - 4));
                }
            }
            p.setPen(pal.color(QPalette::Text));
            p.drawText(share.adjusted(4, 0, -4, 0), Qt::AlignCenter | Qt::TextSingleLine,
                       AccumulationView::tr("rank %1 · %2").arg(rank.rank).arg(QString::fromStdString(rank.device)));
            p.setPen(QPen(pal.color(QPalette::Text), 2));
            p.drawLine(QPointF(share.left(), bar.top()), QPointF(share.left(), bar.bottom()));
        }
        rankOffset += rank.share;
    }
    // Planned micro-batch boundaries (with several devices, within rank 0's share).
    const qint64 planned = v.m_ranks.empty() ? v.m_target : v.m_ranks.front().share;
    if (v.m_microBatch > 0 && planned > 0) {
        const core::EvenSplit even = core::EvenSplit::of(planned, v.m_microBatch);
        if (even.parts > 1 && bar.width() / static_cast<double>(even.parts) >= 3) {
            QColor tick = pal.color(QPalette::Text);
            tick.setAlpha(90);
            p.setPen(QPen(tick, 1));
            for (qint64 i = 1; i < even.parts; ++i) {
                const double x = bar.left() + even.offsetOf(i) * scale;
                p.drawLine(QPointF(x, bar.top() + 2), QPointF(x, bar.bottom() - 2));
            }
        }
    }
    // Where OOMs hit.
    p.setPen(QPen(oom, 2.5));
    for (qint64 offset : v.m_oomOffsets) {
        const double x = bar.left() + std::clamp<double>(offset * scale, 0, bar.width());
        p.drawLine(QPointF(x, bar.top()), QPointF(x, bar.bottom()));
    }
    // The micro-batch the trainer waits to run (step-by-step mode), dashed.
    if (v.m_pending && (v.m_pending->step == v.m_step || v.m_segments.empty())) {
        p.setPen(QPen(pal.color(QPalette::Highlight), 2, Qt::DashLine));
        p.setBrush(Qt::NoBrush);
        p.drawRect(span(v.m_pending->offset, v.m_pending->size).adjusted(1, 2, -1, -2));
    }
    // The optimizer step flash.
    if (v.m_flashLevel > 0) {
        QColor flash(Qt::white);
        flash.setAlphaF(0.6 * v.m_flashLevel);
        QColor edge(0xff, 0xc1, 0x07);
        edge.setAlphaF(v.m_flashLevel);
        p.setPen(QPen(edge, 3));
        p.setBrush(flash);
        p.drawRoundedRect(bar, 3, 3);
    }
}

AccumulationView::AccumulationView(QWidget* parent)
    : QWidget(parent),
      m_caption(new QLabel),
      m_status(new QLabel),
      m_badge(new QLabel),
      m_flash(new QVariantAnimation(this)) {
    m_bar = new AccumulationBar(this);
    m_table = new MicroBatchTable(this);
    m_badge->setObjectName(QStringLiteral("optimizerStepBadge"));
    m_badge->setStyleSheet(
        QStringLiteral("background: #ffc107; color: #202020; border-radius: 3px; "
                       "padding: 1px 6px; font-weight: bold;"));
    m_badge->setToolTip(
        tr("The optimizer changed the weights once, with the gradient summed over "
           "every micro-batch of this batch: one step per target batch, however "
           "many micro-batches it took."));
    m_badge->hide();
    m_status->setToolTip(
        tr("Which optimizer step is being accumulated, how many of the target "
           "batch's samples are done, and the length of the gradient summed so "
           "far."));
    m_caption->setObjectName(QStringLiteral("accumulationCaption"));
    m_caption->setTextInteractionFlags(Qt::TextSelectableByMouse);
    QFont bold = m_caption->font();
    bold.setBold(true);
    m_caption->setFont(bold);
    m_status->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
    // A long caption gives way (it has a tooltip); the step count stays whole.
    m_caption->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    m_status->setSizePolicy(QSizePolicy::Minimum, QSizePolicy::Preferred);
    setToolTip(
        tr("The current training batch. Each block is a micro-batch whose backward pass "
           "finished; its gradients add up until the whole target batch is done, then the "
           "optimizer steps once (the bar flashes). Red lines: out-of-memory errors; red "
           "hatching: work thrown away and replayed at a smaller micro-batch. Green: probe "
           "trials whose gradients were kept."));

    auto* top = new QHBoxLayout;
    top->setContentsMargins(0, 0, 0, 0);
    top->addWidget(m_caption, 1);
    top->addWidget(m_badge);
    top->addWidget(m_status);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(6, 4, 6, 4);
    layout->setSpacing(3);
    layout->addLayout(top);
    layout->addWidget(m_bar);
    layout->addWidget(m_table, 1);

    m_flash->setStartValue(1.0);
    m_flash->setEndValue(0.0);
    m_flash->setDuration(350);
    connect(m_flash, &QVariantAnimation::valueChanged, this, [this](const QVariant& value) {
        m_flashLevel = value.toDouble();
        m_bar->update();
    });
    updateCaption();
}

QString AccumulationView::caption() const {
    return m_caption->text();
}

qint64 AccumulationView::filledSamples() const {
    return m_filled;
}

QString AccumulationView::stepBadge() const {
    return m_badge->isHidden() ? QString() : m_badge->text();
}

void AccumulationView::startBatch(qint64 step) {
    m_step = step;
    m_segments.clear();
    m_filled = 0;
    m_lost.clear();
    m_oomOffsets.clear();
    m_replays = 0;
    m_gradientNorm = 0;
    if (m_batching)
        m_badgeHideDue = true;
    else
        m_badge->hide();
    m_badgeDue = false;
    tableClear();
    if (m_pending) tablePending(m_pending, true);
}

void AccumulationView::tableClear() {
    if (m_batching)
        m_tableCopy = {};
    else
        m_table->tableModel()->clear();
}

void AccumulationView::tableAdd(const core::MicroBatchDone& done) {
    if (!m_batching) {
        m_table->tableModel()->addMicroBatch(done);
        return;
    }
    m_tableCopy.pending.reset();  // the pending micro-batch is now committed
    m_tableCopy.rows.push_back(done);
}

void AccumulationView::tablePending(const std::optional<core::StepModeWaiting>& waiting, bool sameBatch) {
    if (!m_batching) {
        m_table->tableModel()->setPending(waiting, sameBatch);
        return;
    }
    if (!waiting) {
        m_tableCopy.pending.reset();
        return;
    }
    m_tableCopy.pending = waiting;
    m_tableCopy.sameBatch = sameBatch;
}

void AccumulationView::showBadge() {
    // Short, so the plan caption keeps its room; the micro-batch count is in the tooltip.
    m_badge->setText(tr("✓ optimizer step %1").arg(m_lastCommitted));
    m_badge->setToolTip(tr("Optimizer step %1 used the gradient summed over %2 micro-batches. The "
                           "optimizer changes the weights once per target batch, however many "
                           "micro-batches it took.")
                            .arg(m_lastCommitted)
                            .arg(m_badgeMicroBatches));
    m_badge->show();
    m_flash->stop();
    m_flash->start();
}

void AccumulationView::handleEvents(const QList<core::Event>& events) {
    constexpr qsizetype kLargeDelivery = 64;
    if (events.size() < kLargeDelivery) {
        for (const core::Event& event : events) handle(event);
        return;
    }
    const MicroBatchTableModel* model = m_table->tableModel();
    m_tableCopy = {model->rows(), model->pending(), model->pendingSameBatch()};
    m_batching = true;
    m_badgeDue = m_badgeHideDue = false;
    for (const core::Event& event : events) handle(event);
    m_batching = false;
    m_table->tableModel()->reset(std::move(m_tableCopy.rows), m_tableCopy.pending, m_tableCopy.sameBatch);
    m_tableCopy = {};
    if (m_badgeDue)
        showBadge();
    else if (m_badgeHideDue)
        m_badge->hide();
    updateCaption();
    m_bar->update();
}

void AccumulationView::handle(const core::Event& event) {
    if (const auto* done = std::get_if<core::MicroBatchDone>(&event)) {
        if (done->step != m_step)
            startBatch(done->step);
        else if (done->offset == 0 && !m_segments.empty()) {
            // The batch starts over: an OOM threw the earlier micro-batches away.
            m_lost.insert(m_lost.end(), m_segments.begin(), m_segments.end());
            m_segments.clear();
            m_filled = 0;
            ++m_replays;
        }
        if (done->targetBatch > 0) m_target = done->targetBatch;
        m_segments.push_back({done->offset, done->size, done->probeTrial});
        m_filled = std::max<qint64>(m_filled, done->offset + done->size);
        m_pending.reset();
        m_gradientNorm = done->gradientNorm;
        tableAdd(*done);
    } else if (const auto* oom = std::get_if<core::OomEvent>(&event)) {
        m_pending.reset();
        tablePending(std::nullopt, true);
        if (oom->step != m_step) startBatch(oom->step);
        m_oomOffsets.push_back(filledSamples());
    } else if (const auto* stepped = std::get_if<core::OptimizerStepped>(&event)) {
        m_lastCommitted = stepped->step;
        m_badgeMicroBatches = stepped->microBatches;
        m_pending.reset();
        tablePending(std::nullopt, true);
        if (m_batching)
            m_badgeDue = true;
        else
            showBadge();
    } else if (const auto* ranks = std::get_if<core::RanksStepped>(&event)) {
        m_ranks = ranks->ranks;
        // The next batch is split by the next shares when they changed.
        for (size_t r = 0; r < m_ranks.size() && r < ranks->nextShares.size(); ++r)
            m_ranks[r].share = ranks->nextShares[r];
        m_target = 0;
        for (const core::RankStep& rank : m_ranks) m_target += rank.share;
    } else if (const auto* waiting = std::get_if<core::StepModeWaiting>(&event)) {
        m_pending = *waiting;
        if (waiting->targetBatch > 0 && m_segments.empty()) m_target = waiting->targetBatch;
        tablePending(m_pending, waiting->step == m_step || m_segments.empty());
    } else {
        return;
    }
    if (m_batching) return;  // the widgets follow at the delivery's end
    updateCaption();
    m_bar->update();
}

void AccumulationView::setPlan(const RunPlan& plan) {
    // With several devices the plan is rank 0's share; the bar stays the whole batch.
    if (plan.targetBatch > 0 && m_ranks.empty()) m_target = plan.targetBatch;
    m_microBatch = plan.microBatch;
    m_accumulation = plan.accumulationSteps;
    updateCaption();
    m_bar->update();
}

void AccumulationView::clear() {
    m_pending.reset();
    m_ranks.clear();
    startBatch(0);
    m_target = m_microBatch = m_accumulation = 0;
    m_lastCommitted = 0;
    m_flashLevel = 0;
    updateCaption();
    m_bar->update();
}

void AccumulationView::updateCaption() {
    if (m_target <= 0 || m_microBatch <= 0) {
        m_caption->setText(tr("Training batch: waiting for the probe to choose a micro-batch"));
        m_status->clear();
        return;
    }
    if (m_ranks.empty()) {
        m_caption->setText(tr("Training batch: %1").arg(planCaption(m_target, m_microBatch)));
    } else {
        QStringList parts;
        for (const core::RankStep& rank : m_ranks) parts << tr("rank %1: %2").arg(rank.rank).arg(rank.share);
        m_caption->setText(
            tr("Training batch: %1 = %2 — here rank 0: %3")
                .arg(m_target)
                .arg(parts.join(QStringLiteral(" + ")), planCaption(m_ranks.front().share, m_microBatch)));
    }
    m_caption->setToolTip(m_caption->text());
    QString status = tr("step %1: %2/%3 samples").arg(m_step).arg(filledSamples()).arg(m_target);
    if (m_replays > 0) status += tr(", replayed ×%1 after OOM").arg(m_replays);
    if (m_gradientNorm > 0) status += tr(", gradient norm %1").arg(m_gradientNorm, 0, 'g', 4);
    m_status->setText(status);
    m_status->setMinimumWidth(m_status->sizeHint().width());
}

}  // namespace batchpilot::ui
