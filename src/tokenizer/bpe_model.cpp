#include "src/tokenizer/bpe_model.h"

#include <algorithm>

#include "src/tokenizer/json_util.h"
#include "src/tokenizer/utf8.h"

namespace hack::tok {

// ---- WordCache ---------------------------------------------------------------

std::span<const int> WordCache::find(std::string_view word, uint64_t hash) const {
  if (slots_.empty()) return {};
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& s = slots_[i];
    if (!s.used) return {};
    if (s.hash == hash && s.key_len == word.size() &&
        std::string_view(keys_).substr(s.key_offset, s.key_len) == word) {
      return {ids_.data() + s.ids_offset, s.ids_len};
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, std::span<const int> ids) {
  if (word.size() > kMaxWordBytes || ids.size() > UINT16_MAX) return;
  if (slots_.empty()) slots_.resize(kSlots);
  if (used_ >= kSlots / 2) clear();
  size_t i = hash & (kSlots - 1);
  while (slots_[i].used) i = (i + 1) & (kSlots - 1);
  Slot& s = slots_[i];
  s = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
           static_cast<uint16_t>(word.size()), static_cast<uint16_t>(ids.size()), true};
  keys_.append(word);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++used_;
}

void WordCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  used_ = 0;
}

// ---- BpeModel ----------------------------------------------------------------

namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

std::pair<std::string, std::string> parse_merge(const json& m, size_t index, const std::string& where) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    HACK_CHECK(space != std::string::npos, "{}.merges[{}]: \"{}\" is not of the form \"left right\"", where, index, s);
    return {s.substr(0, space), s.substr(space + 1)};
  }
  HACK_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
             "{}.merges[{}]: expected \"left right\" or [\"left\", \"right\"]", where, index);
  return {m[0].get<std::string>(), m[1].get<std::string>()};
}

}  // namespace

BpeModel::BpeModel(const json& spec, const std::string& where) {
  const json& vocab = require(spec, "vocab", where);
  HACK_CHECK(vocab.is_object(), "{}: expected an object of token -> id", field(where, "vocab"));
  entry_tokens_.reserve(vocab.size());
  std::vector<int> entry_ids;
  entry_ids.reserve(vocab.size());
  int max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    HACK_CHECK(id.is_number_integer() && id.get<long long>() >= 0 && id.get<long long>() < (1ll << 30),
               "{}: id of \"{}\" is not a non-negative integer below 2^30", field(where, "vocab"), token);
    entry_tokens_.push_back(token);
    entry_ids.push_back(id.get<int>());
    max_id = std::max(max_id, id.get<int>());
  }
  // Two tokens with one id: id_to_token gives the later one, token_to_id finds both.
  id_to_entry_.assign(static_cast<size_t>(max_id + 1), -1);
  std::vector<std::pair<std::string_view, int>> entries;
  entries.reserve(entry_tokens_.size());
  for (size_t e = 0; e < entry_tokens_.size(); ++e) {
    id_to_entry_[entry_ids[e]] = static_cast<int>(e);
    entries.emplace_back(entry_tokens_[e], entry_ids[e]);
  }
  vocab_.build(entries);

  unk_token_ = spec.contains("unk_token") && !spec["unk_token"].is_null()
                   ? std::optional<std::string>(get_string(spec, "unk_token", where))
                   : std::nullopt;
  continuing_subword_prefix_ = get_string_or(spec, "continuing_subword_prefix", "", where);
  end_of_word_suffix_ = get_string_or(spec, "end_of_word_suffix", "", where);
  byte_fallback_ = get_bool_or(spec, "byte_fallback", false, where);
  fuse_unk_ = get_bool_or(spec, "fuse_unk", false, where);
  ignore_merges_ = get_bool_or(spec, "ignore_merges", false, where);

  const json& merges = require(spec, "merges", where);
  HACK_CHECK(merges.is_array(), "{}: expected an array", field(where, "merges"));
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto [left, right] = parse_merge(merges[i], i, where);
    const int left_id = vocab_.find(left);
    const int right_id = vocab_.find(right);
    HACK_CHECK(left_id >= 0, "{}.merges[{}]: token \"{}\" is not in the vocab", where, i, left);
    HACK_CHECK(right_id >= 0, "{}.merges[{}]: token \"{}\" is not in the vocab", where, i, right);
    HACK_CHECK(right.size() >= prefix_len, "{}.merges[{}]: \"{}\" is shorter than continuing_subword_prefix", where,
               i, right);
    const std::string merged = left + right.substr(prefix_len);
    const int new_id = vocab_.find(merged);
    HACK_CHECK(new_id >= 0, "{}.merges[{}]: merged token \"{}\" is not in the vocab", where, i, merged);
    merges_.insert(left_id, right_id, Merge{static_cast<int>(i), new_id});
  }

  bmp_char_id_.assign(0x10000, -1);
  for (const std::string& t : entry_tokens_) {
    if (t.empty() || t.size() > 3) continue;
    size_t pos = 0;
    const char32_t cp = next_code_point(t, pos);
    if (pos == t.size() && cp < 0x10000) bmp_char_id_[cp] = vocab_.find(t);
  }
  for (int b = 0; b < 256; ++b) byte_id_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));

  // SentencePiece-style vocabularies never merge across the start of a "▁" run: when no
  // merge joins a left part not ending in "▁" to a right part starting with it, BPE of a
  // long word equals BPE of its pieces cut there (merges never interact across a cut), and
  // the pieces are short enough to cache.
  split_at_metaspace_ = !ignore_merges_ && continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  for (size_t i = 0; i < merges.size() && split_at_metaspace_; ++i) {
    const auto [left, right] = parse_merge(merges[i], i, where);
    if (right.starts_with(kMetaspace) && !left.ends_with(kMetaspace)) split_at_metaspace_ = false;
  }
}

