#pragma once

#include <memory>
#include <vector>

#include <QApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QObject>
#include <QStandardPaths>
#include <QTimer>

/// What the GUI benchmarks share: their application and event-loop helpers (Qt only).
namespace batchpilot::bench {

/// The benchmark's QApplication: the offscreen platform unless QT_QPA_PLATFORM says otherwise,
/// and settings kept apart from a user's (test mode, its own organisation and name).
inline std::unique_ptr<QApplication> benchApplication(int& argc, char** argv, const char* name) {
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QStandardPaths::setTestModeEnabled(true);
    auto app = std::make_unique<QApplication>(argc, argv);
    QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotBench"));
    QCoreApplication::setApplicationName(QString::fromLatin1(name));
    return app;
}

/// The event-loop latency of the thread it lives on: the lateness of a 10 ms precise single-shot
/// timer, re-armed every time it fires, one sample (in ms) per firing.
class LatencyProbe : public QObject {
public:
    static constexpr int kTickMs = 10;

    LatencyProbe() {
        m_timer.setSingleShot(true);
        m_timer.setTimerType(Qt::PreciseTimer);
        connect(&m_timer, &QTimer::timeout, this, [this] {
            samples.push_back(static_cast<double>(m_armed.nsecsElapsed()) / 1e6 - kTickMs);
            arm();
        });
    }
    void arm() {
        m_armed.start();
        m_timer.start(kTickMs);
    }
    void stop() { m_timer.stop(); }
    std::vector<double> samples;

private:
    QTimer m_timer;
    QElapsedTimer m_armed;
};

/// Runs the event loop for `milliseconds`.
inline void spin(int milliseconds) {
    QEventLoop loop;
    QTimer::singleShot(milliseconds, &loop, &QEventLoop::quit);
    loop.exec();
}

}  // namespace batchpilot::bench
