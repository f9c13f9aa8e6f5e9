#include <QtTest>
#include "tests/test_main.h"

#include <QSettings>
#include <QStandardPaths>
#include <QTabWidget>
#include <QTemporaryDir>

#include "core/base/byte_size.h"
#include "core/events/events.h"
#include "ui/charts/charts_panel.h"
#include "ui/charts/memory_fit_chart.h"
#include "ui/config/demo_options.h"
#include "ui/window/main_window.h"
#include "ui/charts/memory_breakdown_bar.h"
#include "ui/config/run_panel.h"
#include "ui/session/trainer_controller.h"

namespace tst_report {

using namespace batchpilot;

namespace {

constexpr int kTimeout = 120'000;  // ms; the trainer runs on the CPU of a test machine
constexpr int64_t kMiB = 1024 * 1024;
const int64_t kTrialSizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 192};

/// A whole small run as the engine reports it: summary, probe, breakdown, steps, a check.
QList<core::Event> runEvents() {
    QList<core::Event> events;
    core::RunSummary summary;
    summary.device = "virtual:64MiB";
    summary.model = "cnn<script>";  // must come out escaped
    summary.parameterCount = 123456;
    summary.dataset = "synthetic images";
    summary.datasetSize = 8192;
    summary.optimizer = "adam, learning rate 0.003";
    summary.loss = "cross-entropy";
    summary.targetBatch = 1024;
    events.append(summary);
    events.append(core::ProbeStarted{0.1, 1, core::ProbeReason::Initial, "virtual:64MiB", 1024, 60 * kMiB, 0});
    int trial = 0;
    for (int64_t n : kTrialSizes) {
        core::ProbeTrial t;
        t.time = 0.1 + 0.01 * ++trial;
        t.sequence = 1;
        t.trial = trial;
        t.microBatch = n;
        t.fit = n != 256;
        t.withinHeadroom = t.fit;
        t.peakBytes = 10 * kMiB + n * kMiB / 5;
        t.failedAllocationBytes = t.fit ? 0 : 8 * kMiB;
        events.append(t);
    }
    core::ProbeFinished finished;
    finished.time = 0.5;
    finished.sequence = 1;
    finished.microBatch = 192;
    finished.accumulationSteps = 6;
    finished.targetBatch = 1024;
    finished.trials = trial;
    finished.fixedBytes = 10.0 * kMiB;
    finished.bytesPerSample = 0.2 * kMiB;
    events.append(finished);
    for (int step = 1; step <= 3; ++step) {
        core::StepMetrics m;
        m.time = 0.5 + step;
        m.step = step;
        m.samplesSeen = step * 1024;
        m.loss = 2.5 - 0.25 * step;
        m.microBatch = 192;
        m.accumulationSteps = 6;
        m.targetBatch = 1024;
        m.samplesPerSecond = 1500;
        events.append(m);
    }
    core::MemoryBreakdown b;
    b.time = 3.6;
    b.step = 3;
    b.device = "virtual:64MiB";
    b.totalBytes = 64 * kMiB;
    b.capacityBytes = 64 * kMiB;
    b.usableBytes = 60 * kMiB;
    b.parameterBytes = 3 * kMiB;
    b.gradientBytes = 3 * kMiB;
    b.optimizerStateBytes = 6 * kMiB;
    b.activationBytes = 40 * kMiB;
    b.activationMicroBatch = 192;
    b.residentBytes = 12 * kMiB;
    b.peakBytes = 52 * kMiB;
    b.freeBytes = 12 * kMiB;
    events.append(b);
    core::EquivalenceChecked check;
    check.time = 3.7;
    check.step = 3;
    check.samples = 1024;
    check.microBatchSizes = {171, 171, 171, 171, 170, 170};
    check.tensors = {{"conv1.weight", 864, 2.5e-8, 1.25e-7, 0.999999981}, {"fc.bias", 10, 7.5e-9, 3.5e-8, 0.999999995}};
    check.overall = {"all", 874, 2.5e-8, 1.5e-7, 0.999999876};
    check.explanation = "The accumulated gradient equals the full-batch gradient up to float rounding.";
    events.append(check);
    return events;
}

}  // namespace

