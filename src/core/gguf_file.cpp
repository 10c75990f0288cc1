// GGUF parsing: a cursor over the bytes that checks every read against what is left, so a
// count or length from the file is never trusted before the bytes it promises are there.
#include "hack/core/gguf_file.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <limits>

#include "hack/core/error.h"
#include "hack/core/mapped_file.h"

namespace hack {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are refused
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS

struct Cursor {
  std::span<const unsigned char> bytes;
  size_t at = 0;
  const std::string& source;

  size_t left() const { return bytes.size() - at; }

  void need(size_t n, std::string_view what) const {
    if (n > left())
      fail("{}: truncated GGUF: {} needs {} bytes at offset {}, only {} left", source, what, n, at, left());
  }
  template <class T>
  T get(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string string(std::string_view what) {
    const uint64_t n = get<uint64_t>(what);
    need(n, what);  // n <= left(), so it fits size_t
    std::string s(reinterpret_cast<const char*>(bytes.data() + at), static_cast<size_t>(n));
    at += static_cast<size_t>(n);
    return s;
  }
};

// The fewest bytes one array element of type t takes: a bound on a count before allocating.
size_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string: return 8;
    case GgufType::array: return 12;
  }
  return 1;
}

bool valid_type(uint32_t code) { return code <= static_cast<uint32_t>(GgufType::f64); }

GgufValue read_value(Cursor& c, GgufType type, const std::string& key, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::u8: v.u = c.get<uint8_t>(key); break;
    case GgufType::i8: v.i = c.get<int8_t>(key); break;
    case GgufType::u16: v.u = c.get<uint16_t>(key); break;
    case GgufType::i16: v.i = c.get<int16_t>(key); break;
    case GgufType::u32: v.u = c.get<uint32_t>(key); break;
    case GgufType::i32: v.i = c.get<int32_t>(key); break;
    case GgufType::u64: v.u = c.get<uint64_t>(key); break;
    case GgufType::i64: v.i = c.get<int64_t>(key); break;
    case GgufType::f32: v.f = c.get<float>(key); break;
    case GgufType::f64: v.f = c.get<double>(key); break;
    case GgufType::boolean: {
      const uint8_t b = c.get<uint8_t>(key);
      if (b > 1) fail("{}: metadata {}: bool byte {} at offset {} is not 0 or 1", c.source, key, b, c.at - 1);
      v.u = b;
      break;
    }
    case GgufType::string: v.s = c.string(key); break;
    case GgufType::array: {
      if (depth >= kMaxArrayDepth)
        fail("{}: metadata {}: arrays nested deeper than {} at offset {}", c.source, key, kMaxArrayDepth, c.at);
      const uint32_t elem = c.get<uint32_t>(key);
      if (!valid_type(elem)) fail("{}: metadata {}: array element type {} is not a GGUF type", c.source, key, elem);
      v.elem_type = static_cast<GgufType>(elem);
      const uint64_t n = c.get<uint64_t>(key);
      if (n > c.left() / min_value_bytes(v.elem_type))
        fail("{}: truncated GGUF: metadata {} promises {} {} elements at offset {}, only {} bytes left", c.source,
             key, n, gguf_type_name(v.elem_type), c.at, c.left());
      v.items.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(c, v.elem_type, key, depth + 1));
      break;
    }
  }
  return v;
}

// a * b, or nullopt past 2^63 (the bound every size is checked against first).
std::optional<uint64_t> mul_checked(uint64_t a, uint64_t b) {
  constexpr uint64_t kLimit = uint64_t{1} << 63;
  if (a != 0 && b > kLimit / a) return std::nullopt;
  return a * b;
}

}  // namespace

bool is_gguf_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::array<char, 4> magic{};
  return in.read(magic.data(), magic.size()) && std::string_view(magic.data(), magic.size()) == "GGUF";
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16: case GgufType::u32:
    case GgufType::i32: case GgufType::u64: case GgufType::i64: case GgufType::boolean: return true;
    default: return false;
  }
}

