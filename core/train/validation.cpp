#include "core/train/validation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/data/csv_dataset.h"
#include "core/nn/loss.h"
#include "core/base/text_format.h"

namespace batchpilot::core {

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices, std::string name)
    : m_base(std::move(base)), m_indices(std::move(indices)), m_name(std::move(name)) {}

std::string SubsetDataset::fingerprint() const {
    const std::string base = m_base->fingerprint();
    if (base.empty()) return {};
    return base + ", " + std::to_string(m_indices.size()) + " of its samples, CRC-32 " +
           crcText(crc32Of(m_indices.data(), m_indices.size() * sizeof(int64_t)));
}

Batch SubsetDataset::get(const std::vector<int64_t>& indices) const {
    std::vector<int64_t> mapped;
    mapped.reserve(indices.size());
    for (const int64_t i : indices) mapped.push_back(m_indices.at(static_cast<size_t>(i)));
    return m_base->get(mapped);
}

int64_t heldOutCount(int64_t size, double share) {
    if (!(share > 0) || size < 2) return 0;
    const auto count = static_cast<int64_t>(std::llround(share * static_cast<double>(size)));
    return std::clamp<int64_t>(count, 1, size - 1);
}

std::vector<int64_t> heldOutIndices(int64_t size, double share, uint64_t seed) {
    const int64_t count = heldOutCount(size, share);
    std::vector<int64_t> order(static_cast<size_t>(size));
    std::iota(order.begin(), order.end(), 0);
    // Its own stream (a constant the sampler's seed sequence never holds), so the held-out
    // samples do not follow the training order.
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), 0x76616cU};
    std::mt19937_64 engine(seq);
    // A partial Fisher–Yates: the first `count` places are a uniform draw without replacement.
    for (int64_t i = 0; i < count; ++i) {
        const auto j = i + static_cast<int64_t>(engine() % static_cast<uint64_t>(size - i));
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    order.resize(static_cast<size_t>(count));
    std::sort(order.begin(), order.end());
    return order;
}

TrainValidation splitHeldOut(const std::shared_ptr<Dataset>& data, double share, uint64_t seed) {
    const std::vector<int64_t> held = heldOutIndices(data->size(), share, seed);
    if (held.empty()) return {data, nullptr};
    std::vector<int64_t> kept;
    kept.reserve(static_cast<size_t>(data->size()) - held.size());
    size_t next = 0;
    for (int64_t i = 0; i < data->size(); ++i) {
        if (next < held.size() && held[next] == i) {
            ++next;
        } else {
            kept.push_back(i);
        }
    }
    const std::string percent = formatText("%g%%", 100.0 * share);
    const auto keptCount = static_cast<int64_t>(kept.size());
    const auto heldCount = static_cast<int64_t>(held.size());
    TrainValidation out;
    out.training = std::make_shared<SubsetDataset>(data, std::move(kept),
                                                   data->name() + ", " + std::to_string(keptCount) + " for training");
    out.validation = std::make_shared<SubsetDataset>(
        data, held, data->name() + ", " + std::to_string(heldCount) + " held out (" + percent + ")");
    return out;
}

