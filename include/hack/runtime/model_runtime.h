/// @file model_runtime.h
/// @brief One options struct for loading a model and everything it runs on — weights, a
/// thread pool, the KV cache, the backend built over it, the engine — used by hack-run,
/// hack-prefill and hack-decode alike, so the single-process reference and the cluster
/// read the same flags with the same defaults and cannot disagree.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/flags.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_flags.h"
#include "hack/kv/paged_kv.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/tokenizer.h"

namespace hack {

struct ModelRuntimeConfig {
  std::string model;               ///< Hugging Face model directory or GGUF file
  std::string synthetic;           ///< instead of model: random weights of a named shape
  std::string served_name;         ///< name reported to clients; default: the directory's name (nodes)
  std::string device = "cpu";      ///< cpu | cuda
  std::string cuda_attention = "kernels";  ///< --device cuda: kernels | plan (CudaBackendOptions::plan_attention)
  int threads = 0;                 ///< 0 = all cores
  std::string weights_memory = "huge-pages";  ///< huge-pages | mmap (Model::place_in_huge_pages)
  std::string weights = "native";             ///< native | dequant (a GGUF's blocks kept, or f32; WeightFormat)
  std::string matmul_precision = "fp32";      ///< fp32 | bf16 (cpu::MatmulPrecision)
  KvFlags kv;                      ///< --kv, --hack-*, --kv-dtype (kv/kv_flags.h)
  int64_t kv_capacity_mb = 0;      ///< KV byte budget in MiB; 0 = unbounded
  int prefill_chunk = 512;
  int max_model_len = 0;           ///< prompt + completion limit; 0 = max_position_embeddings
  std::string fdc;                 ///< FDC artifact (model/fdc.h); "auto" = <model>/fdc.safetensors; "" = none
  float fdc_rate = -1;            ///< re-derive the artifact's ranks at this removal rate; < 0 = as stored
};

/// Registers the model, device, thread and KV flags on `flags` (hack-run, hack-prefill and
/// hack-decode all call it; the nodes add --served-model-name with add_served_name_flag).
void add_model_flags(FlagSet& flags, ModelRuntimeConfig& config);
void add_served_name_flag(FlagSet& flags, ModelRuntimeConfig& config);

/// What to build beyond the weights, the tokenizer and the pool.
struct RuntimeParts {
  bool engine = true;  ///< the cache, the backend and the engine (build_engine)
  /// --device cuda: sequences one forward may carry (a decode node's --max-batch; the device
  /// backend sizes its plan and workspace for it). The CPU backend has no such bound.
  int device_max_sequences = 1;
};

struct ModelRuntime {
  Model model;
  std::string name;                ///< served model name
  std::vector<int> eos_ids;
  int max_model_len = 0;
  std::optional<Tokenizer> tokenizer;  ///< the model directory's tokenizer.json, when it has one
  /// Grammar constraints (structured outputs) over the tokenizer's vocabulary, with the
  /// node's compiled-grammar cache; null without a tokenizer (grammar requests then fail).
  std::shared_ptr<const LogitsConstraintFactory> constraints;
  DeviceKind device = DeviceKind::cpu;
  KvCacheOptions kv_options;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<PagedKv> kv;       ///< the backend's paged KV (host or device pages)
  std::unique_ptr<Backend> backend;  ///< built over kv
  std::unique_ptr<Engine> engine;
};

/// Loads and builds everything; throws hack::Error naming the bad flag or file.
std::unique_ptr<ModelRuntime> load_model_runtime(const ModelRuntimeConfig& config, RuntimeParts parts = {});

/// Builds the cache, the backend over it and the engine of a runtime loaded without them.
/// device_kv_tokens: --device cuda, tokens the device KV pool holds (0 = --kv-capacity-mb's
/// worth when set, else max_model_len); device_max_sequences: RuntimeParts's.
void build_engine(const ModelRuntimeConfig& config, ModelRuntime& runtime, int device_kv_tokens = 0,
                  int device_max_sequences = 1);
/// Moves the runtime's KV, backend and engine out (for a node's worker, which owns them).
EngineParts take_engine(ModelRuntime& runtime);

/// What the bytes of a node's KV depend on beyond the model: the cache options and the FDC
/// artifact and ranks ("hack k2v2 block=64 sinks=4 nearest fdc=none"). Prefill and decode
/// nodes must agree on it to exchange KV; they report it in /health and the router pairs
/// only nodes that agree.
std::string kv_format(const ModelRuntime& runtime);

/// KvCacheOptions for the `--kv*` / `--hack-*` flags of a model of `num_layers` layers
/// (its directory's bit allocation applies, see kv/kv_flags.h) and --kv-capacity-mb.
KvCacheOptions kv_options_from(const ModelRuntimeConfig& config, int num_layers);
/// The engine options the flags give: prefill chunk, static eviction, matmul precision.
EngineOptions engine_options_from(const ModelRuntimeConfig& config);

}  // namespace hack
