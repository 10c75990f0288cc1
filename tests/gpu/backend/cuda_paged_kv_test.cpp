// The device KV as a PagedKv (kv/paged_kv.h), what the nodes serve from on --device cuda:
// pages exported by one device import into the other and give that device's logits, and the
// interface's exact-token, page and reservation operations agree with the CPU cache's.
//
// Logits tolerance after an import: the imported pages are the same bytes on both sides, so
// what differs is the new token's q, K and V (bf16 GEMM inputs on the device, f32 GEMV inputs
// on the CPU) and, on 8-bit codes, the INT8 requantization of q and P that follows from them.
// That is the drift the k8v8 decode comparison of cuda_backend_test measured (H100, worst
// 0.045 of max|logit|), so the same 8e-2 applies; a wrong page, count or offset moves logits
// by O(1) relative.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/cuda_backend.h"
#include "hack/core/error.h"
#include "hack/kv/kv_stream.h"
#include "support/test_support.h"

using namespace hack;

namespace {

constexpr int kPageTokens = 16;
constexpr double kImportRelTol = 8e-2;
constexpr int kSeq = 0;

KvCacheOptions hack_k8v8() {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.block_tokens = kPageTokens;
  o.sinks = 4;
  o.k_bits = 8;
  o.v_bits = 8;
  return o;
}

// A model's weights rounded to bf16 (what the device holds), so both sides compute on the
// same numbers.
Model bf16_model(const Model& m) {
  Model r = m;
  auto round = [](const Tensor& t) {
    if (!t.defined() || t.dtype() == DType::bf16) return t;
    const size_t n = static_cast<size_t>(t.numel());
    std::vector<float> f(n);
    convert_to_f32(t.dtype(), t.raw(), f.data(), n);
    Tensor out = Tensor::empty(DType::bf16, t.shape(), t.ndim());
    for (size_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_bf16(f[i]);
    return out;
  };
  const bool tied = m.weights.lm_head.defined() && m.weights.lm_head.raw() == m.weights.embed.raw();
  r.weights.embed = round(m.weights.embed);
  r.weights.lm_head = tied ? r.weights.embed : round(m.weights.lm_head);
  for (LayerWeights& w : r.weights.layers)
    for (Tensor* t : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) *t = round(*t);
  return r;
}

struct Device {
  Device(const Model& model, const KvCacheOptions& options) {
    CudaKvOptions ko;
    ko.page_tokens = kPageTokens;
    ko.num_pages = 64;
    ko.hack = options;
    kv = make_cuda_kv_cache(model.config, ko);
    CudaBackendOptions bo;
    bo.max_batch_tokens = 256;
    bo.max_sequences = 4;
    backend = make_cuda_backend(model, *kv, bo);
    engine = std::make_unique<Engine>(*backend, EngineOptions{256});
  }
  std::unique_ptr<CudaPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

struct Message {
  int layer;
  KvMessageKind kind;
  std::vector<std::byte> payload;
};

// Everything of `seq` that a prefill node would send, every layer, in order.
std::vector<Message> export_all(PagedKv& kv, int seq) {
  std::vector<Message> out;
  KvExportCursor cursor;
  for (int l = 0; l < kv.shape().num_layers; ++l)
    export_layer(kv, seq, l, /*final=*/true, cursor, [&](KvMessageKind kind, std::span<const std::byte> p) {
      out.push_back({l, kind, {p.begin(), p.end()}});
    });
  return out;
}

// Imports `messages` into `seq` of `engine`'s KV as a decode node does (add, import, adopt).
void import_all(Engine& engine, PagedKv& kv, int seq, int max_tokens, const std::vector<Message>& messages) {
  engine.add_sequence(seq, max_tokens);
  for (const Message& m : messages) import_message(kv, seq, m.layer, m.kind, m.payload);
  engine.adopt_sequence(seq);
}

void require_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  float diff = 0, mag = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    mag = std::max(mag, std::fabs(want[i]));
  }
  INFO("max|Δ| " << diff << " max|logit| " << mag);
  REQUIRE(diff <= kImportRelTol * mag);
}

// Four greedy steps of sequence kSeq on both engines from `token`, the cpu's choice fed to both:
// each step's logits within kImportRelTol.
void decode_both(Engine& cpu, Engine& gpu, int token) {
  for (int step = 0; step < 4; ++step) {
    std::vector<float> a, b;
    cpu.decode(std::span<const int>(&kSeq, 1), std::span<const int>(&token, 1), a);
    gpu.decode(std::span<const int>(&kSeq, 1), std::span<const int>(&token, 1), b);
    INFO("decode step " << step);
    require_close(b, a);
    token = static_cast<int>(std::max_element(a.begin(), a.end()) - a.begin());
  }
}

// tiny-qwen3's KV, hack k8v8, on the device (a pool of `pages`) and on the cpu, empty.
struct TwinCaches {
  explicit TwinCaches(int pages)
      : model(Model::load(test::fixtures_dir() / "models" / "tiny-qwen3")),
        shape(kv_shape(model)),
        dev(make_cuda_kv_cache(model.config, CudaKvOptions{kPageTokens, pages, 0, hack_k8v8()})),
        cpu(make_paged_kv_cache(shape, hack_k8v8())),
        token_floats(static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim)) {}
  // n tokens of K = sin(fk · i), V = cos(fv · i) over their elements i: [n][token_floats].
  void tokens(int n, float fk, float fv, std::vector<float>& k, std::vector<float>& v) const {
    k.resize(static_cast<size_t>(n) * token_floats);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = std::sin(fk * static_cast<float>(i));
      v[i] = std::cos(fv * static_cast<float>(i));
    }
  }
  Model model;
  KvShape shape;
  std::unique_ptr<CudaPagedKvCache> dev;
  std::unique_ptr<CpuPagedKvCache> cpu;
  size_t token_floats;
};

