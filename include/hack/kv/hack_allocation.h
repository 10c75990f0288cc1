/// @file hack_allocation.h
/// @brief A calibrated HACK bit allocation: K/V code bits per layer (and the recent window)
/// chosen by `hack-calibrate --hack` under an accuracy budget and stored beside the model
/// as `hack_kv.json`. Every node and hack-run that loads the model applies the same file
/// (`--hack-allocation auto`), so prefill, the wire and decode agree; pages carry their
/// widths in their header (kv/hack_page.h, version 2), so a mismatch is refused on arrival.
///
/// File (JSON):
///   { "format": "hackserve.hack-allocation", "version": 1, "num_layers": L,
///     "layers": [ {"k_bits": 4, "v_bits": 2}, ... L entries ],
///     "recent_tokens": R,            // optional
///     "calibration": { ... }         // optional: how it was chosen (informational) }
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hack/kv/kv_options.h"

namespace hack {

inline constexpr const char* kHackAllocationFile = "hack_kv.json";

struct HackAllocation {
  std::vector<HackLayerBits> layers;
  std::optional<int> recent_tokens;
  std::string calibration_json = "{}";  ///< the "calibration" object, serialized
};

/// Reads and validates an allocation file; throws hack::Error naming the file and field.
HackAllocation load_hack_allocation(const std::string& path);
/// Writes it (atomically: a temporary file renamed over the target).
void save_hack_allocation(const std::string& path, const HackAllocation& allocation);

/// Applies an allocation to options: per-layer bits, and the recent window unless
/// `keep_recent` (the user set --hack-recent). Throws if its layer count differs.
void apply_hack_allocation(KvCacheOptions& options, const HackAllocation& allocation, int num_layers,
                           bool keep_recent);

}  // namespace hack
