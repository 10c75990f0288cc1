#include "hack/backend/cpu_page_selector.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/core/error.h"
#include "hack/core/thread_pool.h"
#include "hack/kernels/cpu/page_bound.h"

namespace hack {

CpuPageSelector::CpuPageSelector(const PageSelectOptions& options) : options_(options) { validate(options_); }

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Moves the k best of idx (by score, descending; ties to the lower index) to its front.
void best_first(std::vector<int>& idx, const float* score, int k) {
  if (k <= 0 || k >= static_cast<int>(idx.size())) return;
  std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), [&](int a, int b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  });
}

}  // namespace

void CpuPageSelector::score_random(int seq_id, int pos, int layer, int head, int n, Scratch& s) const {
  const uint64_t base = mix64(options_.seed ^ mix64(static_cast<uint64_t>(seq_id) << 32 ^ static_cast<uint64_t>(pos)) ^
                              mix64(static_cast<uint64_t>(layer) << 16 ^ static_cast<uint64_t>(head)));
  for (int p = 0; p < n; ++p) s.scores[static_cast<size_t>(p)] = static_cast<float>(mix64(base + static_cast<uint64_t>(p)) >> 40);
}

void CpuPageSelector::score_oracle(const CpuPagedKvCache& kv, int layer, int head, int n, Scratch& sc) const {
  // Attention mass of each page for each query row (softmax over the candidate pages,
  // dequantized K as attention sees it), summed over the rows.
  const HackPageLayout& layout = kv.hack_layout(layer);
  const int T = layout.block_tokens(), kd = layout.head(head).k_dim, G = kv.shape().group_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kv.shape().head_dim));
  std::vector<float> logits(static_cast<size_t>(n) * static_cast<size_t>(T) * static_cast<size_t>(G));  // bench only
  sc.dequant.resize(static_cast<size_t>(T) * static_cast<size_t>(kd));
  for (int p = 0; p < n; ++p) {
    dequantize_k_block(layout, head, sc.pages[static_cast<size_t>(p)], sc.dequant.data());
    for (int t = 0; t < T; ++t)
      for (int g = 0; g < G; ++g) {
        double s = 0;
        for (int d = 0; d < kd; ++d) s += static_cast<double>(sc.q[static_cast<size_t>(g * kd + d)]) * sc.dequant[static_cast<size_t>(t * kd + d)];
        logits[(static_cast<size_t>(p) * T + static_cast<size_t>(t)) * G + static_cast<size_t>(g)] = static_cast<float>(s) * scale;
      }
  }
  std::fill(sc.scores.begin(), sc.scores.begin() + n, 0.0f);
  for (int g = 0; g < G; ++g) {
    float m = -INFINITY;
    for (size_t i = static_cast<size_t>(g); i < logits.size(); i += static_cast<size_t>(G)) m = std::max(m, logits[i]);
    double z = 0;
    for (size_t i = static_cast<size_t>(g); i < logits.size(); i += static_cast<size_t>(G)) z += std::exp(logits[i] - m);
    for (int p = 0; p < n; ++p) {
      double mass = 0;
      for (int t = 0; t < T; ++t) mass += std::exp(logits[(static_cast<size_t>(p) * T + static_cast<size_t>(t)) * G + static_cast<size_t>(g)] - m);
      sc.scores[static_cast<size_t>(p)] += static_cast<float>(mass / z);
    }
  }
}

