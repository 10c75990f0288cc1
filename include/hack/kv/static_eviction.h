/// @file static_eviction.h
/// @brief MPCache's look-once static eviction (DESIGN.md §3.4, issue 15 item 1): during a
/// prompt's prefill, the attention the last `window` fraction of its queries give each
/// earlier token is accumulated; at the end of the prefill only the top-scored tokens, the
/// sinks and a recent window stay, before anything is quantized or sent.
///
/// Scoring: for every observed query row i and query head h, p = softmax_j≤i(q_h·k_j/√d)
/// over keys of h's KV head; score[j] += p_j, summed over the query heads of a GQA group and
/// over the KV heads (every head counts alike, each adds mass 1 per query). Per layer
/// (KeepScope::layer, the default: each layer keeps its own tokens, as MPCache does) or
/// summed over layers (KeepScope::model: one set for every layer). Either way every layer
/// keeps the same number of tokens, so a sequence keeps one KV length; kept tokens keep their
/// RoPE (their K was rotated at their original position) and their order.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "hack/core/thread_pool.h"

namespace hack {

enum class KeepScope { layer, model };
KeepScope parse_keep_scope(std::string_view name);  ///< "layer" | "model"
std::string_view keep_scope_name(KeepScope scope);

/// `--kv-keep-*`: static eviction in prefill; off unless a budget is given.
struct KeepOptions {
  float ratio = 0;        ///< --kv-keep-ratio γ: tokens kept as a fraction of the prompt, (0, 1]
  int tokens = 0;         ///< --kv-keep-tokens: the budget in tokens instead
  int recent = 32;        ///< --kv-keep-recent: newest prompt tokens always kept
  int sinks = 4;          ///< leading tokens always kept (--hack-sinks)
  float window = 0.2f;    ///< --kv-keep-window: fraction of the prompt whose queries score, (0, 1]
  KeepScope scope = KeepScope::layer;  ///< --kv-keep-scope
  bool enabled() const { return ratio > 0 || tokens > 0; }
  /// Tokens a prompt of n tokens keeps (sinks and the recent window included, never fewer
  /// than they hold); n when nothing would be dropped.
  int budget(int n) const;
  /// First position whose query scores.
  int window_start(int n) const;
};

/// Throws hack::Error naming the bad flag.
void validate(const KeepOptions& options);

/// Adds one chunk's attention to `scores` ([n_keys], one per key position).
/// q: [rows][num_heads · head_dim] post-RoPE queries at positions first_pos.. (each row
/// attends causally to keys 0 .. first_pos + row, which must be < n_keys); keys:
/// [n_keys][num_kv_heads · head_dim]. group = num_heads / num_kv_heads. Rows run in parallel
/// on `pool` (may be null); the sum is the same whatever the pool (per-row partial sums are
/// added in row order).
void accumulate_attention_scores(const float* q, int rows, int first_pos, const float* keys, int n_keys, int num_heads,
                                 int num_kv_heads, int head_dim, std::span<float> scores, ThreadPool* pool);

/// Positions a prompt of scores.size() tokens keeps, ascending: [0, sinks), the newest
/// `recent`, and the best-scored of the rest up to budget(n) (ties: the earlier token).
std::vector<int> select_kept_tokens(std::span<const float> scores, const KeepOptions& options);

}  // namespace hack
