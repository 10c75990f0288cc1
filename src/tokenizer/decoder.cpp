#include "src/tokenizer/decoder.h"

#include <algorithm>

#include "src/tokenizer/byte_level.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/text_pattern.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {

struct DecodeContext {
  DecodeStreamState& state;
  bool final;
  bool held_back;
  RegexScratch& scratch;
};

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  virtual void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const = 0;
  /// Whether this step leaves a single token holding all the text (ByteLevel, Fuse).
  virtual bool fuses() const { return false; }
};

namespace {

std::string join(const std::vector<std::string>& tokens, std::string_view sep = "") {
  size_t n = 0;
  for (const auto& t : tokens) n += t.size() + sep.size();
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.append(sep);
    out.append(tokens[i]);
  }
  return out;
}

// Per token: its characters mapped back to bytes, or its own UTF-8 when some character is
// outside the byte alphabet; all bytes concatenated, then decoded lossily.
class ByteLevelStep final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    const ByteLevelTable& table = ByteLevelTable::get();
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool mapped = true;
      while (pos < t.size()) {
        const int b = table.decode(next_code_point(t, pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    if (!ctx.final) {
      const size_t tail = incomplete_utf8_tail(bytes);
      if (tail > 0) {
        ctx.held_back = true;
        bytes.resize(bytes.size() - tail);
      }
    }
    std::string text;
    text.reserve(bytes.size());
    append_utf8_lossy(text, bytes);
    tokens.assign(1, std::move(text));
  }
  bool fuses() const override { return true; }
};

class MetaspaceStep final : public DecoderStep {
 public:
  MetaspaceStep(char32_t replacement, bool add_prefix_space)
      : replacement_(replacement), add_prefix_space_(add_prefix_space) {}
  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      const bool strip = i == 0 && ctx.state.first_token && add_prefix_space_;
      std::string out;
      out.reserve(t.size());
      size_t pos = 0;
      while (pos < t.size()) {
        const size_t start = pos;
        const char32_t cp = next_code_point(t, pos);
        if (cp == replacement_) {
          if (!strip) out.push_back(' ');
        } else {
          out.append(t, start, pos - start);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool add_prefix_space_;
};

class ByteFallbackStep final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (valid_utf8_prefix(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementUtf8);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      int byte = -1;
      if (parse_byte_token(t, &byte)) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    if (!pending.empty()) {
      if (ctx.final) {
        flush();
      } else {
        ctx.held_back = true;  // the run may go on
      }
    }
    tokens = std::move(out);
  }

  // "<0xNN>": 6 bytes; NN parsed like Rust's u8::from_str_radix(_, 16) (either case, an
  // optional leading '+').
  static bool parse_byte_token(std::string_view t, int* byte) {
    if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return false;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int lo = hex(t[4]);
    if (lo < 0) return false;
    if (t[3] == '+') {
      *byte = lo;
      return true;
    }
    const int hi = hex(t[3]);
    if (hi < 0) return false;
    *byte = hi * 16 + lo;
    return true;
  }
};

class FuseStep final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens, DecodeContext&) const override { tokens.assign(1, join(tokens)); }
  bool fuses() const override { return true; }
};

class StripStep final : public DecoderStep {
 public:
  StripStep(char32_t content, int start, int stop, bool fused, int index)
      : content_(content), start_(start), stop_(stop), fused_(fused), index_(index) {}

  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    for (std::string& t : tokens) {
      // Byte offsets of each character, plus the end.
      std::vector<size_t> offsets;
      for (size_t pos = 0; pos < t.size();) {
        offsets.push_back(pos);
        pos += static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(t[pos])));
      }
      const size_t n = offsets.size();
      offsets.push_back(t.size());
      auto is_content = [&](size_t i) {
        size_t pos = offsets[i];
        return next_code_point(t, pos) == content_;
      };
      int& budget = ctx.state.strip_left[index_];
      const size_t left_limit = static_cast<size_t>(fused_ ? budget : start_);
      size_t start_cut = 0;
      while (start_cut < std::min(left_limit, n) && is_content(start_cut)) ++start_cut;
      if (fused_) budget = start_cut == n ? budget - static_cast<int>(start_cut) : 0;
      size_t stop_cut = n;
      for (int i = 0; i < stop_ && stop_cut > start_cut && is_content(stop_cut - 1); ++i) --stop_cut;
      if (fused_ && !ctx.final && stop_cut < n) {
        // Trailing content may be stripped only if nothing follows: hold it back.
        ctx.held_back = true;
      }
      t = t.substr(offsets[start_cut], offsets[stop_cut] - offsets[start_cut]);
    }
  }

 private:
  char32_t content_;
  int start_, stop_;
  bool fused_;
  int index_;
};

