// Defaults of the optional KvCache operations (include/hack/kv/kv_cache.h).
#include "hack/kv/kv_cache.h"

#include "hack/core/error.h"

namespace hack {

void KvCache::read_exact_tokens(int, int, int, int, float*, float*) const {
  fail("the {} KV cache cannot read tokens back", name());
}

void KvCache::keep_tokens(int, int, const std::vector<int>&) {
  fail("the {} KV cache cannot evict tokens (--kv-keep-*)", name());
}

}  // namespace hack
