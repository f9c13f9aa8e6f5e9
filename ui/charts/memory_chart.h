#pragma once

#include <memory>
#include <vector>

#include <QList>

#include "ui/charts/live_chart.h"
#include "ui/charts/series_store.h"

class QGraphicsItem;
class QLabel;
class QLineSeries;
class QScatterSeries;

namespace batchpilot::ui {

/// Device memory over time (MiB against seconds): allocated, peak, reserved (only where the
/// device has an allocator cache), the capacity and the headroom (usable) lines, and every
/// out-of-memory error as a red vertical marker whose tooltip says phase, micro-batch and the
/// bytes requested. With several devices those are rank 0's (this window trains it), and each
/// other rank has a lane in a colour of its own: its device's peak in each step; its OOMs (as
/// it reported them, RankProbed) are red lines too, their markers on its usable-memory level and
/// their tooltips naming the rank.
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
    /// Several devices: the other ranks' lanes.
    int rankLaneCount() const { return static_cast<int>(m_rankLanes.size()); }
    /// Rank `rank`'s peak per step (MiB against seconds); nullptr when it has no lane.
    const SeriesStore* rankPeaks(int rank) const;
    /// The legend's name of rank `rank`'s lane (empty when it has none).
    QString rankLaneName(int rank) const;
    /// The line under the chart that says what the lines are.
    QString captionText() const;

protected:
    void refresh(bool follow) override;
    void applyColors(const ChartColors& colors) override;

private:
    struct Oom {
        double time = 0;
        QString text;
        double level = -1;  ///< where its marker sits (MiB); below 0: rank 0's capacity line
    };
    void addOom(const core::OomEvent& oom, const QString& who, double level);
    void addOom(const core::ProbeTrial& trial, const QString& who, double level);
    void placeMarkers();
    struct RankLane {
        int rank = 0;
        SeriesStore peaks{10000};
        QLineSeries* series = nullptr;
        double usable = -1;  ///< its usable memory (MiB) as its last probe reported, -1 before
        /// Its devices, each from the time it was first reported on it (a device switch adds one).
        QList<QPair<double, QString>> devices;
    };
    /// Rank `rank`'s lane, on `device` since `time` at the latest.
    RankLane& laneOf(int rank, const QString& device, double time);
    /// The caption for one device, or for several (whose lines are rank 0's).
    void setCaption(bool ranks);

    static constexpr std::size_t kMaxOoms = 10000;

    SeriesStore m_allocated;
    SeriesStore m_reserved;
    SeriesStore m_peak;
    SeriesStore m_capacity;
    SeriesStore m_headroom;
    bool m_hasCache = false;
    std::vector<Oom> m_ooms;
    std::vector<std::unique_ptr<RankLane>> m_rankLanes;

    QLineSeries* m_allocatedSeries = nullptr;
    QLineSeries* m_reservedSeries = nullptr;
    QLineSeries* m_peakSeries = nullptr;
    QLineSeries* m_capacitySeries = nullptr;
    QLineSeries* m_headroomSeries = nullptr;
    QScatterSeries* m_oomSeries = nullptr;
    QAbstractAxis* m_yAxis = nullptr;
    QLabel* m_caption = nullptr;
    QList<QGraphicsItem*> m_markerItems;
};

}  // namespace batchpilot::ui
