#include "hack/decode/recompute_budget.h"

#include <algorithm>
#include <cmath>

#include "hack/core/error.h"

namespace hack::server {

namespace {

constexpr double kWeight = 0.2;  // of the newest sample in the moving averages

double blend(double average, double sample) { return average == 0 ? sample : average + kWeight * (sample - average); }

}  // namespace

RecomputeBudget::RecomputeBudget(int max_tokens, double stretch) : max_tokens_(max_tokens), stretch_(stretch) {
  HACK_CHECK(max_tokens > 0, "recompute budget: the largest piece must be positive, got {}", max_tokens);
  HACK_CHECK(stretch > 1, "recompute budget: stretch must exceed 1, got {}", stretch);
}

int RecomputeBudget::next_piece(int decode_rows) const {
  if (decode_rows == 0 || plain_s_ == 0 || token_s_ == 0) return max_tokens_;
  const double tokens = std::floor((stretch_ - 1) * plain_s_ / token_s_);
  return static_cast<int>(std::clamp(tokens, 1.0, static_cast<double>(max_tokens_)));
}

void RecomputeBudget::record(double step_s, int piece_tokens, int decode_rows) {
  if (decode_rows == 0) return;  // a piece alone says nothing about what it adds to a step
  if (piece_tokens == 0) {
    plain_s_ = blend(plain_s_, step_s);
  } else if (plain_s_ > 0) {
    token_s_ = blend(token_s_, std::max(step_s - plain_s_, 0.0) / piece_tokens);
  }
}

}  // namespace hack::server
