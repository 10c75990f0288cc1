/// @file safetensors.h
/// @brief Memory-mapped safetensors files (zero-copy Tensor views) and a Hugging Face model
/// directory of them: model.safetensors, or shards listed by model.safetensors.index.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hack/core/dtype.h"
#include "hack/core/mapped_file.h"
#include "hack/core/tensor.h"

namespace hack {

/// One tensor's header entry. Offsets are absolute within the file (header already added).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  ///< may have any rank; Tensor views need rank <= 4
  size_t begin = 0;            ///< first byte of the data in the file
  size_t end = 0;              ///< one past the last byte

  int64_t numel() const;
  /// "[4096, 2048] bf16"
  std::string describe() const;
};

/// A safetensors file: 8-byte little-endian header length, JSON header, data. open()
/// validates every entry (known dtype, shape × dtype size == data_offsets span, data
/// inside the file) so a truncated or corrupt file fails there, naming file and tensor.
class SafetensorsFile {
 public:
  /// Maps `path` read-only and parses the header. Throws hack::Error naming the file (and
  /// the tensor, for a bad entry).
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_->path(); }
  size_t file_bytes() const { return file_->size(); }
  /// Entries sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// The `__metadata__` string map (empty when absent; non-string values are skipped).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The entry called `name`, or nullptr.
  const SafetensorsEntry* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  /// Zero-copy view of tensor `name` whose keepalive is the mapping (a copy only when the
  /// data is not aligned to its element size). Throws if absent or of rank > 4.
  Tensor tensor(std::string_view name) const;
  Tensor tensor(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  std::shared_ptr<MappedFile> file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// The safetensors files of a model directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` maps tensor names to (each shard opened once).
class SafetensorsCheckpoint {
 public:
  /// `path` is a model directory or a single .safetensors file. Throws hack::Error when
  /// neither file is present, the index is malformed, a shard is missing, or the index
  /// maps a tensor to a shard that does not contain it.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);

  /// Directory (or the single file) this checkpoint was opened from.
  const std::filesystem::path& path() const { return path_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;

  bool contains(std::string_view name) const { return locate(name) != nullptr; }
  /// The file holding tensor `name`, or nullptr.
  const SafetensorsFile* locate(std::string_view name) const;
  /// The file holding tensor `name`; throws "tensor X not found in <dir> (looked in ...)".
  const SafetensorsFile& file_of(std::string_view name) const;
  /// Zero-copy view of tensor `name`; throws like file_of.
  Tensor tensor(std::string_view name) const;

 private:
  std::filesystem::path path_;
  std::string looked_in_;  // for "not found" errors: the file, or the index
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> where_;
};

/// Writes `tensors` (name, tensor) as a safetensors file (host tensors only; used by tools
/// and tests). Tensors are laid out in the given order, the header padded to 8 bytes.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace hack
