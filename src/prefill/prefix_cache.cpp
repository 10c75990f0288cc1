// A prefill node's prefix cache (include/hack/prefill/prefix_cache.h).
#include "hack/prefill/prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "hack/core/clock.h"

namespace hack::server {

namespace {

// Page b holds tokens [S + bΠ, S + (b + 1)Π): it lies under the key of the block holding its
// last token, b + ⌈S/Π⌉.
int page_key_offset(int sinks, int block_tokens) { return (sinks + block_tokens - 1) / block_tokens; }

}  // namespace

PrefixCache::PrefixCache(const KvFingerprint& fingerprint, const KvShape& shape, int block_tokens, DType exact_dtype,
                         PrefixCacheOptions options, net::UcxWorker* ucx)
    : shape_(shape), block_tokens_(block_tokens), dtype_(exact_dtype), options_(std::move(options)) {
  HACK_CHECK(block_tokens_ > 0, "prefix cache: block_tokens must be positive");
  HACK_CHECK(options_.vault_min_blocks >= 1, "prefix cache: vault_min_blocks must be at least 1");
  HACK_CHECK(options_.vault_timeout_s > 0, "prefix cache: vault_timeout_s must be positive");
  net::check_vault_namespace(options_.name_space);
  root_ = chain_root(fingerprint, options_.name_space);
  pages_space_ = options_.name_space + "/pages";
  tail_space_ = options_.name_space + "/tail";
  if (options_.local_bytes > 0) {
    vault::BlockStoreOptions so;
    so.max_bytes = options_.local_bytes;
    local_ = std::make_unique<vault::BlockStore>(so);
  }
  if (options_.vault) {
    HACK_CHECK(ucx != nullptr, "prefix cache: a vault needs the node's UCX worker");
    vault_ = std::make_unique<net::VaultClient>(*ucx, *options_.vault);
  }
}

PrefixCache::~PrefixCache() = default;

std::vector<BlockKey> PrefixCache::keys(std::span<const int> prompt) const {
  return chain_keys(root_, prompt, block_tokens_);
}

int PrefixCache::restorable_blocks(size_t prompt_tokens) const {
  return prompt_tokens == 0 ? 0 : static_cast<int>((prompt_tokens - 1) / static_cast<size_t>(block_tokens_));
}

void PrefixCache::restore_local_layer(PagedKv& cache, int seq_id, int layer,
                                      std::span<const vault::BlockPtr> blocks,
                                      std::span<const KvBlockHeader> headers) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const KvBlockLayer& e = headers[i].layers[static_cast<size_t>(layer)];
    restore_kv_block_layer(cache, seq_id, layer, headers[i],
                           std::span<const std::byte>(blocks[i]->value).subspan(e.offset, e.bytes), scratch_,
                           &restore_times_);
  }
}

