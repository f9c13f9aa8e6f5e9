#include "core/data/csv_dataset.h"

#include "core/base/cancel.h"
#include "core/base/text_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

namespace batchpilot::core {
namespace {

struct Record {
    int64_t line = 0;  ///< 1-based line where the record starts
    std::vector<std::string> fields;
};

std::string trim(const std::string& text) {
    const auto first = text.find_first_not_of(" \t");
    if (first == std::string::npos) return {};
    return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

/// Splits the file into records (RFC 4180: quoted fields may hold commas, quotes doubled,
/// line breaks). CRLF and a UTF-8 byte-order mark are accepted; blank lines are skipped.
tl::expected<std::vector<Record>, std::string> parseRecords(const std::string& text, const std::string& path) {
    std::vector<Record> records;
    size_t i = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
    int64_t line = 1;
    while (i < text.size()) {
        Record record;
        record.line = line;
        std::string field;
        bool quoted = false, wasQuoted = false, endOfRecord = false;
        while (i < text.size() && !endOfRecord) {
            const char c = text[i++];
            if (quoted) {
                if (c == '"' && i < text.size() && text[i] == '"') {
                    field += '"';
                    ++i;
                } else if (c == '"') {
                    quoted = false;
                } else {
                    if (c == '\n') ++line;
                    field += c;
                }
            } else if (c == '"' && trim(field).empty() && !wasQuoted) {
                quoted = wasQuoted = true;
                field.clear();
            } else if (c == ',') {
                record.fields.push_back(wasQuoted ? field : trim(field));
                field.clear();
                wasQuoted = false;
            } else if (c == '\n' || c == '\r') {
                if (c == '\r' && i < text.size() && text[i] == '\n') ++i;
                ++line;
                endOfRecord = true;
            } else {
                field += c;
            }
        }
        if (quoted) {
            return tl::unexpected("CSV file " + path + ": the quoted field starting on line " +
                                  std::to_string(record.line) + " is never closed; add the closing \"");
        }
        const bool blank = record.fields.empty() && trim(field).empty() && !wasQuoted;
        if (blank) continue;
        record.fields.push_back(wasQuoted ? field : trim(field));
        records.push_back(std::move(record));
    }
    return records;
}

std::optional<double> parseDouble(const std::string& field) {
    const std::string text = trim(field);
    double value = 0;
    const char* begin = text.data();
    const char* end = text.data() + text.size();
    if (begin != end && *begin == '+') ++begin;
    const auto [stop, ec] = std::from_chars(begin, end, value);
    if (ec != std::errc{} || stop != end || begin == end) return std::nullopt;
    return value;
}

std::optional<int64_t> parseWhole(const std::string& text) {
    int64_t value = 0;
    const auto [stop, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || stop != text.data() + text.size() || text.empty()) return std::nullopt;
    return value;
}

std::string quoteList(const std::vector<std::string>& names) {
    std::ostringstream out;
    // A table can have thousands of columns: the first few, and how many more.
    constexpr size_t kShown = 20;
    for (size_t i = 0; i < names.size() && i < kShown; ++i) out << (i > 0 ? ", " : "") << quoteForMessage(names[i]);
    if (names.size() > kShown) out << " and " << names.size() - kShown << " more";
    return out.str();
}

}  // namespace

tl::expected<std::shared_ptr<CsvDataset>, std::string> CsvDataset::load(const std::string& path,
                                                                        const std::string& targetColumn,
                                                                        bool regression) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
        return tl::unexpected("CSV file " + path + " does not exist or is not a regular file");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return tl::unexpected("cannot open CSV file " + path + " for reading: check its permissions");
    // Read a chunk at a time into one string sized by the file (a stream's growing buffer held
    // three copies), and refused at the first NUL byte, which no text file holds: a gigabyte of
    // NULs took 5.2 GB before it was refused.
    std::string text;
    if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec) text.reserve(static_cast<size_t>(size));
    constexpr size_t kChunk = size_t{1} << 20;
    std::vector<char> chunk(kChunk);
    while (in) {
        in.read(chunk.data(), static_cast<std::streamsize>(kChunk));
        const auto got = static_cast<size_t>(in.gcount());
        if (const void* nul = std::memchr(chunk.data(), '\0', got); nul != nullptr) {
            const size_t offset = text.size() + static_cast<size_t>(static_cast<const char*>(nul) - chunk.data());
            return tl::unexpected("CSV file " + path + " holds a NUL byte (at byte " + std::to_string(offset) +
                                  "): it is not a text file; a CSV file is text, e.g. UTF-8 (save a UTF-16 "
                                  "file again as UTF-8)");
        }
        text.append(chunk.data(), got);
        if (cancelled(cancelFlag())) return tl::unexpected(std::string(kLoadingCancelled));
    }
    if (in.bad())
        return tl::unexpected("cannot read CSV file " + path + ": a read failed; check the file and its disk");
    const uint32_t crc = crc32Of(text.data(), text.size());
    auto records = parseRecords(text, path);
    if (!records) return tl::unexpected(records.error());
    if (records->empty()) return tl::unexpected("CSV file " + path + " is empty: it needs a header row and data rows");
    const std::vector<std::string> header = records->front().fields;
    if (targetColumn.empty()) {
        return tl::unexpected("CSV file " + path + ": name the target column (--target-column); the columns are " +
                              quoteList(header));
    }
    const auto target = std::find(header.begin(), header.end(), targetColumn);
    if (target == header.end()) {
        return tl::unexpected("CSV file " + path + " has no column " + quoteForMessage(targetColumn) +
                              "; the columns are " + quoteList(header));
    }
    if (std::count(header.begin(), header.end(), targetColumn) > 1) {
        return tl::unexpected("CSV file " + path + " has " +
                              std::to_string(std::count(header.begin(), header.end(), targetColumn)) +
                              " columns named " + quoteForMessage(targetColumn) +
                              ": the target column must be unique; rename the others");
    }
    if (header.size() < 2) {
        return tl::unexpected("CSV file " + path + " has only the target column: it needs at least one feature column");
    }
    const auto targetIndex = static_cast<size_t>(target - header.begin());
    const auto rows = static_cast<int64_t>(records->size()) - 1;
    if (rows == 0) return tl::unexpected("CSV file " + path + " has a header but no data rows");
    const auto features = static_cast<int64_t>(header.size()) - 1;

