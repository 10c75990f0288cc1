// The CPU reference backend: the Llama-family transformer in fp32 activations over
// checkpoint-dtype weights. One forward() runs a batch of sequence chunks (prefill chunks
// and decode tokens mixed) through every layer; attention goes through KvCache.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "hack/backend/backend.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu_ops.h"
#include "hack/kernels/matmul.h"

namespace hack {

DeviceKind parse_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  fail("unknown device '{}' (cpu|cuda)", name);
}

namespace {

// Long prefill chunks are split into blocks of this many query rows per attention task,
// so both threads get work even for a single sequence.
constexpr int kAttentionRowBlock = 16;
// Below this many token rows, element-wise ops run on the calling thread.
constexpr size_t kParallelRowsMin = 32;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, ThreadPool& pool)
      : model_(model), cfg_(model.config), pool_(pool), inv_freq_(cpu::rope_inv_freq(model.config)) {
    scratch_.resize(static_cast<size_t>(pool.size()));
  }

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return cfg_; }

  size_t forward(std::span<const SequenceChunk> batch, KvCache& kv, std::vector<float>& logits,
                 const LayerDoneFn& on_layer_done) override {
    size_t total = 0;
    size_t logit_rows = 0;
    for (const SequenceChunk& c : batch) {
      HACK_CHECK(!c.tokens.empty(), "sequence {}: empty chunk", c.seq_id);
      total += c.tokens.size();
      logit_rows += c.all_logits ? c.tokens.size() : 1;
    }
    if (total == 0) return 0;
    resize(total);

    const size_t H = static_cast<size_t>(cfg_.hidden_size);
    const size_t hd = static_cast<size_t>(cfg_.head_dim);
    const size_t qd = static_cast<size_t>(cfg_.q_dim());
    const size_t kvd = static_cast<size_t>(cfg_.kv_dim());
    const size_t I = static_cast<size_t>(cfg_.intermediate_size);

    size_t row = 0;
    for (const SequenceChunk& c : batch) {
      for (size_t i = 0; i < c.tokens.size(); ++i, ++row) {
        positions_[row] = c.start_pos + static_cast<int>(i);
        cpu::embedding_row(model_.weights.embed, c.tokens[i], &x_[row * H]);
      }
    }

    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const LayerWeights& w = model_.weights.layers[static_cast<size_t>(l)];
      rmsnorm_rows(x_.data(), w.attn_norm, xn_.data(), total, H);
      cpu::matmul(xn_.data(), total, w.wq, q_.data(), pool_, mm_ws_);
      cpu::matmul(xn_.data(), total, w.wk, k_.data(), pool_, mm_ws_);
      cpu::matmul(xn_.data(), total, w.wv, v_.data(), pool_, mm_ws_);
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

      size_t t0 = 0;
      for (const SequenceChunk& c : batch) {
        kv.append(l, c.seq_id, c.start_pos, static_cast<int>(c.tokens.size()), &k_[t0 * kvd], &v_[t0 * kvd]);
        t0 += c.tokens.size();
      }
      attention(batch, kv, l, scale);
      if (on_layer_done) on_layer_done(l);

      cpu::matmul(attn_.data(), total, w.wo, tmp_.data(), pool_, mm_ws_);
      if (w.bo.defined()) add_bias(tmp_.data(), w.bo, total, H);
      for_rows(total, [&](size_t r0, size_t r1) { cpu::add_inplace(&x_[r0 * H], &tmp_[r0 * H], (r1 - r0) * H); });

      rmsnorm_rows(x_.data(), w.ffn_norm, xn_.data(), total, H);
      cpu::matmul(xn_.data(), total, w.w_gate, gate_.data(), pool_, mm_ws_);
      cpu::matmul(xn_.data(), total, w.w_up, up_.data(), pool_, mm_ws_);
      for_rows(total, [&](size_t r0, size_t r1) { cpu::swiglu(&gate_[r0 * I], &up_[r0 * I], &gate_[r0 * I], (r1 - r0) * I); });
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
  struct AttentionTask {
    int seq_id, kv_head, start_pos, n_rows;
    size_t row;  // first token row in the batch
  };

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

  static void add_bias(float* y, const Tensor& bias, size_t rows, size_t n) {
    for (size_t r = 0; r < rows; ++r) cpu::add_inplace(y + r * n, bias.data<float>(), n);
  }

  // One task = (chunk, kv head, block of query rows); tasks are handed out dynamically.
  void attention(std::span<const SequenceChunk> batch, KvCache& kv, int layer, float scale) {
    tasks_.clear();
    size_t t = 0;
    for (const SequenceChunk& c : batch) {
      const int n = static_cast<int>(c.tokens.size());
      for (int r0 = 0; r0 < n; r0 += kAttentionRowBlock) {
        const int nr = std::min(kAttentionRowBlock, n - r0);
        for (int h = 0; h < cfg_.num_kv_heads; ++h)
          tasks_.push_back({c.seq_id, h, c.start_pos + r0, nr, t + static_cast<size_t>(r0)});
      }
      t += static_cast<size_t>(n);
    }
    const size_t qd = static_cast<size_t>(cfg_.q_dim());
    const size_t group_floats = static_cast<size_t>(cfg_.group_size()) * static_cast<size_t>(cfg_.head_dim);
    std::atomic<size_t> next{0};
    pool_.run([&](int thread, int) {
      std::vector<float>& scratch = scratch_[static_cast<size_t>(thread)];
      for (;;) {
        const size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= tasks_.size()) return;
        const AttentionTask& task = tasks_[i];
        const size_t need = kv.attend_scratch_floats(task.n_rows, task.start_pos + task.n_rows);
        if (scratch.size() < need) scratch.resize(need);
        const size_t off = task.row * qd + static_cast<size_t>(task.kv_head) * group_floats;
        kv.attend(layer, task.seq_id, task.kv_head, task.start_pos, task.n_rows, &q_[off], qd, &attn_[off], qd, scale,
                  scratch.data());
      }
    });
  }

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;
  cpu::MatmulWorkspace mm_ws_;
  std::vector<float> x_, xn_, tmp_, q_, k_, v_, attn_, gate_, up_;
  std::vector<int> positions_;
  std::vector<std::vector<float>> scratch_;  // [thread] attention scratch
  std::vector<AttentionTask> tasks_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool) {
  return std::make_unique<CpuBackend>(model, pool);
}

}  // namespace hack