PrefixRestoreResult PrefixCache::restore(PagedKv& cache, int seq_id, std::span<const BlockKey> keys, PrefixJob& job) {
  PrefixRestoreResult r;
  const double t0 = monotonic_s();
  restore_times_ = {};
  job.restored_pages.clear();
  job.known.clear();
  std::vector<vault::BlockPtr> local;
  if (local_ && !keys.empty()) local = local_->promote(options_.name_space, keys);
  const size_t rest = keys.size() - local.size();
  std::unique_ptr<net::VaultPromotion> promotion;
  if (vault_ && rest >= static_cast<size_t>(options_.vault_min_blocks)) {
    promotion = vault_->promote(options_.name_space, keys.subspan(local.size()));
  }
  int vault_blocks = 0;
  // One deadline for the whole restore from the vault: a vault that answers slowly but
  // steadily still costs the request at most vault_timeout_s before it recomputes.
  const double deadline = t0 + options_.vault_timeout_s;
  auto left_s = [&] { return std::max(0.0, deadline - monotonic_s()); };
  if (promotion) {
    if (const Status s = promotion->wait_head(left_s()); !s) {
      r.vault_error = s.message();
    } else {
      vault_blocks = static_cast<int>(promotion->head().headers.size());
      for (const KvBlockHeader& h : promotion->head().headers) {
        // A block of another shape or position (a vault bug or a foreign writer) is not used.
        if (h.codec != options_.codec || h.tokens != block_tokens_ || h.num_kv_heads != shape_.num_kv_heads ||
            h.head_dim != shape_.head_dim || h.num_layers != shape_.num_layers) {
          r.vault_error = "the vault returned a block of another shape or codec";
          vault_blocks = 0;
          break;
        }
      }
      for (int i = 0; i < vault_blocks && r.vault_error.empty(); ++i) {
        if (promotion->head().headers[static_cast<size_t>(i)].first_token !=
            static_cast<int64_t>(local.size() + static_cast<size_t>(i)) * block_tokens_) {
          r.vault_error = "the vault returned a block at another position";
          vault_blocks = 0;
        }
      }
    }
  }
  r.lookup_s = monotonic_s() - t0;
  // Layer by layer: the local blocks, then the vault's as its layer arrives.
  std::vector<KvBlockHeader> headers;
  for (const auto& b : local) headers.push_back(decode_kv_block_header(b->value));
  std::vector<std::span<const std::byte>> slices;
  for (int l = 0; l < shape_.num_layers; ++l) {
    restore_local_layer(cache, seq_id, l, local, headers);
    if (vault_blocks == 0) continue;
    const double t_wait = monotonic_s();
    Status s = promotion->wait_layer(l, left_s(), slices);
    r.vault_wait_s += monotonic_s() - t_wait;
    if (s) {
      try {
        for (int i = 0; i < vault_blocks; ++i)
          restore_kv_block_layer(cache, seq_id, l, promotion->head().headers[static_cast<size_t>(i)],
                                 slices[static_cast<size_t>(i)], scratch_, &restore_times_);
      } catch (const std::exception& e) {
        s = Status::error(e.what());
      }
    }
    if (!s) {
      // Undo: the sequence keeps only the local prefix (restored again from scratch).
      r.vault_error = s.message();
      vault_blocks = 0;
      const int max_tokens = cache.max_tokens(seq_id);
      cache.remove_sequence(seq_id);
      cache.add_sequence(seq_id, max_tokens);
      cache.begin_prefill(seq_id);
      for (int layer = 0; layer < shape_.num_layers; ++layer) restore_local_layer(cache, seq_id, layer, local, headers);
      break;
    }
  }
  // Promote what the vault gave into the local cache (whole values rebuilt from the slices,
  // each layer split once).
  if (vault_blocks > 0 && local_) {
    const auto& head = promotion->head();
    std::vector<std::vector<std::vector<std::byte>>> block_slices(static_cast<size_t>(vault_blocks));
    bool complete = true;
    for (int l = 0; l < shape_.num_layers && complete; ++l) {
      std::vector<std::span<const std::byte>> s;
      complete = static_cast<bool>(promotion->wait_layer(l, 0.0, s));
      for (int i = 0; i < vault_blocks && complete; ++i)
        block_slices[static_cast<size_t>(i)].emplace_back(s[static_cast<size_t>(i)].begin(), s[static_cast<size_t>(i)].end());
    }
    for (int i = 0; i < vault_blocks && complete; ++i) {
      const KvBlockHeader& h = head.headers[static_cast<size_t>(i)];
      const size_t index = local.size() + static_cast<size_t>(i);
      put_local(options_.name_space, keys[index], index == 0 ? root_ : keys[index - 1], index == 0,
                assemble_kv_block(h.codec, h.dtype, shape_, h.first_token, h.tokens, block_slices[static_cast<size_t>(i)]));
    }
  }
  r.local_blocks = static_cast<int>(local.size());
  r.vault_blocks = vault_blocks;
  r.tokens = (r.local_blocks + r.vault_blocks) * block_tokens_;
  if (r.tokens > 0) {
    const double t_pages = monotonic_s();
    find_pages(job, cache, keys, r.local_blocks + r.vault_blocks);
    r.page_blocks = job.known.empty() ? 0 : static_cast<int>(job.known[0].size());
    r.lookup_s += monotonic_s() - t_pages;
  }
  r.restore_s = monotonic_s() - t0;
  r.decode_s = restore_times_.decode_s;
  r.import_s = restore_times_.append_s;
  if (!r.vault_error.empty()) {
    spdlog::warn("prefix cache: vault not used, recomputing: {}", r.vault_error);
  }
  return r;
}