int CpuPageSelector::choose(const CpuPagedKvCache& kv, const AttentionPlan& plan, int item, int head, int layer,
                         const float* q, size_t q_stride, Scratch& sc) const {
  const PlanItem& it = plan.items[static_cast<size_t>(item)];
  const std::span<const PlanSegment> segs = plan.segments_of(item);
  const int T = kv.options().block_tokens;
  // Candidates: the closed pages but the newest; everything else is always kept.
  int first_closed = -1, closed = 0, must = 0;
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    if (segs[static_cast<size_t>(s)].slot == SegmentSlot::closed) {
      if (first_closed < 0) first_closed = s;
      ++closed;
    } else {
      must += segs[static_cast<size_t>(s)].tokens;
    }
  }
  const int C = std::max(0, closed - 1);
  // Scratch sized for the sequence's longest context once, so decode steps allocate nothing
  // (select reserves every worker's scratch ahead; this covers measure_sharing).
  sc.reserve(static_cast<size_t>(kv.max_tokens(it.seq_id) / T + 3), 0, 0);
  if (closed > 0) must += segs[static_cast<size_t>(first_closed + closed - 1)].tokens;
  const int context = it.start_pos + it.n_tokens;
  const double budget = std::max(options_.tokens > 0 ? options_.tokens : std::ceil(options_.ratio * context),
                                 static_cast<double>(options_.min_tokens));
  // Below the floor's context everything is kept.
  const int k = context < options_.min_context ? C
                                               : std::clamp(static_cast<int>(std::lround((budget - must) / T)), 0, C);

  sc.keep.assign(static_cast<size_t>(C), 0);
  if (k == C) {
    std::fill(sc.keep.begin(), sc.keep.end(), 1);
  } else if (k > 0) {
    const std::span<const uint32_t> ids = kv.hack_pages(it.seq_id, layer);
    HACK_CHECK(static_cast<int>(ids.size()) == closed, "page selection: sequence {} layer {} holds {} pages, the plan {}",
               it.seq_id, layer, ids.size(), closed);
    sc.pages.resize(static_cast<size_t>(C));
    for (int p = 0; p < C; ++p) sc.pages[static_cast<size_t>(p)] = kv.page_data(layer, ids[static_cast<size_t>(p)]);
    // The query group's rows (the first k_dim entries of each head_dim slot).
    const HackPageLayout& layout = kv.hack_layout(layer);
    const HackHeadLayout& hl = layout.head(head);
    const int G = kv.shape().group_size, hd = kv.shape().head_dim, kd = hl.k_dim;
    HACK_CHECK(G <= 64, "page selection: query groups above 64 heads are not supported, got {}", G);
    sc.q.resize(static_cast<size_t>(G * kd));
    sc.qsum.assign(static_cast<size_t>(kd), 0.0f);
    const float* src = q + static_cast<size_t>(it.row) * q_stride + static_cast<size_t>(head * G * hd);
    for (int g = 0; g < G; ++g)
      for (int d = 0; d < kd; ++d) {
        sc.q[static_cast<size_t>(g * kd + d)] = src[g * hd + d];
        sc.qsum[static_cast<size_t>(d)] += src[g * hd + d];
      }
    sc.scores.resize(static_cast<size_t>(C));
    const bool bound = options_.score == PageScore::quest || options_.score == PageScore::mpcache;
    cpu::PageBoundArgs args;
    args.k_min_offset = hl.k_min;
    args.k_scale_offset = hl.k_scale;
    args.k_dim = kd;
    args.levels = static_cast<float>((1 << layout.k_bits()) - 1);
    args.linear = options_.score == PageScore::mpcache;
    args.alpha = options_.alpha;
    if (options_.score == PageScore::quest) {
      sc.qpos.resize(static_cast<size_t>(kd));
      sc.qneg.resize(static_cast<size_t>(kd));
      cpu::quest_split(sc.q.data(), G, kd, sc.qpos.data(), sc.qneg.data());
    }
    args.qpos = sc.qpos.data();
    args.qneg = sc.qneg.data();
    args.qsum = sc.qsum.data();
    const cpu::PageBoundFn score = cpu::page_bound_kernel(kv.isa());
    sc.order.clear();
    sc.groups.clear();
    const int P = options_.group_pages, groups = (C + P - 1) / P;
    const int keep_groups = std::min(groups, std::max(static_cast<int>(std::ceil(options_.coarse_ratio * groups)),
                                                      (k + P - 1) / P + 1));
    if (bound && P > 1 && keep_groups < groups) {
      // Coarse: groups on their envelope; fine: pages of the surviving groups.
      sc.group_scores.resize(static_cast<size_t>(groups));
      args.pages = sc.pages.data();
      args.n_pages = C;
      args.span = P;
      score(args, sc.group_scores.data());
      for (int g = 0; g < groups; ++g) sc.groups.push_back(g);
      best_first(sc.groups, sc.group_scores.data(), keep_groups);
      args.span = 1;
      for (int i = 0; i < keep_groups; ++i) {
        const int g = sc.groups[static_cast<size_t>(i)];
        args.pages = sc.pages.data() + static_cast<size_t>(g * P);
        args.n_pages = std::min(P, C - g * P);
        score(args, sc.scores.data() + static_cast<size_t>(g * P));
        for (int p = g * P; p < g * P + args.n_pages; ++p) sc.order.push_back(p);
      }
    } else {
      if (bound) {
        args.pages = sc.pages.data();
        args.n_pages = C;
        args.span = 1;
        score(args, sc.scores.data());
      } else if (options_.score == PageScore::streaming) {
        for (int p = 0; p < C; ++p) sc.scores[static_cast<size_t>(p)] = static_cast<float>(p);
      } else if (options_.score == PageScore::random) {
        score_random(it.seq_id, it.start_pos, layer, head, C, sc);
      } else {
        score_oracle(kv, layer, head, C, sc);
      }
      for (int p = 0; p < C; ++p) sc.order.push_back(p);
    }
    best_first(sc.order, sc.scores.data(), k);
    for (int i = 0; i < std::min(k, static_cast<int>(sc.order.size())); ++i) sc.keep[static_cast<size_t>(sc.order[static_cast<size_t>(i)])] = 1;
  }
  sc.chosen.clear();
  int tokens = 0;
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    const bool candidate = segs[static_cast<size_t>(s)].slot == SegmentSlot::closed && s - first_closed < C;
    if (candidate && !sc.keep[static_cast<size_t>(s - first_closed)]) continue;
    sc.chosen.push_back(s);
    tokens += segs[static_cast<size_t>(s)].tokens;
  }
  return tokens;
}

