// The KV stream codec (include/hack/kv/kv_stream.h): export of one (sequence, layer) of a
// PagedKv as HACK pages and exact-token messages, and their validated import.
#include "hack/kv/kv_stream.h"

#include <algorithm>
#include <cstring>

#include "hack/core/byte_io.h"
#include "hack/core/error.h"

namespace hack {

namespace {

constexpr uint8_t kExactBf16 = 1;
constexpr uint8_t kExactF32 = 2;

size_t token_bytes(const KvShape& shape, DType dtype) {
  return static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim) * dtype_size(dtype);
}

void ensure_cursor(const PagedKv& cache, KvExportCursor& cursor) {
  const size_t layers = static_cast<size_t>(cache.shape().num_layers);
  if (cursor.pages_sent.size() != layers) {
    HACK_CHECK(cursor.pages_sent.empty() && cursor.exact_sent.empty() && cursor.finished.empty(),
               "export: cursor belongs to a cache of {} layers, this one has {}", cursor.pages_sent.size(), layers);
    cursor.pages_sent.assign(layers, 0);
    cursor.exact_sent.assign(layers, 0);
    cursor.finished.assign(layers, 0);
  }
}

}  // namespace

std::vector<std::byte> encode_exact_tokens(const PagedKv& cache, int seq_id, int layer, int first_token,
                                           int n_tokens) {
  const KvShape& shape = cache.shape();
  const DType dtype = cache.exact_dtype();
  HACK_CHECK(n_tokens > 0, "exact tokens: empty range at {}", first_token);
  const size_t kv_bytes = static_cast<size_t>(n_tokens) * token_bytes(shape, dtype);
  std::vector<std::byte> out(kExactTokensHeaderBytes + 2 * kv_bytes);
  size_t at = 0;
  put_le<uint32_t>(out.data(), at, kExactTokensMagic);
  put_le<uint16_t>(out.data(), at, kExactTokensVersion);
  put_le<uint8_t>(out.data(), at, dtype == DType::f32 ? kExactF32 : kExactBf16);
  put_le<uint8_t>(out.data(), at, 0);
  put_le<uint32_t>(out.data(), at, static_cast<uint32_t>(layer));
  put_le<uint32_t>(out.data(), at, static_cast<uint32_t>(n_tokens));
  put_le<uint64_t>(out.data(), at, static_cast<uint64_t>(first_token));
  put_le<uint16_t>(out.data(), at, static_cast<uint16_t>(shape.num_kv_heads));
  put_le<uint16_t>(out.data(), at, static_cast<uint16_t>(shape.head_dim));
  put_le<uint32_t>(out.data(), at, 0);
  cache.copy_exact_tokens(seq_id, layer, first_token, n_tokens, out.data() + kExactTokensHeaderBytes,
                          out.data() + kExactTokensHeaderBytes + kv_bytes);
  return out;
}

ExactTokensHeader decode_exact_header(std::span<const std::byte> payload) {
  HACK_CHECK(payload.size() >= kExactTokensHeaderBytes, "exact tokens: {} bytes, shorter than the {}-byte header",
             payload.size(), kExactTokensHeaderBytes);
  size_t at = 0;
  const auto magic = get_le<uint32_t>(payload.data(), at);
  HACK_CHECK(magic == kExactTokensMagic, "exact tokens: bad magic {:#010x}", magic);
  const auto version = get_le<uint16_t>(payload.data(), at);
  HACK_CHECK(version == kExactTokensVersion, "exact tokens: version {}, this build reads {}", version,
             kExactTokensVersion);
  const auto dtype = get_le<uint8_t>(payload.data(), at);
  HACK_CHECK(dtype == kExactBf16 || dtype == kExactF32, "exact tokens: unknown dtype code {}", dtype);
  const auto reserved = get_le<uint8_t>(payload.data(), at);
  HACK_CHECK(reserved == 0, "exact tokens: reserved byte is {}", reserved);
  ExactTokensHeader h;
  h.dtype = dtype == kExactF32 ? DType::f32 : DType::bf16;
  h.layer = get_le<uint32_t>(payload.data(), at);
  h.n_tokens = get_le<uint32_t>(payload.data(), at);
  h.first_token = get_le<uint64_t>(payload.data(), at);
  h.num_kv_heads = get_le<uint16_t>(payload.data(), at);
  h.head_dim = get_le<uint16_t>(payload.data(), at);
  HACK_CHECK(h.n_tokens > 0, "exact tokens: no tokens");
  HACK_CHECK(h.num_kv_heads > 0 && h.head_dim > 0, "exact tokens: {} heads of dim {}", h.num_kv_heads, h.head_dim);
  const uint64_t expected = kExactTokensHeaderBytes + 2ull * h.n_tokens * h.num_kv_heads * h.head_dim *
                                                          dtype_size(h.dtype);
  HACK_CHECK(payload.size() == expected,
             "exact tokens: {} bytes, but {} tokens × {} heads × {} dims of {} need {}", payload.size(), h.n_tokens,
             h.num_kv_heads, h.head_dim, dtype_name(h.dtype), expected);
  return h;
}