int PrefixCache::restore_tail(PagedKv& cache, int seq_id, std::span<const int> prompt,
                              std::span<const BlockKey> keys, PrefixRestoreResult& result) {
  if (!tails() || prompt.empty() || result.tokens % block_tokens_ != 0) return 0;
  // After the R blocks restored, the longest kept tail that the prompt continues: its own
  // (the same prompt again), or an earlier prompt's that this one extends (the next turn of
  // a conversation: the earlier prompt's partial block, then new tokens).
  const int r = result.tokens / block_tokens_;
  if (r > static_cast<int>(keys.size())) return 0;
  const int first = r * block_tokens_;
  const int longest = std::min(block_tokens_ - 1, static_cast<int>(prompt.size()) - 1 - first);
  if (longest <= 0) return 0;
  const double t0 = monotonic_s();
  const BlockKey parent = r == 0 ? root_ : keys[static_cast<size_t>(r - 1)];
  std::vector<vault::BlockPtr> got;
  int n = longest;
  for (; n > 0 && got.empty(); --n) {
    const BlockKey key = tail_key(parent, prompt.subspan(static_cast<size_t>(first), static_cast<size_t>(n)));
    got = local_->promote(tail_space_, std::span<const BlockKey>(&key, 1));
  }
  ++n;  // the length found (the loop stepped past it)
  result.lookup_s += monotonic_s() - t0;
  if (got.empty()) return 0;
  restore_times_ = {};
  const std::span<const std::byte> value(got[0]->value);
  KvBlockHeader h;
  try {
    // Every layer is checked and decoded once before any is applied, so a bad tail leaves
    // the sequence as restore() left it (a tail is under Π tokens: the second decode is cheap).
    h = decode_kv_block_header(value);
    HACK_CHECK(h.codec == BlockCodec::exact && h.tokens == n && h.first_token == first &&
                   h.num_layers == shape_.num_layers && h.num_kv_heads == shape_.num_kv_heads &&
                   h.head_dim == shape_.head_dim,
               "a tail of {} tokens at {} under the key of {} tokens at {}, or of another shape or codec", h.tokens,
               h.first_token, n, first);
    const size_t floats = static_cast<size_t>(n) * static_cast<size_t>(shape_.num_kv_heads) *
                          static_cast<size_t>(shape_.head_dim);
    scratch_.resize(2 * floats);
    for (int l = 0; l < shape_.num_layers; ++l) {
      HACK_CHECK(verify_kv_block_layer(h, l, value), "layer {} fails its checksum", l);
      const KvBlockLayer& e = h.layers[static_cast<size_t>(l)];
      decode_kv_block_layer(h, value.subspan(e.offset, e.bytes), scratch_.data(), scratch_.data() + floats);
    }
  } catch (const std::exception& e) {
    spdlog::warn("prefix cache: tail not used, computing it: {}", e.what());
    return 0;
  }
  for (int l = 0; l < shape_.num_layers; ++l) {
    const KvBlockLayer& e = h.layers[static_cast<size_t>(l)];
    restore_kv_block_layer(cache, seq_id, l, h, value.subspan(e.offset, e.bytes), scratch_, &restore_times_);
  }
  result.tokens += n;
  result.tail_tokens = n;
  result.decode_s += restore_times_.decode_s;
  result.import_s += restore_times_.append_s;
  result.restore_s += monotonic_s() - t0;
  return n;
}

