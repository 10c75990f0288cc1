/// @file gguf_file.h
/// @brief A GGUF file read natively: header (versions 2 and 3, little-endian), metadata of
/// every value type (arrays nest), the tensor index, and the tensor data mapped, not copied.
///
/// Layout (ggml's gguf.md):
///   "GGUF" u32 version, u64 n_tensors, u64 n_kv
///   n_kv × { string key, u32 type, value }           string = u64 length + UTF-8 bytes
///                                                    array  = u32 elem type, u64 count, values
///   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
///   pad to general.alignment (default 32), then the data; offsets are from there.
/// ne[0] is the row length (ggml lists dims fastest first); tensor() returns the row-major
/// shape [ne[n−1], ..., ne[0]].
///
/// Every count, length, offset and size is checked against the bytes present before it is
/// used; a truncated or malformed file throws hack::Error naming the file, the field and the
/// offset, never reads out of bounds.
///
/// In core (not model) because two layers read it: model (weights, config) and tokenizer
/// (vocabulary, merges, chat template).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hack/core/tensor.h"

namespace hack {

/// True when `path` is a regular file whose first four bytes are the GGUF magic.
bool is_gguf_file(const std::filesystem::path& path);

/// GGUF metadata value types (gguf_type), with their file codes.
enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

/// "u8", "string", "array", ...
std::string_view gguf_type_name(GgufType t);

/// One metadata value. Integers are held in `i` (signed types) or `u` (unsigned and bool),
/// floats in `f`; an array holds its element type and elements (which may be arrays).
struct GgufValue {
  GgufType type = GgufType::u8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  GgufType elem_type = GgufType::u8;  // arrays only
  std::vector<GgufValue> items;       // arrays only

  bool is_integer() const;
  /// The value as an integer of any integer type (or bool), checked to fit; throws
  /// hack::Error naming `what` otherwise.
  int64_t as_int(std::string_view what) const;
  uint64_t as_uint(std::string_view what) const;
  /// f32 / f64, or an integer converted.
  double as_float(std::string_view what) const;
  bool as_bool(std::string_view what) const;
  const std::string& as_string(std::string_view what) const;
  /// An array of strings / of integers.
  std::vector<std::string> as_strings(std::string_view what) const;
  std::vector<int64_t> as_ints(std::string_view what) const;
};

/// ggml tensor type codes this reader knows by name (ggml.h enum ggml_type).
/// name: "Q4_K"; dtype: our DType when we compute on it; block elems/bytes: 0 when unknown.
struct GgmlTypeInfo {
  std::string_view name;
  std::optional<DType> dtype;
  uint64_t block_elems = 0;
  uint64_t block_bytes = 0;
};
/// The type with code `ggml_type`; an unknown code gives the name "type <code>".
GgmlTypeInfo ggml_type_info(uint32_t ggml_type);
/// The ggml code of a DType (f32, f16, bf16 and the block types).
uint32_t ggml_type_of(DType t);

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the row length
  uint32_t ggml_type = 0;
  uint64_t offset = 0;       // from the start of the data section
  uint64_t bytes = 0;        // 0 when the type's block size is unknown to us
};

class GgufFile {
 public:
  /// Maps `path` and parses it.
  static GgufFile open(const std::filesystem::path& path);
  /// Parses bytes held by `keepalive` (a mapping; tests and the fuzz target pass a vector).
  /// `source` names the bytes in errors.
  static GgufFile parse(std::span<const unsigned char> bytes, std::shared_ptr<const void> keepalive,
                        std::string source);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& source() const { return source_; }

  /// Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  /// The value of `key`; throws hack::Error naming the key and file when it is missing.
  const GgufValue& at(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  /// A zero-copy view of tensor `name` in its row-major shape; throws naming the tensor
  /// when it is missing or of a type we do not compute on ("IQ2_XXS is not supported").
  Tensor tensor(std::string_view name) const;
  Tensor tensor(const GgufTensorInfo& info) const;

 private:
  std::shared_ptr<const void> keepalive_;
  std::span<const unsigned char> bytes_;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace hack
