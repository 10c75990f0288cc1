// The CUDA backend of the fp path. Plan on the host, run on the device: forward() validates
// the batch and packs every index the kernels need (tokens, positions, KV slots, page
// tables, logits rows) into one pinned int array, uploads it with one copy, then enqueues
// the whole model on one stream and waits once, for the logits (and after every layer when
// a layer callback is set, so the callback sees that layer's KV complete).
//
// Per layer (T token rows, fp32 unless marked):
//   xn(bf16) = rmsnorm(x)                 q, k, v = xn · Wq/Wk/Wv^T  (cuBLAS, fp32 out)
//   (+ biases, q/k norm)  rope(q, k)      kv_append(k, v) -> bf16 pages
//   attn(bf16) = decode_attention | prefill_attention
//     (--kv hack: decode rows run hack_decode_attention over sinks + HACK pages + the
//      open bf16 block, f32 out scattered to bf16 rows; the blocks the step's append
//      closes are quantized inside the storage, at the layer's commit_append)
//   x += attn · Wo^T (+ bo)               xn = rmsnorm(x)
//   act(bf16) = silu(xn·Wg^T) · (xn·Wu^T) x += act · Wd^T
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hack/model/rope.h"
#include "hack/backend/cuda_backend.h"
#include "hack/backend/cuda_check.h"
#include "hack/backend/cuda_plan_runner.h"
#include "hack/backend/flat_plan.h"
#include "hack/core/error.h"
#include "hack/kernels/cpu/ops.h"
#include "hack/kernels/cuda/hack.h"
#include "hack/kernels/cuda/ops.h"
#include "hack/kv/attention_plan.h"
#include "hack/backend/hack_attention_plan.h"

namespace hack {

namespace {

using cuda::bf16;

// Decode attention splits a sequence's pages over at most this many blocks.
constexpr int kMaxDecodeSplits = 64;
// HACK decode attention: split warps per SM the plan aims for (bench/cuda/NOTES.md, call 9).
constexpr int kHackWarpsPerSm = 64;

class CudaStream {
 public:
  // A blocking stream: it orders after the synchronous uploads and memsets made on the
  // legacy default stream (weights, KV pool), so no extra synchronisation is needed.
  CudaStream() { HACK_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~CudaStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    const cublasStatus_t created = cublasCreate(&handle_);
    HACK_CHECK(created == CUBLAS_STATUS_SUCCESS, "cublasCreate failed: {}", cublasGetStatusString(created));
    const cublasStatus_t s = cublasSetStream(handle_, stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle_);
      fail("cublasSetStream failed: {}", cublasGetStatusString(s));
    }
  }
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// A weight matrix on the device: HF layout [out][in] bf16. `data` points into `buffer`, or
// into another matrix's buffer when shared (tied lm_head).
struct DeviceMatrix {
  Buffer buffer;
  const bf16* data = nullptr;
  int out = 0;
  int in = 0;
};

struct DeviceLayer {
  DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  Buffer attn_norm, ffn_norm, bq, bk, bv, bo, q_norm, k_norm;  // f32; empty when absent
};

const float* f32_ptr(const Buffer& b) { return b.data() ? static_cast<const float*>(b.data()) : nullptr; }

DeviceMatrix upload_matrix(const Tensor& t, int out, int in, int device, const char* what) {
  HACK_CHECK(t.defined() && t.ndim() == 2 && t.dim(0) == out && t.dim(1) == in,
             "CUDA backend: weight {} is {}, expected [{}, {}]", what, t.defined() ? t.describe() : "missing", out, in);
  const size_t n = static_cast<size_t>(out) * static_cast<size_t>(in);
  DeviceMatrix m;
  m.buffer = Buffer::allocate(MemoryKind::device, n * sizeof(uint16_t), device);
  m.data = static_cast<const bf16*>(m.buffer.data());
  m.out = out;
  m.in = in;
  if (t.dtype() == DType::bf16) {
    HACK_CUDA_CHECK(cudaMemcpy(m.buffer.data(), t.raw(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return m;
  }
  // Other dtypes (f32, f16, and a GGUF's quantized blocks, which the device runs as bf16):
  // convert or dequantize to bf16 (round to nearest even) a slab at a time. A slab of 2^20
  // elements is a whole number of blocks (32 or 256), and so is the rest (rows are whole
  // blocks), so every slab starts on a block.
  constexpr size_t kSlab = size_t{1} << 20;
  static_assert(kSlab % 256 == 0);
  std::vector<float> f(std::min(n, kSlab));
  std::vector<uint16_t> h(f.size());
  for (size_t off = 0; off < n; off += kSlab) {
    const size_t count = std::min(kSlab, n - off);
    convert_to_f32(t.dtype(), static_cast<const char*>(t.raw()) + dtype_bytes(t.dtype(), off), f.data(), count);
    for (size_t i = 0; i < count; ++i) h[i] = f32_to_bf16(f[i]);
    HACK_CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(m.buffer.data()) + off, h.data(), count * sizeof(uint16_t),
                               cudaMemcpyHostToDevice));
  }
  return m;
}

Buffer upload_vector(const Tensor& t, int n, int device, const char* what) {
  if (!t.defined()) return Buffer();
  HACK_CHECK(t.dtype() == DType::f32 && t.numel() == n, "CUDA backend: vector {} is {}, expected [{}] f32", what,
             t.describe(), n);
  Buffer b = Buffer::allocate(MemoryKind::device, static_cast<size_t>(n) * sizeof(float), device);
  HACK_CUDA_CHECK(cudaMemcpy(b.data(), t.raw(), static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

Buffer upload_floats(const std::vector<float>& v, int device) {
  Buffer b = Buffer::allocate(MemoryKind::device, v.size() * sizeof(float), device);
  HACK_CUDA_CHECK(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
  return b;
}

template <class T>
T* ptr(const Buffer& b) {
  return static_cast<T*>(b.data());
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, CudaPagedKvCache& kv, const CudaBackendOptions& options)
      : cfg_(model.config), options_(options), kv_(kv), cublas_(stream_.get()) {
    HACK_CHECK(options.max_batch_tokens > 0 && options.max_sequences > 0 && options.max_logit_rows > 0,
               "CUDA backend: max_batch_tokens, max_sequences and max_logit_rows must be positive");
    HACK_CHECK(cfg_.head_dim % 2 == 0, "CUDA backend: head_dim {} must be even (RoPE pairs)", cfg_.head_dim);
    HACK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, options.device));
    int smem_optin = 0;
    HACK_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, options.device));
    max_smem_bytes_ = static_cast<size_t>(smem_optin);
    HACK_CHECK(cuda::prefill_attention_smem_bytes(cfg_.head_dim) <= max_smem_bytes_,
               "CUDA backend: head_dim {} needs {} bytes of shared memory in prefill attention, the device has {}",
               cfg_.head_dim, cuda::prefill_attention_smem_bytes(cfg_.head_dim), max_smem_bytes_);
    HACK_CHECK(kv.device() == options.device, "CUDA backend on device {} got a KV cache on device {}", options.device,
               kv.device());
    HACK_CHECK(!model.fdc, "--fdc runs on --device cpu only: the CUDA backend has no FDC projection yet");
    // The kernels path's HACK decode attends to sinks, closed pages and one bf16 block; the
    // exact blocks a recent window keeps behind the open one need the plan runner.
    HACK_CHECK(!kv.is_hack() || kv.options().recent_tokens == 0 || options.plan_attention,
               "--device cuda --kv hack --hack-recent {} needs --cuda-attention plan (the kernels path's decode "
               "attends to one bf16 block)",
               kv.options().recent_tokens);
    const KvShape& ks = kv.shape();
    HACK_CHECK(ks == kv_shape(cfg_),
               "CUDA backend: KV cache shape (layers {}, kv heads {}, head_dim {}) does not match the model", ks.num_layers,
               ks.num_kv_heads, ks.head_dim);
    upload_weights(model);
    allocate_workspace();
    dec_.reserve(static_cast<size_t>(options.max_sequences));
    pre_.reserve(static_cast<size_t>(options.max_sequences));
    seq_ids_.reserve(static_cast<size_t>(options.max_sequences));
  }

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return cfg_; }

