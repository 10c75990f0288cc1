// GGUF tokenizer metadata (llama.cpp's tokenizer.ggml.* keys) -> Hugging Face tokenizer.json.
//
// tokenizer.ggml.model "gpt2" is byte-level BPE: tokens (id order), merges ("a b"), token
// types (llama.h llama_token_type: CONTROL and USER_DEFINED become added tokens, CONTROL ones
// special). tokenizer.ggml.pre names llama.cpp's pre-tokenizer (llama-vocab.cpp), mapped to
// the Hugging Face components that split text the same way:
//   gpt2    ByteLevel with GPT-2's regex;
//   smollm  Digits(individual_digits) then ByteLevel: SmolLM2's own tokenizer.json;
//   qwen2   NFC, then Qwen2's Split regex (single digits, letters with one leading
//           non-letter), then ByteLevel without its regex: Qwen2's own tokenizer.json.
// Special tokens: bos/eos/unk/pad ids; add_bos_token / add_eos_token become the
// TemplateProcessing post-processor. tokenizer.chat_template goes to the config's
// chat_template.
#include "src/tokenizer/gguf_tokenizer.h"

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "hack/core/error.h"

namespace hack::tok {

namespace {

using json = nlohmann::json;  // std::map objects: ordered_json looks keys up linearly (49k-token vocabularies)

// llama.h enum llama_token_type.
constexpr int64_t kTokenNormal = 1, kTokenControl = 3, kTokenUserDefined = 4;

constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json byte_level(bool use_regex, bool trim_offsets) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", trim_offsets}, {"use_regex", use_regex}};
}

// {normalizer, pre_tokenizer} of a tokenizer.ggml.pre value.
std::pair<json, json> pre_tokenizer(const std::string& pre, const std::string& source) {
  if (pre == "gpt2") return {nullptr, byte_level(true, true)};
  if (pre == "smollm")
    return {nullptr, {{"type", "Sequence"},
                      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true, true)}}}};
  if (pre == "qwen2")
    return {{{"type", "NFC"}},
            {{"type", "Sequence"},
             {"pretokenizers",
              {{{"type", "Split"}, {"pattern", {{"Regex", kQwen2Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
               byte_level(false, false)}}}};
  fail("{}: pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported (gpt2, qwen2 and smollm are)", source, pre);
}

std::string dump(const json& j, const std::string& source, const char* what) {
  try {
    return j.dump();
  } catch (const json::exception& e) {
    fail("{}: the {} is not valid UTF-8: {}", source, what, e.what());
  }
}

}  // namespace

GgufTokenizerJson gguf_tokenizer_json(const GgufFile& f) {
  const std::string& src = f.source();
  const std::string& model = f.at("tokenizer.ggml.model").as_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail("{}: tokenizer model '{}' (tokenizer.ggml.model) is not supported (only 'gpt2', byte-level BPE)", src, model);
  const GgufValue* pre_value = f.find("tokenizer.ggml.pre");
  const std::string pre = pre_value ? pre_value->as_string("tokenizer.ggml.pre") : "default";
  auto [normalizer, pre_tok] = pre_tokenizer(pre, src);
  if (const GgufValue* v = f.find("tokenizer.ggml.add_space_prefix"); v && v->as_bool("tokenizer.ggml.add_space_prefix"))
    fail("{}: tokenizer.ggml.add_space_prefix = true is not supported", src);

  const std::vector<std::string> tokens = f.at("tokenizer.ggml.tokens").as_strings("tokenizer.ggml.tokens");
  std::vector<int64_t> types(tokens.size(), kTokenNormal);
  if (const GgufValue* v = f.find("tokenizer.ggml.token_type")) {
    types = v->as_ints("tokenizer.ggml.token_type");
    HACK_CHECK(types.size() == tokens.size(), "{}: tokenizer.ggml.token_type has {} entries for {} tokens", src,
               types.size(), tokens.size());
  }
  json vocab = json::object();
  std::unordered_map<std::string_view, size_t> seen;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (const auto [it, fresh] = seen.emplace(tokens[i], i); !fresh)
      fail("{}: token '{}' appears twice (ids {} and {})", src, tokens[i], it->second, i);
    vocab[tokens[i]] = i;
  }
  json merges = json::array();
  for (const std::string& m : f.at("tokenizer.ggml.merges").as_strings("tokenizer.ggml.merges")) {
    const size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == m.size() || m.find(' ', space + 1) != std::string::npos)
      fail("{}: merge '{}' is not two tokens separated by one space", src, m);
    merges.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  json added = json::array();
  json added_decoder = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != kTokenControl && types[i] != kTokenUserDefined) continue;
    json a = {{"id", i},          {"content", tokens[i]},   {"single_word", false},
              {"lstrip", false},  {"rstrip", false},        {"normalized", false},
              {"special", types[i] == kTokenControl}};
    json d = a;
    d.erase("id");
    added_decoder[std::to_string(i)] = d;
    added.push_back(std::move(a));
  }
  // A special token's string, or null when the key is absent or out of range.
  auto token = [&](const char* key) -> json {
    const GgufValue* v = f.find(key);
    if (v == nullptr) return nullptr;
    const int64_t id = v->as_int(key);
    return id >= 0 && static_cast<size_t>(id) < tokens.size() ? json(tokens[static_cast<size_t>(id)]) : json(nullptr);
  };
  auto flag = [&](const char* key) {
    const GgufValue* v = f.find(key);
    return v != nullptr && v->as_bool(key);
  };
  const json bos = token("tokenizer.ggml.bos_token_id"), eos = token("tokenizer.ggml.eos_token_id");
  const bool add_bos = flag("tokenizer.ggml.add_bos_token") && !bos.is_null();
  const bool add_eos = flag("tokenizer.ggml.add_eos_token") && !eos.is_null();
  json single = json::array();
  json specials = json::object();
  if (add_bos) {
    single.push_back({{"SpecialToken", {{"id", bos}, {"type_id", 0}}}});
    specials[bos.get<std::string>()] = {{"id", bos}, {"ids", {vocab[bos.get<std::string>()]}}, {"tokens", {bos}}};
  }
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) {
    single.push_back({{"SpecialToken", {{"id", eos}, {"type_id", 0}}}});
    specials[eos.get<std::string>()] = {{"id", eos}, {"ids", {vocab[eos.get<std::string>()]}}, {"tokens", {eos}}};
  }
  json pair = single;
  pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});

  const json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", pre_tok},
      {"post_processor", {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}},
  };
  json config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"add_bos_token", add_bos},
      {"add_eos_token", add_eos},
      {"bos_token", bos},
      {"eos_token", eos},
      {"unk_token", token("tokenizer.ggml.unknown_token_id")},
      {"pad_token", token("tokenizer.ggml.padding_token_id")},
      {"clean_up_tokenization_spaces", false},
      {"added_tokens_decoder", added_decoder},
  };
  if (const GgufValue* t = f.find("tokenizer.chat_template"))
    config["chat_template"] = t->as_string("tokenizer.chat_template");
  return {dump(tokenizer, src, "vocabulary"), dump(config, src, "tokenizer configuration")};
}

}  // namespace hack::tok
