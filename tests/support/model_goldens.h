// Checks shared by the real-model golden tests (tests/e2e/smollm2_golden_test.cpp,
// tests/e2e/qwen/qwen_golden_test.cpp) against goldens.json files written from transformers
// (scripts/make_smollm2_goldens.py, scripts/make_qwen_goldens.py): logits at chosen ids,
// greedy chats with and without EOS, tokenizer ids and decodes, chat-template renders.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hack/backend/engine.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack::test {

inline nlohmann::ordered_json load_goldens(const std::filesystem::path& file) {
  std::ifstream in(file);
  REQUIRE(in.good());
  return nlohmann::ordered_json::parse(in);
}

/// Our last-position logits for `ids` (a fresh sequence `seq`, removed afterwards).
inline std::vector<float> prefill_logits(Engine& engine, int seq, const std::vector<int>& ids) {
  engine.add_sequence(seq, static_cast<int>(ids.size()) + 1);
  std::vector<float> logits;
  engine.prefill(seq, ids, logits);
  engine.remove_sequence(seq);
  return logits;
}

/// max |ours[ids[k]] - ref[k]| over k.
inline float max_abs_diff_at(const std::vector<float>& ours, const std::vector<int>& ids, const std::vector<float>& ref) {
  REQUIRE(ids.size() == ref.size());
  float d = 0;
  for (size_t k = 0; k < ids.size(); ++k) d = std::max(d, std::fabs(ours.at(static_cast<size_t>(ids[k])) - ref[k]));
  return d;
}

inline int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

/// log Σ exp(v), in double.
inline double logsumexp(const std::vector<float>& v) {
  const double m = *std::max_element(v.begin(), v.end());
  double s = 0;
  for (float x : v) s += std::exp(static_cast<double>(x) - m);
  return m + std::log(s);
}

/// Against the fp32-weight reference (no bf16 rounding of the weights): same top-1, and its
/// top-k logits within `tolerance` of ours.
inline void check_fp32_weight_top(const std::vector<float>& ours, const nlohmann::ordered_json& fp32, float tolerance) {
  CHECK(argmax(ours) == fp32["top_ids"][0].get<int>());
  const float d = max_abs_diff_at(ours, fp32["top_ids"].get<std::vector<int>>(),
                                  fp32["top_logits"].get<std::vector<float>>());
  INFO("top-" << fp32["top_ids"].size() << " vs fp32 weights: max|Δ| " << d);
  CHECK(d <= tolerance);
}

/// Each chat's `greedy` tokens (EOS suppressed, as HF min_new_tokens), then without the
/// suppression: the reply must stop at the EOS transformers' argmax chose (natural_end).
/// `seq` numbers the sequences used.
inline void check_greedy_chats(Engine& engine, const nlohmann::ordered_json& chats, int eos, int& seq) {
  const std::vector<int> eos_ids{eos};
  for (const auto& chat : chats) {
    INFO("chat " << chat["name"].get<std::string>());
    const std::vector<int> ids = chat["ids"].get<std::vector<int>>();
    const std::vector<int> greedy = chat["greedy"].get<std::vector<int>>();
    REQUIRE(greedy.size() == 32);
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = sp.min_tokens = static_cast<int>(greedy.size());
    engine.add_sequence(++seq, static_cast<int>(ids.size() + greedy.size()) + 1);
    GenerationResult out = generate(engine, seq, ids, sp, eos_ids);
    engine.remove_sequence(seq);
    CHECK(out.tokens == greedy);

    sp.min_tokens = 0;
    engine.add_sequence(++seq, static_cast<int>(ids.size() + greedy.size()) + 1);
    out = generate(engine, seq, ids, sp, eos_ids);
    engine.remove_sequence(seq);
    if (chat["natural_end"].is_null()) {
      CHECK(out.tokens == greedy);
      CHECK(out.finish_reason == FinishReason::length);
    } else {
      std::vector<int> expected(greedy.begin(), greedy.begin() + chat["natural_end"].get<int>());
      expected.push_back(eos);
      CHECK(out.tokens == expected);
      CHECK(out.finish_reason == FinishReason::stop);
    }
  }
}

/// Encode and decode of every tokenizer case, prompt and rendered chat; a case's decode is
/// its text, or its `decoded` where the tokenizer normalizes (Qwen2's NFC). Returns how many
/// were checked.
inline size_t check_tokenizer_goldens(const Tokenizer& tok, const nlohmann::ordered_json& g) {
  size_t n = 0;
  auto check = [&](const std::string& text, const std::vector<int>& ids, bool add_special,
                   const std::string& decoded) {
    INFO("text " << nlohmann::json(text).dump());
    CHECK(tok.encode(text, add_special) == ids);
    CHECK(tok.decode(ids, /*skip_special_tokens=*/false) == decoded);
    ++n;
  };
  auto check_text = [&](const std::string& text, const std::vector<int>& ids, bool add_special) {
    check(text, ids, add_special, text);
  };
  for (const auto& c : g["tokenizer_cases"]) {
    check(c["text"], c["ids"], true, c.value("decoded", c["text"].get<std::string>()));
  }
  for (const auto& p : g["prompts"]) check_text(p["text"], p["ids"], true);
  for (const char* section : {"chats", "renders"}) {
    if (!g.contains(section)) continue;
    for (const auto& c : g[section]) check_text(c["rendered"], c["ids"], false);
  }
  return n;
}

/// Our Jinja renders the model's chat template as transformers did, for every chat of the
/// given sections (with their `tools`, when a chat has them), generation prompt added.
inline void check_chat_renders(const std::filesystem::path& model_dir, const nlohmann::ordered_json& g) {
  const Tokenizer tok = Tokenizer::load(model_dir);
  size_t n = 0;
  for (const char* section : {"chats", "renders"}) {
    if (!g.contains(section)) continue;
    for (const auto& chat : g[section]) {
      INFO("chat " << chat["name"].get<std::string>());
      const bool has_tools = chat.contains("tools") && !chat["tools"].is_null();
      const std::optional<std::string> source = find_chat_template(model_dir, has_tools);
      REQUIRE(source.has_value());
      const ChatTemplate tmpl = ChatTemplate::parse(*source, model_dir.string());
      ChatRenderOptions ro;
      ro.add_generation_prompt = true;
      ro.bos_token = tok.bos_token();
      ro.eos_token = tok.eos_token();
      if (has_tools) ro.tools = chat["tools"];
      CHECK(tmpl.render(chat["messages"], ro) == chat["rendered"].get<std::string>());
      ++n;
    }
  }
  CHECK(n > 0);
}

}  // namespace hack::test
