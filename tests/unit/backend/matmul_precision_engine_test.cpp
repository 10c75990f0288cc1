// --matmul-precision bf16 through a whole model on both AVX-512 tiers: the avx512 tier (no
// AVX-512 BF16: bf16 products FMA'd in fp32 in VDPBF16PS's order) gives the avx512bf16 tier's
// logits bit for bit — prefill chunks (the GEMMs) and batched decode steps of 5 sequences (the
// GEMVs from 4 rows) — so a CPU without AVX-512 BF16 serves the same tokens.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/thread_pool.h"
#include "hack/model/weights.h"
#include "support/isa_override.h"
#include "support/synthetic_model.h"

using namespace hack;

namespace {

constexpr int kSeqs = 5, kSteps = 6;

// Every logit of: each sequence's prefill (last position), then kSteps batched decode steps.
std::vector<float> run(const Model& model, ThreadPool& pool, cpu::MatmulPrecision precision) {
  KvCacheOptions o;
  o.mode = KvMode::hack;
  o.block_tokens = 16;
  CpuEngine cpu = make_cpu_engine(model, pool, o, EngineOptions{.prefill_chunk_tokens = 32, .matmul_precision = precision});
  Engine& engine = *cpu.engine;
  const int vocab = model.config.vocab_size;
  std::vector<float> all, logits;
  std::vector<int> seqs, next;
  for (int s = 0; s < kSeqs; ++s) {
    engine.add_sequence(s, 128);
    engine.prefill(s, test::random_prompt(20 + 9 * s, vocab, 30 + static_cast<uint32_t>(s)), logits);
    all.insert(all.end(), logits.begin(), logits.end());
    seqs.push_back(s);
    next.push_back(3 + s);
  }
  for (int step = 0; step < kSteps; ++step) {
    engine.decode(seqs, next, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    for (int& t : next) t = (t * 13 + 1) % vocab;
  }
  return all;
}

}  // namespace

TEST_CASE("matmul bf16 through the model: the avx512 tier equals the avx512bf16 tier bit for bit",
          "[backend][engine][isa]") {
  if (!cpu_supports(CpuIsa::avx512bf16)) {
    WARN("no AVX-512 BF16 on this CPU: nothing to compare the avx512 tier with");
    return;
  }
  // hidden 128, intermediate 256, 4 × 32-wide heads: every matrix has in % 32 == 0, so the
  // 5-row decode steps take the bf16 GEMV and the 20–56-token prompts (chunks of 32) the GEMMs.
  const Model model = Model::synthetic(test::small_synthetic_config(), 17);
  ThreadPool pool(2);
  std::vector<float> fma, dot, f32;
  {
    const test::IsaOverride force(CpuIsa::avx512);
    fma = run(model, pool, cpu::MatmulPrecision::bf16);
  }
  {
    const test::IsaOverride force(CpuIsa::avx512bf16);
    dot = run(model, pool, cpu::MatmulPrecision::bf16);
    f32 = run(model, pool, cpu::MatmulPrecision::f32);
  }
  REQUIRE(fma.size() == static_cast<size_t>((kSeqs + kSteps * kSeqs) * model.config.vocab_size));
  REQUIRE(dot.size() == fma.size());
  size_t first = fma.size();
  for (size_t i = 0; i < fma.size() && first == fma.size(); ++i)
    if (std::memcmp(&fma[i], &dot[i], sizeof(float)) != 0) first = i;
  INFO("first difference at logit " << first << " of " << fma.size());
  REQUIRE(first == fma.size());
  REQUIRE(f32 != dot);  // bf16 activations were in play: this compared the bf16 kernels, not fp32 twice
}
