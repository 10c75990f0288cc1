// hack-run: the single-process reference. Prompt in, text out, on the same engine the
// daemons use (no network). Greedy output of the cluster must equal hack-run's: the model,
// device and KV flags are the nodes' own (runtime/model_runtime.h), defaults included.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hack/backend/engine.h"
#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/core/read_file.h"
#include "hack/grammar/grammar.h"
#include "hack/grammar/json_schema.h"
#include "hack/model/gguf_model.h"
#include "hack/runtime/model_runtime.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

struct RunConfig {
  hack::ModelRuntimeConfig runtime;  // --model, --device, --threads, --kv*, --hack-*, ...
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  std::string chat_file;
  std::string chat_template;
  std::string grammar_file;
  std::string json_schema_file;
  int max_tokens = 128;
  int min_tokens = 0;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int top_k = 40;
  float min_p = 0.05f;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int logprobs = -1;
  int prompt_logprobs = -1;
  bool ignore_eos = false;
  bool json = false;
  bool no_special = false;
  std::string log_level = "warn";
};

// False when --help was asked for.
bool parse_flags(int argc, char** argv, RunConfig& c) {
  hack::FlagSet flags("hack-run",
                      "Generates text from a prompt with one process (the reference for the distributed server).\n"
                      "Streams text to stdout; timing goes to stderr.",
                      "HACK_RUN");
  hack::add_model_flags(flags, c.runtime);
  flags.add_string("prompt", &c.prompt, "prompt text");
  flags.add_string("prompt-file", &c.prompt_file, "file holding the prompt text");
  flags.add_string("prompt-ids", &c.prompt_ids, "prompt as token ids, comma separated");
  flags.add_string("chat-file", &c.chat_file, "JSON list of chat messages, rendered with the model's chat template");
  flags.add_string("chat-template", &c.chat_template, "Jinja file overriding the model's chat template");
  flags.add_string("grammar", &c.grammar_file, "GBNF file the output must match (structured output)");
  flags.add_string("json-schema", &c.json_schema_file, "JSON Schema file the output must match (structured output)");
  flags.add_int("max-tokens", &c.max_tokens, "tokens to generate at most");
  flags.add_int("min-tokens", &c.min_tokens, "EOS and stop tokens are suppressed until this many are generated");
  flags.add_float("temperature", &c.temperature, "sampling temperature; 0 = greedy");
  flags.add_float("top-p", &c.top_p, "nucleus sampling mass; 1 = off");
  flags.add_int("top-k", &c.top_k, "sample from the k most likely tokens; 0 = off");
  flags.add_float("min-p", &c.min_p, "drop tokens below min-p × the top probability; 0 = off");
  flags.add_float("presence-penalty", &c.presence_penalty, "OpenAI presence penalty");
  flags.add_float("frequency-penalty", &c.frequency_penalty, "OpenAI frequency penalty");
  flags.add_float("repetition-penalty", &c.repetition_penalty, "HF repetition penalty; 1 = off");
  flags.add_optional_uint64("seed", &c.seed, "RNG seed for reproducible sampling");
  flags.add_int("logprobs", &c.logprobs, "with --json: report logprobs of this many top tokens (-1 = none)");
  flags.add_int("prompt-logprobs", &c.prompt_logprobs,
                "with --json: report the prompt's teacher-forced logprobs with this many top tokens (-1 = none); "
                "the reference for the server's echo + logprobs");
  flags.add_bool("ignore-eos", &c.ignore_eos, "keep generating after EOS");
  flags.add_bool("json", &c.json, "print one JSON object (ids, text, timing) instead of streaming text");
  flags.add_bool("no-special-tokens", &c.no_special, "do not add BOS/EOS when encoding a plain prompt");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
  if (!flags.parse(argc, argv)) return false;
  HACK_CHECK(c.runtime.model.empty() != c.runtime.synthetic.empty(), "give exactly one of --model DIR or --synthetic NAME");
  const int sources = !c.prompt.empty() + !c.prompt_file.empty() + !c.prompt_ids.empty() + !c.chat_file.empty();
  HACK_CHECK(sources == 1, "give exactly one of --prompt, --prompt-file, --prompt-ids, --chat-file");
  return true;
}

