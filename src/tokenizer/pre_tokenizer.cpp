#include "src/tokenizer/pre_tokenizer.h"

#include <utf8proc.h>

#include "src/tokenizer/byte_level.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/text_pattern.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {
namespace {

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: unknown split behavior \"{}\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
       "Contiguous)",
       where, name);
}

// Turns the covering list of (range, is_match) into the pieces to keep, in place: HF's
// NormalizedString::split. After this, is_match marks pieces to drop.
void apply_behavior(std::vector<SplitRange>& m, SplitBehavior behavior) {
  size_t w = 0;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& r : m) r.is_match = false;
      return;
    case SplitBehavior::kRemoved:
      return;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (size_t i = 0; i < m.size(); ++i) {
        const bool is_match = m[i].is_match;
        if (is_match == previous_match && w > 0) {
          m[w - 1].end = m[i].end;
        } else {
          m[w++] = {m[i].start, m[i].end, false};
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (size_t i = 0; i < m.size(); ++i) {
        const bool is_match = m[i].is_match;
        if (is_match && !previous_match && w > 0) {
          m[w - 1].end = m[i].end;
        } else {
          m[w++] = {m[i].start, m[i].end, false};
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A match joins its right neighbour unless that neighbour is a match too.
      for (size_t i = 0; i < m.size(); ++i) {
        if (m[i].is_match && i + 1 < m.size() && !m[i + 1].is_match) {
          m[i + 1].start = m[i].start;
          continue;
        }
        m[w++] = {m[i].start, m[i].end, false};
      }
      break;
    }
  }
  m.resize(w);
}

void emit_ranges(std::string_view piece, bool at_input_start, const std::vector<SplitRange>& ranges, PieceFn emit) {
  for (const SplitRange& r : ranges) {
    if (r.is_match || r.end <= r.start) continue;
    emit(piece.substr(r.start, r.end - r.start), at_input_start && r.start == 0);
  }
}

// Covering list from a char predicate: every matching character is its own match.
template <class Pred>
void char_matches(std::string_view piece, Pred&& pred, std::vector<SplitRange>& out) {
  out.clear();
  size_t last = 0, pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    const char32_t cp = next_code_point(piece, pos);
    if (pred(cp)) {
      if (last < start) out.push_back({last, start, false});
      out.push_back({start, pos, true});
      last = pos;
    }
  }
  if (last < piece.size()) out.push_back({last, piece.size(), false});
}

// Covering list from a pattern's matches (HF's Pattern::find_matches for a regex).
void pattern_matches(const TextPattern& pattern, std::string_view piece, RegexScratch& scratch, bool invert,
                     std::vector<SplitRange>& out) {
  out.clear();
  size_t prev = 0;
  pattern.for_each_match(piece, scratch, [&](size_t s, size_t e) {
    if (prev != s) out.push_back({prev, s, invert});
    out.push_back({s, e, !invert});
    prev = e;
  });
  if (prev != piece.size()) out.push_back({prev, piece.size(), invert});
}

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

std::unique_ptr<TextPattern> make_pattern(const PatternSpec& spec, const std::string& where) {
  try {
    return std::make_unique<TextPattern>(spec);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<TextPattern> pattern, SplitBehavior behavior, bool invert, int slot)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert), slot_(slot) {}

  void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const override {
    auto& ranges = s.ranges[slot_];
    pattern_matches(*pattern_, piece, s.regex, invert_, ranges);
    apply_behavior(ranges, behavior_);
    emit_ranges(piece, at_input_start, ranges, emit);
  }

 private:
  std::unique_ptr<TextPattern> pattern_;
  SplitBehavior behavior_;
  bool invert_;
  int slot_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, int slot)
      : add_prefix_space_(add_prefix_space), slot_(slot) {
    if (use_regex) regex_ = std::make_unique<TextPattern>(PatternSpec{true, std::string(kGpt2Pattern)});
  }

  void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const override {
    std::string_view text = piece;
    if (add_prefix_space_ && piece.front() != ' ') {
      std::string& prefixed = s.buffers[slot_ + 1];
      prefixed.assign(1, ' ');
      prefixed.append(piece);
      text = prefixed;
    }
    const ByteLevelTable& table = ByteLevelTable::get();
    std::string& mapped = s.buffers[slot_];
    if (!regex_) {
      mapped.clear();
      table.encode_append(mapped, text);
      emit(mapped, at_input_start);
      return;
    }
    auto& ranges = s.ranges[slot_];
    pattern_matches(*regex_, text, s.regex, false, ranges);
    for (const SplitRange& r : ranges) {
      if (r.end <= r.start) continue;
      mapped.clear();
      table.encode_append(mapped, text.substr(r.start, r.end - r.start));
      emit(mapped, at_input_start && r.start == 0);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<TextPattern> regex_;
  int slot_;  // uses slot_ (mapped text, ranges) and slot_ + 1 (prefixed text)
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split, int slot)
      : scheme_(scheme), split_(split), replacement_cp_(replacement), slot_(slot) {
    append_utf8(replacement_, replacement);
  }

  void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const override {
    std::string& text = s.buffers[slot_];
    text.clear();
    const bool starts_with_replacement = piece.front() == ' ' || piece.starts_with(replacement_);
    if (!starts_with_replacement &&
        (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_input_start))) {
      text.append(replacement_);
    }
    for (char c : piece) {
      if (c == ' ') {
        text.append(replacement_);
      } else {
        text.push_back(c);
      }
    }
    if (!split_) {
      emit(text, at_input_start);
      return;
    }
    auto& ranges = s.ranges[slot_];
    char_matches(text, [&](char32_t cp) { return cp == replacement_cp_; }, ranges);
    apply_behavior(ranges, SplitBehavior::kMergedWithNext);
    emit_ranges(text, at_input_start, ranges, emit);
  }

 private:
  PrependScheme scheme_;
  bool split_;
  char32_t replacement_cp_;
  std::string replacement_;
  int slot_;
};