void CpuPageSelector::Scratch::reserve(size_t pages_n, size_t q_floats, size_t head_dim) {
  if (keep.capacity() < pages_n) {
    for (auto* v : {&order, &groups, &chosen}) v->reserve(pages_n);
    for (auto* v : {&scores, &group_scores}) v->reserve(pages_n);
    keep.reserve(pages_n);
    pages.reserve(pages_n);
  }
  if (q.capacity() < q_floats) q.reserve(q_floats);
  for (auto* v : {&qsum, &qpos, &qneg})
    if (v->capacity() < head_dim) v->reserve(head_dim);
}

void CpuPageSelector::select(const CpuPagedKvCache& kv, AttentionPlan& plan, const PlanPolicy& policy, int layer,
                          const float* q, size_t q_stride, ThreadPool& pool) {
  const int H = plan.num_kv_heads;
  const size_t items = plan.items.size(), cells = items * static_cast<size_t>(H);
  // Every worker's scratch sized for the longest context once (whichever cells it gets), and
  // one slot per cell as long as its item's segment list.
  const int T = kv.options().block_tokens;
  size_t most = 0;
  for (const PlanItem& it : plan.items)
    if (it.n_tokens == 1) most = std::max(most, static_cast<size_t>(kv.max_tokens(it.seq_id) / T + 3));
  const size_t hd = static_cast<size_t>(kv.shape().head_dim), qf = static_cast<size_t>(kv.shape().group_size) * hd;
  if (scratch_.size() < static_cast<size_t>(pool.size())) scratch_.resize(static_cast<size_t>(pool.size()));
  for (Scratch& s : scratch_) s.reserve(most, qf, hd);
  cell_begin_.resize(cells + 1);
  cell_count_.resize(cells);
  cell_tokens_.resize(cells);
  cell_begin_[0] = 0;
  for (size_t i = 0; i < items; ++i)
    for (int h = 0; h < H; ++h) {
      const size_t c = i * static_cast<size_t>(H) + static_cast<size_t>(h);
      const int n = plan.items[i].n_tokens == 1 ? static_cast<int>(plan.segments_of(static_cast<int>(i)).size()) : 0;
      cell_begin_[c + 1] = cell_begin_[c] + n;
    }
  cell_chosen_.reserve(plan.segments.capacity() * static_cast<size_t>(H));
  cell_chosen_.resize(static_cast<size_t>(cell_begin_[cells]));

  // The cells, handed out one by one (each writes only its own slot and its worker's scratch);
  // a failed check in any cell reaches the caller through the pool.
  std::atomic<size_t> next{0};
  pool.run([&](int thread, int) {
    Scratch& s = scratch_[static_cast<size_t>(thread)];
    for (size_t c = next.fetch_add(1, std::memory_order_relaxed); c < cells; c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int i = static_cast<int>(c / static_cast<size_t>(H)), h = static_cast<int>(c % static_cast<size_t>(H));
      cell_count_[c] = 0;
      cell_tokens_[c] = 0;
      if (plan.items[static_cast<size_t>(i)].n_tokens != 1) continue;
      cell_tokens_[c] = choose(kv, plan, i, h, layer, q, q_stride, s);
      cell_count_[c] = static_cast<int>(s.chosen.size());
      std::copy(s.chosen.begin(), s.chosen.end(), cell_chosen_.begin() + cell_begin_[c]);
    }
  });

  // Concatenated in (item, head) order, stats summed in that order.
  plan.selection_offsets.resize(cells + 1);
  plan.selected.reserve(plan.segments.capacity() * static_cast<size_t>(H));
  plan.selected.clear();
  plan.selection_offsets[0] = 0;
  for (size_t c = 0; c < cells; ++c) {
    const auto from = cell_chosen_.begin() + cell_begin_[c];
    plan.selected.insert(plan.selected.end(), from, from + cell_count_[c]);
    plan.selection_offsets[c + 1] = static_cast<int>(plan.selected.size());
    const PlanItem& it = plan.items[c / static_cast<size_t>(H)];
    if (it.n_tokens != 1) continue;
    stats_.context_tokens += it.start_pos + it.n_tokens;
    stats_.selected_tokens += cell_tokens_[c];
    ++stats_.selections;
  }
  build_plan_tasks(plan, policy);
}

