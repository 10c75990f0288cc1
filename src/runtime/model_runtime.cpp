#include "hack/runtime/model_runtime.h"

#include <algorithm>
#include <filesystem>

#include "hack/backend/cpu_engine.h"
#include "hack/core/error.h"
#include "hack/grammar/grammar_constraint.h"
#include "hack/model/fdc.h"
#include "hack/model/generation_config.h"
#include "hack/model/gguf_model.h"
#ifdef HACK_HAVE_CUDA
#include "hack/backend/cuda_backend.h"
#endif

namespace hack {

void add_model_flags(FlagSet& flags, ModelRuntimeConfig& c) {
  flags.add_string("model", &c.model,
                   "Hugging Face model directory (config.json, safetensors, tokenizer.json), or a llama/qwen2/qwen3 GGUF "
                   "file, read natively (its F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K tensors mapped, see --weights)");
  flags.add_string("weights", &c.weights,
                   "a GGUF's block-quantized matrices: native (kept as blocks and multiplied as llama.cpp does, int8 "
                   "activations per block) or dequant (converted to f32 at load: exact values, 4-8x the memory; for "
                   "equality tests; --device cuda dequantizes the blocks to bf16 as it uploads them)");
  flags.add_string("synthetic", &c.synthetic, "instead of --model: random weights of a named shape (benchmarks)");
  flags.add_string("device", &c.device,
                   "cpu or cuda (cuda: bf16 weights and a pre-allocated paged KV pool on GPU 0, pages of --hack-block "
                   "tokens, sized by --kv-capacity-mb or else max-model-len; --kv fp, or --kv hack with --hack-recent 0 "
                   "and no --kv-select; what the device cannot run yet is refused by name)");
  flags.add_string("cuda-attention", &c.cuda_attention,
                   "--device cuda: attention by the device's decode/prefill kernels (kernels, the measured path) or by "
                   "the CUDA runner of the same AttentionPlan the CPU runs (plan: also prompt chunks over a quantized "
                   "past; a correctness reference, not tuned)");
  flags.add_int("threads", &c.threads, "compute threads; 0 = all cores");
  flags.add_string("weights-memory", &c.weights_memory,
                   "where the CPU backend reads the weight matrices: huge-pages (copied into memory advised for "
                   "transparent huge pages: decode streams every weight per token and ran 1.4x faster so on the dev VM) "
                   "or mmap (the checkpoint's pages, zero-copy, shared with other processes)");
  flags.add_string("matmul-precision", &c.matmul_precision,
                   "arithmetic of the CPU backend's compute-bound matmuls (prefill, decode steps of 4 or more sequences) on bf16 weights: "
                   "fp32 (weights widened, sgemm; matches transformers' fp32 logits) or bf16 (activations rounded to "
                   "bf16, AVX-512 BF16 dot products: llama.cpp's arithmetic, ~2x the prefill GEMM rate; runs as fp32 "
                   "without AVX-512 BF16)");
  add_kv_flags(flags, c.kv);
  flags.add_int64("kv-capacity-mb", &c.kv_capacity_mb, "KV cache budget in MiB; 0 = unbounded");
  flags.add_int("prefill-chunk", &c.prefill_chunk, "prefill long prompts in chunks of this many tokens");
  flags.add_string("fdc", &c.fdc,
                   "FDC artifact from hack-calibrate --fdc (post-RoPE Q/K and low-rank V compression; every prefill "
                   "and decode node of a cluster must use the same); 'auto' = <model>/fdc.safetensors (FILE.gguf.fdc.safetensors "
                   "beside a GGUF); '' = off");
  flags.add_float("fdc-rate", &c.fdc_rate,
                  "with --fdc: choose the ranks at this singular-value removal rate instead of the artifact's; < 0 = "
                  "as stored");
  flags.add_int("max-model-len", &c.max_model_len,
                "longest prompt + completion in tokens; 0 = the model's max_position_embeddings (a larger value runs "
                "RoPE past the trained length)");
}

void add_served_name_flag(FlagSet& flags, ModelRuntimeConfig& c) {
  flags.add_string("served-model-name", &c.served_name, "model name reported to clients; default: the directory name");
}

KvCacheOptions kv_options_from(const ModelRuntimeConfig& c, int num_layers) {
  KvCacheOptions o = kv_options_from(c.kv, c.model, num_layers);
  HACK_CHECK(c.kv_capacity_mb >= 0, "--kv-capacity-mb must not be negative, got {}", c.kv_capacity_mb);
  o.capacity_bytes = static_cast<size_t>(c.kv_capacity_mb) << 20;
  return o;
}

EngineOptions engine_options_from(const ModelRuntimeConfig& c) {
  return EngineOptions{c.prefill_chunk, keep_options_from(c.kv), cpu::parse_matmul_precision(c.matmul_precision)};
}

namespace {

void load_model(const ModelRuntimeConfig& c, ModelRuntime& rt) {
  if (c.synthetic.empty()) {
    // --device cuda: the backend dequantizes a GGUF's blocks to bf16 as it uploads them
    // (DESIGN §2: the device dequantizes at load unless it has kernels), so the host keeps the
    // mapped blocks, not an f32 copy.
    rt.model = Model::load(c.model, parse_weight_format(c.weights));
    if (is_gguf_file(c.model) || std::filesystem::exists(std::filesystem::path(c.model) / "tokenizer.json")) {
      rt.tokenizer = Tokenizer::load(c.model);
      rt.constraints = std::make_shared<const grammar::GrammarConstraintFactory>(
          std::make_shared<const grammar::TokenVocabulary>(grammar::TokenVocabulary::from_tokenizer(*rt.tokenizer)));
    }
    rt.eos_ids = merge_eos_ids(rt.model.config.eos_token_ids, load_generation_config(c.model),
                               rt.tokenizer ? rt.tokenizer->eos_id() : -1);
  } else {
    rt.model = Model::synthetic(synthetic_model_config(c.synthetic), 42);
    rt.eos_ids = rt.model.config.eos_token_ids;
  }
  if (!c.fdc.empty()) {
    HACK_CHECK(c.synthetic.empty() || c.fdc != "auto", "--fdc auto needs --model (the artifact lies beside it)");
    const std::filesystem::path path =
        c.fdc == "auto" ? model_artifact_path(c.model, "fdc.safetensors") : std::filesystem::path(c.fdc);
    const FdcArtifact artifact = load_fdc_artifact(path);
    rt.model = apply_fdc(rt.model, artifact, c.fdc_rate >= 0 ? fdc_ranks_for_rate(artifact, c.fdc_rate)
                                                             : std::vector<FdcRanks>{});
  } else {
    HACK_CHECK(c.fdc_rate < 0, "--fdc-rate needs --fdc");
  }
  rt.name = !c.served_name.empty() ? c.served_name
            : !c.model.empty()     ? std::filesystem::path(c.model).lexically_normal().filename().string()
                                   : c.synthetic;
  if (rt.name.empty()) rt.name = std::filesystem::path(c.model).lexically_normal().parent_path().filename().string();
}

// --model FILE.gguf is served under the file's name (model/gguf_model.h); a missing --model path
// is named here rather than as a missing config.json.
ModelRuntimeConfig with_model_resolved(ModelRuntimeConfig c) {
  resolve_model_flags(c.model, c.served_name);
  return c;
}

void build_cuda(const ModelRuntimeConfig& c, int device_kv_tokens, int max_sequences, ModelRuntime& rt) {
#ifdef HACK_HAVE_CUDA
  HACK_CHECK(cuda_device_available(), "--device cuda: no CUDA device is visible to this process");
  HACK_CHECK(max_sequences > 0, "--device cuda: sequences per forward must be positive, got {}", max_sequences);
  CudaBackendOptions bo;
  bo.plan_attention = c.cuda_attention == "plan";
  // A decode step carries one token per sequence beside at most one prefill chunk.
  bo.max_batch_tokens = c.prefill_chunk + (max_sequences > 1 ? max_sequences : 0);
  bo.max_sequences = max_sequences;
  bo.max_logit_rows = std::max(bo.max_logit_rows, max_sequences);
  CudaKvOptions ko;
  ko.page_tokens = c.kv.hack_block;
  if (rt.kv_options.mode == KvMode::hack) ko.hack = rt.kv_options;  // CudaPagedKvCache refuses what it cannot run
  int tokens = device_kv_tokens > 0 ? device_kv_tokens : rt.max_model_len;
  if (device_kv_tokens <= 0 && rt.kv_options.capacity_bytes > 0) {
    // --kv-capacity-mb: as many pages as its bytes buy (a page's bf16 rows and HACK page in every layer).
    const size_t per_page = cuda_kv_page_bytes(kv_shape(rt.model), ko);
    tokens = static_cast<int>(std::min<size_t>(rt.kv_options.capacity_bytes / per_page, size_t{1} << 24)) *
             c.kv.hack_block;
    HACK_CHECK(tokens > 0, "--kv-capacity-mb {} holds no page of the device KV pool ({} bytes a page)",
               c.kv_capacity_mb, per_page);
  }
  // --kv hack puts the sinks in a page of their own: one page more per sequence.
  ko.num_pages = CudaPagedKvCache::pages_for(tokens, c.kv.hack_block) + (ko.hack ? max_sequences : 0);
  auto kv = make_cuda_kv_cache(rt.model.config, ko);
  rt.backend = make_cuda_backend(rt.model, *kv, bo);
  rt.kv = std::move(kv);
  rt.engine = std::make_unique<Engine>(*rt.backend, engine_options_from(c));
#else
  (void)c;
  (void)device_kv_tokens;
  (void)max_sequences;
  (void)rt;
  fail("--device cuda: this build has no CUDA (configure on a machine with nvcc, HACK_CUDA=AUTO|ON)");
#endif
}

}  // namespace

std::unique_ptr<ModelRuntime> load_model_runtime(const ModelRuntimeConfig& given, RuntimeParts parts) {
  HACK_CHECK(given.model.empty() != given.synthetic.empty(), "give exactly one of --model DIR or --synthetic NAME");
  const ModelRuntimeConfig c = with_model_resolved(given);
  HACK_CHECK(c.prefill_chunk > 0, "--prefill-chunk must be positive, got {}", c.prefill_chunk);
  HACK_CHECK(c.max_model_len >= 0, "--max-model-len must not be negative, got {}", c.max_model_len);
  auto rt = std::make_unique<ModelRuntime>();
  rt->device = parse_device(c.device);
  load_model(c, *rt);
  if (Model::wants_huge_pages(c.weights_memory) && rt->device == DeviceKind::cpu) rt->model.place_in_huge_pages();
  (void)cpu::parse_matmul_precision(c.matmul_precision);  // refused before a node binds its ports
  HACK_CHECK(c.cuda_attention == "kernels" || c.cuda_attention == "plan",
             "--cuda-attention must be kernels or plan, got '{}'", c.cuda_attention);
  rt->max_model_len = c.max_model_len > 0 ? c.max_model_len : rt->model.config.max_position_embeddings;
  rt->kv_options = kv_options_from(c, rt->model.config.num_layers);
  const KeepOptions keep = keep_options_from(c.kv);  // refused early, before a node binds its ports
  HACK_CHECK(!keep.enabled() || !rt->model.fdc, "--kv-keep-ratio / --kv-keep-tokens cannot be combined with --fdc yet");
  rt->pool = std::make_unique<ThreadPool>(c.threads);
  if (parts.engine) build_engine(c, *rt, 0, parts.device_max_sequences);
  return rt;
}

std::string kv_format(const ModelRuntime& rt) {
  // FdcRuntime::digest names the artifact and the ranks in use (a --fdc-rate re-cut included).
  const std::string fdc = rt.model.fdc ? rt.model.fdc->digest.substr(0, 16) : "none";
  // Page selection changes which pages decode reads, never their bytes, and prefill never
  // selects: a prefill node pairs with decode nodes of any selection. Static eviction
  // (--kv-keep-*) is not here either: it changes which tokens a prompt's KV holds, not the
  // format of their bytes; a decode node imports a pruned prompt whatever its own flags and
  // takes the position from the prompt's length.
  KvCacheOptions bytes = rt.kv_options;
  bytes.select = {};
  return fmt::format("{} fdc={}", describe(bytes), fdc);
}

void build_engine(const ModelRuntimeConfig& c, ModelRuntime& rt, int device_kv_tokens, int device_max_sequences) {
  HACK_CHECK(rt.engine == nullptr, "build_engine: the runtime already has an engine");
  if (rt.device == DeviceKind::cuda) {
    build_cuda(c, device_kv_tokens, device_max_sequences, rt);
    return;
  }
  CpuEngine e = make_cpu_engine(rt.model, *rt.pool, rt.kv_options, engine_options_from(c));
  rt.kv = std::move(e.kv);
  rt.backend = std::move(e.backend);
  rt.engine = std::move(e.engine);
}

EngineParts take_engine(ModelRuntime& rt) {
  HACK_CHECK(rt.engine != nullptr, "take_engine: the runtime has no engine (build_engine first)");
  EngineParts parts;
  parts.kv = std::move(rt.kv);
  parts.backend = std::move(rt.backend);
  parts.engine = std::move(rt.engine);
  return parts;
}

}  // namespace hack
