// A GGUF file as a Model: metadata -> the config.json it stands for (parsed by
// parse_model_config, so both sources get the same checks and defaults), llama.cpp's tensor
// names -> ModelWeights, every shape checked against the config.
#include "hack/model/gguf_weights.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>

#include "hack/core/error.h"

namespace hack {

namespace {

struct GgufArch {
  std::string_view name, hf_class;
  bool permuted_qk;  // convert_hf_to_gguf.py interleaved each head's RoPE halves in attn_q/attn_k
  bool biases;       // attn_{q,k,v}.bias
};
// qwen3's per-head q/k norms (attn_q_norm, attn_k_norm) follow from its config (qk_norm).
constexpr GgufArch kArchs[] = {
    {"llama", "LlamaForCausalLM", true, false},
    {"qwen2", "Qwen2ForCausalLM", false, true},
    {"qwen3", "Qwen3ForCausalLM", false, false},
};

const GgufArch& arch_of(const GgufFile& f) {
  const std::string& name = f.at("general.architecture").as_string("general.architecture");
  for (const GgufArch& a : kArchs)
    if (a.name == name) return a;
  fail("{}: architecture '{}' is not supported (llama, qwen2 and qwen3 are)", f.source(), name);
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  const GgufArch& arch = arch_of(f);
  const std::string p = std::string(arch.name) + ".";
  auto key = [&](std::string_view k) { return p + std::string(k); };
  auto integer = [&](std::string_view k) { return f.at(key(k)).as_int(key(k)); };
  auto integer_or = [&](std::string_view k, int64_t d) {
    const GgufValue* v = f.find(key(k));
    return v ? v->as_int(key(k)) : d;
  };
  const int64_t hidden = integer("embedding_length");
  const int64_t heads = integer("attention.head_count");
  HACK_CHECK(heads > 0, "{}: {} must be positive", f.source(), key("attention.head_count"));
  const int64_t kv_heads = integer_or("attention.head_count_kv", heads);
  const int64_t head_dim = integer_or("attention.key_length", hidden / heads);
  if (integer_or("attention.value_length", head_dim) != head_dim)
    fail("{}: {} differs from attention.key_length: not supported", f.source(), key("attention.value_length"));
  if (const int64_t rope = integer_or("rope.dimension_count", head_dim); rope != head_dim)
    fail("{}: partial rotary embedding ({} {} != head_dim {}) is not supported", f.source(), key("rope.dimension_count"),
         rope, head_dim);
  if (const GgufValue* s = f.find(key("rope.scaling.type"))) {
    const std::string& type = s->as_string(key("rope.scaling.type"));
    if (type != "none") fail("{}: rope scaling '{}' ({}) is not supported", f.source(), type, key("rope.scaling.type"));
  }
  if (integer_or("expert_count", 0) != 0)
    fail("{}: mixture-of-experts {} ({}) is not supported", f.source(), arch.name, key("expert_count"));

  // The vocabulary the model computes logits over is the embedding's rows (a tokenizer may
  // have fewer tokens than a padded embedding); <arch>.vocab_size, when given, must agree.
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  HACK_CHECK(embd != nullptr && embd->ne.size() == 2, "{}: tensor token_embd.weight is missing or not 2-D", f.source());
  const int64_t vocab = integer_or("vocab_size", static_cast<int64_t>(embd->ne[1]));
  nlohmann::json c = {
      {"architectures", {std::string(arch.hf_class)}},
      {"model_type", std::string(arch.name)},
      {"hidden_size", hidden},
      {"intermediate_size", integer("feed_forward_length")},
      {"num_hidden_layers", integer("block_count")},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", f.at(key("attention.layer_norm_rms_epsilon")).as_float(key("attention.layer_norm_rms_epsilon"))},
      {"rope_theta", f.find(key("rope.freq_base")) ? f.at(key("rope.freq_base")).as_float(key("rope.freq_base")) : 10000.0},
      {"max_position_embeddings", integer("context_length")},
      {"vocab_size", vocab},
      {"tie_word_embeddings", f.find_tensor("output.weight") == nullptr},
      {"torch_dtype", "bfloat16"},
  };
  for (const auto& [gguf_key, hf_key] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                         std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"}}) {
    if (const GgufValue* v = f.find(gguf_key)) c[hf_key] = v->as_int(gguf_key);
  }
  if (arch.name == "llama") {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
  }
  if (arch.name == "qwen3") c["attention_bias"] = false;  // llama.cpp's qwen3 has no attention biases
  return parse_model_config(c.dump(), f.source());
}

namespace {

class GgufWeightReader {
 public:
  GgufWeightReader(const GgufFile& f, WeightFormat format) : f_(f), format_(format) {}

  // Every tensor of the file was read: one the model has no place for is refused by name
  // (silently ignoring it could mean computing a different model).
  void check_all_used(std::string_view arch) const {
    for (const GgufTensorInfo& t : f_.tensors()) {
      if (used_.contains(t.name)) continue;
      if (t.name == "rope_freqs.weight")
        fail("{}: tensor rope_freqs.weight (llama3 rope scaling) is not supported", f_.source());
      fail("{}: tensor {} has no place in a {} model", f_.source(), t.name, arch);
    }
  }

