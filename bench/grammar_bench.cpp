// bench/grammar_bench: the cost of structured outputs on real generations. For each grammar
// (none, json_object, a nested JSON schema) it generates --runs completions of a chat prompt
// asking for JSON with SmolLM2 (temperature 1, seeds 1..runs) and reports the grammar mask's
// µs per token (mean, p50, p99; the first run — cold state table — and the warm runs apart)
// and decode tok/s, against the bound: mask ≤ 10 % of a decode step.
//
//   grammar_bench --model models/smollm2-135m-instruct [--threads 2] [--runs 5] [--max-tokens 96]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/backend/engine.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/grammar/grammar_constraint.h"
#include "hack/grammar/json_schema.h"
#include "hack/runtime/model_runtime.h"
#include "hack/tokenizer/chat_template.h"

namespace {

using Clock = std::chrono::steady_clock;

const char* kNestedSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0},
  "height_m":{"type":"number"},"pet":{"enum":["cat","dog","none"]},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
             "zip":{"type":"string","pattern":"[0-9]{5}"}},"required":["city"]},
  "hobbies":{"type":"array","items":{"type":"string"},"maxItems":4}},
  "required":["name","age","pet","address","hobbies"]})";

// Wraps the real constraint and times every mask_logits (the whole per-token grammar cost
// before sampling: mask lookup or trie walk, and writing −inf into the row).
class TimedConstraint final : public hack::LogitsConstraint {
 public:
  TimedConstraint(std::unique_ptr<hack::LogitsConstraint> inner, std::vector<double>& us) : inner_(std::move(inner)), us_(us) {}
  void mask_logits(std::span<float> logits) override {
    const auto t = Clock::now();
    inner_->mask_logits(logits);
    us_.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  void accept(int token) override { inner_->accept(token); }

 private:
  std::unique_ptr<hack::LogitsConstraint> inner_;
  std::vector<double>& us_;
};

class TimedFactory final : public hack::LogitsConstraintFactory {
 public:
  explicit TimedFactory(const hack::LogitsConstraintFactory& inner) : inner_(inner) {}
  std::unique_ptr<hack::LogitsConstraint> make(const hack::SamplingParams& p, std::span<const int> eos) const override {
    return std::make_unique<TimedConstraint>(inner_.make(p, eos), us);
  }
  mutable std::vector<double> us;

 private:
  const hack::LogitsConstraintFactory& inner_;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

double mean(const std::vector<double>& v) { return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()); }

}  // namespace

int main(int argc, char** argv) {
  hack::ModelRuntimeConfig rc;
  int runs = 5, max_tokens = 96;
  hack::FlagSet flags("grammar_bench", "Grammar mask µs per token and decode tok/s with and without structured outputs.",
                      "HACK_GRAMMAR_BENCH");
  hack::add_model_flags(flags, rc);
  flags.add_int("runs", &runs, "generations per grammar (seeds 1..runs)");
  flags.add_int("max-tokens", &max_tokens, "tokens per generation at most");
  try {
    if (!flags.parse(argc, argv)) return 0;
    const std::unique_ptr<hack::ModelRuntime> rt = hack::load_model_runtime(rc, hack::RuntimeParts{.engine = false});
    HACK_CHECK(rt->tokenizer && rt->constraints, "--model needs a tokenizer.json");
    const auto source = hack::find_chat_template(rc.model, false);
    HACK_CHECK(source.has_value(), "the model has no chat template");
    const hack::ChatTemplate tmpl = hack::ChatTemplate::parse(*source, rc.model);
    hack::ChatRenderOptions ro;
    ro.add_generation_prompt = true;
    const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
        R"([{"role":"user","content":"Describe a person as JSON with name, age, height_m, pet, address (street, city, zip) and hobbies."}])");
    const std::vector<int> prompt = rt->tokenizer->encode(tmpl.render(messages, ro), false);
    hack::build_engine(rc, *rt, static_cast<int>(prompt.size()) + max_tokens);

    struct Case {
      const char* name;
      std::string gbnf;
    };
    const std::vector<Case> cases = {{"none", ""},
                                     {"json_object", hack::grammar::json_object_gbnf()},
                                     {"nested_schema", hack::grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(kNestedSchema))}};
    std::printf("grammar_bench: %s, %d threads, prompt %zu tokens, %d runs x <= %d tokens, temperature 1\n",
                rc.model.c_str(), rc.threads, prompt.size(), runs, max_tokens);
    std::printf("%-14s %8s %9s %10s %10s %10s %10s %10s %9s\n", "grammar", "tokens", "tok/s", "step_ms", "cold_mean",
                "warm_mean", "warm_p50", "warm_p99", "mask/step");
    for (const Case& c : cases) {
      TimedFactory timed(*rt->constraints);
      std::vector<double> cold, warm;
      int tokens = 0;
      double decode_s = 0;
      for (int run = 1; run <= runs; ++run) {
        hack::SamplingParams sp;
        sp.temperature = 1.0f;
        sp.seed = static_cast<uint64_t>(run);
        sp.max_tokens = max_tokens;
        sp.grammar = c.gbnf;
        timed.us.clear();
        rt->engine->add_sequence(0, static_cast<int>(prompt.size()) + max_tokens);
        const hack::GenerationResult r = hack::generate(*rt->engine, 0, prompt, sp, rt->eos_ids, nullptr, &timed);
        rt->engine->remove_sequence(0);
        tokens += r.stats.generated_tokens - 1;
        decode_s += r.stats.decode_s;
        (run == 1 ? cold : warm).insert((run == 1 ? cold : warm).end(), timed.us.begin(), timed.us.end());
        if (run == 1 && !c.gbnf.empty()) {
          std::string text = rt->tokenizer->decode(r.tokens, true);
          std::printf("  sample (%s): %s\n", c.name, text.substr(0, 160).c_str());
        }
      }
      const double tps = tokens / std::max(decode_s, 1e-9);
      const double step_ms = 1e3 / tps;
      std::printf("%-14s %8d %9.1f %10.2f %10.1f %10.1f %10.1f %10.1f %8.1f%%\n", c.name, tokens, tps, step_ms, mean(cold),
                  mean(warm), percentile(warm, 0.5), percentile(warm, 0.99),
                  c.gbnf.empty() ? 0.0 : 100.0 * mean(warm) / (step_ms * 1e3));
    }
    std::printf("bound: grammar mask <= 10%% of a decode step (mask/step column; cold/warm/p50/p99 in µs)\n");
  } catch (const hack::Error& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
