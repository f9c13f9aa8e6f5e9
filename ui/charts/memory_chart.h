#pragma once

#include <vector>

#include <QList>

#include "ui/charts/live_chart.h"
#include "ui/charts/series_store.h"

class QGraphicsItem;
class QLineSeries;
class QScatterSeries;

namespace batchpilot::ui {

/// Device memory over time (MiB against seconds): allocated, peak, reserved (only where the
/// device has an allocator cache), the capacity and the headroom (usable) lines, and every
/// out-of-memory error as a red vertical marker whose tooltip says phase, micro-batch and the
/// bytes requested.
class MemoryChart : public LiveChart {
    Q_OBJECT
public:
    explicit MemoryChart(QWidget* parent = nullptr);
    ~MemoryChart() override;

    bool timeAxis() const override { return true; }
    void handle(const core::Event& event) override;
    void clear() override;
    QStringList dataSeries() const override {
        return {QStringLiteral("memory_allocated_bytes"), QStringLiteral("memory_reserved_bytes"),
                QStringLiteral("memory_peak_bytes"),      QStringLiteral("memory_capacity_bytes"),
                QStringLiteral("step_peak_bytes"),        QStringLiteral("oom_requested_bytes")};
    }

    const SeriesStore& allocatedStore() const { return m_allocated; }
    int oomMarkerCount() const { return static_cast<int>(m_ooms.size()); }
    /// Tooltip text of OOM marker `index` (tests).
    QString oomText(int index) const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    struct Oom {
        double time = 0;
        QString text;
    };
    void placeMarkers();

    static constexpr std::size_t kMaxOoms = 10000;

    SeriesStore m_allocated;
    SeriesStore m_reserved;
    SeriesStore m_peak;
    SeriesStore m_capacity;
    SeriesStore m_headroom;
    bool m_hasCache = false;
    std::vector<Oom> m_ooms;

    QLineSeries* m_allocatedSeries = nullptr;
    QLineSeries* m_reservedSeries = nullptr;
    QLineSeries* m_peakSeries = nullptr;
    QLineSeries* m_capacitySeries = nullptr;
    QLineSeries* m_headroomSeries = nullptr;
    QScatterSeries* m_oomSeries = nullptr;
    QAbstractAxis* m_yAxis = nullptr;
    QList<QGraphicsItem*> m_markerItems;
};

}  // namespace batchpilot::ui
