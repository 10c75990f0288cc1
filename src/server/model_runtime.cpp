#include "hack/server/model_runtime.h"

#include <filesystem>

#include "hack/core/error.h"
#include "hack/model/generation_config.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack::server {

void add_model_flags(FlagSet& flags, ModelRuntimeConfig& c) {
  flags.add_string("model", &c.model, "Hugging Face model directory (config.json, safetensors, tokenizer.json)");
  flags.add_string("synthetic", &c.synthetic, "instead of --model: random weights of a named shape (benchmarks)");
  flags.add_string("served-model-name", &c.served_name, "model name reported to clients; default: the directory name");
  flags.add_string("device", &c.device, "cpu (cuda serving is not wired into the daemons yet)");
  flags.add_int("threads", &c.threads, "compute threads; 0 = all cores");
  add_kv_flags(flags, c.kv);
  flags.add_int64("kv-capacity-mb", &c.kv_capacity_mb, "KV cache budget in MiB; 0 = unbounded");
  flags.add_int("prefill-chunk", &c.prefill_chunk, "prefill long prompts in chunks of this many tokens");
  flags.add_int("max-model-len", &c.max_model_len,
                "longest prompt + completion in tokens; 0 = the model's max_position_embeddings");
}

KvCacheOptions kv_options_from(const ModelRuntimeConfig& c, int num_layers) {
  KvCacheOptions o = hack::kv_options_from(c.kv, c.model, num_layers);
  HACK_CHECK(c.kv_capacity_mb >= 0, "--kv-capacity-mb must not be negative, got {}", c.kv_capacity_mb);
  o.capacity_bytes = static_cast<size_t>(c.kv_capacity_mb) << 20;
  return o;
}

std::unique_ptr<ModelRuntime> load_model_runtime(const ModelRuntimeConfig& c, bool with_engine) {
  HACK_CHECK(c.model.empty() != c.synthetic.empty(), "give exactly one of --model DIR or --synthetic NAME");
  HACK_CHECK(parse_device(c.device) == DeviceKind::cpu,
             "--device {}: the daemons serve on the CPU backend only so far (hack-run has --device cuda)", c.device);
  HACK_CHECK(c.prefill_chunk > 0, "--prefill-chunk must be positive, got {}", c.prefill_chunk);
  auto rt = std::make_unique<ModelRuntime>();
  if (c.synthetic.empty()) {
    rt->model = Model::load(c.model);
    int tokenizer_eos = -1;
    if (std::filesystem::exists(std::filesystem::path(c.model) / "tokenizer.json")) {
      tokenizer_eos = Tokenizer::load(c.model).eos_id();
    }
    rt->eos_ids = merge_eos_ids(rt->model.config.eos_token_ids, load_generation_config(c.model), tokenizer_eos);
  } else {
    rt->model = Model::synthetic(synthetic_model_config(c.synthetic), 42);
    rt->eos_ids = rt->model.config.eos_token_ids;
  }
  rt->name = !c.served_name.empty() ? c.served_name
             : !c.model.empty()     ? std::filesystem::path(c.model).lexically_normal().filename().string()
                                    : c.synthetic;
  if (rt->name.empty()) rt->name = std::filesystem::path(c.model).lexically_normal().parent_path().filename().string();
  HACK_CHECK(c.max_model_len >= 0, "--max-model-len must not be negative, got {}", c.max_model_len);
  rt->max_model_len = c.max_model_len > 0 ? c.max_model_len : rt->model.config.max_position_embeddings;
  rt->kv_options = kv_options_from(c, rt->model.config.num_layers);
  rt->pool = std::make_unique<ThreadPool>(c.threads);
  if (!with_engine) return rt;
  CpuEngine e = make_cpu_engine(rt->model, *rt->pool, rt->kv_options, EngineOptions{c.prefill_chunk});
  rt->kv = std::move(e.kv);
  rt->backend = std::move(e.backend);
  rt->engine = std::move(e.engine);
  return rt;
}

}  // namespace hack::server
