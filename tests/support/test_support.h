// Helpers shared by tests: where fixtures live, tolerance checks that print context.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

namespace hack::test {

/// Repository root (compile-time path).
inline std::filesystem::path source_dir() { return HACK_SOURCE_DIR; }
/// Build directory, where bin/ holds the tools.
inline std::filesystem::path binary_dir() { return HACK_BINARY_DIR; }
/// tests/fixtures inside the repository.
inline std::filesystem::path fixtures_dir() { return source_dir() / "tests" / "fixtures"; }
/// The shared fixtures (real tokenizer files), copied into the repository from
/// ../shared/fixtures so a clean clone needs nothing beside it.
inline std::filesystem::path shared_fixtures_dir() { return source_dir() / "tests" / "fixtures" / "shared"; }

/// |a - b| <= atol + rtol * |b|
inline bool close(double a, double b, double atol, double rtol) {
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

}  // namespace hack::test