std::vector<int> prompt_of(int n, int vocab) {
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 97 + 13) % vocab);
  return ids;
}

}  // namespace

TEST_CASE("paged kv: cpu-exported pages imported into the device give the cpu's logits, and the reverse",
          "[gpu][paged-kv]") {
  const Model model = bf16_model(Model::load(test::fixtures_dir() / "models" / "tiny-qwen3"));
  const int vocab = model.config.vocab_size;
  const KvCacheOptions options = hack_k8v8();
  ThreadPool pool(2);
  CpuEngine cpu = make_cpu_engine(model, pool, options);
  Device gpu(model, options);
  const std::vector<int> prompt = prompt_of(3 * kPageTokens + 7, vocab);  // sinks, 3 pages, an open block
  const int max_tokens = static_cast<int>(prompt.size()) + 8;
  std::vector<float> logits;

  SECTION("cpu prefill -> device decode") {
    cpu.engine->add_sequence(0, max_tokens);
    cpu.engine->prefill(0, prompt, logits);
    const std::vector<Message> messages = export_all(*cpu.kv, 0);
    REQUIRE(std::count_if(messages.begin(), messages.end(),
                          [](const Message& m) { return m.kind == KvMessageKind::hack_page; }) ==
            3 * model.config.num_layers);
    import_all(*gpu.engine, *gpu.kv, 0, max_tokens, messages);
    for (int l = 0; l < model.config.num_layers; ++l) {
      REQUIRE(gpu.kv->hack_page_count(0, l) == 3);
      std::vector<std::byte> page(gpu.kv->hack_layout(l).page_bytes());
      for (int b = 0; b < 3; ++b) {  // the device holds the cpu's bytes
        gpu.kv->read_hack_page(0, l, b, page.data());
        const std::span<const std::byte> want = cpu.kv->hack_page(0, l, b);
        REQUIRE(std::equal(page.begin(), page.end(), want.begin(), want.end()));
      }
    }
    decode_both(*cpu.engine, *gpu.engine, 5);
  }

  SECTION("device prefill -> cpu decode") {
    gpu.engine->add_sequence(0, max_tokens);
    gpu.engine->prefill(0, prompt, logits);
    const std::vector<Message> messages = export_all(*gpu.kv, 0);
    import_all(*cpu.engine, *cpu.kv, 0, max_tokens, messages);
    decode_both(*cpu.engine, *gpu.engine, 7);
  }
}

