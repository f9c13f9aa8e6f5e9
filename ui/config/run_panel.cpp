#include "ui/config/run_panel.h"

#include <algorithm>
#include <limits>
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QToolButton>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QVBoxLayout>

#include <cmath>
#include <map>
#include <optional>

#include "core/base/byte_size.h"
#include "core/config/option_schema.h"
#include "core/device/device.h"
#include "core/memory/gpu_presets.h"
#include "ui/session/run_commands.h"
#include "ui/session/run_model.h"
#include "ui/session/trainer_controller.h"
#include "ui/style/theme.h"
#include "ui/style/text.h"

namespace batchpilot::ui {

namespace {

constexpr auto kVirtual = "virtual";
constexpr auto kSeveral = "several";

/// A core limit as a spin box's maximum: the limit itself, or the most a QSpinBox holds.
int widest(int64_t limit) {
    return static_cast<int>(std::min<int64_t>(limit, std::numeric_limits<int>::max()));
}

QSpinBox* spin(int min, int max, int value, const QString& tip) {
    auto* box = new QSpinBox;
    box->setRange(min, max);
    box->setValue(value);
    box->setToolTip(tip);
    box->setGroupSeparatorShown(false);
    return box;
}

/// A spin box for one of core's options (core/config/option_schema.h), with its range and default.
/// An option whose null means "none" (no step limit, each epoch) takes 0 for it; `lowest` widens
/// the range below the option's (a target batch of 0 is shown, and refused, rather than clamped).
QSpinBox* spinFor(const char* key, const QString& tip, std::optional<int> lowest = std::nullopt) {
    const core::OptionSpec* spec = core::findOption(key);
    Q_ASSERT(spec != nullptr && spec->type == core::OptionType::Integer);
    const nlohmann::json value = core::optionDefault(*spec);
    const int minimum = lowest ? *lowest : spec->nullMeans.empty() ? static_cast<int>(spec->minimum) : 0;
    return spin(minimum, widest(spec->maximum), value.is_null() ? 0 : widest(value.get<int64_t>()), tip);
}

/// A percentage field's range from a share option's ("probe.headroom": 0 to 0.9 → 0 to 90 %).
void percentRange(QDoubleSpinBox* box, const char* key) {
    const core::OptionSpec* spec = core::findOption(key);
    Q_ASSERT(spec != nullptr && spec->type == core::OptionType::Number);
    box->setRange(spec->low * 100.0, spec->high * 100.0);
}

}  // namespace

RunPanel::RunPanel(RunCommands* commands, QWidget* parent) : QWidget(parent), m_commands(commands) {
    QGroupBox* data = createModelAndData();
    QGroupBox* device = createDevice();
    QGroupBox* batch = createBatch();
    QGroupBox* validation = createValidation();
    QGroupBox* training = createTraining();
    QGridLayout* buttons = createRunButtons();

    m_problemLabel = new QLabel;
    m_problemLabel->setObjectName(QStringLiteral("problemLabel"));
    m_problemLabel->setWordWrap(true);
    m_problemLabel->setStyleSheet(problemTextStyleSheet());
    m_problemLabel->hide();

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->setSpacing(4);
    layout->addLayout(buttons);
    layout->addWidget(m_problemLabel);
    m_teaching = new TeachingBox(commands);
    layout->addWidget(m_teaching);
    layout->addWidget(device);
    layout->addWidget(batch);
    layout->addWidget(data);
    layout->addWidget(validation);
    layout->addWidget(training);
    layout->addStretch(1);

    connectFields();
    connect(&commands->model(), &RunModel::changed, this, &RunPanel::lockFields);
    lockFields();
    revalidate();
}

namespace {

void styleForm(QFormLayout* form) {
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    form->setContentsMargins(6, 4, 6, 4);
    form->setVerticalSpacing(3);
}

}  // namespace

QGroupBox* RunPanel::createModelAndData() {
    m_model = new QComboBox;
    m_model->addItems(TrainerController::builtinModelNames());
    m_model->setToolTip(
        tr("Model to train: a built-in one, or a TorchScript file exported from "
           "Python with torch.jit.script(model).save(\"model.pt\") — choose it "
           "with the … button or drop it on the window"));

    m_dataset = new QComboBox;
    // Core's list decides which data sets exist; here they only get a description.
    const std::map<std::string, QString> datasetDescriptions = {
        {"synthetic", tr("Synthetic images (3×32×32, 10 classes)")},
        {"mnist", tr("MNIST (IDX files in a folder)")},
        {"image-folder", tr("Image folder (one subfolder per class)")},
        {"csv", tr("CSV table (header row, target column)")},
    };
    for (const std::string& name : core::datasetNames()) {
        const auto described = datasetDescriptions.find(name);
        m_dataset->addItem(described != datasetDescriptions.end() ? described->second : str(name), str(name));
    }
    m_dataset->setToolTip(
        tr("Synthetic images are generated from class prototypes plus noise: "
           "learnable, deterministic, nothing to download. The others read the "
           "data path."));
    m_dataPath = new QLineEdit;
    m_dataPath->setPlaceholderText(tr("folder or file of the dataset"));
    m_dataPath->setToolTip(
        tr("MNIST: the folder with train-images-idx3-ubyte(.gz); image folder: "
           "its root; CSV: the file"));
    m_samples = spinFor("data.samples", tr("Number of samples in the synthetic dataset. One pass over all of them is "
                                           "an epoch; after it the samples are shuffled and used again."));

    auto* data = new QGroupBox(tr("Model and data"));
    auto* dataForm = new QFormLayout(data);
    auto* browseModel = new QToolButton;
    browseModel->setText(QStringLiteral("…"));
    browseModel->setToolTip(tr("Choose a TorchScript model file (.pt, .pth)"));
    connect(browseModel, &QToolButton::clicked, this, [this] {
        if (running()) return;  // the model is fixed while a run uses it
        const QString path = QFileDialog::getOpenFileName(this, tr("TorchScript model"), QString(),
                                                          tr("TorchScript models (*.pt *.pth)"));
        if (!path.isEmpty()) setModelFile(path);
    });
    auto* modelRow = new QHBoxLayout;
    modelRow->addWidget(m_model, 1);
    modelRow->addWidget(browseModel);
    QHBoxLayout* dataRow = pathRow(m_dataPath, tr("Choose the dataset's folder (MNIST, image folder) or file (CSV)"),
                                   tr("CSV data"), tr("Dataset folder"));

    dataForm->addRow(tr("Model"), modelRow);
    dataForm->addRow(tr("Dataset"), m_dataset);
    dataForm->addRow(tr("Data path"), dataRow);
    dataForm->addRow(tr("Samples"), m_samples);
    styleForm(dataForm);
    return data;
}

QHBoxLayout* RunPanel::pathRow(QLineEdit* edit, const QString& tip, const QString& fileTitle,
                               const QString& folderTitle) {
    auto* browse = new QToolButton;
    browse->setText(QStringLiteral("…"));
    browse->setToolTip(tip);
    connect(browse, &QToolButton::clicked, this, [this, edit, fileTitle, folderTitle] {
        if (running()) return;  // the data is fixed while a run uses it
        const bool file = m_dataset->currentData().toString() == QLatin1String("csv");
        const QString path = file ? QFileDialog::getOpenFileName(this, fileTitle, QString(), tr("CSV files (*.csv)"))
                                  : QFileDialog::getExistingDirectory(this, folderTitle);
        if (!path.isEmpty()) edit->setText(path);
    });
    auto* row = new QHBoxLayout;
    row->addWidget(edit, 1);
    row->addWidget(browse);
    return row;
}

QGroupBox* RunPanel::createValidation() {
    m_heldOut = new QDoubleSpinBox;
    percentRange(m_heldOut, "validation.split");
    m_heldOut->setDecimals(1);
    m_heldOut->setSingleStep(5);
    m_heldOut->setSuffix(QStringLiteral(" %"));
    m_heldOut->setValue(core::kDefaultValidationSplit * 100.0);
    m_heldOut->setSpecialValueText(tr("none (no validation)"));
    m_heldOut->setToolTip(
        tr("Share of the data kept out of training to measure how well the model does on samples it "
           "never learned from (validation loss and accuracy). The same samples for any seed. "
           "Synthetic data gets this share as extra samples of its own."));
    m_validationPath = new QLineEdit;
    m_validationPath->setPlaceholderText(tr("held out from the data"));
    m_validationPath->setToolTip(
        tr("A second data set in the same format to validate on instead (e.g. MNIST's t10k files); "
           "empty: the held-out share is used."));
    QHBoxLayout* validationRow =
        pathRow(m_validationPath, tr("Choose the validation data's folder (MNIST, image folder) or file (CSV)"),
                tr("CSV validation data"), tr("Validation data folder"));
    m_validateEvery = spinFor("validation.every_steps",
                              tr("Validate every this many optimizer steps; at each epoch's end when set to "
                                 "\"each epoch\". A run also validates when it reaches its limit."));
    m_validateEvery->setSpecialValueText(tr("each epoch"));
    m_validateEvery->setSuffix(tr(" steps"));
    m_keepBest = new QComboBox;
    m_keepBest->setObjectName(QStringLiteral("keepBestCombo"));
    m_keepBest->addItem(tr("no"), QString());
    m_keepBest->addItem(tr("lowest loss"), QStringLiteral("val_loss"));
    m_keepBest->addItem(tr("highest accuracy"), QStringLiteral("val_accuracy"));
    m_keepBest->addItem(tr("highest top-5 accuracy"), QStringLiteral("val_top5_accuracy"));
    m_keepBest->addItem(tr("lowest MSE"), QStringLiteral("val_mse"));
    m_keepBest->addItem(tr("lowest MAE"), QStringLiteral("val_mae"));
    m_keepBest->setToolTip(
        tr("Keep the model that scored best on the validation data so far, as a checkpoint in the run's "
           "folder (checkpoint/best; the run's last state goes to checkpoint/). Continue from either with "
           "File → Resume from checkpoint…"));

    // Its own group with short labels: "Validation data" in the data form widened the whole panel.
    auto* validation = new QGroupBox(tr("Validation"));
    auto* form = new QFormLayout(validation);
    form->addRow(tr("Held out"), m_heldOut);
    form->addRow(tr("Other data"), validationRow);
    form->addRow(tr("Every"), m_validateEvery);
    form->addRow(tr("Keep best"), m_keepBest);
    styleForm(form);
    return validation;
}

QGroupBox* RunPanel::createDevice() {
    m_device = new QComboBox;
    m_device->setObjectName(QStringLiteral("deviceCombo"));
    for (const core::DeviceInfo& info : core::availableDevices())
        m_device->addItem(QStringLiteral("%1 — %2").arg(str(info.id), str(info.description)), str(info.id));
    m_device->addItem(tr("Virtual GPU (simulated memory budget)"), QLatin1String(kVirtual));
    // The GPUs people are handed, simulated with PyTorch's caching allocator, their CUDA context and
    // cuBLAS workspace (--list-devices lists the same).
    for (const core::GpuPreset& gpu : core::gpuPresets()) {
        const QString id = QStringLiteral("virtual:") + str(std::string(gpu.name));
        m_device->addItem(tr("%1 — %2, %3 (simulated)")
                              .arg(id, str(std::string(gpu.description)), str(core::formatBytes(gpu.capacityBytes))),
                          id);
    }
    m_device->addItem(tr("Several devices (one process each)"), QLatin1String(kSeveral));
    m_device->setToolTip(
        tr("Where to train. A virtual GPU is the CPU with a hard memory budget: "
           "allocations past it fail exactly like a GPU running out of memory."));
    m_virtualSize = new QLineEdit(QStringLiteral("64MiB"));
    m_virtualSize->setObjectName(QStringLiteral("virtualSize"));
    m_virtualSize->setToolTip(
        tr("Memory budget of the virtual GPU, e.g. 64MiB, 512MiB, 2GiB. A "
           "smaller budget forces smaller micro-batches and more "
           "accumulation steps; change it during a run to watch the probe "
           "adapt. Add /caching for PyTorch's caching allocator (segments, "
           "cache, fragmentation: the Segments tab shows them), e.g. 64MiB/caching "
           "or 64MiB/expandable_segments:True."));
    m_deviceList = new QLineEdit(QStringLiteral("virtual:48MiB, virtual:192MiB"));
    m_deviceList->setObjectName(QStringLiteral("deviceList"));
    m_deviceList->setToolTip(
        tr("The devices that share every training batch, in rank order, e.g. virtual:48MiB, "
           "virtual:192MiB or cuda:0, cuda:1. Each gets a process of its own and probes its own "
           "micro-batch; this window trains the first and shows every rank's share. During a run, "
           "change one entry to move that rank to another device: every rank agrees at the next "
           "training batch, the rank probes again and the shares follow."));
    m_deviceInfo = new QLabel;
    m_deviceInfo->setWordWrap(true);
    m_deviceInfo->setEnabled(false);

    auto* device = new QGroupBox(tr("Device"));
    auto* deviceForm = new QFormLayout(device);
    deviceForm->addRow(tr("Device"), m_device);
    deviceForm->addRow(tr("Budget"), m_virtualSize);
    deviceForm->addRow(tr("Devices"), m_deviceList);
    deviceForm->addRow(m_deviceInfo);
    styleForm(deviceForm);
    return device;
}

QGroupBox* RunPanel::createBatch() {
    m_target = spinFor("target_batch",
                       tr("Samples per optimizer step. Reached by gradient accumulation when it does "
                          "not fit the device at once. Changes apply at the next training batch."),
                       0);
    m_target->setObjectName(QStringLiteral("targetBatch"));
    m_target->setKeyboardTracking(false);  // commit on Enter or focus change, not per digit
    m_initialMicro =
        spinFor("probe.initial_micro_batch", tr("First micro-batch size the probe tries; it doubles from there "
                                                "until memory runs out. Start higher when you know small sizes fit."));
    m_maxMicro =
        spinFor("probe.max_micro_batch", tr("Largest micro-batch the probe may choose, even if more would fit. Set "
                                            "it below the target batch to see accumulation at work on a big "
                                            "device."));
    m_maxMicro->setSpecialValueText(tr("no limit"));
    m_headroom = new QDoubleSpinBox;
    percentRange(m_headroom, "probe.headroom");
    m_headroom->setDecimals(1);
    m_headroom->setSuffix(QStringLiteral(" %"));
    m_headroom->setValue(5);
    m_headroom->setToolTip(
        tr("Share of the device memory the probe keeps free. Memory gets "
           "fragmented and inputs can vary in size, so a micro-batch that "
           "just fits once might not fit the next time."));
    m_multiple = spinFor("probe.multiple_of", tr("Round the micro-batch down to a multiple of this. GPUs compute some "
                                                 "sizes faster (multiples of 8 suit tensor cores)."));
    m_objective = new QComboBox;
    m_objective->setObjectName(QStringLiteral("objectiveBox"));
    m_objective->addItem(tr("fastest (timed)"), static_cast<int>(core::ProbeObjective::Fastest));
    m_objective->addItem(tr("largest that fits"), static_cast<int>(core::ProbeObjective::Largest));
    m_objective->setToolTip(
        tr("Which micro-batch to train with. Largest: the largest that fits in memory. Fastest: "
           "after finding the largest, time smaller sizes on real training micro-batches (none "
           "is wasted) and keep the one with the most samples per second — a larger micro-batch "
           "is often not faster."));

    m_memorySavers = new QComboBox;
    m_memorySavers->setObjectName(QStringLiteral("memorySaversBox"));
    m_memorySavers->addItem(tr("off"), static_cast<int>(core::MemorySavers::Off));
    m_memorySavers->addItem(tr("auto (the fastest, measured)"), static_cast<int>(core::MemorySavers::Auto));
    m_memorySavers->addItem(tr("activation checkpointing"), static_cast<int>(core::MemorySavers::Checkpoint));
    m_memorySavers->addItem(tr("bfloat16 autocast"), static_cast<int>(core::MemorySavers::Bf16));
    m_memorySavers->addItem(tr("both"), static_cast<int>(core::MemorySavers::Both));
    m_memorySavers->addItem(tr("float16 autocast (loss scaling)"), static_cast<int>(core::MemorySavers::Fp16));
    m_memorySavers->addItem(tr("checkpointing + float16"), static_cast<int>(core::MemorySavers::CheckpointFp16));
    m_memorySavers->setToolTip(
        tr("What training may trade for device memory when even a small micro-batch hardly fits. "
           "Activation checkpointing keeps only each block's input during forward and recomputes the "
           "block in backward: the same gradients, about one more forward pass of time. bfloat16 "
           "autocast runs the forward pass's matrix products in bfloat16: half the activation bytes, "
           "about three significant digits. float16 autocast holds the same bytes, for GPUs without fast bfloat16: "
           "the loss is scaled so that small gradients survive float16, and a batch whose gradients overflow is "
           "trained again at a lower scale (CUDA, or LibTorch 2.5 and later on the CPU). Auto measures every saver on "
           "the model when the probe finds a "
           "small micro-batch or nothing fits, and turns on the fastest (the Memory savers panel shows the "
           "measurements)."));

    auto* batch = new QGroupBox(tr("Batch"));
    auto* batchForm = new QFormLayout(batch);
    batchForm->addRow(tr("Target batch"), m_target);
    batchForm->addRow(tr("Initial micro-batch"), m_initialMicro);
    batchForm->addRow(tr("Max micro-batch"), m_maxMicro);
    batchForm->addRow(tr("Headroom"), m_headroom);
    batchForm->addRow(tr("Round to multiple"), m_multiple);
    batchForm->addRow(tr("Micro-batch"), m_objective);
    batchForm->addRow(tr("Memory savers"), m_memorySavers);
    styleForm(batchForm);
    return batch;
}

QGroupBox* RunPanel::createTraining() {
    m_optimizer = new QComboBox;
    m_optimizer->setObjectName(QStringLiteral("optimizerCombo"));
    for (auto kind : {core::OptimizerKind::Sgd, core::OptimizerKind::Adam, core::OptimizerKind::AdamW})
        m_optimizer->addItem(QString::fromLatin1(core::toString(kind)), static_cast<int>(kind));
    m_optimizer->setToolTip(
        tr("How the weights move along the gradient once per training batch. "
           "Adam and AdamW keep two extra numbers per weight, which costs "
           "memory the probe has to leave free."));
    m_learningRate = new QDoubleSpinBox;
    m_learningRate->setObjectName(QStringLiteral("learningRate"));
    m_learningRate->setDecimals(8);  // 1e-6 and 1e-7, common when fine-tuning, shown as they are
    m_learningRate->setRange(0, core::findOption("optimizer.learning_rate")->high);
    m_learningRate->setSingleStep(0.001);
    m_learningRate->setValue(core::defaultLearningRate(core::OptimizerKind::Sgd));
    m_learningRate->setToolTip(
        tr("How far the optimizer moves the weights in one step. Too "
           "large and the loss jumps around; too small and it falls "
           "slowly. Each optimizer starts at its own default: 0.05 for "
           "SGD, 0.001 (PyTorch's) for Adam and AdamW."));
    // Another optimizer brings its own default rate, unless the rate shown was chosen by hand.
    connect(m_optimizer, &QComboBox::currentIndexChanged, this, [this] {
        if (!core::isDefaultLearningRate(m_learningRate->value())) return;
        m_learningRate->setValue(
            core::defaultLearningRate(static_cast<core::OptimizerKind>(m_optimizer->currentData().toInt())));
    });
    m_lrScaling = new QComboBox;
    m_lrScaling->addItem(tr("none"), static_cast<int>(core::LrScaling::None));
    m_lrScaling->addItem(tr("linear"), static_cast<int>(core::LrScaling::Linear));
    m_lrScaling->addItem(tr("square root"), static_cast<int>(core::LrScaling::Sqrt));
    m_lrScaling->setToolTip(
        tr("How the learning rate follows a change of the target batch "
           "during a run: a larger batch gives a less noisy gradient, which "
           "can take a proportionally (linear) or more cautiously (square "
           "root) larger step."));
    m_seed = spinFor("seed", tr("Seed of the random initial weights and the sample order. The same seed "
                                "gives the same run, so two runs can be compared."));
    m_steps = spinFor("steps", tr("Optimizer steps to run before the run ends by itself. One step = one "
                                  "whole target batch."));
    m_steps->setSpecialValueText(tr("no limit"));

    auto* training = new QGroupBox(tr("Training"));
    auto* trainingForm = new QFormLayout(training);
    trainingForm->addRow(tr("Optimizer"), m_optimizer);
    trainingForm->addRow(tr("Learning rate"), m_learningRate);
    trainingForm->addRow(tr("LR scaling"), m_lrScaling);
    trainingForm->addRow(tr("Seed"), m_seed);
    trainingForm->addRow(tr("Step limit"), m_steps);
    styleForm(trainingForm);
    return training;
}

QGridLayout* RunPanel::createRunButtons() {
    const auto button = [](QAction* action, const QString& name) {
        auto* made = new QPushButton;
        made->setObjectName(name);
        bindButton(made, action);
        return made;
    };
    m_start = button(m_commands->startAction(), QStringLiteral("startButton"));
    m_pause = button(m_commands->pauseAction(), QStringLiteral("pauseButton"));
    m_stop = button(m_commands->stopAction(), QStringLiteral("stopButton"));
    m_reprobe = button(m_commands->reprobeAction(), QStringLiteral("reprobeButton"));
    m_start->setDefault(true);
    auto* buttons = new QGridLayout;
    buttons->addWidget(m_start, 0, 0);
    buttons->addWidget(m_pause, 0, 1);
    buttons->addWidget(m_stop, 1, 0);
    buttons->addWidget(m_reprobe, 1, 1);
    return buttons;
}

void RunPanel::connectFields() {
    const auto changed = [this] { revalidate(); };
    for (QSpinBox* box :
         {m_samples, m_target, m_initialMicro, m_maxMicro, m_multiple, m_seed, m_steps, m_validateEvery})
        connect(box, &QSpinBox::valueChanged, this, changed);
    for (QDoubleSpinBox* box : {m_headroom, m_learningRate, m_heldOut})
        connect(box, &QDoubleSpinBox::valueChanged, this, changed);
    for (QComboBox* box : {m_model, m_dataset, m_optimizer, m_lrScaling, m_objective, m_memorySavers, m_keepBest})
        connect(box, &QComboBox::currentIndexChanged, this, changed);
    connect(m_device, &QComboBox::currentIndexChanged, this, [this] {
        revalidate();
        commitDevice();
    });
    connect(m_virtualSize, &QLineEdit::textChanged, this, changed);
    connect(m_deviceList, &QLineEdit::textChanged, this, changed);
    connect(m_dataPath, &QLineEdit::textChanged, this, changed);
    connect(m_validationPath, &QLineEdit::textChanged, this, changed);
    connect(m_virtualSize, &QLineEdit::editingFinished, this, &RunPanel::commitDevice);
    connect(m_deviceList, &QLineEdit::editingFinished, this, &RunPanel::commitDevice);
    connect(m_target, &QSpinBox::valueChanged, this, [this](int value) {
        if (running() && value > 0)
            m_commands->setTargetBatch(value, static_cast<core::LrScaling>(m_lrScaling->currentData().toInt()));
    });
}

QString RunPanel::deviceId() const {
    const QString id = m_device->currentData().toString();
    if (id == QLatin1String(kSeveral)) {
        const QStringList all = devices();
        return all.isEmpty() ? QString() : all.front();
    }
    if (id != QLatin1String(kVirtual)) return id;
    const QString size = m_virtualSize->text().trimmed().remove(QLatin1Char(' '));
    return QStringLiteral("virtual:") + size;
}

QStringList RunPanel::devices() const {
    if (m_device->currentData().toString() != QLatin1String(kSeveral)) return {};
    QStringList all;
    for (const QString& part : m_deviceList->text().split(QLatin1Char(','))) {
        const auto parsed = core::parseDevice(part.trimmed().toStdString());
        if (!parsed) return {};
        all << str(parsed->name());
    }
    return all.size() >= 2 ? all : QStringList{};
}

core::TrainerOptions RunPanel::options() const {
    core::TrainerOptions o = m_base;
    o.model.name = m_model->currentText().toStdString();
    o.data.name = m_dataset->currentData().toString().toStdString();
    o.data.path = m_dataPath->text().trimmed().toStdString();
    o.data.samples = m_samples->value();
    o.device = deviceId().toStdString();
    o.targetBatch = m_target->value();
    o.probe.initialMicroBatch = m_initialMicro->value();
    o.probe.maxMicroBatch = m_maxMicro->value();
    o.probe.headroom = m_headroom->value() / 100.0;
    o.probe.multipleOf = m_multiple->value();
    o.probe.objective = static_cast<core::ProbeObjective>(m_objective->currentData().toInt());
    o.memorySavers = static_cast<core::MemorySavers>(m_memorySavers->currentData().toInt());
    o.optimizer.kind = static_cast<core::OptimizerKind>(m_optimizer->currentData().toInt());
    o.optimizer.learningRate = m_learningRate->value();
    o.lrScaling = static_cast<core::LrScaling>(m_lrScaling->currentData().toInt());
    o.seed = static_cast<uint64_t>(m_seed->value());
    o.steps = m_steps->value() > 0 ? std::optional<int64_t>(m_steps->value()) : std::nullopt;
    // The default share stays "not chosen" (nullopt) unless setOptions() gave one: core does not
    // split data given by a DatasetFactory unless asked.
    const double split = m_heldOut->value() / 100.0;
    const bool defaultSplit = std::abs(split - core::kDefaultValidationSplit) < 1e-9;
    o.validation.split = defaultSplit && !m_base.validation.split ? std::nullopt : std::optional<double>(split);
    o.validation.path = m_validationPath->text().trimmed().toStdString();
    o.validation.everySteps =
        m_validateEvery->value() > 0 ? std::optional<int64_t>(m_validateEvery->value()) : std::nullopt;
    o.checkpoint.keepBest = m_keepBest->currentData().toString().toStdString();
    return o;
}

void RunPanel::setModelFile(const QString& path) {
    if (m_model->findText(path) < 0) m_model->addItem(path);
    m_model->setCurrentIndex(m_model->findText(path));
    revalidate();
}

void RunPanel::setDataPath(const QString& path) {
    m_dataPath->setText(path);
    revalidate();
}

QString RunPanel::cannotShow(const core::TrainerOptions& o) const {
    const auto outside = [](const QString& key, double value, double min, double max) {
        return tr("%1 is %2, which the window cannot show (it takes %3 to %4): train this configuration with "
                  "batchpilot-cli --config FILE, or change the value in the file")
            .arg(key, QString::number(value, 'g', 12), QString::number(min, 'g', 12), QString::number(max, 'g', 12));
    };
    struct Whole {
        const char* key;
        double value;
        const QSpinBox* box;
    };
    const Whole wholes[] = {
        {"data.samples", static_cast<double>(o.data.samples), m_samples},
        {"target_batch", static_cast<double>(o.targetBatch), m_target},
        {"probe.initial_micro_batch", static_cast<double>(o.probe.initialMicroBatch), m_initialMicro},
        {"probe.max_micro_batch", static_cast<double>(o.probe.maxMicroBatch), m_maxMicro},
        {"probe.multiple_of", static_cast<double>(o.probe.multipleOf), m_multiple},
        {"seed", static_cast<double>(o.seed), m_seed},
        {"steps", static_cast<double>(o.steps.value_or(0)), m_steps},
        {"validation.every_steps", static_cast<double>(o.validation.everySteps.value_or(0)), m_validateEvery},
    };
    for (const Whole& w : wholes) {
        if (w.value < w.box->minimum() || w.value > w.box->maximum())
            return outside(QLatin1String(w.key), w.value, w.box->minimum(), w.box->maximum());
    }
    struct Real {
        const char* key;
        double value;  ///< as the field shows it (percent for shares)
        const QDoubleSpinBox* box;
        double scale;  ///< field value per configuration value
    };
    const Real reals[] = {
        {"probe.headroom", o.probe.headroom * 100.0, m_headroom, 100.0},
        {"optimizer.learning_rate", o.optimizer.learningRate, m_learningRate, 1.0},
        {"validation.split", o.validation.split.value_or(core::kDefaultValidationSplit) * 100.0, m_heldOut, 100.0},
    };
    for (const Real& r : reals) {
        if (r.value < r.box->minimum() || r.value > r.box->maximum())
            return outside(QLatin1String(r.key), r.value / r.scale, r.box->minimum() / r.scale,
                           r.box->maximum() / r.scale);
    }
    // A learning rate is shown to the field's decimals: a smaller one would read (and train) as 0.
    const double shown = std::pow(10.0, -m_learningRate->decimals());
    if (o.optimizer.learningRate > 0 && o.optimizer.learningRate < shown)
        return outside(QStringLiteral("optimizer.learning_rate"), o.optimizer.learningRate, shown,
                       m_learningRate->maximum());
    return {};
}

void RunPanel::setOptions(const core::TrainerOptions& o) {
    m_base = o;
    if (m_model->findText(str(o.model.name)) < 0 && !o.model.name.empty())
        m_model->addItem(str(o.model.name));  // a model file
    const int model = m_model->findText(str(o.model.name));
    if (model >= 0) m_model->setCurrentIndex(model);
    m_dataPath->setText(str(o.data.path));
    const int dataset = m_dataset->findData(str(o.data.name));
    if (dataset >= 0) m_dataset->setCurrentIndex(dataset);
    m_samples->setValue(static_cast<int>(o.data.samples));
    const QString device = str(o.device);
    if (const int preset = m_device->findData(device); preset >= 0) {
        m_device->setCurrentIndex(preset);  // cpu, cuda:N, or a GPU preset ("virtual:T4")
    } else if (device.startsWith(QLatin1String("virtual:"))) {
        m_virtualSize->setText(device.mid(8));
        m_device->setCurrentIndex(m_device->findData(QLatin1String(kVirtual)));
    } else {
        const int index = m_device->findData(device);
        m_device->setCurrentIndex(index >= 0 ? index : 0);
    }
    {
        const QSignalBlocker blocker(m_target);  // not a mid-run change
        m_target->setValue(static_cast<int>(o.targetBatch));
    }
    m_initialMicro->setValue(static_cast<int>(o.probe.initialMicroBatch));
    m_maxMicro->setValue(static_cast<int>(o.probe.maxMicroBatch));
    m_headroom->setValue(o.probe.headroom * 100.0);
    m_multiple->setValue(static_cast<int>(o.probe.multipleOf));
    m_objective->setCurrentIndex(m_objective->findData(static_cast<int>(o.probe.objective)));
    m_memorySavers->setCurrentIndex(m_memorySavers->findData(static_cast<int>(o.memorySavers)));
    m_optimizer->setCurrentIndex(m_optimizer->findData(static_cast<int>(o.optimizer.kind)));
    m_learningRate->setValue(o.optimizer.learningRate);
    m_lrScaling->setCurrentIndex(m_lrScaling->findData(static_cast<int>(o.lrScaling)));
    m_seed->setValue(static_cast<int>(o.seed));
    m_steps->setValue(o.steps ? static_cast<int>(*o.steps) : 0);
    m_heldOut->setValue(o.validation.split.value_or(core::kDefaultValidationSplit) * 100.0);
    m_validationPath->setText(str(o.validation.path));
    m_validateEvery->setValue(o.validation.everySteps ? static_cast<int>(*o.validation.everySteps) : 0);
    m_keepBest->setCurrentIndex(std::max(0, m_keepBest->findData(str(o.checkpoint.keepBest))));
    revalidate();
}

void RunPanel::markField(QWidget* field, const QString& problem) {
    if (!field->property("baseToolTip").isValid()) field->setProperty("baseToolTip", field->toolTip());
    field->setProperty("invalid", !problem.isEmpty());
    field->setStyleSheet(problem.isEmpty() ? QString() : invalidFieldStyleSheet());
    field->setToolTip(problem.isEmpty() ? field->property("baseToolTip").toString() : problem);
}

void RunPanel::revalidate() {
    const bool isVirtual = m_device->currentData().toString() == QLatin1String(kVirtual);
    const bool several = m_device->currentData().toString() == QLatin1String(kSeveral);
    QString deviceProblem;
    QString sizeProblem;
    QString listProblem;
    if (several) {
        const QStringList parts = m_deviceList->text().split(QLatin1Char(','));
        for (const QString& part : parts) {
            if (const auto parsed = core::parseDevice(part.trimmed().toStdString()); !parsed) {
                listProblem = tr("Devices: \"%1\": %2").arg(part.trimmed(), str(parsed.error()));
                break;
            }
        }
        if (listProblem.isEmpty() && parts.size() < 2)
            listProblem = tr("Devices: list two or more, separated by commas (for one, choose it above)");
        if (listProblem.isEmpty() && running() && !m_runDevices.isEmpty() && parts.size() != m_runDevices.size())
            listProblem = tr("Devices: the running job has %1 ranks; change a rank's device, not how many there "
                             "are (stop the run and resume from its checkpoint for another number)")
                              .arg(m_runDevices.size());
    }
    if (isVirtual) {
        // The size, then the allocator's settings as a device name takes them ("64MiB/caching"):
        // the size is checked here, the settings with the whole name below.
        const QString budget = m_virtualSize->text().trimmed().section(QLatin1Char('/'), 0, 0);
        const auto size = core::parseByteSize(budget.toStdString());
        if (!size) sizeProblem = tr("Virtual GPU budget: %1").arg(str(size.error()));
    }
    if (several) {
        const QStringList all = devices();
        QStringList ranks;
        for (int r = 0; r < all.size(); ++r) ranks << tr("rank %1 %2").arg(r).arg(all[r]);
        const QString who =
            m_commands->steeringRemote() ? tr("the served job's rank 0 serves it") : tr("this window trains rank 0");
        m_deviceInfo->setText(all.isEmpty() ? QString()
                                            : tr("%1 processes, each with its share of every batch: %2 (%3)")
                                                  .arg(all.size())
                                                  .arg(ranks.join(QStringLiteral(", ")), who));
    } else if (sizeProblem.isEmpty()) {
        const auto parsed = core::parseDevice(deviceId().toStdString());
        if (!parsed)
            deviceProblem = tr("Device: %1").arg(str(parsed.error()));
        else if (isVirtual)
            m_deviceInfo->setText((parsed->allocator && !parsed->allocator->exact
                                       ? tr("simulated GPU with %1, PyTorch's caching allocator modelled")
                                       : tr("simulated GPU with %1"))
                                      .arg(str(core::formatBytes(parsed->budgetBytes))));
    }
    if (!isVirtual && !several) m_deviceInfo->setText(m_device->currentText().section(QStringLiteral(" — "), 1));
    const QString modelProblem = m_model->count() == 0 ? tr("No model available.") : QString();

    QStringList problems;
    for (const QString& problem : {sizeProblem, listProblem, deviceProblem, modelProblem})
        if (!problem.isEmpty()) problems << problem;
    // Every other rule is core's (the CLI and configuration files share it); its problem names the
    // field, which is marked here.
    std::optional<core::OptionProblem> coreProblem;
    if (problems.isEmpty()) {
        if (const auto resolved = core::resolve(options()); !resolved) {
            coreProblem = resolved.error();
            problems << str(coreProblem->message);
        }
    }
    const auto coreSays = [&](const std::string& field) {
        return coreProblem && coreProblem->field == field ? str(coreProblem->message) : QString();
    };
    markField(m_virtualSize, sizeProblem);
    markField(m_deviceList, listProblem);
    markField(m_device, deviceProblem.isEmpty() ? coreSays("device") : deviceProblem);
    markField(m_model, modelProblem.isEmpty() ? coreSays("model.name") : modelProblem);
    const std::pair<const char*, QWidget*> coreFields[] = {
        {"target_batch", m_target},
        {"probe.initial_micro_batch", m_initialMicro},
        {"probe.max_micro_batch", m_maxMicro},
        {"probe.headroom", m_headroom},
        {"probe.multiple_of", m_multiple},
        {"optimizer.learning_rate", m_learningRate},
        {"data.name", m_dataset},
        {"data.path", m_dataPath},
        {"data.samples", m_samples},
        {"steps", m_steps},
        {"validation.split", m_heldOut},
        {"validation.path", m_validationPath},
        {"validation.every_steps", m_validateEvery},
        {"checkpoint.keep_best", m_keepBest},
        {"memory_savers", m_memorySavers},
    };
    for (const auto& [field, widget] : coreFields) markField(widget, coreSays(field));

    const QString problem = problems.join(QLatin1Char('\n'));
    const bool changed = problem != m_problem;
    m_problem = problem;
    m_problemLabel->setText(problem);
    m_problemLabel->setVisible(!problem.isEmpty());
    m_commands->setStartProblem(problem);
    lockFields();  // the virtual size field follows the device choice
    if (changed) Q_EMIT validityChanged(problem.isEmpty(), problem);
}

void RunPanel::commitDevice() {
    if (!running() || m_device->property("invalid").toBool() || m_virtualSize->property("invalid").toBool()) return;
    if (m_device->currentData().toString() == QLatin1String(kSeveral)) {
        // Several devices: each rank whose entry changed moves (revalidate refuses another count).
        const QStringList now = devices();
        if (m_deviceList->property("invalid").toBool() || now.size() != m_runDevices.size()) return;
        for (int rank = 0; rank < now.size(); ++rank) {
            if (now[rank] == m_runDevices[rank]) continue;
            m_runDevices[rank] = now[rank];
            m_commands->switchDevice(now[rank], rank);
            m_switchSteps = 2;
        }
        return;
    }
    m_commands->switchDevice(deviceId());
}

void RunPanel::showRankDevices(const QStringList& devices) {
    if (!running() || m_deviceList->hasFocus()) return;
    if (m_runDevices.size() != devices.size() || m_device->currentData().toString() != QLatin1String(kSeveral)) {
        // A run this panel did not start — a served job on several devices, whose configuration
        // names rank 0's device only: its ranks' devices, each entry steering that rank.
        m_runDevices = devices;
        m_deviceList->setText(devices.join(QStringLiteral(", ")));
        {
            const QSignalBlocker quiet(m_device);  // showing the job asks nothing of it
            m_device->setCurrentIndex(m_device->findData(QLatin1String(kSeveral)));
        }
        revalidate();
        return;
    }
    // A switch is agreed at the next training batch: the step under way still reports the old
    // device. Only a rank still there a step later (its switch was refused) is put back.
    if (m_switchSteps > 0) {
        --m_switchSteps;
        return;
    }
    if (m_runDevices == devices) return;
    m_runDevices = devices;
    m_deviceList->setText(devices.join(QStringLiteral(", ")));
}

QString RunPanel::deviceInfoText() const {
    return m_deviceInfo->text();
}

bool RunPanel::running() const {
    // This window's run, or a served run it is connected to with the control token: the fields
    // that steer a run (target batch, device) act on it, the others are fixed.
    return m_commands->steering();
}

void RunPanel::lockFields() {
    const bool locked = running();
    for (QWidget* field : std::initializer_list<QWidget*>{m_model, m_dataset, m_dataPath, m_samples, m_heldOut,
                                                          m_validationPath, m_validateEvery, m_keepBest, m_initialMicro,
                                                          m_maxMicro, m_headroom, m_multiple, m_objective,
                                                          m_memorySavers, m_optimizer, m_learningRate, m_seed, m_steps})
        field->setEnabled(!locked);
    m_virtualSize->setEnabled(m_device->currentData().toString() == QLatin1String(kVirtual));
    // Several devices: a rank's entry may change during the run (that rank moves), not their number.
    const bool several = m_device->currentData().toString() == QLatin1String(kSeveral);
    if (locked && !m_wasRunning) m_runDevices = devices();
    if (!locked) m_runDevices.clear();
    m_wasRunning = locked;
    m_deviceList->setEnabled(several);
    m_device->setEnabled(!(several && locked));
}

void RunPanel::saveSettings(QSettings& s) const {
    s.beginGroup(QStringLiteral("run"));
    s.setValue(QStringLiteral("model"), m_model->currentText());
    s.setValue(QStringLiteral("dataset"), m_dataset->currentData());
    s.setValue(QStringLiteral("samples"), m_samples->value());
    s.setValue(QStringLiteral("device"), m_device->currentData());
    s.setValue(QStringLiteral("virtualSize"), m_virtualSize->text());
    s.setValue(QStringLiteral("deviceList"), m_deviceList->text());
    s.setValue(QStringLiteral("targetBatch"), m_target->value());
    s.setValue(QStringLiteral("initialMicroBatch"), m_initialMicro->value());
    s.setValue(QStringLiteral("maxMicroBatch"), m_maxMicro->value());
    s.setValue(QStringLiteral("headroomPercent"), m_headroom->value());
    s.setValue(QStringLiteral("multipleOf"), m_multiple->value());
    s.setValue(QStringLiteral("objective"), m_objective->currentData());
    s.setValue(QStringLiteral("memorySavers"), m_memorySavers->currentData());
    s.setValue(QStringLiteral("optimizer"), m_optimizer->currentData());
    s.setValue(QStringLiteral("learningRate"), m_learningRate->value());
    s.setValue(QStringLiteral("lrScaling"), m_lrScaling->currentData());
    s.setValue(QStringLiteral("seed"), m_seed->value());
    s.setValue(QStringLiteral("steps"), m_steps->value());
    s.setValue(QStringLiteral("validationPercent"), m_heldOut->value());
    s.setValue(QStringLiteral("validationData"), m_validationPath->text());
    s.setValue(QStringLiteral("validateEvery"), m_validateEvery->value());
    s.setValue(QStringLiteral("keepBest"), m_keepBest->currentData());
    s.endGroup();
}

void RunPanel::loadSettings(const QSettings& s) {
    const auto value = [&](const char* key) { return s.value(QStringLiteral("run/") + QLatin1String(key)); };
    if (!value("targetBatch").isValid()) return;  // first launch: keep the defaults
    const auto setCombo = [](QComboBox* box, int index) {
        if (index >= 0) box->setCurrentIndex(index);
    };
    setCombo(m_model, m_model->findText(value("model").toString()));
    setCombo(m_dataset, m_dataset->findData(value("dataset")));
    m_samples->setValue(value("samples").toInt());
    m_virtualSize->setText(value("virtualSize").toString());
    if (value("deviceList").isValid()) m_deviceList->setText(value("deviceList").toString());
    setCombo(m_device, m_device->findData(value("device")));
    m_target->setValue(value("targetBatch").toInt());
    m_initialMicro->setValue(value("initialMicroBatch").toInt());
    m_maxMicro->setValue(value("maxMicroBatch").toInt());
    m_headroom->setValue(value("headroomPercent").toDouble());
    m_multiple->setValue(value("multipleOf").toInt());
    if (value("objective").isValid()) setCombo(m_objective, m_objective->findData(value("objective")));
    if (value("memorySavers").isValid()) setCombo(m_memorySavers, m_memorySavers->findData(value("memorySavers")));
    setCombo(m_optimizer, m_optimizer->findData(value("optimizer")));
    m_learningRate->setValue(value("learningRate").toDouble());
    setCombo(m_lrScaling, m_lrScaling->findData(value("lrScaling")));
    m_seed->setValue(value("seed").toInt());
    m_steps->setValue(value("steps").toInt());
    // Settings saved before the validation fields existed keep the defaults.
    if (value("validationPercent").isValid()) m_heldOut->setValue(value("validationPercent").toDouble());
    m_validationPath->setText(value("validationData").toString());
    m_validateEvery->setValue(value("validateEvery").toInt());
    m_keepBest->setCurrentIndex(std::max(0, m_keepBest->findData(value("keepBest").toString())));
    revalidate();
}

}  // namespace batchpilot::ui