void CpuPageSelector::measure_sharing(const CpuPagedKvCache& kv, const AttentionPlan& plan, int layer, const float* q,
                                   size_t q_stride) {
  if (scratch_.empty()) scratch_.resize(1);
  Scratch& sc = scratch_.front();
  double hits = 0, pages = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    if (plan.items[i].n_tokens != 1) continue;
    const std::span<const PlanSegment> segs = plan.segments_of(static_cast<int>(i));
    for (int h = 0; h < plan.num_kv_heads; ++h) {
      shared_.assign(segs.size(), 0);
      for (const int s : plan.selection_of(static_cast<int>(i), h)) shared_[static_cast<size_t>(s)] = 1;
      choose(kv, plan, static_cast<int>(i), h, layer, q, q_stride, sc);
      int last_closed = -1;
      for (int s = 0; s < static_cast<int>(segs.size()); ++s)
        if (segs[static_cast<size_t>(s)].slot == SegmentSlot::closed) last_closed = s;
      for (const int s : sc.chosen) {
        if (segs[static_cast<size_t>(s)].slot != SegmentSlot::closed || s == last_closed) continue;  // always kept
        pages += 1;
        hits += shared_[static_cast<size_t>(s)];
      }
    }
  }
  stats_.shared_hits += hits;
  stats_.shared_pages += pages;
}

}  // namespace hack