  KvCache& kv() override { return kv_; }

  /// The observer sees each layer's post-RoPE q, k and v of every row, read back to the host
  /// (one synchronous copy of [T][q_dim + 2 kv_dim] floats per layer, only while one is set:
  /// static eviction's scoring and hack-calibrate's capture).
  void set_activation_observer(ActivationObserverFn fn) override { observer_ = std::move(fn); }

  size_t forward(std::span<const SequenceChunk> batch, std::vector<float>& logits,
                 const LayerDoneFn& on_layer_done) override {
    CudaPagedKvCache* kv = &kv_;
    const size_t T = plan(batch, *kv);
    if (T == 0) return 0;
    const cudaStream_t s = stream_.get();
    const int Ti = static_cast<int>(T);
    const int H = cfg_.hidden_size, hd = cfg_.head_dim, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
    const int I = cfg_.intermediate_size, V = cfg_.vocab_size;
    const float eps = cfg_.rms_norm_eps;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int* plan_d = ptr<int>(plan_dev_);

    float* x = ptr<float>(x_);
    bf16* xn = ptr<bf16>(xn_);
    float* q = ptr<float>(q_);
    float* k = ptr<float>(k_);
    float* v = ptr<float>(v_);
    bf16* attn = ptr<bf16>(attn_);
    float* tmp = ptr<float>(tmp_);
    float* gate = ptr<float>(gate_);
    float* up = ptr<float>(up_);
    bf16* act = ptr<bf16>(act_);

    cuda::embedding_gather(embed_.data, plan_d + off_.tokens, Ti, H, x, s);
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const DeviceLayer& w = layers_[static_cast<size_t>(l)];
      cuda::rmsnorm_to_bf16(x, nullptr, f32_ptr(w.attn_norm), xn, Ti, H, eps, s);
      gemm(w.wq, xn, Ti, q);
      gemm(w.wk, xn, Ti, k);
      gemm(w.wv, xn, Ti, v);
      if (cfg_.attention_bias) {
        cuda::add_bias(q, f32_ptr(w.bq), Ti, qd, s);
        cuda::add_bias(k, f32_ptr(w.bk), Ti, kvd, s);
        cuda::add_bias(v, f32_ptr(w.bv), Ti, kvd, s);
      }
      if (cfg_.qk_norm) {
        cuda::rmsnorm_inplace(q, f32_ptr(w.q_norm), Ti * cfg_.num_heads, hd, eps, s);
        cuda::rmsnorm_inplace(k, f32_ptr(w.k_norm), Ti * cfg_.num_kv_heads, hd, eps, s);
      }
      cuda::rope_inplace(q, plan_d + off_.positions, ptr<float>(inv_freq_), Ti, cfg_.num_heads, hd, s);
      cuda::rope_inplace(k, plan_d + off_.positions, ptr<float>(inv_freq_), Ti, cfg_.num_kv_heads, hd, s);
      if (observer_) observe(l, T, q, k, v);

      const cuda::PagedKvLayer kv_layer = kv->layer(l);
      cuda::kv_append(kv_layer, k, v, plan_d + off_.slots, Ti, s);
      for (const SequenceChunk& c : batch)
        kv->commit_append(l, c.seq_id, c.start_pos, static_cast<int>(c.tokens.size()));
      attention(l, kv_layer, q, attn, scale);
      if (on_layer_done) {
        // The layer's K/V (and attention) are enqueued, not finished: wait for them so the
        // callback sees the layer's final KV. Costs one sync per layer, only when set.
        HACK_CUDA_CHECK(cudaStreamSynchronize(s));
        on_layer_done(l);
      }

      gemm(w.wo, attn, Ti, tmp);
      cuda::add_residual(x, tmp, f32_ptr(w.bo), Ti, H, s);
      cuda::rmsnorm_to_bf16(x, nullptr, f32_ptr(w.ffn_norm), xn, Ti, H, eps, s);
      gemm(w.w_gate, xn, Ti, gate);
      gemm(w.w_up, xn, Ti, up);
      cuda::swiglu_to_bf16(gate, up, act, static_cast<long long>(T) * I, s);
      gemm(w.w_down, act, Ti, tmp);
      cuda::add_residual(x, tmp, nullptr, Ti, H, s);
    }

