// The index math of tensor-core HACK attention (kernels/mma_fragments.h) on the host: the
// m16n8k32 fragment maps cover their tiles once each and agree with the PTX ISA's formulas at
// the points its figures show, and every B register read from a HACK page holds, byte by byte,
// the codes the page format's scalar reference (code_at of k_code_pos / v_code_pos) gives for
// the (k, n) positions b_coord names — for 2-, 4- and 8-bit codes, several head dims and
// page sizes, every tile, lane and register.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "hack/kernels/hack_quant_math.h"
#include "hack/kernels/mma_fragments.h"

using namespace hack;

namespace {

// All (lane, element) positions of a fragment map, as a set of matrix coordinates; REQUIREs
// that no coordinate repeats and every one is inside rows × cols.
template <class Map>
std::set<std::pair<int, int>> covered(Map map, int elements, int rows, int cols) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < elements; ++i) {
      const mma::Coord c = map(lane, i);
      INFO("lane " << lane << " element " << i << " -> (" << c.row << ", " << c.col << ")");
      REQUIRE(c.row >= 0);
      REQUIRE(c.row < rows);
      REQUIRE(c.col >= 0);
      REQUIRE(c.col < cols);
      REQUIRE(seen.insert({c.row, c.col}).second);
    }
  return seen;
}

}  // namespace

TEST_CASE("m16n8k32 fragment maps cover each tile once, as the PTX ISA lays them out", "[kernels][mma]") {
  CHECK(covered(mma::a_coord, 16, mma::kM, mma::kK).size() == size_t{mma::kM * mma::kK});
  CHECK(covered(mma::b_coord, 8, mma::kK, mma::kN).size() == size_t{mma::kK * mma::kN});
  CHECK(covered(mma::c_coord, 4, mma::kM, mma::kN).size() == size_t{mma::kM * mma::kN});
  // Points of the ISA's figures: lane 0 holds A row 0 cols 0-3 (a0-a3), row 8 (a4-a7), row 0
  // cols 16-19 (a8-a11); lane 5 (groupID 1, thread 1) starts at row 1, col 4; lane 31 ends
  // at row 15, col 31.
  CHECK((mma::a_coord(0, 3).row == 0 && mma::a_coord(0, 3).col == 3));
  CHECK((mma::a_coord(0, 4).row == 8 && mma::a_coord(0, 4).col == 0));
  CHECK((mma::a_coord(0, 8).row == 0 && mma::a_coord(0, 8).col == 16));
  CHECK((mma::a_coord(5, 0).row == 1 && mma::a_coord(5, 0).col == 4));
  CHECK((mma::a_coord(31, 15).row == 15 && mma::a_coord(31, 15).col == 31));
  // B: lane 5's second register, byte 2 is k = 4 + 16 + 2, n = 1; lane 31's last is k 31, n 7.
  CHECK((mma::b_coord(5, 6).row == 22 && mma::b_coord(5, 6).col == 1));
  CHECK((mma::b_coord(31, 7).row == 31 && mma::b_coord(31, 7).col == 7));
  // C: lane 5 holds (1, 2), (1, 3), (9, 2), (9, 3).
  CHECK((mma::c_coord(5, 0).row == 1 && mma::c_coord(5, 0).col == 2));
  CHECK((mma::c_coord(5, 3).row == 9 && mma::c_coord(5, 3).col == 3));
  // A row's k range in each register is 4 consecutive columns, as a u8x4 word of the row.
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < mma::kARegs; ++reg)
      for (int j = 1; j < 4; ++j) {
        CHECK(mma::a_coord(lane, 4 * reg + j).row == mma::a_coord(lane, 4 * reg).row);
        CHECK(mma::a_coord(lane, 4 * reg + j).col == mma::a_coord(lane, 4 * reg).col + j);
      }
}

TEST_CASE("B registers read from HACK pages hold the codes the page format puts there", "[kernels][mma]") {
  std::mt19937 rng(49);
  for (int bits : {2, 4, 8}) {
    for (int head_dim : {64, 128}) {
      for (int block_tokens : {32, 64}) {
        INFO("bits " << bits << " head_dim " << head_dim << " block_tokens " << block_tokens);
        // One head's K and V code arrays filled with random bytes: every bit is some code.
        const size_t bytes = static_cast<size_t>(head_dim) * static_cast<size_t>(block_tokens) * static_cast<size_t>(bits) / 8;
        std::vector<uint8_t> k(bytes), v(bytes);
        for (uint8_t& b : k) b = static_cast<uint8_t>(rng());
        for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
        int checked = 0;
        // One B register read from `codes` at `w` against the scalar page format: byte j holds
        // the code at (k, n) = b_coord(lane, 4 · reg + j), `code_of(k, n)`.
        const auto check = [&](const char* what, const std::vector<uint8_t>& codes, mma::CodeWord w, int lane, int reg,
                               auto code_of) {
          REQUIRE(w.byte % 4 == 0);
          REQUIRE(w.byte + 4 <= bytes);
          const uint32_t got = mma::load_b_register(codes.data(), w, bits);
          for (int j = 0; j < 4; ++j) {
            const mma::Coord c = mma::b_coord(lane, 4 * reg + j);
            INFO(what << " lane " << lane << " reg " << reg << " byte " << j << " (k " << c.row << ", n " << c.col << ")");
            REQUIRE(static_cast<int>((got >> (8 * j)) & 0xFF) == code_of(c.row, c.col));
            ++checked;
          }
        };
        for (int lane = 0; lane < 32; ++lane)
          for (int reg = 0; reg < mma::kBRegs; ++reg) {
            // Q·Kᵀ: k = channels, n = tokens.
            for (int k0 = 0; k0 < head_dim; k0 += mma::kK)
              for (int n0 = 0; n0 < block_tokens; n0 += mma::kN)
                check("K", k, mma::k_b_word(bits, head_dim, n0, k0, lane, reg), lane, reg, [&](int kk, int n) {
                  return quant::code_at(k.data(), quant::k_code_pos(bits, head_dim, n0 + n, k0 + kk), bits);
                });
            // P·V: k = tokens, n = channels.
            for (int k0 = 0; k0 < block_tokens; k0 += mma::kK)
              for (int n0 = 0; n0 < head_dim; n0 += mma::kN)
                check("V", v, mma::v_b_word(bits, block_tokens, n0, k0, lane, reg), lane, reg, [&](int kk, int n) {
                  return quant::code_at(v.data(), quant::v_code_pos(bits, block_tokens, k0 + kk, n0 + n), bits);
                });
          }
        // Every code of both arrays was read once per (lane, reg, byte) position: K and V
        // each hold head_dim × block_tokens codes.
        CHECK(checked == 2 * head_dim * block_tokens);
      }
    }
  }
}
