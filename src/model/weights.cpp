// Model::load: Hugging Face tensor names -> ModelWeights, every shape checked against the
// config. Matrices stay zero-copy views of the mapping in the checkpoint's dtype; norms and
// biases are small and converted to f32 copies.
#include "hack/model/weights.h"


#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <xxhash.h>

#include "hack/core/error.h"
#include "hack/core/huge_pages.h"
#include "hack/model/gguf_model.h"
#include "hack/model/gguf_weights.h"
#include "hack/model/safetensors.h"

namespace hack {

namespace {

std::string shape_string(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.dim(i));
  return s + "]";
}

class WeightReader {
 public:
  explicit WeightReader(const SafetensorsCheckpoint& ck) : ck_(ck) {}

  // [rows, cols] matrix in f32, f16 or bf16, zero-copy.
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols) {
    Tensor t = fetch(name, {rows, cols});
    const DType d = t.dtype();
    HACK_CHECK(d == DType::f32 || d == DType::f16 || d == DType::bf16,
               "tensor {} in {}: dtype {} is unsupported for weights (need f32, f16 or bf16)", name, file(name),
               dtype_name(d));
    return t;
  }

  // [n] vector converted to f32.
  Tensor vector(const std::string& name, int64_t n) {
    Tensor t = fetch(name, {n});
    const DType d = t.dtype();
    HACK_CHECK(d == DType::f32 || d == DType::f16 || d == DType::bf16,
               "tensor {} in {}: dtype {} is unsupported for weights (need f32, f16 or bf16)", name, file(name),
               dtype_name(d));
    Tensor out = Tensor::empty(DType::f32, {n});
    convert_to_f32(d, t.raw(), out.data<float>(), static_cast<size_t>(n));
    return out;
  }

 private:
  std::string file(const std::string& name) const { return ck_.file_of(name).path().string(); }

  Tensor fetch(const std::string& name, std::initializer_list<int64_t> expected) {
    Tensor t = ck_.tensor(name);
    bool ok = t.ndim() == static_cast<int>(expected.size());
    int i = 0;
    for (int64_t d : expected) ok = ok && t.dim(i++) == d;
    if (!ok) {
      std::string want = "[";
      i = 0;
      for (int64_t d : expected) want += (i++ ? ", " : "") + std::to_string(d);
      fail("tensor {} in {}: expected {}, got {}", name, file(name), want + "]", shape_string(t));
    }
    return t;
  }

  const SafetensorsCheckpoint& ck_;
};

}  // namespace

WeightFormat parse_weight_format(std::string_view name) {
  if (name == "native") return WeightFormat::native;
  if (name == "dequant") return WeightFormat::dequant;
  fail("--weights must be native or dequant, got '{}'", name);
}

Model Model::load(const std::filesystem::path& directory, WeightFormat format) {
  if (is_gguf_file(directory)) return load_gguf_model(GgufFile::open(directory), format);
  Model m;
  m.directory = directory;
  m.config = load_model_config(directory / "config.json");
  const ModelConfig& c = m.config;
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(directory);
  WeightReader r(ck);

  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ffn = c.intermediate_size, hd = c.head_dim;
  m.weights.embed = r.matrix("model.embed_tokens.weight", c.vocab_size, h);
  m.weights.layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = m.weights.layers[static_cast<size_t>(i)];
    l.attn_norm = r.vector(p + "input_layernorm.weight", h);
    l.wq = r.matrix(p + "self_attn.q_proj.weight", q, h);
    l.wk = r.matrix(p + "self_attn.k_proj.weight", kv, h);
    l.wv = r.matrix(p + "self_attn.v_proj.weight", kv, h);
    l.wo = r.matrix(p + "self_attn.o_proj.weight", h, q);
    if (c.attention_bias) {
      l.bq = r.vector(p + "self_attn.q_proj.bias", q);
      l.bk = r.vector(p + "self_attn.k_proj.bias", kv);
      l.bv = r.vector(p + "self_attn.v_proj.bias", kv);
    }
    if (c.attention_out_bias) l.bo = r.vector(p + "self_attn.o_proj.bias", h);
    if (c.qk_norm) {
      l.q_norm = r.vector(p + "self_attn.q_norm.weight", hd);
      l.k_norm = r.vector(p + "self_attn.k_norm.weight", hd);
    }
    l.ffn_norm = r.vector(p + "post_attention_layernorm.weight", h);
    l.w_gate = r.matrix(p + "mlp.gate_proj.weight", ffn, h);
    l.w_up = r.matrix(p + "mlp.up_proj.weight", ffn, h);
    l.w_down = r.matrix(p + "mlp.down_proj.weight", h, ffn);
  }
  m.weights.final_norm = r.vector("model.norm.weight", h);
  // Tied checkpoints may still carry lm_head.weight (a copy); HF ignores it, so do we.
  m.weights.lm_head = c.tie_word_embeddings ? m.weights.embed : r.matrix("lm_head.weight", c.vocab_size, h);
  return m;
}

size_t Model::weight_bytes() const {
  std::unordered_set<const void*> counted;
  size_t total = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined() && counted.insert(t.raw()).second) total += t.bytes();
  };
  add(weights.embed);
  for (const LayerWeights& l : weights.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm, &l.k_norm,
                            &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      add(*t);
    }
  }
  add(weights.final_norm);
  add(weights.lm_head);
  return total;
}

size_t Model::place_in_huge_pages() {
  std::vector<Tensor*> matrices{&weights.embed, &weights.lm_head};
  for (LayerWeights& l : weights.layers)
    for (Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) matrices.push_back(t);
  constexpr size_t kAlign = 64;
  struct Place {
    size_t offset, bytes;
  };
  std::unordered_map<const void*, Place> places;  // by source: a tied matrix is copied once
  size_t total = 0;
  for (const Tensor* t : matrices) {
    if (!t->defined() || places.contains(t->raw())) continue;
    places.emplace(t->raw(), Place{total, t->bytes()});
    total += (t->bytes() + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return 0;
  auto arena = std::make_shared<const HugePageMapping>(total, "the weights", /*populate=*/true);
  for (const auto& [src, place] : places) std::memcpy(arena->data() + place.offset, src, place.bytes);
  for (Tensor* t : matrices)
    if (t->defined())
      *t = Tensor::view(t->dtype(), t->shape(), t->ndim(), arena->data() + places.at(t->raw()).offset, arena);
  return total;
}

bool Model::wants_huge_pages(std::string_view weights_memory) {
  HACK_CHECK(weights_memory == "huge-pages" || weights_memory == "mmap",
             "--weights-memory must be huge-pages or mmap, got '{}'", weights_memory);
  return weights_memory == "huge-pages";
}

// xxh3 over every weight tensor (name order fixed by the struct), with its shape and dtype.
// The weights are the operator's, not an adversary's, so a fast hash suffices; the prefix
// cache's chain keys themselves are SHA-256.
std::string weights_digest(const Model& model) {
  XXH3_state_t* state = XXH3_createState();
  HACK_CHECK(state != nullptr && XXH3_64bits_reset(state) == XXH_OK, "weights digest: cannot initialise xxh3");
  auto add = [&](const Tensor& t) {
    if (!t.defined()) return;
    const std::string d = t.describe();
    XXH3_64bits_update(state, d.data(), d.size());
    XXH3_64bits_update(state, t.raw(), t.bytes());
  };
  const ModelWeights& w = model.weights;
  add(w.embed);
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.q_norm,
                            &l.k_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      add(*t);
  }
  add(w.final_norm);
  add(w.lm_head);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", h);
}

}  // namespace hack
