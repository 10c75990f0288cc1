// tokenizer.json "pre_tokenizer": ByteLevel, Split, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Punctuation and Sequence. Pre-tokenizers stream: each piece they cut (and
// possibly rewrite) goes straight to the next stage through a callback, so no list of
// strings is built per input.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "src/tokenizer/regex.h"

namespace hack::tok {

/// Non-owning reference to a callable void(std::string_view piece, bool at_input_start).
class PieceFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, PieceFn>>>
  PieceFn(F&& f) : obj_(static_cast<void*>(&f)), call_([](void* o, std::string_view p, bool s) {
                     (*static_cast<std::remove_reference_t<F>*>(o))(p, s);
                   }) {}
  void operator()(std::string_view piece, bool at_input_start) const { call_(obj_, piece, at_input_start); }

 private:
  void* obj_;
  void (*call_)(void*, std::string_view, bool);
};

/// One split of a piece: [start, end) and whether the behaviour removes it.
struct SplitRange {
  size_t start, end;
  bool is_match;
};

/// Reusable buffers: slot i belongs to the i-th pre-tokenizer of the pipeline, so nested
/// stages never share one.
struct PreTokenizeScratch {
  RegexScratch regex;
  std::vector<std::string> buffers;
  std::vector<std::vector<SplitRange>> ranges;
  void ensure_slots(size_t n) {
    if (buffers.size() < n) buffers.resize(n);
    if (ranges.size() < n) ranges.resize(n);
  }
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Cuts `piece` (non-empty valid UTF-8) and emits each non-empty sub-piece in order.
  /// `at_input_start`: the piece begins at offset 0 of the original input (Metaspace's
  /// prepend_scheme "first" depends on it); emitted pieces carry it on when they begin at
  /// offset 0 of `piece`.
  virtual void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& scratch,
                            PieceFn emit) const = 0;
};

/// Builds the pre-tokenizer `spec` describes (null for JSON null). `slots` counts the
/// scratch slots handed out so far (PreTokenizeScratch::ensure_slots(*slots) before use).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec, const std::string& where, int* slots);

}  // namespace hack::tok