    auto dataset = std::shared_ptr<CsvDataset>(new CsvDataset());
    dataset->m_fingerprint = "CSV " + std::filesystem::path(path).filename().string() + ", content CRC-32 " +
                             crcText(crc) + ", target " + quoteForMessage(targetColumn);
    dataset->m_path = path;
    dataset->m_target = targetColumn;
    dataset->m_regression = regression;
    for (size_t c = 0; c < header.size(); ++c) {
        if (c != targetIndex) dataset->m_featureNames.push_back(header[c]);
    }
    std::vector<double> values(static_cast<size_t>(rows * features));
    std::vector<std::string> labels(static_cast<size_t>(rows));
    const std::atomic<bool>* stop = cancelFlag();
    for (int64_t r = 0; r < rows; ++r) {
        if (r % 4096 == 0 && cancelled(stop)) return tl::unexpected(std::string(kLoadingCancelled));
        const Record& record = (*records)[static_cast<size_t>(r + 1)];
        const std::string where = "CSV file " + path + ", line " + std::to_string(record.line);
        if (record.fields.size() != header.size()) {
            return tl::unexpected(where + ": " + std::to_string(record.fields.size()) + " fields, but the header has " +
                                  std::to_string(header.size()) + " columns; fix or remove that row");
        }
        int64_t f = 0;
        for (size_t c = 0; c < header.size(); ++c) {
            const std::string& field = record.fields[c];
            if (c == targetIndex) {
                if (field.empty())
                    return tl::unexpected(where + ": the target " + quoteForMessage(targetColumn) + " is empty");
                labels[static_cast<size_t>(r)] = field;
                continue;
            }
            const auto value = parseDouble(field);
            if (!value || !std::isfinite(*value)) {
                return tl::unexpected(
                    where + ", column " + quoteForMessage(header[c]) + ": " + quoteForMessage(field) +
                    " is not a finite number; features must be numeric (encode categories as numbers, "
                    "or drop the column)");
            }
            values[static_cast<size_t>(r * features + f++)] = *value;
        }
    }