namespace {
bool is_signed(GgufType t) {
  return t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64;
}
}  // namespace

int64_t GgufValue::as_int(std::string_view what) const {
  HACK_CHECK(is_integer(), "{}: expected an integer, got {}", what, gguf_type_name(type));
  if (is_signed(type)) return i;
  HACK_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: {} does not fit int64", what, u);
  return static_cast<int64_t>(u);
}

uint64_t GgufValue::as_uint(std::string_view what) const {
  HACK_CHECK(is_integer(), "{}: expected an integer, got {}", what, gguf_type_name(type));
  if (is_signed(type)) {
    HACK_CHECK(i >= 0, "{}: expected a non-negative integer, got {}", what, i);
    return static_cast<uint64_t>(i);
  }
  return u;
}

double GgufValue::as_float(std::string_view what) const {
  if (type == GgufType::f32 || type == GgufType::f64) return f;
  HACK_CHECK(is_integer() && type != GgufType::boolean, "{}: expected a number, got {}", what, gguf_type_name(type));
  return is_signed(type) ? static_cast<double>(i) : static_cast<double>(u);
}

bool GgufValue::as_bool(std::string_view what) const {
  HACK_CHECK(type == GgufType::boolean, "{}: expected a bool, got {}", what, gguf_type_name(type));
  return u != 0;
}

const std::string& GgufValue::as_string(std::string_view what) const {
  HACK_CHECK(type == GgufType::string, "{}: expected a string, got {}", what, gguf_type_name(type));
  return s;
}

std::vector<std::string> GgufValue::as_strings(std::string_view what) const {
  HACK_CHECK(type == GgufType::array && elem_type == GgufType::string, "{}: expected an array of strings, got {}{}",
             what, gguf_type_name(type), type == GgufType::array ? fmt::format(" of {}", gguf_type_name(elem_type)) : "");
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const GgufValue& v : items) out.push_back(v.s);
  return out;
}

std::vector<int64_t> GgufValue::as_ints(std::string_view what) const {
  HACK_CHECK(type == GgufType::array, "{}: expected an array of integers, got {}", what, gguf_type_name(type));
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (const GgufValue& v : items) out.push_back(v.as_int(what));
  return out;
}

GgmlTypeInfo ggml_type_info(uint32_t code) {
  // Block sizes from ggml's type_traits, for the types whose layout we know; the rest are
  // known by name only (a file holding them still parses; its tensors are refused by name).
  switch (code) {
    case 0: return {"F32", DType::f32, 1, 4};
    case 1: return {"F16", DType::f16, 1, 2};
    case 2: return {"Q4_0", DType::q4_0, 32, 18};
    case 3: return {"Q4_1", DType::q4_1, 32, 20};
    case 6: return {"Q5_0", DType::q5_0, 32, 22};
    case 7: return {"Q5_1", DType::q5_1, 32, 24};
    case 8: return {"Q8_0", DType::q8_0, 32, 34};
    case 9: return {"Q8_1", std::nullopt, 32, 36};
    case 10: return {"Q2_K", std::nullopt, 256, 84};
    case 11: return {"Q3_K", std::nullopt, 256, 110};
    case 12: return {"Q4_K", DType::q4_k, 256, 144};
    case 13: return {"Q5_K", DType::q5_k, 256, 176};
    case 14: return {"Q6_K", DType::q6_k, 256, 210};
    case 15: return {"Q8_K", std::nullopt, 256, 292};
    case 16: return {"IQ2_XXS", std::nullopt, 0, 0};
    case 17: return {"IQ2_XS", std::nullopt, 0, 0};
    case 18: return {"IQ3_XXS", std::nullopt, 0, 0};
    case 19: return {"IQ1_S", std::nullopt, 0, 0};
    case 20: return {"IQ4_NL", std::nullopt, 0, 0};
    case 21: return {"IQ3_S", std::nullopt, 0, 0};
    case 22: return {"IQ2_S", std::nullopt, 0, 0};
    case 23: return {"IQ4_XS", std::nullopt, 0, 0};
    case 24: return {"I8", DType::i8, 1, 1};
    case 25: return {"I16", std::nullopt, 1, 2};
    case 26: return {"I32", DType::i32, 1, 4};
    case 27: return {"I64", DType::i64, 1, 8};
    case 28: return {"F64", std::nullopt, 1, 8};
    case 29: return {"IQ1_M", std::nullopt, 0, 0};
    case 30: return {"BF16", DType::bf16, 1, 2};
    case 34: return {"TQ1_0", std::nullopt, 0, 0};
    case 35: return {"TQ2_0", std::nullopt, 0, 0};
    case 39: return {"MXFP4", std::nullopt, 0, 0};
    default: return {"unknown", std::nullopt, 0, 0};
  }
}

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::f32: return 0;
    case DType::f16: return 1;
    case DType::q4_0: return 2;
    case DType::q4_1: return 3;
    case DType::q5_0: return 6;
    case DType::q5_1: return 7;
    case DType::q8_0: return 8;
    case DType::q4_k: return 12;
    case DType::q5_k: return 13;
    case DType::q6_k: return 14;
    case DType::i8: return 24;
    case DType::i32: return 26;
    case DType::i64: return 27;
    case DType::bf16: return 30;
    case DType::u8: break;
  }
  fail("dtype {} has no ggml type", dtype_name(t));
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  const std::span<const unsigned char> bytes(file->data(), file->size());
  return parse(bytes, std::move(file), path.string());
}