class TestReport : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void htmlReportHasEverything();
    void pdfReport();
    void unwritablePathIsAnError();
    void realRunFillsMemoryViews();

private:
    static void feed(ui::MainWindow& w, const QList<core::Event>& events) {
        // What the controller sends after a real run's events: no trainer needed.
        Q_EMIT w.controller()->eventsReceived(events);
        w.chartsPanel()->redrawNow();
    }
    static QString screenshotPath(const QString& name) {
        // The build tree, next to the test executable, so a person can open it after a run.
        return QDir(QCoreApplication::applicationDirPath()).filePath(name);
    }
};

void TestReport::initTestCase() {
    QStandardPaths::setTestModeEnabled(true);  // keep the user's settings out of it
    QCoreApplication::setOrganizationName(QStringLiteral("BatchPilotTests"));
    QCoreApplication::setApplicationName(QStringLiteral("tst_report"));
    QSettings().clear();
}

void TestReport::htmlReportHasEverything() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    feed(w, runEvents());
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("report.html"));
    QVERIFY2(w.saveReport(path), qPrintable(w.errorText()));
    QFile file(path);
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QString html = QString::fromUtf8(file.readAll());

    // Run summary, escaped.
    QVERIFY(html.contains(QLatin1String("cnn&lt;script&gt;")));
    QVERIFY(!html.contains(QLatin1String("cnn<script>")));
    QVERIFY(html.contains(QLatin1String("adam, learning rate 0.003")));
    // The probe table: one row per trial, with its micro-batch.
    int trial = 0;
    for (int64_t n : kTrialSizes) {
        const QString rowStart = QStringLiteral("<tr><td>%1</td><td>%2</td>").arg(++trial).arg(n);
        QVERIFY2(html.contains(rowStart), qPrintable(rowStart));
    }
    QVERIFY(html.contains(QLatin1String("out of memory")));
    // The breakdown table.
    QVERIFY(html.contains(QLatin1String("<td>activations (micro-batch 192)</td><td>40.00</td><td>62.5 %</td>")));
    QVERIFY(html.contains(QLatin1String("<td>parameters</td><td>3.00</td>")));
    // The plan, the equivalence check's overall numbers and its tensors, the last step.
    QVERIFY(html.contains(QStringLiteral("1024 = 4 × 171 + 2 × 170")));
    QVERIFY(html.contains(QLatin1String("relative difference 1.5e-07")));
    QVERIFY(html.contains(QLatin1String("cosine similarity 0.999999876")));
    QVERIFY(html.contains(QLatin1String("<td>conv1.weight</td><td>864</td>")));
    QVERIFY(html.contains(QLatin1String("up to float rounding")));
    QVERIFY(html.contains(QLatin1String("Last step 3")));
    // Three embedded images: memory fit, breakdown bar, loss.
    QCOMPARE(html.count(QLatin1String("<img src=\"data:image/png;base64,")), 3);
    // The embedded PNGs decode.
    const qsizetype start = html.indexOf(QLatin1String("base64,")) + 7;
    const qsizetype end = html.indexOf(QLatin1Char('"'), start);
    QImage image;
    QVERIFY(image.loadFromData(QByteArray::fromBase64(html.mid(start, end - start).toLatin1()), "PNG"));
    QVERIFY(image.width() > 100);

    // Before a check has run, the report says how to run one.
    ui::MainWindow unchecked;
    QList<core::Event> events = runEvents();
    events.removeLast();
    feed(unchecked, events);
    QVERIFY(unchecked.saveReport(path));
    QFile again(path);
    QVERIFY(again.open(QIODevice::ReadOnly));
    const QString fresh = QString::fromUtf8(again.readAll());
    QVERIFY(fresh.contains(QLatin1String("Not run.")));
    QVERIFY(fresh.contains(QLatin1String("--check-equivalence")));
    QVERIFY(!fresh.contains(QLatin1String("conv1.weight")));
}

