// tokenizer.json "decoder": ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// BPEDecoder and Sequence (flattened into one list of steps), or none (tokens joined by
// " "). Besides a full decode it can decode a window of a token stream: the stream state
// carries what depends on earlier windows (is this the first token, how much leading Strip
// budget is left), and with final = false each step withholds a tail later tokens could
// still change, reporting that it did.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hack::tok {

class RegexScratch;

/// What decoding a window needs to know about the windows before it.
struct DecodeStreamState {
  bool first_token = true;      // no token has been decoded in an earlier window
  std::vector<int> strip_left;  // per Strip step: leading content characters still to strip
};

class DecoderStep;

class DecoderPipeline {
 public:
  /// `spec` is tokenizer.json "decoder" (null: no decoder).
  DecoderPipeline(const nlohmann::json& spec, const std::string& where);
  ~DecoderPipeline();

  DecodeStreamState initial_state() const;

  /// Decodes `tokens` (consumed) as the continuation of a stream in `state`, which is
  /// updated as if the window were committed. With final = false the unstable tail is
  /// left out and *held_back says whether anything was.
  std::string decode(std::vector<std::string>& tokens, DecodeStreamState& state, bool final, bool* held_back,
                     RegexScratch& scratch) const;

 private:
  std::vector<std::unique_ptr<DecoderStep>> steps_;
  std::vector<int> strip_starts_;  // "start" of each Strip step, in order
  bool join_with_space_ = false;  // no decoder at all
};

}  // namespace hack::tok
