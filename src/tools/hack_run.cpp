// hack-run: the single-process reference. Prompt in, text out, on the same engine the
// daemons use (no network). Greedy output of the cluster must equal hack-run's.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hack/backend/backend.h"
#ifdef HACK_HAVE_CUDA
#include "hack/backend/cuda_backend.h"
#endif
#include "hack/backend/engine.h"
#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/kv/kv_flags.h"
#include "hack/kv/paged_kv_cache.h"
#include "hack/model/generation_config.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/chat_template.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

struct RunConfig {
  std::string model;
  std::string synthetic;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  std::string chat_file;
  std::string chat_template;
  std::string system;
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
  bool ignore_eos = false;
  int threads = 0;
  std::string device = "cpu";
  // The single-process reference defaults to the uncompressed f32 cache; every KV flag
  // is the daemons' own (kv/kv_flags.h), so `hack-run --kv hack ...` equals the cluster.
  hack::KvFlags kv = [] {
    hack::KvFlags f;
    f.kv = "fp";
    f.kv_dtype = "f32";
    return f;
  }();
  int prefill_chunk = 512;
  int max_model_len = 0;
  bool json = false;
  bool no_special = false;
  std::string log_level = "warn";
};

int run(int argc, char** argv) {
  RunConfig c;
  hack::FlagSet flags("hack-run",
                      "Generates text from a prompt with one process (the reference for the distributed server).\n"
                      "Streams text to stdout; timing goes to stderr.",
                      "HACK_RUN");
  flags.add_string("model", &c.model, "Hugging Face model directory (config.json, safetensors, tokenizer.json)");
  flags.add_string("synthetic", &c.synthetic, "instead of --model: random weights of a named shape (needs --prompt-ids)");
  flags.add_string("prompt", &c.prompt, "prompt text");
  flags.add_string("prompt-file", &c.prompt_file, "file holding the prompt text");
  flags.add_string("prompt-ids", &c.prompt_ids, "prompt as token ids, comma separated");
  flags.add_string("chat-file", &c.chat_file, "JSON list of chat messages, rendered with the model's chat template");
  flags.add_string("chat-template", &c.chat_template, "Jinja file overriding the model's chat template");
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
  flags.add_bool("ignore-eos", &c.ignore_eos, "keep generating after EOS");
  flags.add_int("threads", &c.threads, "worker threads; 0 = all cores");
  flags.add_string("device", &c.device,
                   "cpu or cuda (cuda: bf16 weights and a bf16 paged KV pool on GPU 0, --kv fp only, pages of "
                   "--hack-block tokens)");
  hack::add_kv_flags(flags, c.kv);
  flags.add_int("prefill-chunk", &c.prefill_chunk, "prefill long prompts in chunks of this many tokens");
  flags.add_int("max-model-len", &c.max_model_len,
                "longest prompt + completion in tokens; 0 = the model's max_position_embeddings (a larger value "
                "runs RoPE past the trained length)");
  flags.add_bool("json", &c.json, "print one JSON object (ids, text, timing) instead of streaming text");
  flags.add_bool("no-special-tokens", &c.no_special, "do not add BOS/EOS when encoding a plain prompt");
  flags.add_string("log-level", &c.log_level, "trace|debug|info|warn|error|off");
  if (!flags.parse(argc, argv)) return 0;
  hack::setup_logging(c.log_level);

  HACK_CHECK(c.model.empty() != c.synthetic.empty(), "give exactly one of --model DIR or --synthetic NAME");
  const int n_prompt_sources = !c.prompt.empty() + !c.prompt_file.empty() + !c.prompt_ids.empty() + !c.chat_file.empty();
  HACK_CHECK(n_prompt_sources == 1, "give exactly one of --prompt, --prompt-file, --prompt-ids, --chat-file");
  const hack::DeviceKind device = hack::parse_device(c.device);
#ifndef HACK_HAVE_CUDA
  HACK_CHECK(device == hack::DeviceKind::cpu,
             "--device cuda: this hack-run was built without CUDA (configure on a machine with nvcc, HACK_CUDA=AUTO|ON)");
#else
  if (device == hack::DeviceKind::cuda) {
    HACK_CHECK(hack::cuda_device_available(), "--device cuda: no CUDA device is visible to this process");
    HACK_CHECK(c.kv.kv == "fp", "--device cuda --kv {}: not yet (the CUDA HACK kernels are not wired in); use --kv fp",
               c.kv.kv);
  }
#endif

  const auto t_load = std::chrono::steady_clock::now();
  hack::Model model = c.synthetic.empty() ? hack::Model::load(c.model)
                                          : hack::Model::synthetic(hack::synthetic_model_config(c.synthetic), 42);
  std::optional<hack::Tokenizer> tokenizer;
  if (!c.model.empty()) tokenizer = hack::Tokenizer::load(c.model);

  std::vector<int> prompt;
  if (!c.prompt_ids.empty()) {
    prompt = hack::parse_id_list(c.prompt_ids, "prompt-ids");
  } else {
    HACK_CHECK(tokenizer.has_value(), "--synthetic models have no tokenizer: use --prompt-ids");
    std::string text;
    bool add_special = !c.no_special;
    if (!c.chat_file.empty()) {
      nlohmann::ordered_json messages;
      try {
        messages = nlohmann::ordered_json::parse(hack::read_file(c.chat_file, "chat file"));
      } catch (const nlohmann::json::parse_error& e) {
        hack::fail("{}: malformed JSON: {}", c.chat_file, e.what());
      }
      HACK_CHECK(messages.is_array() && !messages.empty(), "{}: expected a non-empty JSON list of messages",
                 c.chat_file);
      std::optional<std::string> source;
      if (!c.chat_template.empty()) {
        source = hack::read_file(c.chat_template, "chat template");
      } else {
        source = hack::find_chat_template(c.model, /*has_tools=*/false);
      }
      HACK_CHECK(source.has_value(), "{} has no chat template: pass --chat-template FILE", c.model);
      const hack::ChatTemplate tmpl =
          hack::ChatTemplate::parse(*source, c.chat_template.empty() ? c.model : c.chat_template);
      hack::ChatRenderOptions ro;
      ro.add_generation_prompt = true;
      if (!tokenizer->bos_token().empty()) ro.bos_token = tokenizer->bos_token();
      if (!tokenizer->eos_token().empty()) ro.eos_token = tokenizer->eos_token();
      text = tmpl.render(messages, ro);
      add_special = false;  // like apply_chat_template: the template writes BOS itself
    } else {
      text = c.prompt_file.empty() ? c.prompt : hack::read_file(c.prompt_file, "prompt file");
    }
    prompt = tokenizer->encode(text, add_special);
  }
  HACK_CHECK(!prompt.empty(), "the prompt is empty");
  HACK_CHECK(c.max_model_len >= 0, "--max-model-len must not be negative, got {}", c.max_model_len);
  const int max_ctx = c.max_model_len > 0 ? c.max_model_len : model.config.max_position_embeddings;
  HACK_CHECK(static_cast<int>(prompt.size()) + c.max_tokens <= max_ctx,
             "prompt ({} tokens) + --max-tokens {} exceeds the model's context of {} tokens", prompt.size(),
             c.max_tokens, max_ctx);
  hack::KvCacheOptions kv_options = hack::kv_options_from(c.kv, c.model, model.config.num_layers);
  kv_options.seed = c.seed.value_or(0);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  hack::ThreadPool pool(c.threads);
  const hack::ModelConfig& cfg = model.config;
  std::unique_ptr<hack::KvCache> kv;
  std::unique_ptr<hack::Backend> backend;
  if (device == hack::DeviceKind::cpu) {
    auto paged = hack::make_paged_kv_cache(
        hack::KvShape{cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.group_size()}, kv_options);
    backend = hack::make_cpu_backend(model, pool, *paged);
    kv = std::move(paged);
  } else {
#ifdef HACK_HAVE_CUDA
    HACK_CHECK(c.prefill_chunk > 0, "--prefill-chunk must be positive");
    hack::CudaBackendOptions bo;
    bo.max_batch_tokens = c.prefill_chunk;
    bo.max_sequences = 1;
    hack::CudaKvOptions ko;
    ko.page_tokens = c.kv.hack_block;
    ko.num_pages = hack::CudaPagedKvCache::pages_for(static_cast<int>(prompt.size()) + c.max_tokens, c.kv.hack_block);
    auto device_kv = hack::make_cuda_kv_cache(cfg, ko);
    backend = hack::make_cuda_backend(model, *device_kv, bo);
    kv = std::move(device_kv);
#endif
  }
  hack::Engine engine(*backend, hack::EngineOptions{c.prefill_chunk});

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

  std::vector<int> eos_ids = cfg.eos_token_ids;
  if (!c.model.empty()) {
    eos_ids = hack::merge_eos_ids(cfg.eos_token_ids, hack::load_generation_config(c.model),
                                  tokenizer ? tokenizer->eos_id() : -1);
  }
  std::optional<hack::IncrementalDecoder> detok;
  if (tokenizer) detok.emplace(*tokenizer, /*skip_special_tokens=*/true);
  std::string text;
  engine.add_sequence(0, static_cast<int>(prompt.size()) + c.max_tokens);
  hack::GenerationResult r =
      hack::generate(engine, 0, prompt, sp, eos_ids, [&](const hack::SampleResult& s) {
        if (!detok) return true;
        const std::string piece = detok->step(s.token);
        text += piece;
        if (!c.json) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
        return true;
      });
  if (detok) {
    const std::string rest = detok->finish();
    text += rest;
    if (!c.json) std::fwrite(rest.data(), 1, rest.size(), stdout);
  }

  const auto& st = r.stats;
  const double prefill_tps = st.prompt_tokens / std::max(st.prefill_s, 1e-9);
  const double decode_tps = st.generated_tokens > 1 ? (st.generated_tokens - 1) / std::max(st.decode_s, 1e-9) : 0.0;
  if (c.json) {
    nlohmann::json out;
    out["prompt_ids"] = prompt;
    out["ids"] = r.tokens;
    out["text"] = text;
    out["finish_reason"] = r.finish_reason == hack::FinishReason::stop ? "stop" : "length";
    if (c.logprobs >= 0) {
      nlohmann::json lp = nlohmann::json::array();
      for (const auto& s : r.samples) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& t : s.top_logprobs) top.push_back({{"token", t.token}, {"logprob", t.logprob}});
        lp.push_back({{"token", s.token}, {"logprob", s.logprob}, {"top", top}});
      }
      out["logprobs"] = lp;
    }
    out["timing"] = {{"load_s", load_s},          {"prefill_s", st.prefill_s},   {"ttft_s", st.first_token_s},
                     {"decode_s", st.decode_s},    {"prefill_tok_s", prefill_tps}, {"decode_tok_s", decode_tps}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\n");
  }
  std::fprintf(stderr,
               "[hack-run] %d prompt tokens, %d generated (%s) | load %.2f s | prefill %.1f tok/s | TTFT %.1f ms | "
               "decode %.1f tok/s | %s, %d threads, %s, kv %s\n",
               st.prompt_tokens, st.generated_tokens, r.finish_reason == hack::FinishReason::stop ? "stop" : "length",
               load_s, prefill_tps, st.first_token_s * 1e3, decode_tps, backend->name().c_str(), pool.size(), hack::cpu_isa_name(hack::cpu_isa()), kv->name().c_str());
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