void TestReport::pdfReport() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    feed(w, runEvents());
    QTemporaryDir dir;
    const QString path = dir.filePath(QStringLiteral("report.PDF"));
    QVERIFY2(w.saveReport(path), qPrintable(w.errorText()));
    QFile file(path);
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QByteArray bytes = file.readAll();
    QVERIFY(bytes.startsWith("%PDF"));
    QVERIFY2(bytes.size() > 20'000, qPrintable(QString::number(bytes.size())));  // the images are in it
}

void TestReport::unwritablePathIsAnError() {
    ui::MainWindow w;
    w.show();
    feed(w, runEvents());
    QTemporaryDir dir;
    for (const QString& name : {QStringLiteral("missing/report.html"), QStringLiteral("missing/report.pdf")}) {
        const QString path = dir.filePath(name);
        QVERIFY(!w.saveReport(path));
        QVERIFY2(w.errorText().contains(QLatin1String("Could not write")), qPrintable(w.errorText()));
        QVERIFY(w.errorText().contains(path));
        QVERIFY(!QFile::exists(path));
    }
}

void TestReport::realRunFillsMemoryViews() {
    ui::MainWindow w;
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    core::TrainerOptions options = ui::demoOptions();
    options.steps = 6;
    w.runPanel()->setOptions(options);
    QVERIFY2(w.runPanel()->isValid(), qPrintable(w.runPanel()->problem()));
    QVERIFY(w.start());
    QTRY_VERIFY_WITH_TIMEOUT(!w.controller()->isRunning(), kTimeout);
    QVERIFY2(w.errorText().isEmpty(), qPrintable(w.errorText()));

    ui::MemoryBreakdownBar* bar = w.chartsPanel()->breakdownBar();
    QVERIFY(bar->hasBreakdown());
    QVERIFY(bar->breakdown().step > 0);
    QVERIFY(bar->breakdown().activationBytes > 0);
    qint64 sum = 0;
    for (const auto& segment : bar->segments()) sum += segment.bytes;
    QCOMPARE(sum, qint64(bar->breakdown().totalBytes));
    // MemoryBreakdown comes every step: the events record keeps none of them.
    for (const core::Event& event : w.record().events()) QVERIFY(!std::holds_alternative<core::MemoryBreakdown>(event));

    ui::MemoryFitChart* fit = w.chartsPanel()->memoryFitChart();
    w.chartsPanel()->redrawNow();
    QVERIFY(fit->trialCount() > 0);
    QCOMPARE(fit->plottedTrialCount(), fit->trialCount());
    QVERIFY(fit->memoryModel().has_value());
    QVERIFY(fit->chosenMicroBatch() > 0);
    QVERIFY2(fit->whatIfText().startsWith(QLatin1String("fits")), qPrintable(fit->whatIfText()));

    // Screenshots for a person to look at: the live tab and the memory-fit tab, light and dark.
    QVERIFY(w.saveReport(screenshotPath(QStringLiteral("report.html"))));
    QVERIFY(w.saveReport(screenshotPath(QStringLiteral("report.pdf"))));
    for (const bool dark : {false, true}) {
        w.setTheme(dark ? ui::Theme::Dark : ui::Theme::Light);
        const QString suffix = dark ? QStringLiteral("dark") : QStringLiteral("light");
        w.chartsPanel()->tabs()->setCurrentIndex(0);
        w.chartsPanel()->redrawNow();
        QTest::qWait(50);
        QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-memory-live-%1.png").arg(suffix))));
        w.chartsPanel()->tabs()->setCurrentIndex(1);
        fit->setWhatIf(fit->chosenMicroBatch() * 3 / 2);
        w.chartsPanel()->redrawNow();
        QTest::qWait(50);
        QVERIFY(w.grab().save(screenshotPath(QStringLiteral("screenshot-memory-fit-%1.png").arg(suffix))));
    }
    w.setTheme(ui::Theme::Light);
}

}  // namespace tst_report

BATCHPILOT_TEST_MAIN(tst_report::TestReport)
#include "tst_report.moc"