GgufFile GgufFile::parse(std::span<const unsigned char> bytes, std::shared_ptr<const void> keepalive,
                         std::string source) {
  GgufFile g;
  g.keepalive_ = std::move(keepalive);
  g.bytes_ = bytes;
  g.source_ = std::move(source);
  Cursor c{bytes, 0, g.source_};

  c.need(4, "the magic");
  const uint32_t magic = c.get<uint32_t>("the magic");
  if (magic != kMagic) fail("{}: not a GGUF file (the first four bytes are not \"GGUF\")", g.source_);
  g.version_ = c.get<uint32_t>("the version");
  if (g.version_ == 1) fail("{}: GGUF version 1 is not supported (versions 2 and 3 are)", g.source_);
  if (g.version_ > 0xFFFF && (g.version_ >> 24) != 0)
    fail("{}: big-endian GGUF (version bytes {:#010x}) is not supported", g.source_, g.version_);
  if (g.version_ != 2 && g.version_ != 3)
    fail("{}: GGUF version {} is not supported (versions 2 and 3 are)", g.source_, g.version_);
  const uint64_t n_tensors = c.get<uint64_t>("the tensor count");
  const uint64_t n_kv = c.get<uint64_t>("the metadata count");
  // A key/value takes at least 8 + 4 + 1 bytes, a tensor entry 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.left() / 13) fail("{}: truncated GGUF: {} metadata entries cannot fit in {} bytes", g.source_, n_kv, c.left());
  if (n_tensors > c.left() / 32)
    fail("{}: truncated GGUF: {} tensor entries cannot fit in {} bytes", g.source_, n_tensors, c.left());

  g.metadata_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const size_t key_at = c.at;
    std::string key = c.string("a metadata key");
    const uint32_t type = c.get<uint32_t>(key);
    if (!valid_type(type)) fail("{}: metadata {} (at offset {}): value type {} is not a GGUF type", g.source_, key, key_at, type);
    GgufValue v = read_value(c, static_cast<GgufType>(type), key, 0);
    if (!g.metadata_index_.emplace(key, g.metadata_.size()).second)
      fail("{}: metadata key {} appears twice", g.source_, key);
    g.metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    HACK_CHECK(a->type == GgufType::u32, "{}: general.alignment must be a u32, got {}", g.source_, gguf_type_name(a->type));
    HACK_CHECK(a->u != 0 && (a->u & (a->u - 1)) == 0, "{}: general.alignment {} is not a power of two", g.source_, a->u);
    g.alignment_ = a->u;
  }

  g.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = c.string("a tensor name");
    const uint32_t n_dims = c.get<uint32_t>(t.name);
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("{}: tensor {}: {} dims (1 to {} supported)", g.source_, t.name, n_dims, kMaxDims);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.get<uint64_t>(t.name);
      const std::optional<uint64_t> e = mul_checked(elems, n);
      if (!e) fail("{}: tensor {}: its element count overflows", g.source_, t.name);
      elems = *e;
      t.ne.push_back(n);
    }
    t.ggml_type = c.get<uint32_t>(t.name);
    t.offset = c.get<uint64_t>(t.name);
    const GgmlTypeInfo info = ggml_type_info(t.ggml_type);
    if (info.block_elems != 0) {
      if (t.ne[0] % info.block_elems != 0)
        fail("{}: tensor {}: rows of {} elements are not whole {} blocks of {}", g.source_, t.name, t.ne[0], info.name,
             info.block_elems);
      const std::optional<uint64_t> b = mul_checked(elems / info.block_elems, info.block_bytes);
      if (!b) fail("{}: tensor {}: its byte size overflows", g.source_, t.name);
      t.bytes = *b;
    }
    if (t.offset % g.alignment_ != 0)
      fail("{}: tensor {}: data offset {} is not a multiple of the alignment {}", g.source_, t.name, t.offset, g.alignment_);
    if (!g.tensor_index_.emplace(t.name, g.tensors_.size()).second)
      fail("{}: tensor {} appears twice", g.source_, t.name);
    g.tensors_.push_back(std::move(t));
  }
  const uint64_t data = (c.at + g.alignment_ - 1) / g.alignment_ * g.alignment_;
  g.data_offset_ = data;
  const uint64_t data_bytes = data <= bytes.size() ? bytes.size() - data : 0;
  for (const GgufTensorInfo& t : g.tensors_) {
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset)
      fail("{}: truncated GGUF: tensor {} needs bytes [{}, {}) of the data section, which has {}", g.source_, t.name,
           t.offset, t.offset + t.bytes, data_bytes);
  }
  return g;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  HACK_CHECK(v != nullptr, "{}: metadata key {} is missing", source_, key);
  return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* t = find_tensor(name);
  HACK_CHECK(t != nullptr, "{}: tensor {} is missing", source_, name);
  return tensor(*t);
}