namespace {

std::string shapeWords(const std::vector<int64_t>& shape) {
    std::string out;
    for (size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
    return out;
}

}  // namespace

tl::expected<TrainValidation, std::string> makeValidation(const TrainerOptions& options,
                                                          std::shared_ptr<Dataset> training) {
    const ValidationOptions& v = options.validation;
    if (!v.path.empty()) {
        DataOptions other = options.data;
        other.path = v.path;
        auto made = makeDataset(other);
        if (!made) return tl::unexpected("validation data: " + made.error());
        std::shared_ptr<Dataset> validation = *made;
        if (validation->sampleShape() != training->sampleShape()) {
            return tl::unexpected("validation data \"" + v.path + "\" has samples of shape " +
                                  shapeWords(validation->sampleShape()) + ", the training data " +
                                  shapeWords(training->sampleShape()) +
                                  ": give validation data in the training data's format and size");
        }
        if (validation->classNames() != training->classNames() ||
            (!options.data.regression && validation->classes() > training->classes())) {
            return tl::unexpected("validation data \"" + v.path + "\" has other classes (" +
                                  std::to_string(validation->classes()) + ") than the training data (" +
                                  std::to_string(training->classes()) +
                                  "): the same class must have the same label in both; give validation data with "
                                  "the training data's classes");
        }
        if (validation->size() <= 0) return tl::unexpected("validation data \"" + v.path + "\" holds no samples");
        // A CSV's features are standardised over their file: the validation file's must be
        // scaled with the training file's statistics, or the model sees other units.
        auto* table = dynamic_cast<CsvDataset*>(validation.get());
        const auto* reference = dynamic_cast<const CsvDataset*>(training.get());
        if (table && reference) {
            if (auto same = table->standardiseLike(*reference); !same)
                return tl::unexpected("validation data: " + same.error());
        }
        return TrainValidation{std::move(training), std::move(validation)};
    }
    if (!v.split && options.datasetFactory) return TrainValidation{std::move(training), nullptr};
    const double share = v.split.value_or(kDefaultValidationSplit);
    if (!(share > 0)) return TrainValidation{std::move(training), nullptr};
    if (options.data.name == "synthetic" && !options.datasetFactory) {
        // Generated data: held-out samples of the same generator, after the training ones.
        const int64_t extra = std::max<int64_t>(1, std::llround(share * static_cast<double>(options.data.samples)));
        DataOptions bigger = options.data;
        bigger.samples = options.data.samples + extra;
        std::vector<int64_t> indices(static_cast<size_t>(extra));
        std::iota(indices.begin(), indices.end(), options.data.samples);
        const auto* same = dynamic_cast<const SyntheticImages*>(training.get());
        auto generator = same != nullptr ? std::make_shared<SyntheticImages>(*same, bigger.samples)
                                         : std::make_shared<SyntheticImages>(bigger);
        const std::string name = "synthetic, " + std::to_string(extra) + " held-out samples of its own";
        return TrainValidation{std::move(training),
                               std::make_shared<SubsetDataset>(std::move(generator), std::move(indices), name)};
    }
    if (training->size() < 2) return TrainValidation{std::move(training), nullptr};
    return splitHeldOut(training, share, options.data.seed);
}

void ValidationTotals::add(const torch::Tensor& output, const torch::Tensor& targets) {
    torch::NoGradGuard noGrad;
    const int64_t n = output.size(0);
    m_lossSum += computeLoss(m_loss, output, targets).item<double>() * static_cast<double>(n);
    m_samples += n;
    if (!targets.is_floating_point() && output.dim() == 2 && targets.dim() == 1) {
        m_classification = true;
        const int64_t classes = output.size(1);
        m_correct += output.argmax(1).eq(targets).sum().item<int64_t>();
        if (classes > 5) {
            m_top5 = true;
            const torch::Tensor top = std::get<1>(output.topk(5, 1));
            m_correct5 += top.eq(targets.unsqueeze(1)).any(1).sum().item<int64_t>();
        }
    } else if (targets.is_floating_point()) {
        m_regression = true;
        const torch::Tensor expected = targets.reshape(output.sizes()).to(output.scalar_type());
        const torch::Tensor error = (output - expected).to(torch::kFloat64);
        m_squared += error.square().sum().item<double>();
        m_absolute += error.abs().sum().item<double>();
        m_values += error.numel();
    }
}

double ValidationTotals::meanLoss() const {
    return m_samples > 0 ? m_lossSum / static_cast<double>(m_samples) : 0.0;
}

double ValidationTotals::accuracy() const {
    return m_classification && m_samples > 0 ? static_cast<double>(m_correct) / static_cast<double>(m_samples) : -1.0;
}

double ValidationTotals::top5Accuracy() const {
    return m_top5 && m_samples > 0 ? static_cast<double>(m_correct5) / static_cast<double>(m_samples) : -1.0;
}

double ValidationTotals::meanSquaredError() const {
    return m_regression && m_values > 0 ? m_squared / static_cast<double>(m_values) : -1.0;
}

double ValidationTotals::meanAbsoluteError() const {
    return m_regression && m_values > 0 ? m_absolute / static_cast<double>(m_values) : -1.0;
}

ValidationDone ValidationTotals::done() const {
    ValidationDone done;
    done.samples = samples();
    done.loss = meanLoss();
    done.accuracy = accuracy();
    done.top5Accuracy = top5Accuracy();
    done.meanSquaredError = meanSquaredError();
    done.meanAbsoluteError = meanAbsoluteError();
    return done;
}

}  // namespace batchpilot::core
