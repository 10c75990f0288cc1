// The vault block codec (include/hack/kv/kv_block.h): a block's value, header and per-layer
// table, exact and int8-head slices, and their validated restore into a PagedKv.
#include "hack/kv/kv_block.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hack/core/byte_io.h"
#include "hack/core/clock.h"
#include "hack/core/error.h"

namespace hack {

namespace {

constexpr uint8_t kDtypeNone = 0;  // int8-head: codes and scales have fixed types
constexpr uint8_t kDtypeBf16 = 1;
constexpr uint8_t kDtypeF32 = 2;
constexpr int kMaxDim = std::numeric_limits<uint16_t>::max();
constexpr int kMaxPosition = std::numeric_limits<int>::max();
constexpr float kInt8Max = 127.0f;

uint64_t xxh64(std::span<const std::byte> bytes) { return XXH64(bytes.data(), bytes.size(), 0); }

void check_codec(BlockCodec codec) {
  HACK_CHECK(codec == BlockCodec::exact || codec == BlockCodec::int8_head, "kv block: unknown codec {}",
             static_cast<int>(codec));
}

void check_exact_dtype(BlockCodec codec, DType dtype) {
  HACK_CHECK(codec != BlockCodec::exact || dtype == DType::bf16 || dtype == DType::f32,
             "kv block: the exact codec stores bf16 or f32, not {}", dtype_name(dtype));
}

// Bytes of one (token, head) in one layer, K and V together.
size_t token_head_bytes(BlockCodec codec, DType dtype, int head_dim) {
  const size_t d = static_cast<size_t>(head_dim);
  return codec == BlockCodec::exact ? 2 * d * dtype_size(dtype) : 2 * (sizeof(float) + d);
}

// int8-head, one K or V part of a slice: scales f32 [rows], codes int8 [rows][dim], where a
// row is one (token, head). `out` has rows · (4 + dim) bytes.
void quantize_rows(const float* x, size_t rows, size_t dim, std::byte* out) {
  std::byte* scales = out;
  std::byte* codes = out + rows * sizeof(float);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    float absmax = 0.0f;
    for (size_t c = 0; c < dim; ++c) {
      const float a = std::fabs(row[c]);
      if (a > absmax || std::isnan(a)) absmax = a;  // a NaN sticks (nothing compares greater)
    }
    HACK_CHECK(std::isfinite(absmax), "kv block int8-head: non-finite value in row {} (token × head)", r);
    const float scale = absmax / kInt8Max;
    std::memcpy(scales + r * sizeof(float), &scale, sizeof(float));
    int8_t* q = reinterpret_cast<int8_t*>(codes + r * dim);
    if (scale == 0.0f) {  // an all-zero row (or one so small its scale underflows)
      std::fill(q, q + dim, int8_t{0});
      continue;
    }
    for (size_t c = 0; c < dim; ++c)  // nearbyint: the default mode rounds to nearest even
      q[c] = static_cast<int8_t>(std::clamp(std::nearbyint(row[c] / scale), -kInt8Max, kInt8Max));
  }
}

void dequantize_rows(const std::byte* in, size_t rows, size_t dim, float* x) {
  const std::byte* scales = in;
  const int8_t* codes = reinterpret_cast<const int8_t*>(in + rows * sizeof(float));
  for (size_t r = 0; r < rows; ++r) {
    float scale;
    std::memcpy(&scale, scales + r * sizeof(float), sizeof(float));
    HACK_CHECK(std::isfinite(scale) && scale >= 0.0f, "kv block int8-head: row {} has scale {}", r, scale);
    const int8_t* q = codes + r * dim;
    float* out = x + r * dim;
    for (size_t c = 0; c < dim; ++c) {
      HACK_CHECK(q[c] != std::numeric_limits<int8_t>::min(), "kv block int8-head: code -128 in row {}", r);
      out[c] = static_cast<float>(q[c]) * scale;
    }
  }
}

void to_dtype(const float* x, size_t n, DType dtype, std::byte* out) {
  if (dtype == DType::f32) {
    std::memcpy(out, x, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = f32_to_bf16(x[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

// Appends `bytes` to `out` and lets `fill` write them; `out` keeps its old size if it throws.
template <class Fill>
void append_slice(std::vector<std::byte>& out, size_t bytes, Fill&& fill) {
  const size_t at = out.size();
  out.resize(at + bytes);
  try {
    fill(out.data() + at);
  } catch (...) {
    out.resize(at);
    throw;
  }
}

}  // namespace

BlockCodec parse_block_codec(std::string_view name) {
  if (name == "exact") return BlockCodec::exact;
  if (name == "int8-head") return BlockCodec::int8_head;
  fail("unknown KV block codec '{}' (exact, int8-head)", name);
}

std::string_view block_codec_name(BlockCodec codec) {
  switch (codec) {
    case BlockCodec::exact: return "exact";
    case BlockCodec::int8_head: return "int8-head";
  }
  return "unknown";
}

size_t kv_block_layer_bytes(BlockCodec codec, DType dtype, int tokens, int num_kv_heads, int head_dim) {
  check_codec(codec);
  check_exact_dtype(codec, dtype);
  HACK_CHECK(tokens >= 0 && num_kv_heads >= 0 && head_dim >= 0, "kv block: {} tokens × {} heads × {} dims",
             tokens, num_kv_heads, head_dim);
  return static_cast<size_t>(tokens) * static_cast<size_t>(num_kv_heads) * token_head_bytes(codec, dtype, head_dim);
}

size_t kv_block_bytes(BlockCodec codec, DType dtype, const KvShape& shape, int tokens) {
  const size_t layers = static_cast<size_t>(std::max(shape.num_layers, 0));
  return kKvBlockHeaderBytes +
         layers * (kKvBlockLayerEntryBytes + kv_block_layer_bytes(codec, dtype, tokens, shape.num_kv_heads,
                                                                  shape.head_dim));
}

namespace {

// Largest value a prefix may describe (decode_kv_block_prefix): bounds the table's arithmetic
// the way a whole value's size does.
constexpr uint64_t kMaxDescribedValueBytes = uint64_t{1} << 40;

// The header and table of `value`; with prefix_only the slices need not be present (`value`
// then holds at least the header and table, and the slices are checked against a value of
// kMaxDescribedValueBytes).
KvBlockHeader decode_header(std::span<const std::byte> value, bool prefix_only) {
  const uint64_t size = prefix_only ? kMaxDescribedValueBytes : value.size();
  HACK_CHECK(value.size() >= kKvBlockHeaderBytes, "kv block: {} bytes, shorter than the {}-byte header", value.size(),
             kKvBlockHeaderBytes);
  const std::byte* p = value.data();
  size_t at = 0;
  const auto magic = get_le<uint32_t>(p, at);
  HACK_CHECK(magic == kKvBlockMagic, "kv block: bad magic {:#010x} (expected {:#010x}, \"HKVB\")", magic,
             kKvBlockMagic);
  const auto version = get_le<uint16_t>(p, at);
  HACK_CHECK(version == kKvBlockVersion, "kv block: version {}, this build reads {}", version, kKvBlockVersion);
  const auto codec = get_le<uint8_t>(p, at);
  HACK_CHECK(codec == static_cast<uint8_t>(BlockCodec::exact) || codec == static_cast<uint8_t>(BlockCodec::int8_head),
             "kv block: unknown codec {} (1 exact, 2 int8-head)", codec);
  const auto dtype = get_le<uint8_t>(p, at);
  KvBlockHeader h;
  h.codec = static_cast<BlockCodec>(codec);
  if (h.codec == BlockCodec::exact) {
    HACK_CHECK(dtype == kDtypeBf16 || dtype == kDtypeF32, "kv block: exact codec with dtype code {} (1 bf16, 2 f32)",
               dtype);
    h.dtype = dtype == kDtypeF32 ? DType::f32 : DType::bf16;
  } else {
    HACK_CHECK(dtype == kDtypeNone, "kv block: int8-head codec with dtype code {} (must be 0)", dtype);
    h.dtype = DType::i8;
  }
  const auto num_layers = get_le<uint32_t>(p, at);
  const auto tokens = get_le<uint32_t>(p, at);
  const auto num_kv_heads = get_le<uint16_t>(p, at);
  const auto head_dim = get_le<uint16_t>(p, at);
  const auto reserved = get_le<uint32_t>(p, at);
  const auto first_token = get_le<uint64_t>(p, at);
  HACK_CHECK(num_layers > 0 && tokens > 0 && num_kv_heads > 0 && head_dim > 0,
             "kv block: empty shape ({} layers, {} tokens, {} heads, head_dim {})", num_layers, tokens, num_kv_heads,
             head_dim);
  HACK_CHECK(reserved == 0, "kv block: reserved field is {}", reserved);
  HACK_CHECK(tokens <= static_cast<uint32_t>(kMaxPosition) &&
                 first_token <= static_cast<uint64_t>(static_cast<uint32_t>(kMaxPosition) - tokens),
             "kv block: tokens [{}, {} + {}) lie beyond the largest position", first_token, first_token, tokens);
  const uint64_t table_end = kKvBlockHeaderBytes + uint64_t{num_layers} * kKvBlockLayerEntryBytes;
  HACK_CHECK(table_end <= value.size(), "kv block: {} bytes cannot hold the table of {} layers ({} bytes with the header)",
             value.size(), num_layers, table_end);
  // tokens · heads < 2^48 and a (token, head) is < 2^19 bytes: bounded by `size` before multiplying.
  const uint64_t rows = uint64_t{tokens} * num_kv_heads;
  const uint64_t row_bytes = token_head_bytes(h.codec, h.dtype, head_dim);
  HACK_CHECK(rows <= size / row_bytes,
             "kv block: {} tokens × {} heads × head_dim {} need more than the value's {} bytes per layer", tokens,
             num_kv_heads, head_dim, size);
  const uint64_t layer_bytes = rows * row_bytes;
  h.num_layers = static_cast<int>(num_layers);
  h.tokens = static_cast<int>(tokens);
  h.num_kv_heads = num_kv_heads;
  h.head_dim = head_dim;
  h.first_token = static_cast<int64_t>(first_token);
  h.layers.resize(num_layers);
  uint64_t next = table_end;  // slices are contiguous, layer 0 first
  for (uint32_t l = 0; l < num_layers; ++l) {
    KvBlockLayer& e = h.layers[l];
    e.offset = get_le<uint64_t>(p, at);
    e.bytes = get_le<uint64_t>(p, at);
    e.checksum = get_le<uint64_t>(p, at);
    HACK_CHECK(e.bytes == layer_bytes, "kv block: layer {} slice has {} bytes, but {} × {} tokens × {} heads × "
               "head_dim {} need {}", l, e.bytes, block_codec_name(h.codec), tokens, num_kv_heads, head_dim,
               layer_bytes);
    HACK_CHECK(e.offset <= size && e.bytes <= size - e.offset,
               "kv block: layer {} slice [{}, {} + {}) lies outside the {}-byte value", l, e.offset, e.offset, e.bytes,
               size);
    HACK_CHECK(e.offset == next, "kv block: layer {} slice starts at {}, expected {} (slices follow the table, "
               "contiguous, in layer order)", l, e.offset, next);
    next += e.bytes;
  }
  HACK_CHECK(prefix_only || next == size,
             "kv block: {} bytes after the last layer's slice (value of {} bytes, slices end at {})", size - next, size,
             next);
  return h;
}

}  // namespace

KvBlockHeader decode_kv_block_header(std::span<const std::byte> value) { return decode_header(value, false); }

KvBlockHeader decode_kv_block_prefix(std::span<const std::byte> prefix) { return decode_header(prefix, true); }

bool verify_kv_block_layer(const KvBlockHeader& header, int layer, std::span<const std::byte> value) {
  HACK_CHECK(layer >= 0 && static_cast<size_t>(layer) < header.layers.size(),
             "kv block: layer {} out of range (the block has {})", layer, header.layers.size());
  const KvBlockLayer& e = header.layers[static_cast<size_t>(layer)];
  if (e.offset > value.size() || e.bytes > value.size() - e.offset) return false;
  return xxh64(value.subspan(e.offset, e.bytes)) == e.checksum;
}

void encode_kv_block_layer(const PagedKv& cache, int seq_id, int layer, int first_token, int tokens,
                           BlockCodec codec, std::vector<std::byte>& out) {
  check_codec(codec);
  const KvShape& shape = cache.shape();
  HACK_CHECK(tokens > 0 && first_token >= 0, "kv block: cannot encode {} tokens at {}", tokens, first_token);
  const DType dtype = cache.exact_dtype();
  const size_t elems = static_cast<size_t>(tokens) * static_cast<size_t>(shape.num_kv_heads) *
                       static_cast<size_t>(shape.head_dim);
  const size_t bytes = kv_block_layer_bytes(codec, dtype, tokens, shape.num_kv_heads, shape.head_dim);
  if (codec == BlockCodec::exact) {
    append_slice(out, bytes, [&](std::byte* slice) {
      const size_t half = elems * dtype_size(dtype);
      cache.copy_exact_tokens(seq_id, layer, first_token, tokens, slice, slice + half);  // checks the range first
    });
    return;
  }
  std::vector<float> kv(2 * elems);  // [K|V][tokens][heads][head_dim]
  cache.read_exact_tokens(seq_id, layer, first_token, tokens, kv.data(), kv.data() + elems);
  encode_kv_block_layer(kv.data(), kv.data() + elems, tokens, shape.num_kv_heads, shape.head_dim, codec, dtype, out);
}

void encode_kv_block_layer(const float* k, const float* v, int tokens, int num_kv_heads, int head_dim,
                           BlockCodec codec, DType dtype, std::vector<std::byte>& out) {
  check_codec(codec);
  check_exact_dtype(codec, dtype);
  HACK_CHECK(tokens > 0 && num_kv_heads > 0 && head_dim > 0, "kv block: cannot encode {} tokens × {} heads × {} dims",
             tokens, num_kv_heads, head_dim);
  const size_t rows = static_cast<size_t>(tokens) * static_cast<size_t>(num_kv_heads);
  const size_t dim = static_cast<size_t>(head_dim);
  const size_t bytes = kv_block_layer_bytes(codec, dtype, tokens, num_kv_heads, head_dim);
  append_slice(out, bytes, [&](std::byte* slice) {
    const size_t half = bytes / 2;  // K part, then V part of the same size
    if (codec == BlockCodec::exact) {
      to_dtype(k, rows * dim, dtype, slice);
      to_dtype(v, rows * dim, dtype, slice + half);
    } else {
      quantize_rows(k, rows, dim, slice);
      quantize_rows(v, rows, dim, slice + half);
    }
  });
}

std::vector<std::byte> assemble_kv_block(BlockCodec codec, DType dtype, const KvShape& shape, int64_t first_token,
                                         int tokens, std::span<const std::vector<std::byte>> slices) {
  check_codec(codec);
  check_exact_dtype(codec, dtype);
  HACK_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.num_kv_heads <= kMaxDim && shape.head_dim > 0 &&
                 shape.head_dim <= kMaxDim,
             "kv block: cannot store {} layers of {} heads × head_dim {}", shape.num_layers, shape.num_kv_heads,
             shape.head_dim);
  HACK_CHECK(tokens > 0 && first_token >= 0 && first_token <= kMaxPosition - tokens,
             "kv block: cannot store {} tokens at {}", tokens, first_token);
  HACK_CHECK(slices.size() == static_cast<size_t>(shape.num_layers), "kv block: {} slices for {} layers",
             slices.size(), shape.num_layers);
  const size_t layer_bytes = kv_block_layer_bytes(codec, dtype, tokens, shape.num_kv_heads, shape.head_dim);
  for (size_t l = 0; l < slices.size(); ++l)
    HACK_CHECK(slices[l].size() == layer_bytes, "kv block: layer {} slice has {} bytes, {} needs {}", l,
               slices[l].size(), block_codec_name(codec), layer_bytes);
  std::vector<std::byte> value(kv_block_bytes(codec, dtype, shape, tokens));
  std::byte* p = value.data();
  size_t at = 0;
  put_le<uint32_t>(p, at, kKvBlockMagic);
  put_le<uint16_t>(p, at, kKvBlockVersion);
  put_le<uint8_t>(p, at, static_cast<uint8_t>(codec));
  put_le<uint8_t>(p, at, codec == BlockCodec::int8_head ? kDtypeNone : dtype == DType::f32 ? kDtypeF32 : kDtypeBf16);
  put_le<uint32_t>(p, at, static_cast<uint32_t>(shape.num_layers));
  put_le<uint32_t>(p, at, static_cast<uint32_t>(tokens));
  put_le<uint16_t>(p, at, static_cast<uint16_t>(shape.num_kv_heads));
  put_le<uint16_t>(p, at, static_cast<uint16_t>(shape.head_dim));
  put_le<uint32_t>(p, at, 0);
  put_le<uint64_t>(p, at, static_cast<uint64_t>(first_token));
  size_t offset = kKvBlockHeaderBytes + slices.size() * kKvBlockLayerEntryBytes;
  for (const std::vector<std::byte>& slice : slices) {
    put_le<uint64_t>(p, at, offset);
    put_le<uint64_t>(p, at, slice.size());
    put_le<uint64_t>(p, at, xxh64(slice));
    std::memcpy(p + offset, slice.data(), slice.size());
    offset += slice.size();
  }
  return value;
}

void decode_kv_block_layer(const KvBlockHeader& header, std::span<const std::byte> slice, float* k, float* v) {
  const size_t bytes = kv_block_layer_bytes(header.codec, header.codec == BlockCodec::exact ? header.dtype : DType::i8,
                                            header.tokens, header.num_kv_heads, header.head_dim);
  HACK_CHECK(slice.size() == bytes, "kv block: slice of {} bytes, {} × {} tokens × {} heads × head_dim {} need {}",
             slice.size(), block_codec_name(header.codec), header.tokens, header.num_kv_heads, header.head_dim, bytes);
  const size_t rows = static_cast<size_t>(header.tokens) * static_cast<size_t>(header.num_kv_heads);
  const size_t dim = static_cast<size_t>(header.head_dim), n = rows * dim;
  const std::byte* kp = slice.data();
  const std::byte* vp = kp + bytes / 2;
  if (header.codec == BlockCodec::int8_head) {
    dequantize_rows(kp, rows, dim, k);
    dequantize_rows(vp, rows, dim, v);
  } else if (header.dtype == DType::f32) {
    std::memcpy(k, kp, n * sizeof(float));
    std::memcpy(v, vp, n * sizeof(float));
  } else {
    convert_to_f32(DType::bf16, kp, k, n);
    convert_to_f32(DType::bf16, vp, v, n);
  }
}

void restore_kv_block_layer(PagedKv& cache, int seq_id, int layer, const KvBlockHeader& header,
                            std::span<const std::byte> slice, std::vector<float>& scratch,
                            KvRestoreTimes* times) {
  const double t0 = times ? monotonic_s() : 0.0;
  const KvShape& shape = cache.shape();
  HACK_CHECK(header.num_layers == shape.num_layers && header.layers.size() == static_cast<size_t>(shape.num_layers),
             "kv block restore: the block has {} layers, the cache {}", header.num_layers, shape.num_layers);
  HACK_CHECK(layer >= 0 && layer < shape.num_layers, "kv block restore: layer {} out of range (the cache has {})",
             layer, shape.num_layers);
  HACK_CHECK(header.tokens > 0, "kv block restore: the block has {} tokens", header.tokens);
  HACK_CHECK(header.num_kv_heads == shape.num_kv_heads && header.head_dim == shape.head_dim,
             "kv block restore: the block has {} KV heads of dim {}, the cache {} of dim {}", header.num_kv_heads,
             header.head_dim, shape.num_kv_heads, shape.head_dim);
  HACK_CHECK(header.codec != BlockCodec::exact || header.dtype == cache.exact_dtype(),
             "kv block restore: an exact block of {} cannot restore into a cache that keeps {} (its options differ)",
             dtype_name(header.dtype), dtype_name(cache.exact_dtype()));
  HACK_CHECK(cache.has_sequence(seq_id), "kv block restore: unknown sequence {}", seq_id);
  const KvBlockLayer& entry = header.layers[static_cast<size_t>(layer)];
  HACK_CHECK(slice.size() == entry.bytes, "kv block restore: layer {} slice has {} bytes, its table entry says {}",
             layer, slice.size(), entry.bytes);
  const uint64_t checksum = xxh64(slice);
  HACK_CHECK(checksum == entry.checksum, "kv block restore: layer {} slice checksum {:016x}, expected {:016x} (corrupt)",
             layer, checksum, entry.checksum);
  const int length = cache.length(seq_id, layer);
  HACK_CHECK(header.first_token == length,
             "kv block restore: the block starts at token {} but sequence {} layer {} holds {} tokens", header.first_token,
             seq_id, layer, length);
  HACK_CHECK(static_cast<int64_t>(length) + header.tokens <= cache.max_tokens(seq_id),
             "kv block restore: {} tokens exceed sequence {}'s capacity of {}",
             static_cast<int64_t>(length) + header.tokens, seq_id, cache.max_tokens(seq_id));
  const size_t elems = static_cast<size_t>(header.tokens) * static_cast<size_t>(shape.num_kv_heads) *
                       static_cast<size_t>(shape.head_dim);
  if (scratch.size() < 2 * elems) scratch.resize(2 * elems);
  decode_kv_block_layer(header, slice, scratch.data(), scratch.data() + elems);  // validates the codes, then nothing throws
  const double t1 = times ? monotonic_s() : 0.0;
  // bf16 → f32 here and f32 → bf16 in append is the identity on every non-NaN bf16 value.
  cache.append(layer, seq_id, length, header.tokens, scratch.data(), scratch.data() + elems);
  if (times) {
    times->decode_s += t1 - t0;
    times->append_s += monotonic_s() - t1;
  }
}

double snr_db(std::span<const float> exact, std::span<const float> approx) {
  HACK_CHECK(exact.size() == approx.size(), "snr_db: {} values against {}", exact.size(), approx.size());
  double signal = 0.0, noise = 0.0;
  for (size_t i = 0; i < exact.size(); ++i) {
    const double x = exact[i], e = x - static_cast<double>(approx[i]);
    signal += x * x;
    noise += e * e;
  }
  if (noise == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(signal / noise);
}

}  // namespace hack