TEST_CASE("paged kv: the device's exact tokens, peeked pages and reservations agree with the cpu cache",
          "[gpu][paged-kv]") {
  TwinCaches twins(16);
  // References, not a structured binding: lambdas below capture them (clang < 16 cannot).
  const KvShape& shape = twins.shape;
  auto& dev = twins.dev;
  auto& cpu = twins.cpu;
  const size_t token_floats = twins.token_floats;
  const int n = 2 * kPageTokens + 4 + 5;  // sinks, two full blocks, five open tokens
  std::vector<float> k, v;
  twins.tokens(n, 0.37f, 0.11f, k, v);
  for (PagedKv* kv : {static_cast<PagedKv*>(dev.get()), static_cast<PagedKv*>(cpu.get())}) {
    kv->add_sequence(0, n + 3);
    kv->begin_prefill(0);
    for (int l = 0; l < shape.num_layers; ++l) kv->append(l, 0, 0, n, k.data(), v.data());
  }
  // Exact tokens come back as the bf16 bits the cpu keeps.
  const size_t elems = static_cast<size_t>(n) * token_floats;
  std::vector<uint16_t> dk(elems), dv(elems), ck(elems), cv(elems);
  dev->copy_exact_tokens(0, 1, 0, n, reinterpret_cast<std::byte*>(dk.data()), reinterpret_cast<std::byte*>(dv.data()));
  cpu->copy_exact_tokens(0, 1, 0, n, reinterpret_cast<std::byte*>(ck.data()), reinterpret_cast<std::byte*>(cv.data()));
  REQUIRE(dk == ck);
  REQUIRE(dv == cv);
  // A pending block peeked (quantized into scratch) equals the cpu's peek, and stays pending.
  REQUIRE(dev->pending_block_count(0, 0) == 2);
  std::vector<std::byte> a(cpu->hack_layout(0).page_bytes()), b(a.size());
  for (int block = 0; block < 2; ++block) {
    dev->peek_block_page(0, 0, block, a.data());
    cpu->peek_block_page(0, 0, block, b.data());
    REQUIRE(a == b);
  }
  REQUIRE(dev->pending_block_count(0, 0) == 2);
  // Closing one layer closes that layer only; its pages then read back as the cpu's.
  dev->close_pending_blocks(0, 0);
  cpu->close_pending_blocks(0, 0);
  REQUIRE(dev->hack_page_count(0, 0) == 2);
  REQUIRE(dev->pending_block_count(0, 1) == 2);
  dev->read_hack_page(0, 0, 1, a.data());
  cpu->read_hack_page(0, 0, 1, b.data());
  REQUIRE(a == b);
  REQUIRE_THROWS_WITH(dev->copy_exact_tokens(0, 0, 4, 1, reinterpret_cast<std::byte*>(dk.data()), nullptr),
                      Catch::Contains("quantized block"));
  // Closing with a known page (a prefix hit's) copies it: here layer 1's block 1 is given the
  // bytes of layer 1's block 1 with one code byte changed, so the copy is visible; block 0 is
  // quantized. A page of the wrong position is refused first, nothing closed.
  {
    std::vector<std::byte> given(b.size());
    cpu->peek_block_page(0, 1, 1, given.data());
    given.back() ^= std::byte{0x5a};
    const std::vector<std::byte> block0 = [&] {
      std::vector<std::byte> p(b.size());
      cpu->peek_block_page(0, 1, 0, p.data());
      return p;
    }();
    const KnownPages wrong = [&](int, int block) { return block == 1 ? block0.data() : nullptr; };
    REQUIRE_THROWS_AS(dev->close_pending_blocks(0, 1, wrong), Error);
    REQUIRE(dev->pending_block_count(0, 1) == 2);
    const KnownPages known = [&](int, int block) { return block == 1 ? given.data() : nullptr; };
    dev->close_pending_blocks(0, 1, known);
    REQUIRE(dev->hack_page_count(0, 1) == 2);
    dev->read_hack_page(0, 1, 1, a.data());
    REQUIRE(a == given);
    dev->read_hack_page(0, 1, 0, a.data());
    REQUIRE(a == block0);
    cpu->close_pending_blocks(0, 1);
  }
  // Reservations count page units; extending takes pages while they last.
  REQUIRE(dev->stats().bytes_reserved == dev->sequence_bytes(n + 3));
  REQUIRE(dev->try_extend_sequence(0, 8 * kPageTokens));
  REQUIRE(dev->max_tokens(0) == 8 * kPageTokens);
  REQUIRE_FALSE(dev->try_extend_sequence(0, 64 * kPageTokens));
  REQUIRE(dev->max_tokens(0) == 8 * kPageTokens);
  // Evicting after a block closed is refused, as on the cpu.
  REQUIRE_THROWS_WITH(dev->keep_tokens(0, 0, {0, 1}), Catch::Contains("before any block is quantized"));
  REQUIRE_THROWS(dev->set_append_observer(99, nullptr));  // an unknown sequence
  // A page for the wrong position is refused before anything is stored.
  dev->add_sequence(1, 3 * kPageTokens);
  const std::span<const std::byte> page1 = cpu->hack_page(0, 0, 1);
  REQUIRE_THROWS(dev->append_hack_page(0, 1, page1.data(), page1.size()));  // no sinks yet
  REQUIRE(dev->length(1, 0) == 0);
}

