// The CPU reference backend: the Llama-family transformer in fp32 activations over
// checkpoint-dtype weights. One forward() runs a batch of sequence chunks (prefill chunks
// and decode tokens mixed) through every layer; attention is planned once per forward by
// the backend's CpuPagedKvCache and run in every layer.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "hack/model/rope.h"
#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/cpu_page_selector.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu/ops.h"
#include "hack/kernels/cpu/matmul.h"
#include "hack/model/fdc.h"

namespace hack {

namespace {

// Below this many token rows, element-wise ops run on the calling thread.
constexpr size_t kParallelRowsMin = 32;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, ThreadPool& pool, CpuPagedKvCache& kv, cpu::MatmulPrecision matmul_precision)
      : model_(model),
        cfg_(model.config),
        pool_(pool),
        kv_(kv),
        inv_freq_(rope_inv_freq(model.config)),
        selector_(kv.options().select) {
    const KvShape& ks = kv.shape();
    HACK_CHECK(ks == kv_shape(model),
               "CPU backend: KV cache shape (layers {}, KV heads {}, head_dim {}, group {}{}) does not match the model{}",
               ks.num_layers, ks.num_kv_heads, ks.head_dim, ks.group_size, ks.compressed() ? ", FDC dims" : "",
               model.fdc ? " with FDC" : "");
    if (model.fdc)
      for (const FdcRanks& r : model.fdc->ranks) fdc_d_qk_.push_back(r.d_qk);
    mm_ws_.precision = matmul_precision;
  }

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return cfg_; }
  KvCache& kv() override { return kv_; }
  void set_activation_observer(ActivationObserverFn fn) override { observer_ = std::move(fn); }
  const PageSelectStats* page_select_stats() const override { return selector_.active() ? &selector_.stats() : nullptr; }
  void reset_page_select_stats() override { selector_.reset_stats(); }
  void set_measure_sharing(bool on) override { measure_sharing_ = on; }

  size_t forward(std::span<const SequenceChunk> batch, std::vector<float>& logits,
                 const LayerDoneFn& on_layer_done) override {
    size_t total = 0;
    size_t logit_rows = 0;
    bool decoding = false;  // some chunk is one token: page selection has something to do
    plan_items_.clear();
    for (const SequenceChunk& c : batch) {
      decoding |= c.tokens.size() == 1;
      HACK_CHECK(!c.tokens.empty(), "sequence {}: empty chunk", c.seq_id);
      plan_items_.push_back(PlanItem{c.seq_id, c.start_pos, static_cast<int>(c.tokens.size()), static_cast<int>(total)});
      total += c.tokens.size();
      logit_rows += c.all_logits ? c.tokens.size() : 1;
    }
    if (total == 0) return 0;
    kv_.plan(plan_items_, PlanPolicy{.workers = pool_.size()}, plan_);  // validates every chunk before anything is stored
    resize(total);

    const size_t H = static_cast<size_t>(cfg_.hidden_size);
    const size_t hd = static_cast<size_t>(cfg_.head_dim);
    const size_t qd = static_cast<size_t>(cfg_.q_dim());
    const size_t kvd = static_cast<size_t>(cfg_.kv_dim());

    size_t row = 0;
    for (const SequenceChunk& c : batch) {
      for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
        positions_[row] = c.start_pos + c.rope_offset + static_cast<int>(i);
        cpu::embedding_row(model_.weights.embed, c.tokens[i], &x_[row * H]);
      }
    }

    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights& w = model_.weights.layers[static_cast<size_t>(l)];
      rmsnorm_rows(x_.data(), w.attn_norm, xn_.data(), total, H);
      const cpu::Projection qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
      cpu::matmul_many(xn_.data(), total, qkv, pool_, mm_ws_);
      if (cfg_.attention_bias) {
        add_bias(q_.data(), w.bq, total, qd);
        add_bias(k_.data(), w.bk, total, kvd);
        add_bias(v_.data(), w.bv, total, kvd);
      }
      if (cfg_.qk_norm) {
        rmsnorm_rows(q_.data(), w.q_norm, q_.data(), total * static_cast<size_t>(cfg_.num_heads), hd);
        rmsnorm_rows(k_.data(), w.k_norm, k_.data(), total * static_cast<size_t>(cfg_.num_kv_heads), hd);
      }
      for_rows(total, [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          cpu::rope_apply(&q_[r * qd], cfg_.num_heads, cfg_.head_dim, positions_[r], inv_freq_.data());
          cpu::rope_apply(&k_[r * kvd], cfg_.num_kv_heads, cfg_.head_dim, positions_[r], inv_freq_.data());
        }
      });
      if (observer_) observer_(l, total, q_.data(), k_.data(), v_.data());
      if (model_.fdc) {  // V' came out of the folded W_V; Q and K are compressed after RoPE
        for_rows(total, [&](size_t r0, size_t r1) {
          fdc_project(&q_[r0 * qd], r1 - r0, cfg_.num_heads, cfg_.group_size(), l);
          fdc_project(&k_[r0 * kvd], r1 - r0, cfg_.num_kv_heads, 1, l);
        });
      }

      size_t t0 = 0;
      for (const SequenceChunk& c : batch) {
        kv_.append(l, c.seq_id, c.start_pos, static_cast<int>(c.tokens.size()), &k_[t0 * kvd], &v_[t0 * kvd]);
        t0 += c.tokens.size();
      }
      // MPCache (backend/cpu_page_selector.h): past the dense layers, decode tokens attend to the
      // pages their q selects, chosen here every share_layers layers and reused in between;
      // plan_ stays unselected (dense layers, the next step).
      const AttentionPlan* run_plan = &plan_;
      if (decoding && selector_.active() && !selector_.dense(l)) {
        if (selector_.selects_in(l)) {
          copy_plan(plan_, selected_plan_);
          selector_.select(kv_, selected_plan_, PlanPolicy{.workers = pool_.size()}, l, q_.data(), qd, pool_);
        } else if (measure_sharing_) {
          selector_.measure_sharing(kv_, selected_plan_, l, q_.data(), qd);
        }
        run_plan = &selected_plan_;
      }
      kv_.run(*run_plan, l, q_.data(), qd, attn_.data(), qd, scale, pool_, attention_ws_);
      if (on_layer_done) on_layer_done(l);

      cpu::matmul(attn_.data(), total, w.wo, tmp_.data(), pool_, mm_ws_);
      if (w.bo.defined()) add_bias(tmp_.data(), w.bo, total, H);
      for_rows(total, [&](size_t r0, size_t r1) { cpu::add_inplace(&x_[r0 * H], &tmp_[r0 * H], (r1 - r0) * H); });

      rmsnorm_rows(x_.data(), w.ffn_norm, xn_.data(), total, H);
      cpu::matmul_swiglu(xn_.data(), total, w.w_gate, w.w_up, gate_.data(), up_.data(), pool_, mm_ws_);
      cpu::matmul(gate_.data(), total, w.w_down, tmp_.data(), pool_, mm_ws_);
      for_rows(total, [&](size_t r0, size_t r1) { cpu::add_inplace(&x_[r0 * H], &tmp_[r0 * H], (r1 - r0) * H); });
    }

    // Gather the rows that need logits, normalise them, project to the vocabulary.
    size_t out_row = 0;
    size_t t0 = 0;
    for (const SequenceChunk& c : batch) {
      const size_t n = c.tokens.size();
      const size_t first = c.all_logits ? t0 : t0 + n - 1;
      const size_t count = c.all_logits ? n : 1;
      std::memcpy(&xn_[out_row * H], &x_[first * H], count * H * sizeof(float));
      out_row += count;
      t0 += n;
    }
    rmsnorm_rows(xn_.data(), model_.weights.final_norm, xn_.data(), logit_rows, H);
    logits.resize(logit_rows * static_cast<size_t>(cfg_.vocab_size));
    cpu::matmul(xn_.data(), logit_rows, model_.weights.lm_head, logits.data(), pool_, mm_ws_);
    return logit_rows;
  }

 private:
  void resize(size_t total) {
    const size_t H = static_cast<size_t>(cfg_.hidden_size);
    auto grow = [](std::vector<float>& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(x_, total * H);
    grow(xn_, total * H);
    grow(tmp_, total * H);
    grow(q_, total * static_cast<size_t>(cfg_.q_dim()));
    grow(attn_, total * static_cast<size_t>(cfg_.q_dim()));
    grow(k_, total * static_cast<size_t>(cfg_.kv_dim()));
    grow(v_, total * static_cast<size_t>(cfg_.kv_dim()));
    grow(gate_, total * static_cast<size_t>(cfg_.intermediate_size));
    grow(up_, total * static_cast<size_t>(cfg_.intermediate_size));
    if (positions_.size() < total) positions_.resize(total);
  }

  template <class Fn>
  void for_rows(size_t rows, const Fn& fn) {
    if (rows < kParallelRowsMin) {
      fn(0, rows);
    } else {
      pool_.parallel_for(rows, fn);
    }
  }

  void rmsnorm_rows(const float* x, const Tensor& weight, float* out, size_t rows, size_t n) {
    for_rows(rows, [&](size_t r0, size_t r1) {
      cpu::rmsnorm(x + r0 * n, weight.data<float>(), out + r0 * n, r1 - r0, n, cfg_.rms_norm_eps);
    });
  }

  // FDC (model/fdc.h): every head slot of `rows` rows of `heads` heads becomes x·R[:, :d_qk]
  // of its KV head in the layer (cpu::fdc_project).
  void fdc_project(float* x, size_t rows, int heads, int per_kv_head, int layer) const {
    const size_t kv = static_cast<size_t>(cfg_.num_kv_heads);
    cpu::fdc_project(x, rows, heads, per_kv_head, cfg_.head_dim, model_.fdc->proj(layer, 0),
                     &fdc_d_qk_[static_cast<size_t>(layer) * kv]);
  }

  static void add_bias(float* y, const Tensor& bias, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; ++r) cpu::add_inplace(y + r * n, bias.data<float>(), n);
  }

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  CpuPagedKvCache& kv_;
  std::vector<float> inv_freq_;  // [head_dim / 2] RoPE frequencies
  cpu::MatmulWorkspace mm_ws_;
  // Activations, grown to the largest batch seen (T = token rows of the forward), f32:
  std::vector<float> x_;          // [T][hidden] residual stream
  std::vector<float> xn_;         // [T][hidden] normed input of a projection (the logits rows at the end)
  std::vector<float> tmp_;        // [T][hidden] output of o_proj / down_proj before the residual add
  std::vector<float> q_, attn_;   // [T][num_heads · head_dim] queries (RoPE applied), attention output
  std::vector<float> k_, v_;      // [T][num_kv_heads · head_dim] new keys (RoPE applied) and values
  std::vector<float> gate_, up_;  // [T][intermediate] SwiGLU inputs (gate_ then holds the product)
  std::vector<int> positions_;    // [T] position of each row
  std::vector<PlanItem> plan_items_;  // [chunks] the forward's chunks as the plan sees them
  AttentionPlan plan_;                // this forward's attention plan, run by every layer
  AttentionPlan selected_plan_;       // plan_ with the decode items' page selection (MPCache)
  CpuPageSelector selector_;
  bool measure_sharing_ = false;
  AttentionWorkspace attention_ws_;
  ActivationObserverFn observer_;
  std::vector<int> fdc_d_qk_;  // FDC: d_qk per (layer, KV head)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool, CpuPagedKvCache& kv,
                                          cpu::MatmulPrecision matmul_precision) {
  return std::make_unique<CpuBackend>(model, pool, kv, matmul_precision);
}

}  // namespace hack
