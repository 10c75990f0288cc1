#include "hack/kv/hack_allocation.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hack/core/error.h"
#include "hack/core/read_file.h"

namespace hack {

namespace {
constexpr const char* kFormat = "hackserve.hack-allocation";
constexpr int kVersion = 1;
}  // namespace

HackAllocation load_hack_allocation(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "HACK allocation"));
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
  HACK_CHECK(j.is_object() && j.value("format", "") == kFormat, "{}: not a HACK allocation (format must be \"{}\")",
             path, kFormat);
  HACK_CHECK(j.value("version", 0) == kVersion, "{}: version {}, this build reads version {}", path,
             j.value("version", 0), kVersion);
  HACK_CHECK(j.contains("layers") && j["layers"].is_array() && !j["layers"].empty(), "{}: \"layers\" must be a non-empty list",
             path);
  HackAllocation a;
  for (size_t l = 0; l < j["layers"].size(); ++l) {
    const nlohmann::json& e = j["layers"][l];
    HACK_CHECK(e.is_object() && e.contains("k_bits") && e.contains("v_bits") && e["k_bits"].is_number_integer() &&
                   e["v_bits"].is_number_integer(),
               "{}: layers[{}] needs integer k_bits and v_bits", path, l);
    const HackLayerBits b{e["k_bits"].get<int>(), e["v_bits"].get<int>()};
    for (const int bits : {b.k_bits, b.v_bits})
      HACK_CHECK(is_hack_bits(bits), "{}: layers[{}]: bits must be 2, 4 or 8, got {}", path, l, bits);
    a.layers.push_back(b);
  }
  if (j.contains("num_layers"))
    HACK_CHECK(j["num_layers"].is_number_integer() && j["num_layers"].get<size_t>() == a.layers.size(),
               "{}: num_layers {} but {} layer entries", path, j["num_layers"].dump(), a.layers.size());
  if (j.contains("recent_tokens")) {
    HACK_CHECK(j["recent_tokens"].is_number_integer() && j["recent_tokens"].get<int>() >= 0,
               "{}: recent_tokens must be a non-negative integer", path);
    a.recent_tokens = j["recent_tokens"].get<int>();
  }
  if (j.contains("calibration")) a.calibration_json = j["calibration"].dump();
  return a;
}

void save_hack_allocation(const std::string& path, const HackAllocation& a) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["num_layers"] = a.layers.size();
  j["layers"] = nlohmann::ordered_json::array();
  for (const HackLayerBits& b : a.layers) j["layers"].push_back({{"k_bits", b.k_bits}, {"v_bits", b.v_bits}});
  if (a.recent_tokens) j["recent_tokens"] = *a.recent_tokens;
  j["calibration"] = nlohmann::ordered_json::parse(a.calibration_json);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    HACK_CHECK(out.good(), "{}: cannot write", tmp);
    out << j.dump(2) << "\n";
    HACK_CHECK(out.good(), "{}: write failed", tmp);
  }
  std::filesystem::rename(tmp, path);
}

void apply_hack_allocation(KvCacheOptions& options, const HackAllocation& a, int num_layers, bool keep_recent) {
  HACK_CHECK(static_cast<int>(a.layers.size()) == num_layers, "HACK allocation has {} layers, the model {}",
             a.layers.size(), num_layers);
  options.layer_bits = a.layers;
  if (a.recent_tokens && !keep_recent) options.recent_tokens = *a.recent_tokens;
}

}  // namespace hack