TEST_CASE("paged kv: keep_tokens on the device keeps the cpu cache's tokens, and closes the cpu's pages after",
          "[gpu][paged-kv][keep]") {
  // Static eviction inside a prefill (--kv-keep-*): the same kept positions give the same
  // exact tokens in order on both devices, and the blocks closed at end_prefill are the same
  // page bytes.
  TwinCaches twins(32);
  // References, not a structured binding: lambdas below capture them (clang < 16 cannot).
  const KvShape& shape = twins.shape;
  auto& dev = twins.dev;
  auto& cpu = twins.cpu;
  const size_t token_floats = twins.token_floats;
  const int n = 5 * kPageTokens + 7;
  std::vector<float> k, v;
  twins.tokens(n, 0.29f, 0.13f, k, v);
  // Sinks, every third token after them, and the last ten: 4 + 23 + 10 kept (two full blocks).
  std::vector<int> kept = {0, 1, 2, 3};
  for (int p = 4; p < n - 10; p += 3) kept.push_back(p);
  for (int p = n - 10; p < n; ++p) kept.push_back(p);
  for (PagedKv* kv : {static_cast<PagedKv*>(dev.get()), static_cast<PagedKv*>(cpu.get())}) {
    kv->add_sequence(0, n + 8);
    kv->begin_prefill(0);
    for (int l = 0; l < shape.num_layers; ++l) {
      kv->append(l, 0, 0, n, k.data(), v.data());
      kv->keep_tokens(0, l, kept);
    }
  }
  const int m = static_cast<int>(kept.size());
  const size_t elems = static_cast<size_t>(m) * token_floats;
  for (int l = 0; l < shape.num_layers; ++l) {
    INFO("layer " << l);
    REQUIRE(dev->length(0, l) == m);
    std::vector<uint16_t> dk(elems), dv(elems), ck(elems), cv(elems);
    dev->copy_exact_tokens(0, l, 0, m, reinterpret_cast<std::byte*>(dk.data()), reinterpret_cast<std::byte*>(dv.data()));
    cpu->copy_exact_tokens(0, l, 0, m, reinterpret_cast<std::byte*>(ck.data()), reinterpret_cast<std::byte*>(cv.data()));
    REQUIRE(dk == ck);
    REQUIRE(dv == cv);
    // Token i of the kept layer is the prompt's token kept[i] (bf16 of the given f32).
    for (int i : {0, 4, m - 1})
      for (size_t e = 0; e < token_floats; e += 7)
        REQUIRE(dk[static_cast<size_t>(i) * token_floats + e] ==
                f32_to_bf16(k[static_cast<size_t>(kept[static_cast<size_t>(i)]) * token_floats + e]));
  }
  dev->end_prefill(0);
  cpu->end_prefill(0);
  const int closed = (m - 4) / kPageTokens;
  std::vector<std::byte> a(cpu->hack_layout(0).page_bytes()), b(a.size());
  for (int l = 0; l < shape.num_layers; ++l) {
    REQUIRE(dev->hack_page_count(0, l) == closed);
    for (int p = 0; p < closed; ++p) {
      dev->read_hack_page(0, l, p, a.data());
      cpu->read_hack_page(0, l, p, b.data());
      REQUIRE(a == b);
    }
  }
  // Kept positions out of order or past the layer are refused before anything changes.
  dev->add_sequence(1, 40);
  dev->begin_prefill(1);
  dev->append(0, 1, 0, 20, k.data(), v.data());
  REQUIRE_THROWS_WITH(dev->keep_tokens(1, 0, {3, 2}), Catch::Contains("out of order"));
  REQUIRE_THROWS_WITH(dev->keep_tokens(1, 0, {0, 20}), Catch::Contains("not among its 20 tokens"));
  REQUIRE(dev->length(1, 0) == 20);
}
