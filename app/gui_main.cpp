#include <QApplication>
#include <QCoreApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QTimer>
#include <QUrl>

#include <cstdio>

#include "core/base/host_memory.h"
#include "ui/session/remote_run.h"
#include "ui/session/run_watcher.h"
#include "ui/window/main_window.h"

namespace {

void nameApplication() {
    QCoreApplication::setOrganizationName(QStringLiteral("BatchPilot"));
    QCoreApplication::setApplicationName(QStringLiteral("BatchPilot"));
    QCoreApplication::setApplicationVersion(QStringLiteral(BATCHPILOT_VERSION));
}

struct Flags {
    QCommandLineOption demo{QStringLiteral("demo"),
                            QCoreApplication::translate("main",
                                                        "Start the built-in demo right away (small CNN, synthetic "
                                                        "images, a 64 MiB virtual GPU).")};
    QCommandLineOption open{
        QStringLiteral("open"),
        QCoreApplication::translate("main",
                                    "Show the run in <run-folder> (one batchpilot-cli wrote, here or on a mounted "
                                    "server folder) and follow it while it trains."),
        QStringLiteral("run-folder")};
    QCommandLineOption connect{
        QStringLiteral("connect"),
        QCoreApplication::translate("main",
                                    "Show and steer the run batchpilot-cli --serve serves at <url> "
                                    "(http://HOST:PORT/?token=…, as it printed)."),
        QStringLiteral("url")};
    QCommandLineOption quitAfter{
        QStringLiteral("quit-after"),
        QCoreApplication::translate("main", "Close the window after <seconds> (for scripted checks)."),
        QStringLiteral("seconds")};

    void declare(QCommandLineParser& parser) const {
        parser.setApplicationDescription(QCoreApplication::translate(
            "main", "Train at the batch you want on the device you get, and watch it live."));
        parser.addHelpOption();
        parser.addVersionOption();
        parser.addOption(demo);
        parser.addOption(open);
        parser.addOption(connect);
        parser.addOption(quitAfter);
    }
};

/// Why no window can open here: no display to open it on. Empty where Qt chooses its platform
/// from QT_QPA_PLATFORM, or a display is set.
QString noDisplay() {
    if (!qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) return {};
    if (!qEnvironmentVariableIsEmpty("DISPLAY") || !qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY")) return {};
    return QStringLiteral(
        "batchpilot: there is no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set): run "
        "it on a desktop or over ssh -X, train without a window with batchpilot-cli, or set "
        "QT_QPA_PLATFORM=offscreen to run it without showing it\n");
}

}  // namespace

int main(int argc, char* argv[]) {
    // Before any thread allocates: the trainer runs on a thread of its own here.
    batchpilot::core::keepFreedHostMemory();
    const Flags flags;
    {
        // --help, --version and unknown flags are answered without a display, which QApplication
        // needs (it aborted without one, even for --help).
        QCoreApplication console(argc, argv);
        nameApplication();
        QCommandLineParser parser;
        flags.declare(parser);
        parser.process(console);  // prints and exits for --help, --version and errors
        if (parser.isSet(flags.connect)) {
            if (const QString why = batchpilot::ui::RemoteRun::whyNotARunUrl(QUrl(parser.value(flags.connect)));
                !why.isEmpty()) {
                std::fputs(
                    (QStringLiteral("batchpilot: --connect: ") + why + QLatin1Char('\n')).toLocal8Bit().constData(),
                    stderr);
                return 2;
            }
        }
        if (parser.isSet(flags.open)) {
            if (const QString why = batchpilot::ui::RunWatcher::whyNotARun(parser.value(flags.open)); !why.isEmpty()) {
                std::fputs((QStringLiteral("batchpilot: --open: ") + why + QLatin1Char('\n')).toLocal8Bit().constData(),
                           stderr);
                return 2;
            }
        }
    }
    if (const QString why = noDisplay(); !why.isEmpty()) {
        std::fputs(why.toLocal8Bit().constData(), stderr);
        return 1;
    }
    QApplication app(argc, argv);
    nameApplication();
    QApplication::setDesktopFileName(QStringLiteral("batchpilot"));
    Q_INIT_RESOURCE(resources);  // the icons live in the static batchpilot_ui library
    QIcon icon;
    for (int size : {32, 64, 256})
        icon.addFile(QStringLiteral(":/batchpilot/batchpilot-%1.png").arg(size), QSize(size, size));
    QApplication::setWindowIcon(icon);

    QCommandLineParser parser;
    flags.declare(parser);
    parser.process(app);

    batchpilot::ui::MainWindow window;
    window.show();
    if (static_cast<int>(parser.isSet(flags.demo)) + static_cast<int>(parser.isSet(flags.open)) +
            static_cast<int>(parser.isSet(flags.connect)) >
        1) {
        std::fputs("batchpilot: --demo, --open and --connect each show a run: give one of them\n", stderr);
        return 2;
    }
    if (parser.isSet(flags.demo)) QTimer::singleShot(0, &window, [&window] { window.startDemo(); });
    if (parser.isSet(flags.connect)) {
        const QUrl url(parser.value(flags.connect));
        QTimer::singleShot(0, &window, [&window, url] { window.connectToRun(url); });
    }
    if (parser.isSet(flags.open)) {
        const QString folder = parser.value(flags.open);
        QTimer::singleShot(0, &window, [&window, folder] { window.openRun(folder); });
    }
    if (parser.isSet(flags.quitAfter)) {
        bool ok = false;
        const double seconds = parser.value(flags.quitAfter).toDouble(&ok);
        if (ok && seconds > 0) QTimer::singleShot(static_cast<int>(seconds * 1000), &window, &QWidget::close);
    }
    return QApplication::exec();
}
