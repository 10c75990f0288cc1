// Recompute pieces sized to keep a decode step within 2x a plain one.
#include <catch2/catch.hpp>

#include "hack/core/error.h"
#include "hack/decode/recompute_budget.h"

namespace hack::server {

TEST_CASE("recompute budget: the largest piece until measured, then what fits in the stretch", "[decode][budget]") {
  RecomputeBudget b(16);
  CHECK(b.next_piece(8) == 16);  // nothing measured
  b.record(0.070, 0, 8);         // plain steps of 70 ms
  CHECK(b.next_piece(8) == 16);  // no piece measured yet
  b.record(0.310, 16, 8);        // 16 tokens added 240 ms: 15 ms a token
  CHECK(b.token_s() == Approx(0.015));
  CHECK(b.next_piece(8) == 4);  // (2 − 1) · 70 ms / 15 ms
  CHECK(b.next_piece(0) == 16);  // nobody decoding beside it
  // Slow tokens never make a piece empty; fast ones never pass the largest piece.
  RecomputeBudget slow(16);
  slow.record(0.010, 0, 4);
  slow.record(1.010, 1, 4);
  CHECK(slow.next_piece(4) == 1);
  RecomputeBudget fast(16);
  fast.record(0.100, 0, 4);
  fast.record(0.101, 16, 4);
  CHECK(fast.next_piece(4) == 16);
  // A recorded piece without decode rows teaches nothing.
  RecomputeBudget alone(16);
  alone.record(0.070, 0, 8);
  alone.record(5.0, 16, 0);
  CHECK(alone.token_s() == 0);
  CHECK_THROWS_AS(RecomputeBudget(0), Error);
  CHECK_THROWS_AS(RecomputeBudget(16, 1.0), Error);
}

}  // namespace hack::server