    // Standardise each feature over the file so that columns in different units train alike.
    dataset->m_features = torch::empty({rows, features}, torch::kFloat32);
    float* out = dataset->m_features.data_ptr<float>();
    // Computed on the column divided by its largest magnitude (the result does not depend on the
    // scale), so that values near the double range (1e308) neither overflow the sum nor the squares.
    for (int64_t f = 0; f < features; ++f) {
        double scale = 0;
        for (int64_t r = 0; r < rows; ++r)
            scale = std::max(scale, std::fabs(values[static_cast<size_t>(r * features + f)]));
        if (scale == 0) scale = 1;
        double sum = 0, squares = 0;
        for (int64_t r = 0; r < rows; ++r) sum += values[static_cast<size_t>(r * features + f)] / scale;
        const double mean = sum / static_cast<double>(rows);
        for (int64_t r = 0; r < rows; ++r) {
            const double d = values[static_cast<size_t>(r * features + f)] / scale - mean;
            squares += d * d;
        }
        const double deviation = std::sqrt(squares / static_cast<double>(rows));
        dataset->m_standardisation.push_back({scale, mean, deviation > 1e-12 ? deviation : 0.0});
        for (int64_t r = 0; r < rows; ++r) {
            const double centred = values[static_cast<size_t>(r * features + f)] / scale - mean;
            out[r * features + f] = static_cast<float>(deviation > 1e-12 ? centred / deviation : 0.0);
        }
    }

    if (regression) {
        dataset->m_targets = torch::empty({rows, 1}, torch::kFloat32);
        float* t = dataset->m_targets.data_ptr<float>();
        for (int64_t r = 0; r < rows; ++r) {
            const auto value = parseDouble(labels[static_cast<size_t>(r)]);
            if (!value || !std::isfinite(*value)) {
                return tl::unexpected("CSV file " + path + ", line " +
                                      std::to_string((*records)[static_cast<size_t>(r + 1)].line) + ": the target " +
                                      quoteForMessage(labels[static_cast<size_t>(r)]) +
                                      " is not a finite number, as regression (MSE) needs");
            }
            // Targets train as floats, and their squared error must stay finite too.
            if (std::fabs(*value) > 1e18) {
                return tl::unexpected("CSV file " + path + ", line " +
                                      std::to_string((*records)[static_cast<size_t>(r + 1)].line) + ": the target " +
                                      quoteForMessage(labels[static_cast<size_t>(r)]) +
                                      " is too large to train on (at most 1e18 in magnitude, so that its squared error "
                                      "stays finite); rescale the target column");
            }
            t[r] = static_cast<float>(*value);
        }
        dataset->m_classes = 1;
        return dataset;
    }

