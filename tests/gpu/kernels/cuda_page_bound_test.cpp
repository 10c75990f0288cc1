// cuda::page_bound against cpu::detail::page_bound_scalar: the same bits for quest and mpcache
// scores, single pages and coarse boxes (span 3 over 10 pages leaves a short last box), on
// random bf16 K ranges laid out as in a HACK page (min and scale arrays at offsets).
#include <catch2/catch.hpp>

#include <cstring>

#include "gpu/cuda_test_util.h"
#include "hack/kernels/cpu/page_bound.h"
#include "hack/kernels/cuda/page_bound.h"
#include "support/test_support.h"

using namespace hack;
using test::dptr;

namespace {

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);  // truncation: any bf16 value will do here
}

}  // namespace

TEST_CASE("cuda page_bound equals the CPU scalar page scores bit for bit", "[gpu][page_selection]") {
  const uint32_t seed = 31;
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const int k_dim : {16, 64, 128}) {
    const int n_pages = 10, rows = 4;
    const size_t min_off = 64, scale_off = 64 + 2 * static_cast<size_t>(k_dim), page_bytes = scale_off + 2 * k_dim + 32;
    std::vector<std::byte> pages(page_bytes * n_pages);
    for (int p = 0; p < n_pages; ++p) {
      const auto mins = test::random_floats(rng, static_cast<size_t>(k_dim), -2, 1);
      const auto scales = test::random_floats(rng, static_cast<size_t>(k_dim), 0, 0.7f);
      for (int c = 0; c < k_dim; ++c) {
        const uint16_t m = to_bf16_bits(mins[static_cast<size_t>(c)]), s = to_bf16_bits(scales[static_cast<size_t>(c)]);
        std::memcpy(&pages[p * page_bytes + min_off + 2 * static_cast<size_t>(c)], &m, 2);
        std::memcpy(&pages[p * page_bytes + scale_off + 2 * static_cast<size_t>(c)], &s, 2);
      }
    }
    const auto q = test::random_floats(rng, static_cast<size_t>(rows * k_dim), -3, 3);
    std::vector<float> qpos(static_cast<size_t>(k_dim)), qneg(static_cast<size_t>(k_dim)), qsum(static_cast<size_t>(k_dim));
    cpu::quest_split(q.data(), rows, k_dim, qpos.data(), qneg.data());
    for (int c = 0; c < k_dim; ++c) qsum[static_cast<size_t>(c)] = qpos[static_cast<size_t>(c)] + qneg[static_cast<size_t>(c)];

    Buffer dpages = test::to_device(pages), dqpos = test::to_device(qpos), dqneg = test::to_device(qneg),
           dqsum = test::to_device(qsum);
    std::vector<const std::byte*> host_ptrs(n_pages), dev_ptrs(n_pages);
    for (int p = 0; p < n_pages; ++p) {
      host_ptrs[static_cast<size_t>(p)] = pages.data() + p * page_bytes;
      dev_ptrs[static_cast<size_t>(p)] = dptr<std::byte>(dpages) + p * page_bytes;
    }
    Buffer dptrs = test::to_device(dev_ptrs);
    for (const bool linear : {false, true})
      for (const int span : {1, 3}) {
        INFO("k_dim " << k_dim << " linear " << linear << " span " << span);
        cpu::PageBoundArgs a;
        a.n_pages = n_pages;
        a.span = span;
        a.k_min_offset = min_off;
        a.k_scale_offset = scale_off;
        a.k_dim = k_dim;
        a.levels = 3;
        a.linear = linear;
        a.alpha = 0.6f;
        a.pages = host_ptrs.data();
        a.qpos = qpos.data();
        a.qneg = qneg.data();
        a.qsum = qsum.data();
        const int boxes = (n_pages + span - 1) / span;
        std::vector<float> want(static_cast<size_t>(boxes));
        cpu::detail::page_bound_scalar(a, want.data());

        a.pages = dptr<const std::byte*>(dptrs);
        a.qpos = dptr<float>(dqpos);
        a.qneg = dptr<float>(dqneg);
        a.qsum = dptr<float>(dqsum);
        Buffer dout = Buffer::allocate(MemoryKind::device, static_cast<size_t>(boxes) * sizeof(float));
        cuda::page_bound(a, dptr<float>(dout), nullptr);
        const auto got = test::to_host<float>(dout, static_cast<size_t>(boxes));
        REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
  }
}