// The chat in --chat-file rendered with the model's template (or --chat-template).
std::string render_chat(const RunConfig& c, const hack::Tokenizer& tokenizer) {
  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(hack::read_file(c.chat_file, "chat file"));
  } catch (const nlohmann::json::parse_error& e) {
    hack::fail("{}: malformed JSON: {}", c.chat_file, e.what());
  }
  HACK_CHECK(messages.is_array() && !messages.empty(), "{}: expected a non-empty JSON list of messages", c.chat_file);
  const std::string model_dir = hack::resolve_model_path(c.runtime.model).string();  // a directory or a GGUF file
  const std::optional<std::string> source = !c.chat_template.empty()
                                                ? hack::read_file(c.chat_template, "chat template")
                                                : hack::find_chat_template(model_dir, /*has_tools=*/false);
  HACK_CHECK(source.has_value(), "{} has no chat template: pass --chat-template FILE", c.runtime.model);
  const hack::ChatTemplate tmpl =
      hack::ChatTemplate::parse(*source, c.chat_template.empty() ? model_dir : c.chat_template);
  hack::ChatRenderOptions ro;
  ro.add_generation_prompt = true;
  if (!tokenizer.bos_token().empty()) ro.bos_token = tokenizer.bos_token();
  if (!tokenizer.eos_token().empty()) ro.eos_token = tokenizer.eos_token();
  return tmpl.render(messages, ro);
}

// The prompt's token ids from whichever of --prompt-ids, --chat-file, --prompt(-file) was given.
std::vector<int> prompt_ids(const RunConfig& c, const std::optional<hack::Tokenizer>& tokenizer) {
  if (!c.prompt_ids.empty()) return hack::parse_id_list(c.prompt_ids, "prompt-ids");
  HACK_CHECK(tokenizer.has_value(), "{} has no tokenizer.json: use --prompt-ids",
             c.runtime.model.empty() ? "--synthetic " + c.runtime.synthetic : c.runtime.model);
  if (!c.chat_file.empty()) return tokenizer->encode(render_chat(c, *tokenizer), /*add_special=*/false);
  const std::string text = c.prompt_file.empty() ? c.prompt : hack::read_file(c.prompt_file, "prompt file");
  return tokenizer->encode(text, !c.no_special);
}

hack::SamplingParams sampling_params(const RunConfig& c) {
  hack::SamplingParams sp;
  sp.temperature = c.temperature;
  sp.top_p = c.top_p;
  sp.top_k = c.top_k;
  sp.min_p = c.min_p;
  sp.seed = c.seed;
  sp.presence_penalty = c.presence_penalty;
  sp.frequency_penalty = c.frequency_penalty;
  sp.repetition_penalty = c.repetition_penalty;
  sp.max_tokens = c.max_tokens;
  sp.min_tokens = c.min_tokens;
  sp.ignore_eos = c.ignore_eos;
  sp.logprobs = c.logprobs;
  HACK_CHECK(c.grammar_file.empty() || c.json_schema_file.empty(), "--grammar and --json-schema exclude each other");
  if (!c.grammar_file.empty()) {
    sp.grammar = hack::read_file(c.grammar_file, "--grammar");
    hack::grammar::compile_gbnf(sp.grammar);  // a bad grammar fails here, with its line and column
  } else if (!c.json_schema_file.empty()) {
    sp.grammar = hack::grammar::json_schema_to_gbnf(
        nlohmann::ordered_json::parse(hack::read_file(c.json_schema_file, "--json-schema")));
  }
  return sp;
}

nlohmann::json sample_json(const hack::SampleResult& s) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : s.top_logprobs) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
  return {{"token", s.token}, {"logprob", s.logprob}, {"top", top}};
}

// The prompt's logprobs as one prefill over all positions sees them (its own sequence, gone
// before generation starts): [null, {token, logprob, top}, ...].
nlohmann::json prompt_logprobs_json(hack::Engine& engine, const std::vector<int>& prompt, int top_k) {
  constexpr int kSeq = 1;
  std::vector<float> logits;
  engine.add_sequence(kSeq, static_cast<int>(prompt.size()));
  engine.prefill(kSeq, prompt, logits, /*all_logits=*/true);
  engine.remove_sequence(kSeq);
  nlohmann::json out = nlohmann::json::array({nullptr});
  for (const auto& s : hack::prompt_logprobs(logits, prompt, engine.config().vocab_size, top_k)) {
    out.push_back(sample_json(s));
  }
  return out;
}

