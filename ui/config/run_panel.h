#pragma once

#include <QString>
#include <QWidget>

#include "core/config/options.h"
#include "ui/teaching/teaching_box.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QGridLayout;
class QGroupBox;
class QHBoxLayout;
class QLabel;
class QLineEdit;
class QPushButton;
class QSettings;
class QSpinBox;

namespace batchpilot::ui {

class RunCommands;

/// The run configuration form, the run buttons (Start, Pause/Resume, Stop, Re-probe) and the
/// teaching controls (step by step, Next micro-batch, Finish batch, Check equivalence). The buttons
/// press RunCommands' actions, the same ones as the Run menu's.
///
/// Every field is checked as it changes: an invalid one gets a red frame and a tooltip, and Start
/// is disabled with a tooltip saying why. During a run (RunModel::isRunning) the fields that only
/// matter at start are locked; the target batch and the device stay editable and are given to the
/// running trainer through RunCommands, applied at its next training batch.
class RunPanel : public QWidget {
    Q_OBJECT
public:
    explicit RunPanel(RunCommands* commands, QWidget* parent = nullptr);

    core::TrainerOptions options() const;
    /// Shows `options`; values the panel has no field for (checkpoints, loss, CSV columns, image
    /// size) are kept and returned by options() unchanged. The validation fields: held-out share,
    /// validation data and interval (core::ValidationOptions).
    void setOptions(const core::TrainerOptions& options);
    /// Why the panel cannot show `options` without changing them: a value outside what its field
    /// takes (a seed above 2^31 - 1, a learning rate finer than its decimals); empty when it can.
    /// setOptions() never clamps: call this first (MainWindow::openConfiguration refuses with it).
    QString cannotShow(const core::TrainerOptions& options) const;
    /// Selects a TorchScript model file (a .pt or .pth exported from Python) as the model.
    void setModelFile(const QString& path);
    /// Selects the dataset `name` ("mnist", "image-folder", "csv") read from `path`.
    void setDataPath(const QString& path);
    /// Why the current values cannot start a run; empty when they can.
    QString problem() const { return m_problem; }
    bool isValid() const { return m_problem.isEmpty(); }
    /// The device id the fields describe ("cpu", "cuda:0", "virtual:64MiB"); empty if invalid.
    /// With several devices, the first (rank 0's, trained in this window).
    QString deviceId() const;
    /// Several devices (the device "Several devices"): every device of the job in rank order,
    /// each canonical ("virtual:48MiB"); empty for one device.
    QStringList devices() const;

    void saveSettings(QSettings& settings) const;
    void loadSettings(const QSettings& settings);

    QPushButton* startButton() const { return m_start; }
    QPushButton* pauseButton() const { return m_pause; }
    QPushButton* stopButton() const { return m_stop; }
    QPushButton* reprobeButton() const { return m_reprobe; }
    QSpinBox* targetBatchBox() const { return m_target; }
    QSpinBox* stepLimitBox() const { return m_steps; }
    QComboBox* deviceBox() const { return m_device; }
    QComboBox* objectiveBox() const { return m_objective; }
    QComboBox* memorySaversBox() const { return m_memorySavers; }
    QComboBox* modelBox() const { return m_model; }
    QComboBox* datasetBox() const { return m_dataset; }
    QLineEdit* dataPathEdit() const { return m_dataPath; }
    QLineEdit* virtualSizeEdit() const { return m_virtualSize; }
    QLineEdit* deviceListEdit() const { return m_deviceList; }
    /// The line under the device choice (what the device or devices are).
    QString deviceInfoText() const;
    /// Several devices, during a run: where the ranks are (every step), so that the Devices list
    /// goes back to a rank's device after a switch it refused; left alone while being edited.
    void showRankDevices(const QStringList& devices);
    QDoubleSpinBox* heldOutBox() const { return m_heldOut; }
    QLineEdit* validationPathEdit() const { return m_validationPath; }
    QSpinBox* validateEveryBox() const { return m_validateEvery; }
    QComboBox* keepBestBox() const { return m_keepBest; }
    TeachingBox* teachingBox() const { return m_teaching; }
    QCheckBox* stepModeBox() const { return m_teaching->stepModeBox(); }
    QPushButton* nextMicroBatchButton() const { return m_teaching->nextMicroBatchButton(); }
    QPushButton* finishBatchButton() const { return m_teaching->finishBatchButton(); }
    QPushButton* checkEquivalenceButton() const { return m_teaching->checkEquivalenceButton(); }
    /// Samples of the equivalence check; 0 means the whole training batch.
    QSpinBox* checkBatchBox() const { return m_teaching->checkBatchBox(); }

Q_SIGNALS:
    void validityChanged(bool valid, const QString& problem);

private:
    // The constructor's parts: each builds a group of fields (or the run buttons) and its layout.
    QGroupBox* createModelAndData();
    QGroupBox* createValidation();
    /// `edit` with a "…" button that chooses a CSV file or, for the other data sets, a folder.
    QHBoxLayout* pathRow(QLineEdit* edit, const QString& tip, const QString& fileTitle, const QString& folderTitle);
    QGroupBox* createDevice();
    QGroupBox* createBatch();
    QGroupBox* createTraining();
    QGridLayout* createRunButtons();
    void connectFields();

    void revalidate();
    void markField(QWidget* field, const QString& problem);
    void commitDevice();
    bool running() const;
    /// Locks the fields that only matter at start while a run goes on.
    void lockFields();

    QComboBox* m_model;
    QComboBox* m_dataset;
    QLineEdit* m_dataPath;
    core::TrainerOptions m_base;  ///< values without a field, kept from setOptions()
    QSpinBox* m_samples;
    QDoubleSpinBox* m_heldOut;    ///< validation split, percent; 0: no validation
    QLineEdit* m_validationPath;  ///< validation data in the training data's format; empty: held out
    QSpinBox* m_validateEvery;    ///< steps; 0: at each epoch's end
    QComboBox* m_keepBest;        ///< the validation metric the best model is kept by; "": none
    QComboBox* m_device;
    QLineEdit* m_virtualSize;
    QLineEdit* m_deviceList;  ///< several devices, comma-separated
    /// Several devices, during a run: each rank's device, as started or last switched to.
    QStringList m_runDevices;
    bool m_wasRunning = false;
    int m_switchSteps = 0;  ///< steps to wait before the list shows where the ranks are again
    QLabel* m_deviceInfo;
    QSpinBox* m_target;
    QSpinBox* m_initialMicro;
    QSpinBox* m_maxMicro;
    QDoubleSpinBox* m_headroom;
    QSpinBox* m_multiple;
    QComboBox* m_objective;
    QComboBox* m_memorySavers;  ///< core::MemorySavers
    QComboBox* m_optimizer;
    QDoubleSpinBox* m_learningRate;
    QComboBox* m_lrScaling;
    QSpinBox* m_seed;
    QSpinBox* m_steps;
    QPushButton* m_start;
    QPushButton* m_pause;
    QPushButton* m_stop;
    QPushButton* m_reprobe;
    QLabel* m_problemLabel;
    TeachingBox* m_teaching;
    RunCommands* m_commands;

    QString m_problem;
};

}  // namespace batchpilot::ui