    dataset->m_targets = torch::empty({rows}, torch::kInt64);
    int64_t* t = dataset->m_targets.data_ptr<int64_t>();
    const bool wholeNumbers = std::all_of(labels.begin(), labels.end(),
                                          [](const std::string& label) { return parseWhole(label).has_value(); });
    if (wholeNumbers) {
        std::vector<int64_t> values(labels.size());
        std::transform(labels.begin(), labels.end(), values.begin(),
                       [](const std::string& label) { return *parseWhole(label); });
        const auto [smallest, largest] = std::minmax_element(values.begin(), values.end());
        if (*smallest >= 0) {
            if (*largest >= 1'000'000) {
                return tl::unexpected("CSV file " + path + ": the target " + quoteForMessage(targetColumn) +
                                      " has class id " + std::to_string(*largest) +
                                      "; class ids must be 0..classes-1 (to predict "
                                      "numeric values use regression: --loss mse)");
            }
            std::copy(values.begin(), values.end(), t);
            dataset->m_classes = std::max<int64_t>(2, *largest + 1);
            return dataset;
        }
        // Signed labels such as -1/1: ids in numeric order.
        std::map<int64_t, int64_t> ids;
        for (int64_t value : values) ids.emplace(value, 0);
        int64_t next = 0;
        for (auto& [value, id] : ids) {
            id = next++;
            dataset->m_classNames.push_back(std::to_string(value));
        }
        for (int64_t r = 0; r < rows; ++r) t[r] = ids.at(values[static_cast<size_t>(r)]);
        dataset->m_classes = std::max<int64_t>(2, next);
        return dataset;
    }
    // Fractional numbers as labels are almost always a regression target given to a classifier.
    const bool allNumbers = std::all_of(labels.begin(), labels.end(),
                                        [](const std::string& label) { return parseDouble(label).has_value(); });
    if (allNumbers) {
        const auto fractional =
            std::find_if(labels.begin(), labels.end(), [](const std::string& label) { return !parseWhole(label); });
        return tl::unexpected("CSV file " + path + ": the target " + quoteForMessage(targetColumn) +
                              " holds numbers such as " + cutForMessage(*fractional) +
                              ", not class ids or names; to predict the values use regression "
                              "(--loss mse)");
    }
    std::map<std::string, int64_t> ids;
    for (const auto& label : labels) ids.emplace(label, 0);
    int64_t next = 0;
    for (auto& [label, id] : ids) {
        id = next++;
        dataset->m_classNames.push_back(label);
    }
    for (int64_t r = 0; r < rows; ++r) t[r] = ids.at(labels[static_cast<size_t>(r)]);
    dataset->m_classes = std::max<int64_t>(2, next);
    return dataset;
}

std::string CsvDataset::name() const {
    std::string text = "CSV " + std::filesystem::path(m_path).filename().string() + ": " + std::to_string(size()) +
                       " rows, " + std::to_string(m_featureNames.size()) + " features, target \"" + m_target + "\"";
    if (m_regression) return text + " (regression)";
    text += ", " + std::to_string(m_classes) + " classes";
    if (!m_classNames.empty()) {
        text += " (";
        const size_t shown = std::min<size_t>(m_classNames.size(), 10);
        for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + m_classNames[i] + "=" + std::to_string(i);
        text += m_classNames.size() > shown ? ", ...)" : ")";
    }
    return text;
}

Batch CsvDataset::get(const std::vector<int64_t>& indices) const {
    const auto index = torch::tensor(indices, torch::kInt64);
    return Batch{m_features.index_select(/*dim=*/0, index), m_targets.index_select(/*dim=*/0, index)};
}

tl::expected<void, std::string> CsvDataset::standardiseLike(const CsvDataset& reference) {
    if (m_featureNames != reference.m_featureNames) {
        std::string mine, theirs;
        for (const auto& n : m_featureNames) mine += (mine.empty() ? "" : ", ") + n;
        for (const auto& n : reference.m_featureNames) theirs += (theirs.empty() ? "" : ", ") + n;
        return tl::unexpected("CSV file " + m_path + " has the feature columns " + mine + "; " + reference.m_path +
                              " has " + theirs + ": give the same columns in the same order");
    }
    float* values = m_features.data_ptr<float>();
    const int64_t rows = m_features.size(0);
    const auto features = static_cast<int64_t>(m_standardisation.size());
    for (int64_t f = 0; f < features; ++f) {
        const Standardisation& own = m_standardisation[static_cast<size_t>(f)];
        const Standardisation& ref = reference.m_standardisation[static_cast<size_t>(f)];
        for (int64_t r = 0; r < rows; ++r) {
            float& x = values[r * features + f];
            // Back to this file's value over its scale, then to the reference's standard units.
            const double raw = (static_cast<double>(x) * own.deviation + own.mean) * own.scale;
            x = static_cast<float>(ref.deviation > 0 ? (raw / ref.scale - ref.mean) / ref.deviation : 0.0);
        }
    }
    m_standardisation = reference.m_standardisation;
    return {};
}

}  // namespace batchpilot::core
