/// @file cpu_engine.h
/// @brief The CPU backend over a CpuPagedKvCache and an engine over both, in one call: what a
/// tool, a bench or a test needs to run a model over one CPU cache configuration (the nodes
/// get theirs from runtime/model_runtime.h, on either device).
#pragma once

#include <memory>

#include "hack/backend/backend.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/backend/cpu_paged_kv_cache.h"

namespace hack {

/// A paged KV cache, the CPU backend over it and an engine over both. Destroyed engine
/// first, then backend, then cache.
struct CpuEngine {
  std::unique_ptr<CpuPagedKvCache> kv;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};
/// The cache is shaped for `model`; `model` and `pool` must outlive the result.
CpuEngine make_cpu_engine(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options,
                          EngineOptions options = {});
/// The same, typed as a node's worker takes it.
EngineParts make_cpu_engine_parts(const Model& model, ThreadPool& pool, const KvCacheOptions& kv_options,
                                  EngineOptions options = {});

}  // namespace hack
