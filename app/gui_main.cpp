#include <QApplication>
#include <QCommandLineParser>
#include <QIcon>
#include <QTimer>

#include "ui/window/main_window.h"

int main(int argc, char* argv[]) {
    QApplication app(argc, argv);
    QApplication::setOrganizationName(QStringLiteral("BatchPilot"));
    QApplication::setApplicationName(QStringLiteral("BatchPilot"));
    QApplication::setApplicationVersion(QStringLiteral(BATCHPILOT_VERSION));
    QApplication::setDesktopFileName(QStringLiteral("batchpilot"));
    Q_INIT_RESOURCE(resources);  // the icons live in the static batchpilot_ui library
    QIcon icon;
    for (int size : {32, 64, 256})
        icon.addFile(QStringLiteral(":/batchpilot/batchpilot-%1.png").arg(size), QSize(size, size));
    QApplication::setWindowIcon(icon);

    QCommandLineParser parser;
    parser.setApplicationDescription(
        QApplication::translate("main", "Train at the batch you want on the device you get, and watch it live."));
    parser.addHelpOption();
    parser.addVersionOption();
    const QCommandLineOption demo(QStringLiteral("demo"),
                                  QApplication::translate("main",
                                                          "Start the built-in demo right away (small CNN, synthetic "
                                                          "images, a 64 MiB virtual GPU)."));
    const QCommandLineOption quitAfter(
        QStringLiteral("quit-after"),
        QApplication::translate("main", "Close the window after <seconds> (for scripted checks)."),
        QStringLiteral("seconds"));
    parser.addOption(demo);
    parser.addOption(quitAfter);
    parser.process(app);

    batchpilot::ui::MainWindow window;
    window.show();
    if (parser.isSet(demo)) QTimer::singleShot(0, &window, [&window] { window.startDemo(); });
    if (parser.isSet(quitAfter)) {
        bool ok = false;
        const double seconds = parser.value(quitAfter).toDouble(&ok);
        if (ok && seconds > 0) QTimer::singleShot(static_cast<int>(seconds * 1000), &window, &QWidget::close);
    }
    return QApplication::exec();
}