    // Rows that need logits: final norm (gathering them), lm_head in passes, copy out.
    const int L = n_logit_rows_;
    cuda::rmsnorm_to_bf16(x, plan_d + off_.logit_rows, ptr<float>(final_norm_), xn, L, H, eps, s);
    logits.resize(static_cast<size_t>(L) * static_cast<size_t>(V));
    for (int r0 = 0; r0 < L; r0 += options_.max_logit_rows) {
      const int n = std::min(options_.max_logit_rows, L - r0);
      gemm(lm_head_, xn + static_cast<size_t>(r0) * static_cast<size_t>(H), n, ptr<float>(logits_));
      HACK_CUDA_CHECK(cudaMemcpyAsync(logits.data() + static_cast<size_t>(r0) * static_cast<size_t>(V),
                                      logits_.data(), static_cast<size_t>(n) * static_cast<size_t>(V) * sizeof(float),
                                      cudaMemcpyDeviceToHost, s));
    }
    HACK_CUDA_CHECK(cudaStreamSynchronize(s));
    return static_cast<size_t>(L);
  }

 private:
  // Offsets (in ints) of the plan's arrays.
  struct PlanOffsets {
    size_t tokens = 0, positions = 0, slots = 0, logit_rows = 0;
    size_t dec_rows = 0, dec_lengths = 0, dec_tables = 0;
    size_t pre_rows = 0, pre_tokens = 0, pre_start = 0, pre_tables = 0;
    size_t hack_pages = 0, hack_sinks = 0, hack_open = 0;  // --kv hack decode: per decode row
    size_t page_tables = 0, identity = 0, total = 0;  // identity: [T] 0 .. T − 1 (plan attention)
  };
  // One decode query (a chunk of one token) or one prefill chunk, as the plan records it.
  struct DecodeEntry {
    int row, length, table_offset, seq_id;
    int closed_pages;  // blocks closed once this step's token is appended (KvBlockManager::closable_blocks)
  };
  struct PrefillEntry {
    int row, n_tokens, start_pos, table_offset;
  };

  // Shows the layer's rows to observer_ (host copies of the device q, k, v; rows in chunk order,
  // as the CPU backend shows them).
  void observe(int layer, size_t T, const float* q, const float* k, const float* v) {
    const size_t qn = T * static_cast<size_t>(cfg_.q_dim()), kn = T * static_cast<size_t>(cfg_.kv_dim());
    observed_q_.resize(qn);
    observed_k_.resize(kn);
    observed_v_.resize(kn);
    const cudaStream_t s = stream_.get();
    HACK_CUDA_CHECK(cudaMemcpyAsync(observed_q_.data(), q, qn * sizeof(float), cudaMemcpyDeviceToHost, s));
    HACK_CUDA_CHECK(cudaMemcpyAsync(observed_k_.data(), k, kn * sizeof(float), cudaMemcpyDeviceToHost, s));
    HACK_CUDA_CHECK(cudaMemcpyAsync(observed_v_.data(), v, kn * sizeof(float), cudaMemcpyDeviceToHost, s));
    HACK_CUDA_CHECK(cudaStreamSynchronize(s));
    observer_(layer, T, observed_q_.data(), observed_k_.data(), observed_v_.data());
  }

