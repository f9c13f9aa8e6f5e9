#pragma once

#include <QString>
#include <QTableWidgetItem>

namespace batchpilot::ui {

/// A table cell the user can select and copy but not edit; numbers right-aligned by default.
inline QTableWidgetItem* readOnlyCell(const QString& text, Qt::Alignment align = Qt::AlignRight | Qt::AlignVCenter) {
    auto* item = new QTableWidgetItem(text);
    item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
    item->setTextAlignment(align);
    return item;
}

}  // namespace batchpilot::ui
