// MPCache static eviction: scoring and the kept set (include/hack/kv/static_eviction.h).
#include "hack/kv/static_eviction.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "hack/core/error.h"
#include "hack/kernels/cpu/hack_attention.h"
#include "hack/kernels/cpu/ops.h"

namespace hack {

namespace {

// Query rows scored together: their probabilities ([rows][heads][n_keys] f32) are held
// at once, so the column sums can run over key ranges in a fixed row order.
constexpr int kTileRows = 16;

// ⌈fraction · n⌉ for a fraction given as a float flag: 0.2f is 0.2000000030, and 0.2 of 300
// tokens is 60, not 61.
int ceil_fraction(float fraction, int n) {
  return static_cast<int>(std::ceil(static_cast<double>(fraction) * n - 1e-4));
}

}  // namespace

KeepScope parse_keep_scope(std::string_view name) {
  if (name == "layer") return KeepScope::layer;
  if (name == "model") return KeepScope::model;
  fail("--kv-keep-scope must be layer or model, got '{}'", name);
}

std::string_view keep_scope_name(KeepScope scope) { return scope == KeepScope::layer ? "layer" : "model"; }

int KeepOptions::budget(int n) const {
  if (!enabled() || n <= 0) return n;
  const int target = tokens > 0 ? tokens : ceil_fraction(ratio, n);
  const int floor = std::min(n, std::min(sinks, n) + std::min(recent, n));
  return std::clamp(target, floor, n);
}

int KeepOptions::window_start(int n) const {
  const int w = std::max(1, ceil_fraction(window, n));
  return std::max(0, n - w);
}

void validate(const KeepOptions& o) {
  HACK_CHECK(o.ratio >= 0 && o.ratio <= 1, "--kv-keep-ratio must be in [0, 1] (0 = off), got {}", o.ratio);
  HACK_CHECK(o.tokens >= 0, "--kv-keep-tokens must not be negative, got {}", o.tokens);
  HACK_CHECK(!(o.ratio > 0 && o.tokens > 0), "give --kv-keep-ratio or --kv-keep-tokens, not both");
  HACK_CHECK(o.recent >= 0, "--kv-keep-recent must not be negative, got {}", o.recent);
  HACK_CHECK(o.sinks >= 0, "sinks must not be negative, got {}", o.sinks);
  HACK_CHECK(o.window > 0 && o.window <= 1, "--kv-keep-window must be in (0, 1], got {}", o.window);
}

void accumulate_attention_scores(const float* q, int rows, int first_pos, const float* keys, int n_keys, int num_heads,
                                 int num_kv_heads, int head_dim, std::span<float> scores, ThreadPool* pool) {
  HACK_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "attention scores: {} query heads over {} KV heads",
             num_heads, num_kv_heads);
  HACK_CHECK(rows >= 0 && first_pos >= 0 && first_pos + rows <= n_keys, "attention scores: rows {}..{} past {} keys",
             first_pos, first_pos + rows, n_keys);
  HACK_CHECK(scores.size() >= static_cast<size_t>(n_keys), "attention scores: {} scores for {} keys", scores.size(),
             n_keys);
  if (rows == 0) return;
  const int group = num_heads / num_kv_heads;
  const size_t hd = static_cast<size_t>(head_dim), qd = static_cast<size_t>(num_heads) * hd,
               kd = static_cast<size_t>(num_kv_heads) * hd, nk = static_cast<size_t>(n_keys);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> probs(static_cast<size_t>(kTileRows) * static_cast<size_t>(num_heads) * nk);
  auto for_range = [&](size_t n, auto&& fn) {
    if (pool != nullptr && n > 1) {
      pool->parallel_for(n, fn);
    } else {
      fn(size_t{0}, n);
    }
  };
  for (int r0 = 0; r0 < rows; r0 += kTileRows) {
    const int tile = std::min(kTileRows, rows - r0);
    // Softmax of every (row, head) of the tile over its causal keys; 0 past them.
    for_range(static_cast<size_t>(tile) * static_cast<size_t>(num_heads), [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        const int r = r0 + static_cast<int>(i / static_cast<size_t>(num_heads));
        const int h = static_cast<int>(i % static_cast<size_t>(num_heads));
        const size_t visible = static_cast<size_t>(first_pos + r + 1);
        const float* qh = q + static_cast<size_t>(r) * qd + static_cast<size_t>(h) * hd;
        const float* kh = keys + static_cast<size_t>(h / group) * hd;
        float* p = probs.data() + i * nk;
        float m = -std::numeric_limits<float>::infinity();
        for (size_t j = 0; j < visible; ++j) {
          p[j] = scale * cpu::dot(qh, kh + j * kd, hd);
          m = std::max(m, p[j]);
        }
        float sum = 0;
        for (size_t j = 0; j < visible; ++j) {
          p[j] = cpu::hack_exp(p[j] - m);
          sum += p[j];
        }
        const float inv = 1.0f / sum;
        for (size_t j = 0; j < visible; ++j) p[j] *= inv;
        std::fill(p + visible, p + nk, 0.0f);
      }
    });
    // Column sums over the tile in (row, head) order, split by key ranges.
    const size_t pairs = static_cast<size_t>(tile) * static_cast<size_t>(num_heads);
    for_range(nk, [&](size_t b, size_t e) {
      for (size_t i = 0; i < pairs; ++i) {
        const float* p = probs.data() + i * nk;
        for (size_t j = b; j < e; ++j) scores[j] += p[j];
      }
    });
  }
}

std::vector<int> select_kept_tokens(std::span<const float> scores, const KeepOptions& o) {
  const int n = static_cast<int>(scores.size());
  const int budget = o.budget(n);
  std::vector<char> keep(static_cast<size_t>(n), 0);
  int kept = 0;
  auto take = [&](int i) {
    if (!keep[static_cast<size_t>(i)]) {
      keep[static_cast<size_t>(i)] = 1;
      ++kept;
    }
  };
  for (int i = 0; i < std::min(o.sinks, n); ++i) take(i);
  for (int i = std::max(0, n - o.recent); i < n; ++i) take(i);
  std::vector<int> rest;
  rest.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    if (!keep[static_cast<size_t>(i)]) rest.push_back(i);
  const size_t more = static_cast<size_t>(std::clamp(budget - kept, 0, static_cast<int>(rest.size())));
  std::partial_sort(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(more), rest.end(), [&](int a, int b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  });
  for (size_t i = 0; i < more; ++i) take(rest[i]);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(kept));
  for (int i = 0; i < n; ++i)
    if (keep[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

}  // namespace hack