  void upload_weights(const Model& model) {
    const int dev = options_.device;
    const int H = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), I = cfg_.intermediate_size;
    const ModelWeights& mw = model.weights;
    embed_ = upload_matrix(mw.embed, cfg_.vocab_size, H, dev, "embed_tokens");
    if (mw.lm_head.defined() && mw.lm_head.raw() == mw.embed.raw() && mw.lm_head.dtype() == mw.embed.dtype()) {
      lm_head_.data = embed_.data;  // tied: one copy on the device
      lm_head_.out = embed_.out;
      lm_head_.in = embed_.in;
    } else {
      lm_head_ = upload_matrix(mw.lm_head, cfg_.vocab_size, H, dev, "lm_head");
    }
    final_norm_ = upload_vector(mw.final_norm, H, dev, "norm");
    HACK_CHECK(static_cast<int>(mw.layers.size()) == cfg_.num_layers, "CUDA backend: {} layers of weights for {} layers",
               mw.layers.size(), cfg_.num_layers);
    layers_.resize(mw.layers.size());
    for (size_t l = 0; l < mw.layers.size(); ++l) {
      const LayerWeights& w = mw.layers[l];
      DeviceLayer& d = layers_[l];
      d.wq = upload_matrix(w.wq, qd, H, dev, "q_proj");
      d.wk = upload_matrix(w.wk, kvd, H, dev, "k_proj");
      d.wv = upload_matrix(w.wv, kvd, H, dev, "v_proj");
      d.wo = upload_matrix(w.wo, H, qd, dev, "o_proj");
      d.w_gate = upload_matrix(w.w_gate, I, H, dev, "gate_proj");
      d.w_up = upload_matrix(w.w_up, I, H, dev, "up_proj");
      d.w_down = upload_matrix(w.w_down, H, I, dev, "down_proj");
      d.attn_norm = upload_vector(w.attn_norm, H, dev, "input_layernorm");
      d.ffn_norm = upload_vector(w.ffn_norm, H, dev, "post_attention_layernorm");
      if (cfg_.attention_bias) {
        d.bq = upload_vector(w.bq, qd, dev, "q_proj.bias");
        d.bk = upload_vector(w.bk, kvd, dev, "k_proj.bias");
        d.bv = upload_vector(w.bv, kvd, dev, "v_proj.bias");
        HACK_CHECK(d.bq.data() && d.bk.data() && d.bv.data(), "CUDA backend: layer {} lacks q/k/v biases", l);
      }
      d.bo = upload_vector(w.bo, H, dev, "o_proj.bias");
      if (cfg_.qk_norm) {
        d.q_norm = upload_vector(w.q_norm, cfg_.head_dim, dev, "q_norm");
        d.k_norm = upload_vector(w.k_norm, cfg_.head_dim, dev, "k_norm");
        HACK_CHECK(d.q_norm.data() && d.k_norm.data(), "CUDA backend: layer {} lacks q/k norms", l);
      }
      HACK_CHECK(d.attn_norm.data() && d.ffn_norm.data(), "CUDA backend: layer {} lacks its norms", l);
    }
    HACK_CHECK(final_norm_.data() != nullptr, "CUDA backend: the model lacks its final norm");
    inv_freq_ = upload_floats(rope_inv_freq(cfg_), dev);
  }

  void allocate_workspace() {
    const int dev = options_.device;
    const size_t T = static_cast<size_t>(options_.max_batch_tokens);
    const size_t H = static_cast<size_t>(cfg_.hidden_size), qd = static_cast<size_t>(cfg_.q_dim());
    const size_t kvd = static_cast<size_t>(cfg_.kv_dim()), I = static_cast<size_t>(cfg_.intermediate_size);
    auto alloc = [&](size_t bytes) { return Buffer::allocate(MemoryKind::device, bytes, dev); };
    x_ = alloc(T * H * sizeof(float));
    xn_ = alloc(T * H * sizeof(bf16));
    tmp_ = alloc(T * H * sizeof(float));
    q_ = alloc(T * qd * sizeof(float));
    k_ = alloc(T * kvd * sizeof(float));
    v_ = alloc(T * kvd * sizeof(float));
    attn_ = alloc(T * qd * sizeof(bf16));
    gate_ = alloc(T * I * sizeof(float));
    up_ = alloc(T * I * sizeof(float));
    act_ = alloc(T * I * sizeof(bf16));
    const size_t logit_rows = std::min(T, static_cast<size_t>(options_.max_logit_rows));
    logits_ = alloc(logit_rows * static_cast<size_t>(cfg_.vocab_size) * sizeof(float));
    if (options_.plan_attention) plan_out_ = alloc(T * qd * sizeof(float));
    if (kv_.is_hack()) {
      hack_q_ = alloc(static_cast<size_t>(options_.max_sequences) * qd * sizeof(float));
      hack_out_ = alloc(static_cast<size_t>(options_.max_sequences) * qd * sizeof(float));
    }
    partial_ = alloc(static_cast<size_t>(cuda::decode_attention_workspace_floats(
                         options_.max_sequences, cfg_.num_heads, kMaxDecodeSplits, cfg_.head_dim)) *
                     sizeof(float));
    // The plan: tokens, positions, slots, logits rows (≤ T each), 10 ints per chunk, and
    // page tables, which grow with context (reserve_plan grows it when a batch needs more).
    reserve_plan(4 * T + 10 * static_cast<size_t>(options_.max_sequences) + 4096);
  }

  // Grows the pinned and device plan arrays to at least `ints` (only when a batch needs more
  // page-table entries than any before; a steady decode loop allocates nothing).
  void reserve_plan(size_t ints) { grow_staged(plan_host_, plan_dev_, plan_capacity_, ints, sizeof(int)); }

  // Grows a pinned host array and its device twin to at least n elements of `elem` bytes
  // (doubling; waits for the stream first, as the old arrays may still be in a copy).
  void grow_staged(Buffer& host, Buffer& dev, size_t& capacity, size_t n, size_t elem) {
    if (n <= capacity) return;
    const size_t cap = std::max(n, capacity * 2);
    HACK_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    host = Buffer::allocate(MemoryKind::pinned, cap * elem);
    dev = Buffer::allocate(MemoryKind::device, cap * elem, options_.device);
    capacity = cap;
  }

  // Validates the batch against the cache and writes the plan; returns the token rows.
  size_t plan(std::span<const SequenceChunk> batch, const CudaPagedKvCache& kv) {
    HACK_CHECK(batch.size() <= static_cast<size_t>(options_.max_sequences),
               "CUDA backend: {} chunks in one forward, at most {} (max_sequences)", batch.size(), options_.max_sequences);
    const int P = kv.page_tokens();
    size_t T = 0, L = 0, pages = 0;
    seq_ids_.clear();
    for (const SequenceChunk& c : batch) {
      HACK_CHECK(!c.tokens.empty(), "sequence {}: empty chunk", c.seq_id);
      HACK_CHECK(std::find(seq_ids_.begin(), seq_ids_.end(), c.seq_id) == seq_ids_.end(),
                 "CUDA backend: sequence {} appears twice in one forward", c.seq_id);
      seq_ids_.push_back(c.seq_id);
      HACK_CHECK(kv.has_sequence(c.seq_id), "CUDA backend: sequence {} is not in the KV cache", c.seq_id);
      const int n = static_cast<int>(c.tokens.size());
      HACK_CHECK(c.start_pos == kv.length(c.seq_id, 0), "sequence {}: chunk starts at {} but {} tokens are stored",
                 c.seq_id, c.start_pos, kv.length(c.seq_id, 0));
      HACK_CHECK(c.start_pos + n <= kv.max_tokens(c.seq_id),
                 "sequence {}: {} + {} tokens exceed the {} reserved in the KV cache", c.seq_id, c.start_pos, n,
                 kv.max_tokens(c.seq_id));
      T += static_cast<size_t>(n);
      L += c.all_logits ? static_cast<size_t>(n) : 1;
      pages += static_cast<size_t>(CudaPagedKvCache::pages_for(kv.rows_for(c.start_pos + n), P));
      // The CPU cache would attend such a chunk to quantized blocks (multi-query homomorphic
      // attention, not on the device yet): a past already closed, or full blocks outside a prefill.
      if (kv.is_hack() && n > 1 && !options_.plan_attention)
        HACK_CHECK(kv.closed_blocks(c.seq_id) == 0 && (kv.prefilling(c.seq_id) || kv.full_blocks(c.start_pos) == 0),
                   "CUDA backend --kv hack: sequence {} holds quantized blocks; a prompt chunk over a quantized past "
                   "runs on --device cpu only",
                   c.seq_id);
    }
    if (T == 0) return 0;
    // --cuda-attention plan: the step's AttentionPlan from the device-neutral block manager,
    // exactly as the CPU builds it. The kernels path needs only the plan's closing rule
    // (KvBlockManager::closable_blocks, below), not its segments and tasks.
    if (options_.plan_attention) {
      plan_items_.clear();
      for (const SequenceChunk& c : batch)
        plan_items_.push_back(PlanItem{c.seq_id, c.start_pos, static_cast<int>(c.tokens.size()),
                                       static_cast<int>(plan_items_.empty() ? 0 : plan_items_.back().row + plan_items_.back().n_tokens)});
      kv.plan(plan_items_, device_plan_policy(sm_count_), attention_plan_);
    }
    HACK_CHECK(T <= static_cast<size_t>(options_.max_batch_tokens),
               "CUDA backend: {} tokens in one forward, at most {} (max_batch_tokens)", T, options_.max_batch_tokens);

    dec_.clear();
    pre_.clear();
    PlanOffsets o;
    o.tokens = 0;
    o.positions = o.tokens + T;
    o.slots = o.positions + T;
    o.logit_rows = o.slots + T;
    const size_t n_chunks = batch.size();
    o.dec_rows = o.logit_rows + L;
    // Decode and prefill arrays are sized for every chunk; only the first D / C are used.
    o.dec_lengths = o.dec_rows + n_chunks;
    o.dec_tables = o.dec_lengths + n_chunks;
    o.pre_rows = o.dec_tables + n_chunks;
    o.pre_tokens = o.pre_rows + n_chunks;
    o.pre_start = o.pre_tokens + n_chunks;
    o.pre_tables = o.pre_start + n_chunks;
    o.hack_pages = o.pre_tables + n_chunks;
    o.hack_sinks = o.hack_pages + n_chunks;
    o.hack_open = o.hack_sinks + n_chunks;
    o.page_tables = o.hack_open + n_chunks;
    o.identity = o.page_tables + pages;
    o.total = o.identity + (options_.plan_attention ? T : 0);
    reserve_plan(o.total);
    int* h = ptr<int>(plan_host_);

    int row = 0, n_logits = 0, table_at = 0;
    max_decode_pages_ = 0;
    max_prefill_tokens_ = 0;
    for (const SequenceChunk& c : batch) {
      const int n = static_cast<int>(c.tokens.size());
      const std::span<const int> table = kv.page_table(c.seq_id);
      const int used_pages = CudaPagedKvCache::pages_for(kv.rows_for(c.start_pos + n), P);
      std::copy(table.begin(), table.begin() + used_pages, h + o.page_tables + static_cast<size_t>(table_at));
      for (int i = 0; i < n; ++i) {
        const int token = c.tokens[static_cast<size_t>(i)];
        HACK_CHECK(token >= 0 && token < cfg_.vocab_size, "sequence {}: token id {} out of range [0, {})", c.seq_id,
                   token, cfg_.vocab_size);
        const int pos = c.start_pos + i;
        const size_t r = static_cast<size_t>(row + i);
        h[o.tokens + r] = token;
        h[o.positions + r] = pos + c.rope_offset;  // RoPE only; KV slots and masks use pos
        const int kv_row = cuda::kv_row(pos, P, kv.sinks());
        h[o.slots + r] = table[static_cast<size_t>(kv_row / P)] * P + kv_row % P;
      }
      if (c.all_logits) {
        for (int i = 0; i < n; ++i) h[o.logit_rows + static_cast<size_t>(n_logits++)] = row + i;
      } else {
        h[o.logit_rows + static_cast<size_t>(n_logits++)] = row + n - 1;
      }
      // A prompt's one-token chunk inside a HACK prefill attends to its exact past, as a prefill.
      if (n == 1 && !(kv.is_hack() && kv.prefilling(c.seq_id))) {
        // The blocks closed once this token is appended: the rule the plan and the CPU use.
        const int closed = kv.is_hack() ? kv.blocks().closable_blocks(c.seq_id, 0) : 0;
        dec_.push_back({row, c.start_pos + 1, table_at, c.seq_id, closed});
        max_decode_pages_ = std::max(max_decode_pages_, used_pages);
      } else {
        pre_.push_back({row, n, c.start_pos, table_at});
        max_prefill_tokens_ = std::max(max_prefill_tokens_, n);
      }
      row += n;
      table_at += used_pages;
    }
    for (size_t i = 0; i < dec_.size(); ++i) {
      h[o.dec_rows + i] = dec_[i].row;
      h[o.dec_lengths + i] = dec_[i].length;
      h[o.dec_tables + i] = dec_[i].table_offset;
    }
    if (options_.plan_attention) {
      for (size_t r = 0; r < T; ++r) h[o.identity + r] = static_cast<int>(r);
      // The blocks each chunk closes (a decode token's filled blocks, a prompt chunk's past
      // outside the prefill bracket) close inside the storage at the layer's commit_append,
      // as the CPU storage closes them at its append; their HACK page ids are reserved at
      // admission, so the plan resolves them now.
      plan_runner_.upload(attention_plan_, kv_, stream_.get());
    } else if (kv.is_hack() && !dec_.empty()) {
      plan_hack_decode_rows(o, h);
    }
    for (size_t i = 0; i < pre_.size(); ++i) {
      h[o.pre_rows + i] = pre_[i].row;
      h[o.pre_tokens + i] = pre_[i].n_tokens;
      h[o.pre_start + i] = pre_[i].start_pos;
      h[o.pre_tables + i] = pre_[i].table_offset;
    }
    if (!dec_.empty() && !kv.is_hack() && !options_.plan_attention) {
      const size_t smem = cuda::decode_attention_smem_bytes(cfg_.group_size(), cfg_.head_dim, P);
      HACK_CHECK(smem <= max_smem_bytes_,
                 "CUDA backend: decode attention with {} tokens per page needs {} bytes of shared memory, the device "
                 "has {}; use smaller pages",
                 P, smem, max_smem_bytes_);
    }
    HACK_CUDA_CHECK(cudaMemcpyAsync(plan_dev_.data(), plan_host_.data(), o.total * sizeof(int), cudaMemcpyHostToDevice,
                                    stream_.get()));
    off_ = o;
    n_logit_rows_ = static_cast<int>(L);
    n_rows_ = static_cast<int>(T);
    return T;
  }

  void attention(int layer, const cuda::PagedKvLayer& kv_layer, const float* q, bf16* out, float scale) {
    const int* plan_d = ptr<int>(plan_dev_);
    if (options_.plan_attention) {  // the step's AttentionPlan: f32 rows, then bf16 for o_proj
      const int qd = cfg_.q_dim();
      plan_runner_.run(layer, q, static_cast<size_t>(qd), ptr<float>(plan_out_), static_cast<size_t>(qd), scale,
                       stream_.get());
      cuda::scatter_rows_to_bf16(ptr<float>(plan_out_), plan_d + off_.identity, n_rows_, qd, out, stream_.get());
      return;
    }
    if (!dec_.empty() && kv_.is_hack()) hack_decode(layer, q, out, scale);
    if (!dec_.empty() && !kv_.is_hack()) {
      cuda::DecodeAttentionArgs a;
      a.kv = kv_layer;
      a.q = q;
      a.out = out;
      a.q_row_stride = cfg_.q_dim();
      a.rows = plan_d + off_.dec_rows;
      a.kv_lengths = plan_d + off_.dec_lengths;
      a.page_tables = plan_d + off_.page_tables;
      a.page_table_offsets = plan_d + off_.dec_tables;
      a.n_seqs = static_cast<int>(dec_.size());
      a.group_size = cfg_.group_size();
      a.scale = scale;
      const int splits =
          cuda::decode_attention_splits(sm_count_, a.n_seqs, cfg_.num_kv_heads, max_decode_pages_, kMaxDecodeSplits);
      a.pages_per_split = (max_decode_pages_ + splits - 1) / splits;
      a.n_splits = (max_decode_pages_ + a.pages_per_split - 1) / a.pages_per_split;
      a.partial = ptr<float>(partial_);
      cuda::decode_attention(a, stream_.get());
    }
    if (!pre_.empty()) {
      cuda::PrefillAttentionArgs a;
      a.kv = kv_layer;
      a.q = q;
      a.out = out;
      a.q_row_stride = cfg_.q_dim();
      a.first_rows = plan_d + off_.pre_rows;
      a.n_tokens = plan_d + off_.pre_tokens;
      a.start_pos = plan_d + off_.pre_start;
      a.page_tables = plan_d + off_.page_tables;
      a.page_table_offsets = plan_d + off_.pre_tables;
      a.n_chunks = static_cast<int>(pre_.size());
      a.max_tokens = max_prefill_tokens_;
      a.q_heads = cfg_.num_heads;
      a.group_size = cfg_.group_size();
      a.scale = scale;
      cuda::prefill_attention(a, stream_.get());
    }
  }

  // --kv hack, in plan(): writes the decode rows' counts (HACK pages, sink and open-block
  // tokens) into the int plan and every layer's page, sink and open-block pointers into the
  // pointer plan. The pages counted are those closed once the step's token is appended
  // (DecodeEntry::closed_pages): the storage closes the blocks each row's sequence filled
  // before this step at the layer's commit_append, before the layer's attention runs.
  void plan_hack_decode_rows(const PlanOffsets& o, int* h) {
    const int S = kv_.sinks(), P = kv_.page_tokens();
    hack_max_pages_ = 0;
    for (const DecodeEntry& d : dec_) hack_max_pages_ = std::max(hack_max_pages_, d.closed_pages);
    const size_t nd = dec_.size(), maxp = static_cast<size_t>(hack_max_pages_);
    const size_t per_layer = nd * maxp + 2 * nd;
    hack_rows_dense_ = true;  // decode rows 0 .. nd − 1: q is read in place, not gathered
    for (size_t i = 0; i < nd; ++i) hack_rows_dense_ = hack_rows_dense_ && dec_[i].row == static_cast<int>(i);
    reserve_pointer_plan(per_layer * static_cast<size_t>(cfg_.num_layers));
    auto* ptrs = ptr<uint64_t>(pointers_host_);
    for (size_t i = 0; i < nd; ++i) {
      const DecodeEntry& d = dec_[i];
      const int closed = d.closed_pages;
      const int open_first = S + closed * P;  // first token of the open block
      h[o.hack_pages + i] = closed;
      h[o.hack_sinks + i] = std::min(d.length, S);
      h[o.hack_open + i] = std::max(0, d.length - open_first);
      const std::span<const int> table = kv_.page_table(d.seq_id);
      const std::span<const int> hack_table = kv_.hack_page_table(d.seq_id);
      // The open block's bf16 page (page 1 + closed past the sink page), when it holds tokens.
      const int open_page =
          d.length > open_first ? table[static_cast<size_t>(cuda::kv_row(open_first, P, S) / P)] : -1;
      for (int l = 0; l < cfg_.num_layers; ++l) {
        uint64_t* lp = ptrs + static_cast<size_t>(l) * per_layer;
        for (int p = 0; p < closed; ++p)
          lp[i * maxp + static_cast<size_t>(p)] =
              reinterpret_cast<uint64_t>(kv_.hack_page(l, hack_table[static_cast<size_t>(p)]));
        lp[nd * maxp + i] = S > 0 ? reinterpret_cast<uint64_t>(kv_.exact_page(l, table[0])) : 0;
        lp[nd * maxp + nd + i] = open_page >= 0 ? reinterpret_cast<uint64_t>(kv_.exact_page(l, open_page)) : 0;
      }
    }
    HACK_CUDA_CHECK(cudaMemcpyAsync(pointers_dev_.data(), pointers_host_.data(),
                                    per_layer * static_cast<size_t>(cfg_.num_layers) * sizeof(uint64_t),
                                    cudaMemcpyHostToDevice, stream_.get()));
    const int G = cfg_.group_size();
    HackDecodePlanInput in;
    in.sm_count = sm_count_;
    in.warps_per_sm = kHackWarpsPerSm;
    in.batch = static_cast<int>(nd);
    in.kv_heads = cfg_.num_kv_heads;
    in.max_pages = hack_max_pages_;
    hack_plan_ = plan_hack_decode(in);
    size_t need = 0;
    for (int l = 0; l < cfg_.num_layers; ++l)
      need = std::max(need,
                      cuda::hack_decode_workspace_bytes(kv_.hack_geometry(l), static_cast<int>(nd), G, hack_plan_));
    if (hack_workspace_.bytes() < need) {
      HACK_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
      hack_workspace_ = Buffer::allocate(MemoryKind::device, need, options_.device);
    }
  }

  void reserve_pointer_plan(size_t n) {
    grow_staged(pointers_host_, pointers_dev_, pointers_capacity_, n, sizeof(uint64_t));
  }

  // --kv hack: the decode rows of one layer. q rows are gathered into a dense block unless
  // they are rows 0 .. n − 1 already (the plan says); the f32 output goes to attn's rows as bf16.
  void hack_decode(int layer, const float* q, bf16* out, float scale) {
    const cudaStream_t s = stream_.get();
    const int* plan_d = ptr<int>(plan_dev_);
    const int nd = static_cast<int>(dec_.size()), qd = cfg_.q_dim();
    const float* qb = q;
    if (!hack_rows_dense_) {
      cuda::gather_rows(q, plan_d + off_.dec_rows, nd, qd, ptr<float>(hack_q_), s);
      qb = ptr<float>(hack_q_);
    }
    const size_t maxp = static_cast<size_t>(hack_max_pages_), n = static_cast<size_t>(nd);
    const size_t per_layer = n * maxp + 2 * n;
    const auto* lp = ptr<uint64_t>(pointers_dev_) + static_cast<size_t>(layer) * per_layer;
    cuda::HackDecodeBatch b;
    b.batch = nd;
    b.group_size = cfg_.group_size();
    b.scale = scale;
    b.q = qb;
    b.out = ptr<float>(hack_out_);
    b.page_table = reinterpret_cast<const void* const*>(lp);
    b.max_pages = hack_max_pages_;
    b.num_pages = plan_d + off_.hack_pages;
    b.sink_kv = reinterpret_cast<const uint16_t* const*>(lp + n * maxp);
    b.sink_tokens = plan_d + off_.hack_sinks;
    b.sink_capacity = kv_.page_tokens();  // sinks sit in a whole bf16 page: its row stride
    b.open_kv = reinterpret_cast<const uint16_t* const*>(lp + n * maxp + n);
    b.open_tokens = plan_d + off_.hack_open;
    cuda::hack_decode_attention(kv_.hack_geometry(layer), b, hack_plan_, hack_workspace_.data(),
                                hack_workspace_.bytes(), s);
    cuda::scatter_rows_to_bf16(ptr<float>(hack_out_), plan_d + off_.dec_rows, nd, qd, out, s);
  }

  // y[rows][w.out] = x[rows][w.in] · w^T
  void gemm(const DeviceMatrix& w, const bf16* x, int rows, float* y) {
    cuda::gemm_bf16(cublas_.get(), w.data, w.out, w.in, x, rows, y);
  }

  ModelConfig cfg_;
  CudaBackendOptions options_;
  CudaPagedKvCache& kv_;
  CudaStream stream_;
  CublasHandle cublas_;
  int sm_count_ = 1;
  size_t max_smem_bytes_ = 0;

  DeviceMatrix embed_, lm_head_;  // [vocab][hidden] bf16 (tied: one copy)
  Buffer final_norm_;             // [hidden] f32
  Buffer inv_freq_;               // [head_dim / 2] f32 RoPE frequencies
  std::vector<DeviceLayer> layers_;

  // Workspace for T = max_batch_tokens rows (device memory):
  Buffer x_;            // [T][hidden] f32 residual stream
  Buffer xn_;           // [T][hidden] bf16 normed GEMM input (logit rows gathered at the end)
  Buffer tmp_;          // [T][hidden] f32 o_proj / down_proj output before the residual add
  Buffer q_;            // [T][num_heads · head_dim] f32 queries (RoPE applied in place)
  Buffer k_, v_;        // [T][num_kv_heads · head_dim] f32 new keys (RoPE applied) and values
  Buffer attn_;         // [T][num_heads · head_dim] bf16 attention output (o_proj input)
  Buffer gate_, up_;    // [T][intermediate] f32 SwiGLU inputs
  Buffer act_;          // [T][intermediate] bf16 SwiGLU output (down_proj input)
  Buffer logits_;       // [min(T, max_logit_rows)][vocab] f32, one lm_head pass
  Buffer partial_;      // f32, decode_attention_workspace_floats(max_sequences, num_heads, splits, head_dim): split-K partial softmax states of bf16 decode attention
  Buffer plan_host_, plan_dev_;  // [plan_capacity_] int: the forward's plan, pinned host and device
  size_t plan_capacity_ = 0;
  // --kv hack decode:
  Buffer pointers_host_, pointers_dev_;  // [pointers_capacity_] u64: per layer page, sink and open pointers
  size_t pointers_capacity_ = 0;
  Buffer hack_q_, hack_out_;             // [max_sequences][q_dim] f32: gathered q, attention out
  Buffer hack_workspace_;                // f32: max and sum of every state row (sequence × KV head × split × group), then a head_dim accumulator each (hack_decode_workspace_bytes), grown on demand
  HackDecodePlan hack_plan_;
  int hack_max_pages_ = 0;
  bool hack_rows_dense_ = true;

  // The current forward's plan.
  PlanOffsets off_;
  std::vector<DecodeEntry> dec_;
  std::vector<PlanItem> plan_items_;  // --cuda-attention plan: the step's chunks as the block manager plans them
  AttentionPlan attention_plan_;      // --cuda-attention plan: the step's plan (KvBlockManager::plan)
  CudaPlanRunner plan_runner_;        // --cuda-attention plan: runs attention_plan_ in every layer
  Buffer plan_out_;                   // --cuda-attention plan: f32 [max_batch_tokens][q_dim] attention output
  int n_rows_ = 0;                    // token rows of the current forward
  std::vector<PrefillEntry> pre_;
  std::vector<int> seq_ids_;
  int n_logit_rows_ = 0;
  int max_decode_pages_ = 0;
  int max_prefill_tokens_ = 0;
  // The activation observer and its host copies: [T][q_dim], [T][kv_dim] ×2 f32.
  ActivationObserverFn observer_;
  std::vector<float> observed_q_, observed_k_, observed_v_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Model& model, CudaPagedKvCache& kv, const CudaBackendOptions& options) {
  HACK_CHECK(cuda_device_available(), "--device cuda: no CUDA device is visible to this process");
  int n_devices = 0;
  HACK_CUDA_CHECK(cudaGetDeviceCount(&n_devices));
  HACK_CHECK(options.device >= 0 && options.device < n_devices, "CUDA device {} does not exist ({} present)",
             options.device, n_devices);
  HACK_CUDA_CHECK(cudaSetDevice(options.device));
  return std::make_unique<CudaBackend>(model, kv, options);
}

std::unique_ptr<CudaPagedKvCache> make_cuda_kv_cache(const ModelConfig& config, const CudaKvOptions& options) {
  HACK_CHECK(cuda_device_available(), "--device cuda: no CUDA device is visible to this process");
  return std::make_unique<CudaPagedKvCache>(
      kv_shape(config), options);
}

}  // namespace hack
