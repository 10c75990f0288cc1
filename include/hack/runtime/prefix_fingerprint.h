/// @file prefix_fingerprint.h
/// @brief The fingerprint of prefix-cache blocks (kv/block_key.h) for a loaded model: what a
/// block's bytes depend on, hashed into the root of every chain, so a prefill node and a decode
/// node (and any process serving the same model the same way) compute the same keys.
#pragma once

#include <string>

#include "hack/core/dtype.h"
#include "hack/kv/block_key.h"
#include "hack/kv/kv_block.h"
#include "hack/kv/kv_options.h"
#include "hack/model/weights.h"

namespace hack {

/// The model's config and a digest of its weights, the device that computes KV, the cache's
/// exact element type, Π, the block format's version and the codec. HACK bits and windows are
/// not in it: the exact and int8-head codecs hold the KV before quantization, so every HACK
/// setting shares them.
KvFingerprint prefix_fingerprint(const Model& model, const std::string& device, const KvCacheOptions& kv,
                                 DType exact_dtype, BlockCodec codec);

/// The exact element type of a cache with these options (what its exact codec blocks hold).
DType cache_exact_dtype(const KvCacheOptions& kv);

}  // namespace hack