std::string_view BpeModel::symbol_text(std::string_view chars, bool is_first, bool is_last,
                                       BpeScratch& scratch) const {
  const bool add_prefix = !is_first && !continuing_subword_prefix_.empty();
  const bool add_suffix = is_last && !end_of_word_suffix_.empty();
  if (!add_prefix && !add_suffix) return chars;
  std::string& s = scratch.piece;
  s.clear();
  if (add_prefix) s.append(continuing_subword_prefix_);
  s.append(chars);
  if (add_suffix) s.append(end_of_word_suffix_);
  return s;
}

int BpeModel::symbol_id(std::string_view text) const {
  if (text.size() <= 3) {
    size_t pos = 0;
    const char32_t cp = next_code_point(text, pos);
    if (pos == text.size() && cp < 0x10000) return bmp_char_id_[cp];
  }
  return vocab_.find(text);
}

void BpeModel::tokenize(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const {
  if (word.empty()) return;
  if (split_at_metaspace_ && word.size() > WordCache::kMaxWordBytes) {
    // Cut before each "▁" that follows another character.
    size_t start = 0;
    for (size_t pos = word.find(kMetaspace, 1); pos != std::string_view::npos; pos = word.find(kMetaspace, pos + 1)) {
      if (word.substr(0, pos).ends_with(kMetaspace)) continue;
      tokenize_word(word.substr(start, pos - start), scratch, out);
      start = pos;
    }
    tokenize_word(word.substr(start), scratch, out);
    return;
  }
  tokenize_word(word, scratch, out);
}

void BpeModel::tokenize_word(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  uint64_t hash = 0;
  if (cacheable) {
    hash = hash_bytes(word);
    const std::span<const int> hit = scratch.cache.find(word, hash);
    if (!hit.empty()) {
      out.insert(out.end(), hit.begin(), hit.end());
      return;
    }
  }
  const size_t first = out.size();
  if (ignore_merges_) {
    const int id = vocab_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  merge_word(word, scratch, out);
  if (cacheable) scratch.cache.insert(word, hash, std::span<const int>(out).subspan(first));
}

void BpeModel::merge_word(std::string_view word, BpeScratch& scratch, std::vector<int>& out) const {
  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add_symbol = [&](int id, int len) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, len});
  };

  // Pending unknown run: (unk id, bytes), fused or flushed like HF's merge_word.
  int unk_id = -1, unk_len = 0;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    pos += static_cast<size_t>(utf8_seq_len(static_cast<unsigned char>(word[pos])));
    const std::string_view chars = word.substr(start, pos - start);
    const std::string_view text = symbol_text(chars, start == 0, pos >= word.size(), scratch);
    const int id = symbol_id(text);
    if (id >= 0) {
      if (unk_id >= 0) {
        add_symbol(unk_id, unk_len);
        unk_id = -1;
      }
      add_symbol(id, static_cast<int>(chars.size()));
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (unsigned char b : text) all_bytes = all_bytes && byte_id_[b] >= 0;
      if (all_bytes) {
        // HF adds these without flushing a pending unk first.
        for (unsigned char b : text) add_symbol(byte_id_[b], 1);
        continue;
      }
    }
    if (!unk_token_) continue;  // no unk token: the character is dropped
    const int unk = vocab_.find(*unk_token_);
    HACK_CHECK(unk >= 0, "tokenizer: unk_token \"{}\" is not in the vocab", *unk_token_);
    if (unk_id >= 0 && fuse_unk_) {
      unk_len += static_cast<int>(chars.size());
    } else {
      if (unk_id >= 0) add_symbol(unk_id, unk_len);
      unk_id = unk;
      unk_len = static_cast<int>(chars.size());
    }
  }
  if (unk_id >= 0) add_symbol(unk_id, unk_len);

  // Min-heap on (rank, pos).
  auto& heap = scratch.heap;
  heap.clear();
  const auto later = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = merges_.find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int>(i), m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int next_pos = cur.next;
    const BpeScratch::Symbol right = symbols[next_pos];
    // Skip entries made stale by an earlier merge.
    const Merge* m = merges_.find(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = merges_.find(symbols[cur.prev].id, cur.id)) {
        heap.push_back({pm->rank, cur.prev, pm->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (cur.next >= 0) {
      if (const Merge* nm = merges_.find(cur.id, symbols[cur.next].id)) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  for (const auto& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace hack::tok