void export_layer(PagedKv& cache, int seq_id, int layer, bool final, KvExportCursor& cursor,
                  const KvEmitFn& emit) {
  const KvShape& shape = cache.shape();
  HACK_CHECK(layer >= 0 && layer < shape.num_layers, "export: layer {} out of range", layer);
  ensure_cursor(cache, cursor);
  const size_t l = static_cast<size_t>(layer);
  HACK_CHECK(!cursor.finished[l], "export: sequence {} layer {} was already exported in full", seq_id, layer);
  const KvCacheOptions& o = cache.options();
  const int T = o.block_tokens;
  const int length = cache.length(seq_id, layer);
  auto send = [&](KvMessageKind kind, std::span<const std::byte> payload, bool in_cache = false) {
    cursor.payload_in_cache = in_cache;
    emit(kind, payload);
    cursor.payload_in_cache = false;
    ++cursor.messages;
    cursor.bytes += payload.size();
  };
  auto send_exact = [&](int first, int n) {
    const std::vector<std::byte> message = encode_exact_tokens(cache, seq_id, layer, first, n);
    send(KvMessageKind::exact, message);
    cursor.exact_sent[l] = std::max(cursor.exact_sent[l], first + n);
  };

  if (o.mode == KvMode::fp) {
    // Page-sized messages: whole pages as they fill, the partial last one at the end.
    const int ready = final ? length : length / T * T;
    while (cursor.exact_sent[l] < ready) {
      const int first = cursor.exact_sent[l];
      send_exact(first, std::min(T, ready - first));
    }
  } else {
    const int S = o.sinks;
    if (final) cache.close_pending_blocks(seq_id, layer, cursor.known_pages);
    // Sinks first: append_hack_page needs them, and they never change once complete.
    const int sinks_ready = final ? std::min(length, S) : (length >= S ? S : 0);
    if (cursor.exact_sent[l] < sinks_ready) send_exact(cursor.exact_sent[l], sinks_ready - cursor.exact_sent[l]);
    // Pages are emitted only behind complete sinks (an import appends them after).
    if (length >= S) {
      const int pages = cache.hack_page_count(seq_id, layer);
      std::vector<std::byte> scratch;  // pages that do not lie in host memory are read into it
      for (; cursor.pages_sent[l] < pages; ++cursor.pages_sent[l]) {
        const std::span<const std::byte> page = cache.host_hack_page(seq_id, layer, cursor.pages_sent[l]);
        if (!page.empty()) {
          send(KvMessageKind::hack_page, page, /*in_cache=*/true);
          continue;
        }
        scratch.resize(cache.hack_layout(layer).page_bytes());
        cache.read_hack_page(seq_id, layer, cursor.pages_sent[l], scratch.data());
        send(KvMessageKind::hack_page, scratch);
      }
      if (!final && cursor.prompt_tokens > 0) {
        // Blocks full now that will have left the recent window when the prompt ends.
        const int filled = std::max(0, length - S) / T;
        const int closing = std::max(0, cursor.prompt_tokens - o.recent_tokens - S) / T;
        const int ready = std::min(filled, closing);
        if (cursor.pages_sent[l] < ready) {
          std::vector<std::byte> page(cache.hack_layout(layer).page_bytes());
          for (; cursor.pages_sent[l] < ready; ++cursor.pages_sent[l]) {
            const std::byte* known = cursor.known_pages ? cursor.known_pages(layer, cursor.pages_sent[l]) : nullptr;
            if (known != nullptr) {
              // Checked as a close would check it (it is the page the close will copy).
              const HackPageLayout& layout = cache.hack_layout(layer);
              layout.validate_at(known, layer, S + static_cast<int64_t>(cursor.pages_sent[l]) * T);
              send(KvMessageKind::hack_page, std::span<const std::byte>(known, layout.page_bytes()));
              continue;
            }
            cache.peek_block_page(seq_id, layer, cursor.pages_sent[l], page.data());
            send(KvMessageKind::hack_page, page);
          }
        }
      }
    }
    if (final) {
      // Exact tail: the recent window's full blocks and the open block.
      const int open_first = S + cursor.pages_sent[l] * T;
      if (length > open_first) send_exact(open_first, length - open_first);
    }
  }
  if (final) cursor.finished[l] = 1;
}

