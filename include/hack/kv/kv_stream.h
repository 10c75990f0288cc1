/// @file kv_stream.h
/// @brief What a prefill node sends of one (sequence, layer) of a PagedKv, and how a
/// decode node applies it, so that the decode node's sequence ends up with exactly the
/// state (same bytes) the prefill node's has after prefill plus close_pending_blocks —
/// which is the state a single-process run reaches at its next append (DESIGN.md §3.1).
///
/// Two kinds of message (the transport carries the kind, e.g. as its wire type):
///   hack_page  one closed HACK page, as stored (kv/hack_page.h; self-describing)
///   exact      tokens kept exactly: an ExactTokensHeader + K + V (below)
///
/// Per layer the exporter emits, in this order (so plain in-order application rebuilds the
/// layer: append() fills sinks / the open block, append_hack_page() needs the sinks before
/// the first page and an empty open block):
///   hack mode: exact sinks [0, min(length, sinks)) — as soon as they are complete —,
///              HACK pages in position order as they close (or, with prompt_tokens
///              known, as soon as their block fills), and with `final` the exact tail —
///              the recent window's blocks and the open block — after the pending blocks
///              that left the window were closed;
///   fp mode:   exact tokens in page-sized messages (Π tokens at positions k·Π), full
///              pages as they fill, the partly filled last page with `final`.
///
/// Exact message (version 1), little-endian:
///   u32 magic "HKEX" | u16 version | u8 dtype (1 bf16, 2 f32) | u8 reserved (0) |
///   u32 layer | u32 n_tokens | u64 first_token | u16 num_kv_heads | u16 head_dim | u32 0
///   K [n_tokens][num_kv_heads][head_dim] dtype, then V likewise
/// dtype is the cache's exact element type (bf16 in hack mode; the fp page type in fp mode),
/// so an fp cache ships its tokens uncompressed and bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "hack/kv/paged_kv.h"

namespace hack {

/// exact_copy: an exact message of tokens a node keeps beside the cache (for the vault), not
/// applied to it (a prefill node sends the prompt's last partial block this way in hack mode,
/// whose first tokens the decode node otherwise only gets inside a quantized page).
enum class KvMessageKind : uint8_t { hack_page = 1, exact = 2, exact_copy = 3 };

inline constexpr uint32_t kExactTokensMagic = 0x58454B48;  // "HKEX"
inline constexpr uint16_t kExactTokensVersion = 1;
inline constexpr size_t kExactTokensHeaderBytes = 32;

/// The decoded header of an exact message.
struct ExactTokensHeader {
  DType dtype = DType::bf16;  ///< bf16 or f32
  uint32_t layer = 0;
  uint32_t n_tokens = 0;
  uint64_t first_token = 0;
  uint16_t num_kv_heads = 0;
  uint16_t head_dim = 0;
};

/// Decodes and checks an exact message's header and its total size (header + K + V).
/// Throws hack::Error naming the first problem.
ExactTokensHeader decode_exact_header(std::span<const std::byte> payload);

/// The K and V of a decoded exact message as f32 ([n_tokens][num_kv_heads][head_dim] each);
/// `payload` must be the message decode_exact_header accepted.
void exact_tokens_f32(const ExactTokensHeader& header, std::span<const std::byte> payload, std::vector<float>& k,
                      std::vector<float>& v);

/// Where the export of one sequence stands, per layer. Start with a default one; one
/// cursor per sequence.
struct KvExportCursor {
  /// The prompt's length when known (a prefill node knows it): full blocks that will be
  /// quantized when the prefill ends (those older than the recent window at that length)
  /// are then sent as pages as soon as they fill, while the prefill still attends to them
  /// exactly — so an exact multi-chunk prefill streams its pages as it goes. 0 = unknown:
  /// pages go as the cache closes them.
  int prompt_tokens = 0;
  std::vector<int> pages_sent;       ///< per layer: HACK pages emitted
  std::vector<int> exact_sent;       ///< per layer: exact tokens emitted from position 0 (hack: sinks; fp: pages)
  std::vector<uint8_t> finished;     ///< per layer: the final export ran
  size_t messages = 0;               ///< messages emitted, all layers
  size_t bytes = 0;                  ///< payload bytes emitted, all layers
  /// During an emit: whether its payload is the cache's own closed page (hack_page), which
  /// stays valid and unchanged until the sequence is removed, so a sender may keep it beyond
  /// the call. False for pages peeked early into a scratch buffer and for exact messages.
  bool payload_in_cache = false;
  /// Pages known before their blocks close (a prefix hit's cached pages): sent as they are
  /// instead of peeked early, and the final close copies them instead of quantizing.
  KnownPages known_pages;
};

using KvEmitFn = std::function<void(KvMessageKind kind, std::span<const std::byte> payload)>;

/// Emits what of (seq_id, layer) is final and not yet emitted (see the file comment). With
/// `final` (the sequence's prefill of this layer is complete) it first closes the layer's
/// pending blocks, then emits everything left, exact tokens last; the layer is then done
/// and a further call for it throws. `emit` sees payloads valid only during the call; an
/// exception it throws propagates (the cursor then still counts that message as unsent).
void export_layer(PagedKv& cache, int seq_id, int layer, bool final, KvExportCursor& cursor,
                  const KvEmitFn& emit);

/// Applies one message to (seq_id, layer) of a decode-side cache: a HACK page through
/// append_hack_page, exact tokens converted to f32 through append(). Everything is
/// validated first (kind, sizes, dtype, layer, dims, position = the layer's length,
/// capacity, that exact tokens never fill a quantizable block); a bad message throws
/// hack::Error and leaves the cache unchanged.
void import_message(PagedKv& cache, int seq_id, int layer, KvMessageKind kind, std::span<const std::byte> payload);

/// An exact message of tokens [first_token, first_token + n_tokens) of a layer, as
/// export_layer builds it (exposed for tests and tools).
std::vector<std::byte> encode_exact_tokens(const PagedKv& cache, int seq_id, int layer, int first_token,
                                           int n_tokens);

}  // namespace hack
