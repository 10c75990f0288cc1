// safetensors reading (mmap, zero-copy) and writing.
//
// Format (https://github.com/huggingface/safetensors): u64 little-endian N, N bytes of a
// UTF-8 JSON object {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {str: str}}, then the data; offsets are relative to the first byte after the header.
#include "hack/model/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "hack/core/error.h"
#include "hack/core/read_file.h"

namespace hack {

namespace {

using json = nlohmann::json;

// The Rust reference implementation refuses headers above 100 MB; so do we, so a corrupt
// length cannot make us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

bool parse_safetensors_dtype(std::string_view name, DType* out) {
  struct Pair {
    const char* name;
    DType dtype;
  };
  static constexpr Pair kDtypes[] = {{"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
                                     {"I8", DType::i8},   {"U8", DType::u8},   {"I32", DType::i32},
                                     {"I64", DType::i64}};
  for (const Pair& p : kDtypes) {
    if (name == p.name) {
      *out = p.dtype;
      return true;
    }
  }
  return false;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    default: break;  // block types never come from safetensors
  }
  return "?";
}

// Non-negative integer from a JSON value, or false.
bool as_u64(const json& v, uint64_t* out) {
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  const int64_t x = v.get<int64_t>();
  if (x < 0) return false;
  *out = static_cast<uint64_t>(x);
  return true;
}

SafetensorsEntry parse_entry(const std::string& file, const std::string& name, const json& v, uint64_t data_bytes,
                             size_t data_start) {
  if (!v.is_object()) fail("{}: tensor {}: header entry must be an object, got {}", file, name, v.dump());
  const auto dtype_it = v.find("dtype");
  const auto shape_it = v.find("shape");
  const auto offsets_it = v.find("data_offsets");
  if (dtype_it == v.end() || !dtype_it->is_string()) fail("{}: tensor {}: missing or non-string 'dtype'", file, name);
  if (shape_it == v.end() || !shape_it->is_array()) fail("{}: tensor {}: missing or non-list 'shape'", file, name);
  if (offsets_it == v.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    fail("{}: tensor {}: 'data_offsets' must be a list [begin, end]", file, name);
  }

  SafetensorsEntry e;
  e.name = name;
  const std::string dtype = dtype_it->get<std::string>();
  if (!parse_safetensors_dtype(dtype, &e.dtype)) {
    fail("{}: tensor {} has unsupported dtype {} (supported: F32, F16, BF16, I8, U8, I32, I64)", file, name, dtype);
  }
  uint64_t numel = 1;
  for (const json& d : *shape_it) {
    uint64_t dim = 0;
    if (!as_u64(d, &dim)) fail("{}: tensor {}: shape {} has a non-integer or negative dim", file, name, shape_it->dump());
    // Overflow-safe product (bounded by the file size check below anyway).
    if (dim != 0 && numel > (uint64_t{1} << 56) / dim) fail("{}: tensor {}: shape {} is too large", file, name, shape_it->dump());
    numel *= dim;
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t begin = 0, end = 0;
  if (!as_u64((*offsets_it)[0], &begin) || !as_u64((*offsets_it)[1], &end) || end < begin) {
    fail("{}: tensor {}: bad data_offsets {}", file, name, offsets_it->dump());
  }
  const uint64_t expect_bytes = numel * dtype_size(e.dtype);
  if (end - begin != expect_bytes) {
    fail("{}: tensor {}: shape {} {} needs {} bytes but data_offsets {} span {}", file, name, shape_it->dump(), dtype,
         expect_bytes, offsets_it->dump(), end - begin);
  }
  if (end > data_bytes) {
    fail("{}: tensor {}: data_offsets {} run past the end of the data ({} bytes); the file is truncated", file, name,
         offsets_it->dump(), data_bytes);
  }
  e.begin = data_start + static_cast<size_t>(begin);
  e.end = data_start + static_cast<size_t>(end);
  return e;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsEntry::describe() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "] " + std::string(dtype_name(dtype));
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> st(new SafetensorsFile());
  st->file_ = MappedFile::open(path);
  const std::string file = path.string();
  const size_t size = st->file_->size();
  HACK_CHECK(size >= 8, "{}: not a safetensors file: {} bytes, shorter than the 8-byte header length", file, size);

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | st->file_->data()[i];
  HACK_CHECK(header_bytes <= size - 8,
             "{}: header length {} runs past the end of the file ({} bytes); the file is truncated or not safetensors",
             file, header_bytes, size);
  HACK_CHECK(header_bytes <= kMaxHeaderBytes, "{}: header length {} exceeds the {}-byte limit", file, header_bytes,
             kMaxHeaderBytes);

  const char* header = reinterpret_cast<const char*>(st->file_->data() + 8);
  json root;
  try {
    root = json::parse(header, header + header_bytes);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON header: {}", file, e.what());
  }
  HACK_CHECK(root.is_object(), "{}: JSON header must be an object, got {}", file, root.type_name());

  const size_t data_start = 8 + static_cast<size_t>(header_bytes);
  const uint64_t data_bytes = size - data_start;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (value.is_object()) {
        for (const auto& [k, v] : value.items()) {
          if (v.is_string()) st->metadata_[k] = v.get<std::string>();
        }
      }
      continue;
    }
    st->entries_.push_back(parse_entry(file, name, value, data_bytes, data_start));
  }
  // nlohmann::json objects iterate in key order already; keep the invariant explicit.
  std::sort(st->entries_.begin(), st->entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.name < b.name; });
  return st;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const SafetensorsEntry& e, std::string_view n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  HACK_CHECK(e != nullptr, "tensor {} not found in {}", name, path().string());
  return tensor(*e);
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& e) const {
  HACK_CHECK(e.shape.size() <= static_cast<size_t>(Tensor::kMaxDims), "{}: tensor {} has rank {}; at most {} is supported",
             path().string(), e.name, e.shape.size(), Tensor::kMaxDims);
  Tensor::Shape shape{0, 0, 0, 0};
  for (size_t i = 0; i < e.shape.size(); ++i) shape[i] = e.shape[i];
  const int ndim = static_cast<int>(e.shape.size());
  const unsigned char* data = file_->data() + e.begin;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(e.dtype) == 0) {
    return Tensor::view(e.dtype, shape, ndim, data, file_);
  }
  // The format does not promise alignment (the header length is free); kernels may.
  Tensor copy = Tensor::empty(e.dtype, shape, ndim);
  std::memcpy(copy.raw(), data, e.end - e.begin);
  return copy;
}