void PrefixCache::begin_capture(PrefixJob& job, std::span<const BlockKey> all_keys, int first_new_block,
                                int full_blocks, std::span<const int> prompt) {
  job.keys.assign(all_keys.begin(), all_keys.end());
  job.first = first_new_block;
  job.end = full_blocks;
  HACK_CHECK(job.end <= static_cast<int>(job.keys.size()), "prefix cache: {} blocks to capture, {} keys", job.end,
             job.keys.size());
  job.slices.assign(static_cast<size_t>(std::max(0, job.end - job.first)), {});
  job.tail_tokens = 0;
  job.tail_slices.clear();
  if (!tails() || prompt.empty()) return;
  const int r = restorable_blocks(prompt.size());
  job.tail_first = r * block_tokens_;
  const int n = static_cast<int>(prompt.size()) - 1 - job.tail_first;
  if (n <= 0 || static_cast<int>(job.keys.size()) < r) return;
  job.tail_tokens = n;
  job.tail_parent = r == 0 ? root_ : job.keys[static_cast<size_t>(r - 1)];
  job.tail_key = tail_key(job.tail_parent, prompt.subspan(static_cast<size_t>(job.tail_first), static_cast<size_t>(n)));
}

void PrefixCache::capture_layer(PrefixJob& job, const PagedKv& cache, int seq_id, int layer) {
  if (job.tail_tokens > 0) {
    HACK_CHECK(static_cast<int>(job.tail_slices.size()) == layer, "prefix cache: tail layer {} captured out of order", layer);
    job.tail_slices.emplace_back();
    encode_kv_block_layer(cache, seq_id, layer, job.tail_first, job.tail_tokens, BlockCodec::exact, job.tail_slices.back());
  }
  for (int b = job.first; b < job.end; ++b) {
    auto& slices = job.slices[static_cast<size_t>(b - job.first)];
    HACK_CHECK(static_cast<int>(slices.size()) == layer, "prefix cache: layer {} captured out of order", layer);
    slices.emplace_back();
    encode_kv_block_layer(cache, seq_id, layer, b * block_tokens_, block_tokens_, options_.codec, slices.back());
  }
}

int PrefixCache::finish_capture(PrefixJob& job) {
  int stored = 0;
  for (int b = job.first; b < job.end; ++b) {
    auto& slices = job.slices[static_cast<size_t>(b - job.first)];
    if (static_cast<int>(slices.size()) != shape_.num_layers) break;  // the prefill stopped early
    std::vector<std::byte> value =
        assemble_kv_block(options_.codec, dtype_, shape_, int64_t{b} * block_tokens_, block_tokens_, slices);
    const auto bi = static_cast<size_t>(b);
    store_block(job.keys[bi], b == 0 ? root_ : job.keys[bi - 1], b == 0, std::move(value));
    ++stored;
  }
  const size_t layers = static_cast<size_t>(shape_.num_layers);
  for (size_t i = 0; i < job.pages.size(); ++i) {
    auto& pages = job.pages[i];
    if (pages.size() != layers) break;  // the prefill stopped early
    std::vector<std::byte> value;
    for (const auto& page : pages) value.insert(value.end(), page.begin(), page.end());
    const int b = job.page_first + static_cast<int>(i), k = b + job.page_offset;
    const auto ki = static_cast<size_t>(k);
    put_local(pages_space_, job.keys[ki], k == 0 ? root_ : job.keys[ki - 1], b == 0, std::move(value));
  }
  if (job.tail_tokens > 0 && static_cast<int>(job.tail_slices.size()) == shape_.num_layers) {
    put_local(tail_space_, job.tail_key, job.tail_parent, /*first=*/true,
              assemble_kv_block(BlockCodec::exact, dtype_, shape_, job.tail_first, job.tail_tokens, job.tail_slices));
  }
  job = PrefixJob{};
  return stored;
}

