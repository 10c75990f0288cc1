/// @file recompute_budget.h
/// @brief How many tokens of a recompute ride in one decode step (chunked prefill beside
/// decode): as many as keep the step within `stretch` × a plain decode step, measured as the
/// node runs. A prompt token costs a CPU step far more than a decode token (compute-bound rows
/// against rows that mostly stream the weights: ~15 ms a token against a 70 ms 8-stream step
/// for SmolLM2 on dev-2c, bench/RESULTS.md), so a fixed piece size either stalls the streams or
/// crawls; the budget follows the machine, the model and the batch.
#pragma once

namespace hack::server {

class RecomputeBudget {
 public:
  /// max_tokens: the largest piece (--recompute-chunk-tokens); stretch: the step time a piece
  /// may reach, as a multiple of a plain step's.
  explicit RecomputeBudget(int max_tokens, double stretch = 2.0);

  /// Tokens for the next piece, in [1, max_tokens]: max_tokens while nothing is measured yet or
  /// when no stream decodes beside it (decode_rows 0: nobody to keep waiting).
  int next_piece(int decode_rows) const;
  /// One step's wall time with `piece_tokens` of a recompute (0: a plain step) beside
  /// `decode_rows` decode tokens.
  void record(double step_s, int piece_tokens, int decode_rows);

  double plain_step_s() const { return plain_s_; }
  double token_s() const { return token_s_; }

 private:
  int max_tokens_;
  double stretch_;
  double plain_s_ = 0;  // moving average of plain steps (0: none yet)
  double token_s_ = 0;  // moving average of what a piece token adds to a step (0: none yet)
};

}  // namespace hack::server