// ---- checkpoint (directory) ------------------------------------------------------------

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  ck.path_ = path;
  auto add_file = [&ck](const std::shared_ptr<SafetensorsFile>& f) {
    ck.files_.push_back(f);
    for (const SafetensorsEntry& e : f->entries()) ck.where_.emplace(e.name, f.get());
  };

  if (fs::is_regular_file(path)) {
    ck.looked_in_ = path.string();
    add_file(SafetensorsFile::open(path));
    return ck;
  }
  HACK_CHECK(fs::is_directory(path), "model path {} is neither a directory nor a file", path.string());
  const fs::path single = path / "model.safetensors";
  const fs::path index = path / "model.safetensors.index.json";
  if (fs::exists(single)) {
    ck.looked_in_ = single.string();
    add_file(SafetensorsFile::open(single));
    return ck;
  }
  HACK_CHECK(fs::exists(index), "no model.safetensors or model.safetensors.index.json in {}", path.string());

  ck.looked_in_ = index.string() + " weight_map";
  json root;
  {
    const std::string text = read_file(index, "safetensors index");
    try {
      root = json::parse(text);
    } catch (const json::exception& e) {
      fail("{}: invalid JSON: {}", index.string(), e.what());
    }
  }
  HACK_CHECK(root.is_object() && root.contains("weight_map") && root["weight_map"].is_object(),
             "{}: missing 'weight_map' object", index.string());

  // Open each shard once, in order of first mention, then check the map against the shards.
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    HACK_CHECK(shard.is_string(), "{}: weight_map entry for tensor {} is not a file name", index.string(), tensor);
    const std::string shard_name = shard.get<std::string>();
    if (shards.count(shard_name)) continue;
    HACK_CHECK(fs::path(shard_name).filename() == fs::path(shard_name),
               "{}: shard '{}' (for tensor {}) is not a plain file name", index.string(), shard_name, tensor);
    const fs::path shard_path = path / shard_name;
    HACK_CHECK(fs::exists(shard_path), "{}: shard {} (holding tensor {}) does not exist", index.string(),
               shard_path.string(), tensor);
    ck.files_.push_back(SafetensorsFile::open(shard_path));
    shards[shard_name] = ck.files_.back().get();
  }
  for (const auto& [tensor, shard] : root["weight_map"].items()) {
    const SafetensorsFile* f = shards.at(shard.get<std::string>());
    HACK_CHECK(f->contains(tensor), "{}: maps tensor {} to {}, which does not contain it", index.string(), tensor,
               f->path().string());
    ck.where_.emplace(tensor, f);
  }
  return ck;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile* SafetensorsCheckpoint::locate(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(std::string_view name) const {
  const SafetensorsFile* f = locate(name);
  HACK_CHECK(f != nullptr, "tensor {} not found in {} (looked in {})", name, path_.string(), looked_in_);
  return *f;
}

Tensor SafetensorsCheckpoint::tensor(std::string_view name) const { return file_of(name).tensor(name); }

// ---- writing -----------------------------------------------------------------------------

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    HACK_CHECK(names.insert(name).second, "write_safetensors {}: duplicate tensor {}", path.string(), name);
    HACK_CHECK(name != "__metadata__", "write_safetensors {}: reserved tensor name __metadata__", path.string());
    HACK_CHECK(t.defined(), "write_safetensors {}: tensor {} is undefined", path.string(), name);
    HACK_CHECK(t.memory_kind() != MemoryKind::device, "write_safetensors {}: tensor {} is in device memory",
               path.string(), name);
    std::vector<int64_t> shape(t.shape().begin(), t.shape().begin() + t.ndim());
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  HACK_CHECK(out.good(), "cannot create {}", path.string());
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, t] : tensors) out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.bytes()));
  out.flush();
  HACK_CHECK(out.good(), "write to {} failed", path.string());
}

}  // namespace hack