void PrefixCache::find_pages(PrefixJob& job, const PagedKv& cache, std::span<const BlockKey> keys, int restored_blocks) {
  const KvCacheOptions& o = cache.options();
  if (!options_.keep_pages || !local_ || o.mode != KvMode::hack) return;
  HACK_CHECK(o.block_tokens == block_tokens_, "prefix cache: blocks of {} tokens, the cache's of {}", block_tokens_,
             o.block_tokens);
  const int offset = page_key_offset(o.sinks, block_tokens_);
  if (restored_blocks <= offset) return;
  std::vector<vault::BlockPtr> got = local_->promote(
      pages_space_, keys.subspan(static_cast<size_t>(offset), static_cast<size_t>(restored_blocks - offset)));
  std::vector<size_t> offsets;
  size_t total = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    offsets.push_back(total);
    total += cache.hack_layout(l).page_bytes();
  }
  job.known.assign(static_cast<size_t>(shape_.num_layers), {});
  for (const vault::BlockPtr& b : got) {
    if (b->value.size() != total) {  // another layout (cannot happen under one fingerprint): not used
      spdlog::warn("prefix cache: cached pages of {} bytes, the cache's layout needs {}; quantizing instead",
                   b->value.size(), total);
      break;
    }
    for (size_t l = 0; l < job.known.size(); ++l) job.known[l].push_back(b->value.data() + offsets[l]);
    job.restored_pages.push_back(b);
  }
}

KnownPages PrefixCache::known_pages(const PrefixJob& job) {
  if (job.known.empty() || job.known[0].empty()) return {};
  return [&job](int layer, int block) -> const std::byte* {
    const auto& pages = job.known[static_cast<size_t>(layer)];
    return block >= 0 && static_cast<size_t>(block) < pages.size() ? pages[static_cast<size_t>(block)] : nullptr;
  };
}

void PrefixCache::capture_pages(PrefixJob& job, const PagedKv& cache, int seq_id, int layer) {
  if (!options_.keep_pages || !local_ || cache.options().mode != KvMode::hack || job.keys.empty()) return;
  if (layer == 0) {
    // New pages: from the first one the restore did not find, up to the last one closed whose
    // key (the block holding its last token) is a full block of the prompt.
    job.page_offset = page_key_offset(cache.options().sinks, block_tokens_);
    job.page_first = job.known.empty() ? 0 : static_cast<int>(job.known[0].size());
    const int end = std::min(cache.hack_page_count(seq_id, 0), job.end - job.page_offset);
    job.pages.assign(static_cast<size_t>(std::max(0, end - job.page_first)), {});
  }
  const size_t page_bytes = cache.hack_layout(layer).page_bytes();
  for (size_t i = 0; i < job.pages.size(); ++i) {
    auto& pages = job.pages[i];
    HACK_CHECK(static_cast<int>(pages.size()) == layer, "prefix cache: pages of layer {} captured out of order", layer);
    const int b = job.page_first + static_cast<int>(i);
    pages.emplace_back(page_bytes);
    const std::span<const std::byte> host = cache.host_hack_page(seq_id, layer, b);
    if (host.empty()) {
      cache.read_hack_page(seq_id, layer, b, pages.back().data());
    } else {
      std::memcpy(pages.back().data(), host.data(), page_bytes);
    }
  }
}

void PrefixCache::store_block(const BlockKey& key, const BlockKey& parent, bool first, std::vector<std::byte> value) {
  if (vault_) vault_->store(options_.name_space, key, parent, first, static_cast<uint8_t>(options_.codec), value);
  if (local_) put_local(options_.name_space, key, parent, first, std::move(value));
}

void PrefixCache::put_local(const std::string& name_space, const BlockKey& key, const BlockKey& parent, bool first,
                            std::vector<std::byte> value) {
  vault::Block b;
  b.name_space = name_space;
  b.key = key;
  b.parent = parent;
  b.first = first;
  b.codec = static_cast<uint8_t>(options_.codec);
  b.checksum = vault::block_checksum(value);
  b.value = std::move(value);
  local_->put(std::move(b));
}

}  // namespace hack::server
