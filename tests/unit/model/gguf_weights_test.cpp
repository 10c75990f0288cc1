// Model::load of a GGUF file: a synthetic model written as llama.cpp's converter lays it out
// (llama.cpp names, dims fastest first, attn_q/attn_k rows interleaved per head for llama) by
// the test's own writer, loaded back: config from the metadata, every matrix equal to the
// source (un-permuted), block matrices kept as views of the mapping, dequant converting them.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "hack/core/error.h"
#include "hack/core/quant_blocks.h"
#include "hack/core/gguf_file.h"
#include "hack/model/gguf_weights.h"
#include "hack/model/weights.h"
#include "support/gguf_writer.h"
#include "model_test_util.h"

using namespace hack;
using Catch::Contains;
using test::GgufWriter;

namespace {

ModelConfig tiny(ModelArch arch, bool tied) {
  ModelConfig c = synthetic_model_config("tiny");
  c.arch = arch;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.tie_word_embeddings = tied;
  c.attention_bias = arch == ModelArch::qwen2;
  c.attention_out_bias = false;
  c.qk_norm = arch == ModelArch::qwen3;
  c.rope_theta = 100000.0f;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 512;
  return c;
}

std::vector<unsigned char> bytes_of_tensor(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  return {p, p + t.bytes()};
}

// convert_hf_to_gguf.py's LlamaModel.permute: w.reshape(n_head, 2, hd/2, in).swapaxes(1, 2):
// GGUF row h·hd + 2i + j holds HF row h·hd + j·hd/2 + i.
std::vector<unsigned char> permuted_rows(const Tensor& t, int64_t head_dim) {
  const size_t row = t.bytes() / static_cast<size_t>(t.dim(0));
  std::vector<unsigned char> out(t.bytes());
  const auto* src = static_cast<const unsigned char*>(t.raw());
  for (int64_t h = 0; h < t.dim(0) / head_dim; ++h)
    for (int64_t i = 0; i < head_dim / 2; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(out.data() + static_cast<size_t>(h * head_dim + 2 * i + j) * row,
                    src + static_cast<size_t>(h * head_dim + j * head_dim / 2 + i) * row, row);
  return out;
}

Tensor random_q8_0(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(DType::q8_0, {rows, cols});
  auto* b = static_cast<BlockQ8_0*>(t.raw());
  std::normal_distribution<float> d(0.0f, 0.001f);
  for (size_t i = 0; i < t.bytes() / sizeof(BlockQ8_0); ++i) {
    b[i].d = f32_to_f16(d(rng));
    for (int8_t& q : b[i].qs) q = static_cast<int8_t>(rng());
  }
  return t;
}

struct Written {
  Model source;  // the weights as the HF layout has them (wv and w_down as q8_0 blocks)
  GgufWriter writer;
};

Written write_model(ModelArch arch, bool tied) {
  const ModelConfig c = tiny(arch, tied);
  Written w{Model::synthetic(c, 7, DType::f32), GgufWriter{}};
  std::mt19937_64 rng(77);
  for (LayerWeights& l : w.source.weights.layers) {
    l.wv = random_q8_0(c.kv_dim(), c.hidden_size, rng);
    l.w_down = random_q8_0(c.hidden_size, c.intermediate_size, rng);
  }
  GgufWriter& g = w.writer;
  const std::string a = arch == ModelArch::qwen2 ? "qwen2" : arch == ModelArch::qwen3 ? "qwen3" : "llama";
  g.kv_string("general.architecture", a);
  g.kv_scalar(a + ".block_count", GgufWriter::u32, uint32_t(c.num_layers));
  g.kv_scalar(a + ".context_length", GgufWriter::u32, uint32_t(c.max_position_embeddings));
  g.kv_scalar(a + ".embedding_length", GgufWriter::u32, uint32_t(c.hidden_size));
  g.kv_scalar(a + ".feed_forward_length", GgufWriter::u32, uint32_t(c.intermediate_size));
  g.kv_scalar(a + ".attention.head_count", GgufWriter::u32, uint32_t(c.num_heads));
  g.kv_scalar(a + ".attention.head_count_kv", GgufWriter::u32, uint32_t(c.num_kv_heads));
  g.kv_scalar(a + ".rope.freq_base", GgufWriter::f32, c.rope_theta);
  g.kv_scalar(a + ".attention.layer_norm_rms_epsilon", GgufWriter::f32, c.rms_norm_eps);
  g.kv_scalar(a + ".rope.dimension_count", GgufWriter::u32, uint32_t(c.head_dim));
  g.kv_scalar("tokenizer.ggml.bos_token_id", GgufWriter::u32, uint32_t{1});
  g.kv_scalar("tokenizer.ggml.eos_token_id", GgufWriter::u32, uint32_t{2});
  auto matrix = [&](const std::string& name, const Tensor& t, bool permute = false) {
    const uint32_t type = ggml_type_of(t.dtype());
    g.tensor({name, {uint64_t(t.dim(1)), uint64_t(t.dim(0))}, type, permute ? permuted_rows(t, c.head_dim) : bytes_of_tensor(t)});
  };
  auto vector = [&](const std::string& name, const Tensor& t) { g.tensor({name, {uint64_t(t.dim(0))}, 0, bytes_of_tensor(t)}); };
  const ModelWeights& mw = w.source.weights;
  matrix("token_embd.weight", mw.embed);
  for (size_t i = 0; i < mw.layers.size(); ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const LayerWeights& l = mw.layers[i];
    vector(p + "attn_norm.weight", l.attn_norm);
    matrix(p + "attn_q.weight", l.wq, arch == ModelArch::llama);
    matrix(p + "attn_k.weight", l.wk, arch == ModelArch::llama);
    matrix(p + "attn_v.weight", l.wv);
    matrix(p + "attn_output.weight", l.wo);
    if (c.attention_bias) {
      vector(p + "attn_q.bias", l.bq);
      vector(p + "attn_k.bias", l.bk);
      vector(p + "attn_v.bias", l.bv);
    }
    if (c.qk_norm) {
      vector(p + "attn_q_norm.weight", l.q_norm);
      vector(p + "attn_k_norm.weight", l.k_norm);
    }
    vector(p + "ffn_norm.weight", l.ffn_norm);
    matrix(p + "ffn_gate.weight", l.w_gate);
    matrix(p + "ffn_up.weight", l.w_up);
    matrix(p + "ffn_down.weight", l.w_down);
  }
  vector("output_norm.weight", mw.final_norm);
  if (!tied) matrix("output.weight", mw.lm_head);
  return w;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.ndim() == b.ndim() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("gguf model: llama, qwen2 and qwen3 load with the config, weights and row order of the source",
          "[model][gguf]") {
  for (ModelArch arch : {ModelArch::llama, ModelArch::qwen2, ModelArch::qwen3}) {
    for (bool tied : {false, true}) {
      INFO(model_arch_name(arch) << (tied ? " tied" : ""));
      test::TempDir dir;
      const Written w = write_model(arch, tied);
      w.writer.write(dir / "m.gguf");
      const Model m = Model::load(dir / "m.gguf");
      const ModelConfig& c = m.config;
      const ModelConfig want = tiny(arch, tied);
      CHECK(c.arch == arch);
      CHECK(c.hidden_size == want.hidden_size);
      CHECK(c.intermediate_size == want.intermediate_size);
      CHECK(c.num_layers == want.num_layers);
      CHECK(c.num_heads == want.num_heads);
      CHECK(c.num_kv_heads == want.num_kv_heads);
      CHECK(c.head_dim == want.head_dim);
      CHECK(c.vocab_size == want.vocab_size);
      CHECK(c.rope_theta == want.rope_theta);
      CHECK(c.rms_norm_eps == want.rms_norm_eps);
      CHECK(c.tie_word_embeddings == tied);
      CHECK(c.attention_bias == (arch == ModelArch::qwen2));
      CHECK(c.qk_norm == (arch == ModelArch::qwen3));
      CHECK(c.bos_token_id == 1);
      CHECK(c.eos_token_ids == std::vector<int>{2});
      CHECK(m.directory == dir / "m.gguf");
      const ModelWeights& got = m.weights;
      const ModelWeights& src = w.source.weights;
      CHECK(same(got.embed, src.embed));
      CHECK(same(got.final_norm, src.final_norm));
      CHECK(same(got.lm_head, src.lm_head));
      if (tied) CHECK(got.lm_head.raw() == got.embed.raw());
      for (size_t i = 0; i < got.layers.size(); ++i) {
        const LayerWeights &a = got.layers[i], &b = src.layers[i];
        CHECK(same(a.wq, b.wq));
        CHECK(same(a.wk, b.wk));
        CHECK(same(a.wv, b.wv));
        CHECK(a.wv.dtype() == DType::q8_0);
        CHECK(a.wv.memory_kind() == MemoryKind::borrowed);  // a view of the mapping, not a copy
        CHECK(same(a.wo, b.wo));
        CHECK(same(a.w_gate, b.w_gate));
        CHECK(same(a.w_up, b.w_up));
        CHECK(same(a.w_down, b.w_down));
        CHECK(same(a.attn_norm, b.attn_norm));
        CHECK(same(a.ffn_norm, b.ffn_norm));
        if (arch == ModelArch::qwen2) {
          CHECK(same(a.bq, b.bq));
          CHECK(same(a.bk, b.bk));
          CHECK(same(a.bv, b.bv));
        }
        CHECK(a.bq.defined() == (arch == ModelArch::qwen2));
        if (arch == ModelArch::qwen3) {
          REQUIRE(a.q_norm.defined());
          CHECK(same(a.q_norm, b.q_norm));
          CHECK(same(a.k_norm, b.k_norm));
        }
      }
      // --weights dequant: the q8_0 matrices as f32, value for value.
      const Model d = Model::load(dir / "m.gguf", WeightFormat::dequant);
      const Tensor& wv = d.weights.layers[1].wv;
      REQUIRE(wv.dtype() == DType::f32);
      std::vector<float> ref(static_cast<size_t>(wv.numel()));
      dequantize_row(DType::q8_0, src.layers[1].wv.raw(), ref.data(), ref.size());
      CHECK(std::memcmp(ref.data(), wv.raw(), wv.bytes()) == 0);
      CHECK(same(d.weights.layers[0].wq, src.layers[0].wq));
    }
  }
}

TEST_CASE("gguf model: unsupported architectures, settings and missing or mis-shaped tensors are named",
          "[model][gguf]") {
  test::TempDir dir;
  auto error_of = [&](const GgufWriter& w) -> std::string {
    w.write(dir / "bad.gguf");
    try {
      Model::load(dir / "bad.gguf");
    } catch (const Error& e) {
      return e.what();
    }
    return "(loaded)";
  };
  {
    GgufWriter w;
    w.kv_string("general.architecture", "phi3");
    CHECK_THAT(error_of(w), Contains("architecture 'phi3' is not supported (llama, qwen2 and qwen3 are)"));
  }
  {
    Written w = write_model(ModelArch::llama, false);
    w.writer.kv_string("llama.rope.scaling.type", "yarn");
    CHECK_THAT(error_of(w.writer), Contains("rope scaling 'yarn' (llama.rope.scaling.type) is not supported"));
  }
  {
    Written w = write_model(ModelArch::llama, false);
    w.writer.kv_scalar("llama.expert_count", GgufWriter::u32, uint32_t{8});
    CHECK_THAT(error_of(w.writer), Contains("mixture-of-experts llama (llama.expert_count) is not supported"));
  }
  {  // a tensor the model does not use: llama3's rope frequencies, anything else
    Written w = write_model(ModelArch::llama, false);
    w.writer.tensor({"rope_freqs.weight", {8}, 0, std::vector<unsigned char>(32)});
    CHECK_THAT(error_of(w.writer), Contains("tensor rope_freqs.weight (llama3 rope scaling) is not supported"));
    Written x = write_model(ModelArch::llama, false);
    x.writer.tensor({"blk.0.attn_q_norm.weight", {16}, 0, std::vector<unsigned char>(64)});
    CHECK_THAT(error_of(x.writer), Contains("tensor blk.0.attn_q_norm.weight has no place in a llama model"));
  }
  {
    Written w = write_model(ModelArch::qwen2, true);
    GgufWriter g;
    g.kv_string("general.architecture", "llama");
    g.kv_scalar("llama.block_count", GgufWriter::u32, uint32_t{1});
    g.kv_scalar("llama.context_length", GgufWriter::u32, uint32_t{64});
    g.kv_scalar("llama.embedding_length", GgufWriter::u32, uint32_t{64});
    g.kv_scalar("llama.feed_forward_length", GgufWriter::u32, uint32_t{96});
    g.kv_scalar("llama.attention.head_count", GgufWriter::u32, uint32_t{4});
    g.kv_scalar("llama.attention.layer_norm_rms_epsilon", GgufWriter::f32, 1e-5f);
    g.tensor({"token_embd.weight", {64, 96}, 0, std::vector<unsigned char>(64 * 96 * 4)});
    CHECK_THAT(error_of(g), Contains("tensor blk.0.attn_norm.weight is missing"));
    GgufWriter s = g;
    s.tensor({"blk.0.attn_norm.weight", {32}, 0, std::vector<unsigned char>(128)});
    CHECK_THAT(error_of(s), Contains("tensor blk.0.attn_norm.weight: expected [64], got [32]"));
  }
}