template <class Pred>
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(Pred pred, SplitBehavior behavior, int slot) : pred_(pred), behavior_(behavior), slot_(slot) {}

  void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const override {
    auto& ranges = s.ranges[slot_];
    char_matches(piece, pred_, ranges);
    apply_behavior(ranges, behavior_);
    emit_ranges(piece, at_input_start, ranges, emit);
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
  int slot_;
};

template <class Pred>
std::unique_ptr<PreTokenizer> make_char_split(Pred pred, SplitBehavior behavior, int slot) {
  return std::make_unique<CharSplitPreTokenizer<Pred>>(pred, behavior, slot);
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}

  void pre_tokenize(std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const override {
    run(0, piece, at_input_start, s, emit);
  }

 private:
  void run(size_t i, std::string_view piece, bool at_input_start, PreTokenizeScratch& s, PieceFn emit) const {
    if (i == steps_.size()) {
      emit(piece, at_input_start);
      return;
    }
    auto next = [&](std::string_view sub, bool sub_start) { run(i + 1, sub, sub_start, s, emit); };
    steps_[i]->pre_tokenize(piece, at_input_start, s, next);
  }

  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec, const std::string& where, int* slots) {
  if (spec.is_null()) return nullptr;
  const std::string type = get_type(spec, where);
  if (type == "ByteLevel") {
    const int slot = *slots;
    *slots += 2;
    return std::make_unique<ByteLevelPreTokenizer>(get_bool_or(spec, "add_prefix_space", true, where),
                                                   get_bool_or(spec, "use_regex", true, where), slot);
  }
  if (type == "Split") {
    const std::string behavior = get_string(spec, "behavior", where);
    auto pattern = make_pattern(get_pattern(spec, "pattern", where), field(where, "pattern"));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), parse_behavior(behavior, field(where, "behavior")),
                                               get_bool_or(spec, "invert", false, where), (*slots)++);
  }
  if (type == "Metaspace") {
    const char32_t replacement = get_char(spec, "replacement", where);
    PrependScheme scheme = get_bool_or(spec, "add_prefix_space", true, where) ? PrependScheme::kAlways
                                                                               : PrependScheme::kNever;
    if (spec.contains("prepend_scheme") && !spec["prepend_scheme"].is_null()) {
      const std::string name = get_string(spec, "prepend_scheme", where);
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        fail("{}: unknown prepend_scheme \"{}\" (expected always, first or never)", field(where, "prepend_scheme"),
             name);
      }
    }
    return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, get_bool_or(spec, "split", true, where),
                                                   (*slots)++);
  }
  if (type == "Digits") {
    const bool individual = get_bool_or(spec, "individual_digits", false, where);
    return make_char_split(is_numeric, individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                           (*slots)++);
  }
  if (type == "WhitespaceSplit") return make_char_split(is_unicode_whitespace, SplitBehavior::kRemoved, (*slots)++);
  if (type == "Punctuation") {
    const std::string behavior = get_string_or(spec, "behavior", "Isolated", where);
    return make_char_split(is_punctuation, parse_behavior(behavior, field(where, "behavior")), (*slots)++);
  }
  if (type == "Whitespace") {
    return std::make_unique<SplitPreTokenizer>(std::make_unique<TextPattern>(PatternSpec{true, R"(\w+|[^\w\s]+)"}),
                                               SplitBehavior::kRemoved, true, (*slots)++);
  }
  if (type == "Sequence") {
    const json& list = require(spec, "pretokenizers", where);
    HACK_CHECK(list.is_array(), "{}: expected an array", field(where, "pretokenizers"));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), slots);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  fail("{}: unsupported pre-tokenizer type \"{}\" (supported: ByteLevel, Split, Metaspace, Digits, Whitespace, "
       "WhitespaceSplit, Punctuation, Sequence)",
       where, type);
}

}  // namespace hack::tok