void exact_tokens_f32(const ExactTokensHeader& header, std::span<const std::byte> payload, std::vector<float>& k,
                      std::vector<float>& v) {
  const size_t elems = static_cast<size_t>(header.n_tokens) * header.num_kv_heads * header.head_dim;
  const std::byte* kp = payload.data() + kExactTokensHeaderBytes;
  k.resize(elems);
  v.resize(elems);
  convert_to_f32(header.dtype, kp, k.data(), elems);
  convert_to_f32(header.dtype, kp + elems * dtype_size(header.dtype), v.data(), elems);
}

void import_message(PagedKv& cache, int seq_id, int layer, KvMessageKind kind, std::span<const std::byte> payload) {
  const KvShape& shape = cache.shape();
  HACK_CHECK(layer >= 0 && layer < shape.num_layers, "import: layer {} out of range (the cache has {})", layer,
             shape.num_layers);
  HACK_CHECK(cache.has_sequence(seq_id), "import: unknown sequence {}", seq_id);
  const KvCacheOptions& o = cache.options();
  if (kind == KvMessageKind::hack_page) {
    HACK_CHECK(o.mode == KvMode::hack, "import: got a HACK page but this cache is --kv fp (the nodes' KV options differ)");
    cache.append_hack_page(layer, seq_id, payload.data(), payload.size());  // validates before storing
    return;
  }
  HACK_CHECK(kind == KvMessageKind::exact, "import: unknown message kind {}", static_cast<int>(kind));
  const ExactTokensHeader h = decode_exact_header(payload);
  HACK_CHECK(h.dtype == cache.exact_dtype(),
             "import: exact tokens are {} but this cache keeps {} (the nodes' KV options differ)", dtype_name(h.dtype),
             dtype_name(cache.exact_dtype()));
  HACK_CHECK(h.layer == static_cast<uint32_t>(layer), "import: exact tokens of layer {} arrived for layer {}", h.layer,
             layer);
  HACK_CHECK(h.num_kv_heads == shape.num_kv_heads && h.head_dim == shape.head_dim,
             "import: exact tokens have {} KV heads of dim {}, this cache {} of dim {}", h.num_kv_heads, h.head_dim,
             shape.num_kv_heads, shape.head_dim);
  const int length = cache.length(seq_id, layer);
  HACK_CHECK(h.first_token == static_cast<uint64_t>(length),
             "import: exact tokens start at {} but sequence {} layer {} holds {} tokens", h.first_token, seq_id, layer,
             length);
  const int n = static_cast<int>(h.n_tokens);
  HACK_CHECK(static_cast<int64_t>(length) + n <= cache.max_tokens(seq_id),
             "import: {} tokens exceed sequence {}'s capacity of {}", static_cast<int64_t>(length) + n, seq_id,
             cache.max_tokens(seq_id));
  if (o.mode == KvMode::hack) {
    const int S = o.sinks, T = o.block_tokens;
    if (length < S) {
      HACK_CHECK(length + n <= S, "import: exact tokens [{}, {}) cross the end of the {} sinks", length, length + n, S);
    } else {
      // Blocks that have left the recent window travel as HACK pages; exact tokens only
      // fill the window's blocks and the open block.
      HACK_CHECK(cache.pending_block_count(seq_id, layer) == 0, "import: sequence {} layer {} has pending blocks",
                 seq_id, layer);
      const int quantized_end = S + (std::max(0, length + n - o.recent_tokens - S) / T) * T;
      HACK_CHECK(length >= quantized_end,
                 "import: exact tokens [{}, {}) include the block at {}, which has left the recent window of {} "
                 "(such blocks arrive as HACK pages)",
                 length, length + n, length, o.recent_tokens);
    }
  }
  std::vector<float> kf, vf;
  exact_tokens_f32(h, payload, kf, vf);  // bf16 comes back as the same bits in append (exact round trip)
  cache.append(layer, seq_id, length, n, kf.data(), vf.data());
}

}  // namespace hack