  // [rows, cols]: a view of the mapping (dequant: a block type converted to f32).
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols) {
    Tensor t = fetch(name, rows, cols);
    const DType d = t.dtype();
    HACK_CHECK(d == DType::f32 || d == DType::f16 || d == DType::bf16 || dtype_is_quantized(d),
               "{}: tensor {}: type {} is unsupported for weights", f_.source(), name, dtype_name(d));
    if (format_ == WeightFormat::dequant && dtype_is_quantized(d)) {
      Tensor out = Tensor::empty(DType::f32, {rows, cols});
      convert_to_f32(d, t.raw(), out.data<float>(), static_cast<size_t>(rows * cols));
      return out;
    }
    return t;
  }

  // The same with llama.cpp's RoPE interleave undone: rows copied into the HF order.
  Tensor rope_matrix(const std::string& name, int64_t rows, int64_t cols, int64_t head_dim) {
    const Tensor src = matrix(name, rows, cols);
    Tensor out = Tensor::empty(src.dtype(), {rows, cols});
    const size_t row_bytes = dtype_bytes(src.dtype(), static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(r) * row_bytes,
                  static_cast<const char*>(src.raw()) + static_cast<size_t>(gguf_rope_row(r, head_dim)) * row_bytes,
                  row_bytes);
    return out;
  }

  // [n] converted to f32.
  Tensor vector(const std::string& name, int64_t n) {
    const GgufTensorInfo* info = f_.find_tensor(name);
    HACK_CHECK(info != nullptr, "{}: tensor {} is missing", f_.source(), name);
    used_.insert(name);
    HACK_CHECK(info->ne.size() == 1 && info->ne[0] == static_cast<uint64_t>(n), "{}: tensor {}: expected [{}], got {}",
               f_.source(), name, n, shape_of(*info));
    const Tensor t = f_.tensor(*info);
    const DType d = t.dtype();
    HACK_CHECK(d == DType::f32 || d == DType::f16 || d == DType::bf16, "{}: tensor {}: type {} is unsupported for a vector",
               f_.source(), name, dtype_name(d));
    Tensor out = Tensor::empty(DType::f32, {n});
    convert_to_f32(d, t.raw(), out.data<float>(), static_cast<size_t>(n));
    return out;
  }

 private:
  static std::string shape_of(const GgufTensorInfo& t) {
    std::string s = "[";
    for (size_t i = t.ne.size(); i-- > 0;) s += std::to_string(t.ne[i]) + (i ? ", " : "");
    return s + "]";
  }

  Tensor fetch(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo* info = f_.find_tensor(name);
    HACK_CHECK(info != nullptr, "{}: tensor {} is missing", f_.source(), name);
    used_.insert(name);
    HACK_CHECK(info->ne.size() == 2 && info->ne[0] == static_cast<uint64_t>(cols) &&
                   info->ne[1] == static_cast<uint64_t>(rows),
               "{}: tensor {}: expected [{}, {}], got {}", f_.source(), name, rows, cols, shape_of(*info));
    return f_.tensor(*info);
  }

  const GgufFile& f_;
  WeightFormat format_;
  std::unordered_set<std::string> used_;
};

}  // namespace

Model load_gguf_model(const GgufFile& f, WeightFormat format) {
  const GgufArch& arch = arch_of(f);
  Model m;
  m.directory = f.source();
  m.config = gguf_model_config(f);
  const ModelConfig& c = m.config;
  GgufWeightReader r(f, format);
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ffn = c.intermediate_size, hd = c.head_dim;
  m.weights.embed = r.matrix("token_embd.weight", c.vocab_size, h);
  m.weights.layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = m.weights.layers[static_cast<size_t>(i)];
    l.attn_norm = r.vector(p + "attn_norm.weight", h);
    if (arch.permuted_qk) {
      l.wq = r.rope_matrix(p + "attn_q.weight", q, h, hd);
      l.wk = r.rope_matrix(p + "attn_k.weight", kv, h, hd);
    } else {
      l.wq = r.matrix(p + "attn_q.weight", q, h);
      l.wk = r.matrix(p + "attn_k.weight", kv, h);
    }
    l.wv = r.matrix(p + "attn_v.weight", kv, h);
    l.wo = r.matrix(p + "attn_output.weight", h, q);
    if (c.attention_bias) {
      l.bq = r.vector(p + "attn_q.bias", q);
      l.bk = r.vector(p + "attn_k.bias", kv);
      l.bv = r.vector(p + "attn_v.bias", kv);
    }
    if (c.qk_norm) {
      l.q_norm = r.vector(p + "attn_q_norm.weight", hd);
      l.k_norm = r.vector(p + "attn_k_norm.weight", hd);
    }
    l.ffn_norm = r.vector(p + "ffn_norm.weight", h);
    l.w_gate = r.matrix(p + "ffn_gate.weight", ffn, h);
    l.w_up = r.matrix(p + "ffn_up.weight", ffn, h);
    l.w_down = r.matrix(p + "ffn_down.weight", h, ffn);
  }
  m.weights.final_norm = r.vector("output_norm.weight", h);
  m.weights.lm_head = c.tie_word_embeddings ? m.weights.embed : r.matrix("output.weight", c.vocab_size, h);
  r.check_all_used(arch.name);
  return m;
}

}  // namespace hack