class ReplaceStep final : public DecoderStep {
 public:
  ReplaceStep(const PatternSpec& pattern, std::string content) : pattern_(pattern), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    for (std::string& t : tokens) {
      if (!pattern_.could_match(t)) continue;
      std::string out;
      pattern_.replace_all(t, content_, ctx.scratch, out);
      t = std::move(out);
    }
  }

 private:
  TextPattern pattern_;
  std::string content_;
};

// BPEDecoder: end_of_word_suffix becomes a space, except on the last token.
class BpeSuffixStep final : public DecoderStep {
 public:
  explicit BpeSuffixStep(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens, DecodeContext& ctx) const override {
    if (tokens.empty()) return;
    if (!ctx.final) {
      // Whether the last token is last is not known yet.
      tokens.pop_back();
      ctx.held_back = true;
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view replacement = ctx.final && i + 1 == tokens.size() ? "" : " ";
      std::string out;
      TextPattern(PatternSpec{false, suffix_}).replace_all(tokens[i], replacement, ctx.scratch, out);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

// Flattens `spec` into `steps`; strip_starts gets each Strip step's "start".
void build_steps(const json& spec, const std::string& where, std::vector<std::unique_ptr<DecoderStep>>& steps,
                 std::vector<int>* strip_starts) {
  const std::string type = get_type(spec, where);
  const bool fused = std::any_of(steps.begin(), steps.end(), [](const auto& s) { return s->fuses(); });
  if (type == "ByteLevel") {
    steps.push_back(std::make_unique<ByteLevelStep>());
  } else if (type == "Metaspace") {
    bool add_prefix_space = get_bool_or(spec, "add_prefix_space", true, where);
    if (spec.contains("prepend_scheme") && !spec["prepend_scheme"].is_null()) {
      add_prefix_space = get_string(spec, "prepend_scheme", where) != "never";
    }
    steps.push_back(std::make_unique<MetaspaceStep>(get_char(spec, "replacement", where), add_prefix_space));
  } else if (type == "ByteFallback") {
    steps.push_back(std::make_unique<ByteFallbackStep>());
  } else if (type == "Fuse") {
    steps.push_back(std::make_unique<FuseStep>());
  } else if (type == "Strip") {
    const long long start = get_int_or(spec, "start", 0, where);
    const long long stop = get_int_or(spec, "stop", 0, where);
    HACK_CHECK(start >= 0 && stop >= 0 && start < (1 << 20) && stop < (1 << 20), "{}: start / stop out of range",
               where);
    steps.push_back(std::make_unique<StripStep>(get_char(spec, "content", where), static_cast<int>(start),
                                                static_cast<int>(stop), fused,
                                                static_cast<int>(strip_starts->size())));
    strip_starts->push_back(static_cast<int>(start));
  } else if (type == "Replace") {
    const PatternSpec pattern = get_pattern(spec, "pattern", where);
    try {
      steps.push_back(std::make_unique<ReplaceStep>(pattern, get_string(spec, "content", where)));
    } catch (const Error& e) {
      fail("{}: {}", field(where, "pattern"), e.what());
    }
  } else if (type == "BPEDecoder") {
    steps.push_back(std::make_unique<BpeSuffixStep>(get_string_or(spec, "suffix", "</w>", where)));
  } else if (type == "Sequence") {
    const json& list = require(spec, "decoders", where);
    HACK_CHECK(list.is_array(), "{}: expected an array", field(where, "decoders"));
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) continue;
      build_steps(list[i], fmt::format("{}.decoders[{}]", where, i), steps, strip_starts);
    }
  } else {
    fail("{}: unsupported decoder type \"{}\" (supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
         "BPEDecoder, Sequence)",
         where, type);
  }
}

}  // namespace

DecoderPipeline::DecoderPipeline(const json& spec, const std::string& where) {
  if (spec.is_null()) {
    join_with_space_ = true;
    return;
  }
  build_steps(spec, where, steps_, &strip_starts_);
}

DecoderPipeline::~DecoderPipeline() = default;

DecodeStreamState DecoderPipeline::initial_state() const {
  DecodeStreamState state;
  state.strip_left = strip_starts_;
  return state;
}

std::string DecoderPipeline::decode(std::vector<std::string>& tokens, DecodeStreamState& state, bool final,
                                    bool* held_back, RegexScratch& scratch) const {
  const bool had_tokens = !tokens.empty();
  DecodeContext ctx{state, final, false, scratch};
  for (const auto& step : steps_) step->apply(tokens, ctx);
  std::string text;
  if (join_with_space_) {
    if (had_tokens && !state.first_token) text.push_back(' ');
    text += join(tokens, " ");
  } else {
    text = join(tokens);
  }
  if (had_tokens) state.first_token = false;
  if (held_back) *held_back = ctx.held_back;
  return text;
}

}  // namespace hack::tok
