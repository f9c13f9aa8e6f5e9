// CsvDataset::load: a user's CSV file, as classification and as regression data.
#include <cstdint>
#include <cstdlib>

#include "core/data/csv_dataset.h"
#include "fuzz/fuzz_util.h"

using batchpilot::core::CsvDataset;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const auto file = batchpilot::fuzz::scratch() / "data.csv";
    batchpilot::fuzz::writeFile(file, batchpilot::fuzz::asText(data, size));
    for (const bool regression : {false, true}) {
        const auto loaded = CsvDataset::load(file.string(), "y", regression);
        if (!loaded) {
            if (loaded.error().empty()) std::abort();
            continue;
        }
        const auto& csv = **loaded;
        if (csv.size() < 1 || csv.classes() < 1) std::abort();  // load refuses empty data
        const auto batch = csv.get({0, csv.size() - 1});
        if (batch.inputs.size(0) != 2 || batch.inputs.size(1) != csv.sampleShape()[0]) std::abort();
    }
    return 0;
}
