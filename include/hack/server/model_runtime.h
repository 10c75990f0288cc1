/// @file model_runtime.h
/// @brief What every node builds from its model flags: the weights, a thread pool, the
/// backend, the paged KV cache and the engine over them, plus the ids that end generation.
/// The flags are shared by hack-prefill and hack-decode (and named as hack-run's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/flags.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_flags.h"
#include "hack/kv/paged_kv_cache.h"
#include "hack/model/weights.h"

namespace hack::server {

struct ModelRuntimeConfig {
  std::string model;               ///< Hugging Face model directory
  std::string synthetic;           ///< instead of model: random weights of a named shape
  std::string served_name;         ///< name reported to clients; default: the directory's name
  std::string device = "cpu";
  int threads = 0;                 ///< 0 = all cores
  KvFlags kv;                      ///< --kv, --hack-*, --kv-dtype (kv/kv_flags.h)
  int64_t kv_capacity_mb = 0;      ///< KV byte budget in MiB; 0 = unbounded
  int prefill_chunk = 512;
  int max_model_len = 0;           ///< prompt + completion limit; 0 = max_position_embeddings
};

/// Registers the model/KV flags on `flags` (names as hack-run's).
void add_model_flags(FlagSet& flags, ModelRuntimeConfig& config);

struct ModelRuntime {
  Model model;
  std::string name;                ///< served model name
  std::vector<int> eos_ids;
  int max_model_len = 0;
  KvCacheOptions kv_options;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<PagedKvCache> kv;
  std::unique_ptr<Backend> backend;  ///< the CPU backend over kv
  std::unique_ptr<Engine> engine;
};

/// Loads and builds everything; throws hack::Error naming the bad flag or file. Without
/// `with_engine` the cache, backend and engine are left out (a prefill node's worker builds
/// its own).
std::unique_ptr<ModelRuntime> load_model_runtime(const ModelRuntimeConfig& config, bool with_engine = true);

/// KvCacheOptions for the `--kv*` / `--hack-*` flags of a model of `num_layers` layers
/// (its directory's bit allocation applies, see kv/kv_flags.h).
KvCacheOptions kv_options_from(const ModelRuntimeConfig& config, int num_layers);

}  // namespace hack::server
