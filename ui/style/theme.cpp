#include "ui/style/theme.h"

#include <QApplication>
#include <QPalette>
#include <QStyle>
#include <QStyleFactory>

namespace batchpilot::ui {

namespace {

QPalette darkPalette() {
    QPalette p;
    const QColor window(0x2b, 0x2d, 0x30);
    const QColor base(0x1e, 0x1f, 0x22);
    const QColor text(0xe6, 0xe6, 0xe6);
    const QColor disabled(0x80, 0x80, 0x80);
    p.setColor(QPalette::Window, window);
    p.setColor(QPalette::WindowText, text);
    p.setColor(QPalette::Base, base);
    p.setColor(QPalette::AlternateBase, QColor(0x26, 0x28, 0x2b));
    p.setColor(QPalette::ToolTipBase, QColor(0x3c, 0x3f, 0x41));
    p.setColor(QPalette::ToolTipText, text);
    p.setColor(QPalette::PlaceholderText, disabled);
    p.setColor(QPalette::Text, text);
    p.setColor(QPalette::Button, QColor(0x35, 0x37, 0x3b));
    p.setColor(QPalette::ButtonText, text);
    p.setColor(QPalette::BrightText, QColor(0xff, 0x5c, 0x5c));
    p.setColor(QPalette::Highlight, QColor(0x2f, 0x65, 0xca));
    p.setColor(QPalette::HighlightedText, Qt::white);
    p.setColor(QPalette::Link, QColor(0x4f, 0xa3, 0xf7));
    p.setColor(QPalette::Mid, QColor(0x50, 0x52, 0x56));
    p.setColor(QPalette::Dark, QColor(0x18, 0x19, 0x1b));
    p.setColor(QPalette::Light, QColor(0x45, 0x47, 0x4b));
    for (auto role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
        p.setColor(QPalette::Disabled, role, disabled);
    return p;
}

}  // namespace

bool applyTheme(Theme theme) {
    static const QPalette systemPalette = QApplication::palette();
    if (theme != Theme::System) QApplication::setStyle(QStyleFactory::create(QStringLiteral("Fusion")));
    switch (theme) {
    case Theme::System: QApplication::setPalette(systemPalette); break;
    case Theme::Light: QApplication::setPalette(QApplication::style()->standardPalette()); break;
    case Theme::Dark: QApplication::setPalette(darkPalette()); break;
    }
    return paletteIsDark();
}

bool paletteIsDark() {
    return QApplication::palette().color(QPalette::Window).lightness() < 128;
}

QString errorBoxStyleSheet(bool dark) {
    return dark ? QStringLiteral(
                      "#errorBox { background: #4a1c1c; border: 1px solid #ff5c5c; border-radius: 3px; }"
                      " #errorBox QLabel { color: #ffd6d6; }")
                : QStringLiteral(
                      "#errorBox { background: #fde2e1; border: 1px solid #d62728; border-radius: 3px; }"
                      " #errorBox QLabel { color: #7a0c0c; }");
}

QString invalidFieldStyleSheet() {
    return QStringLiteral("border: 2px solid #d62728;");
}

QString problemTextStyleSheet(bool strong) {
    return strong ? QStringLiteral("color: #d62728; font-weight: bold;") : QStringLiteral("color: #d62728;");
}

}  // namespace batchpilot::ui