Tensor GgufFile::tensor(const GgufTensorInfo& t) const {
  const GgmlTypeInfo info = ggml_type_info(t.ggml_type);
  if (!info.dtype) {
    if (info.name == "unknown") fail("{}: tensor {}: ggml type {} is not supported", source_, t.name, t.ggml_type);
    fail("{}: tensor {}: type {} is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K are)", source_,
         t.name, info.name);
  }
  Tensor::Shape shape{0, 0, 0, 0};
  const int ndim = static_cast<int>(t.ne.size());
  for (int d = 0; d < ndim; ++d) {
    const uint64_t n = t.ne[static_cast<size_t>(ndim - 1 - d)];
    HACK_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "{}: tensor {}: dim {} too large",
               source_, t.name, n);
    shape[static_cast<size_t>(d)] = static_cast<int64_t>(n);
  }
  // Every tensor with bytes lies inside the file (checked in parse); an empty one may name an
  // offset at or past the end, which is clamped so no pointer is formed outside the mapping.
  const unsigned char* data = bytes_.data() + std::min<uint64_t>(data_offset_ + t.offset, bytes_.size());
  // Block and 16-bit types hold u16 fields, f32 floats: the views read them in place.
  const size_t align = dtype_is_quantized(*info.dtype) ? 2 : dtype_size(*info.dtype);
  HACK_CHECK(reinterpret_cast<uintptr_t>(data) % align == 0, "{}: tensor {}: data at file offset {} is not {}-byte aligned",
             source_, t.name, data_offset_ + t.offset, align);
  return Tensor::view(*info.dtype, shape, ndim, data, keepalive_);
}

}  // namespace hack