void print_json(const RunConfig& c, const std::vector<int>& prompt, const hack::GenerationResult& r,
                const std::string& text, double load_s, double prefill_tps, double decode_tps,
                nlohmann::json prompt_lps) {
  const auto& st = r.stats;
  nlohmann::json out;
  out["prompt_ids"] = prompt;
  out["ids"] = r.tokens;
  out["text"] = text;
  out["finish_reason"] = hack::finish_reason_name(r.finish_reason);
  if (c.logprobs >= 0) {
    nlohmann::json lp = nlohmann::json::array();
    for (const auto& s : r.samples) lp.push_back(sample_json(s));
    out["logprobs"] = lp;
  }
  if (!prompt_lps.is_null()) out["prompt_logprobs"] = std::move(prompt_lps);
  out["timing"] = {{"load_s", load_s},       {"prefill_s", st.prefill_s},   {"ttft_s", st.first_token_s},
                   {"decode_s", st.decode_s}, {"prefill_tok_s", prefill_tps}, {"decode_tok_s", decode_tps}};
  std::printf("%s\n", out.dump().c_str());
}

int run(int argc, char** argv) {
  RunConfig c;
  if (!parse_flags(argc, argv, c)) return 0;
  hack::setup_logging(c.log_level);

  const auto t_load = std::chrono::steady_clock::now();
  // The engine is built once the prompt is known: the CUDA KV pool is sized for it.
  const std::unique_ptr<hack::ModelRuntime> rt = hack::load_model_runtime(c.runtime, hack::RuntimeParts{.engine = false});
  const std::optional<hack::Tokenizer>& tokenizer = rt->tokenizer;
  const std::vector<int> prompt = prompt_ids(c, tokenizer);
  HACK_CHECK(!prompt.empty(), "the prompt is empty");
  HACK_CHECK(c.max_tokens >= 0, "--max-tokens must not be negative, got {}", c.max_tokens);
  HACK_CHECK(static_cast<int>(prompt.size()) + c.max_tokens <= rt->max_model_len,
             "prompt ({} tokens) + --max-tokens {} exceeds the model's context of {} tokens", prompt.size(),
             c.max_tokens, rt->max_model_len);
  hack::build_engine(c.runtime, *rt, static_cast<int>(prompt.size()) + c.max_tokens);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  std::optional<hack::IncrementalDecoder> detok;
  if (tokenizer) detok.emplace(*tokenizer, /*skip_special_tokens=*/true);
  std::string text;
  hack::SamplingParams sp = sampling_params(c);
  HACK_CHECK(c.prompt_logprobs < 0 || c.json, "--prompt-logprobs needs --json");
  const nlohmann::json prompt_lps =
      c.prompt_logprobs >= 0 ? prompt_logprobs_json(*rt->engine, prompt, c.prompt_logprobs) : nlohmann::json();
  rt->engine->add_sequence(0, static_cast<int>(prompt.size()) + c.max_tokens);
  HACK_CHECK(sp.grammar.empty() || rt->constraints, "--grammar/--json-schema need the model's tokenizer.json");
  const hack::GenerationResult r = hack::generate(*rt->engine, 0, prompt, sp, rt->eos_ids, [&](const hack::SampleResult& s) {
    if (!detok) return true;
    const std::string piece = detok->step(s.token);
    text += piece;
    if (!c.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  }, rt->constraints.get());
  if (detok) {
    const std::string rest = detok->finish();
    text += rest;
    if (!c.json) std::fwrite(rest.data(), 1, rest.size(), stdout);
  }

  const auto& st = r.stats;
  const double prefill_tps = st.prompt_tokens / std::max(st.prefill_s, 1e-9);
  const double decode_tps = st.generated_tokens > 1 ? (st.generated_tokens - 1) / std::max(st.decode_s, 1e-9) : 0.0;
  if (c.json) {
    print_json(c, prompt, r, text, load_s, prefill_tps, decode_tps, prompt_lps);
  } else {
    std::printf("\n");
  }
  std::fprintf(stderr,
               "[hack-run] %d prompt tokens, %d generated (%s) | load %.2f s | prefill %.1f tok/s | TTFT %.1f ms | "
               "decode %.1f tok/s | %s, %d threads, isa %s, kv %s\n",
               st.prompt_tokens, st.generated_tokens, std::string(hack::finish_reason_name(r.finish_reason)).c_str(),
               load_s, prefill_tps, st.first_token_s * 1e3, decode_tps, rt->backend->name().c_str(), rt->pool->size(),
               hack::cpu_isa_name(hack::cpu_isa()), rt->kv->name().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-run: error: %s\n", e.what());
    return 1;
  }
}
