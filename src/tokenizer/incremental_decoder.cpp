// IncrementalDecoder: decodes the window of ids since the last point where the decoder
// pipeline had nothing held back, with the stream state of everything before it, and emits
// the part of the window's text not emitted yet. A window ends (its state is committed)
// as soon as no step withholds a tail, so windows stay a few tokens long.
#include "hack/tokenizer/tokenizer.h"

#include "src/tokenizer/tokenizer_impl.h"

namespace hack {

struct IncrementalDecoder::State {
  std::vector<int> window;             // ids since the last commit
  tok::DecodeStreamState committed;    // stream state before the window
  size_t emitted = 0;                  // bytes of the window's text already returned
  std::vector<std::string> tokens;     // scratch
};

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens), state_(std::make_unique<State>()) {
  reset();
}

IncrementalDecoder::~IncrementalDecoder() = default;
IncrementalDecoder::IncrementalDecoder(IncrementalDecoder&&) noexcept = default;
IncrementalDecoder& IncrementalDecoder::operator=(IncrementalDecoder&&) noexcept = default;

void IncrementalDecoder::reset() {
  state_->window.clear();
  state_->committed = tokenizer_->impl_->decoder->initial_state();
  state_->emitted = 0;
}

std::string IncrementalDecoder::step(int id) {
  const Tokenizer::Impl& im = *tokenizer_->impl_;
  if (!im.token_string(id) || (skip_special_tokens_ && im.id_is_special[id])) return {};
  State& s = *state_;
  s.window.push_back(id);
  s.tokens.clear();
  for (int w : s.window) s.tokens.push_back(*im.token_string(w));
  tok::DecodeStreamState next = s.committed;
  bool held_back = false;
  std::string text;
  {
    auto scratch = im.pool->acquire();
    text = im.decoder->decode(s.tokens, next, false, &held_back, scratch->pre.regex);
  }
  // The window's text only grows while the window does (each step withholds exactly what
  // could still change), so what was emitted is a prefix of it.
  std::string out = text.size() > s.emitted ? text.substr(s.emitted) : std::string();
  if (held_back) {
    s.emitted = std::max(s.emitted, text.size());
  } else {
    s.committed = std::move(next);
    s.window.clear();
    s.emitted = 0;
  }
  return out;
}

std::string IncrementalDecoder::finish() {
  const Tokenizer::Impl& im = *tokenizer_->impl_;
  State& s = *state_;
  std::string out;
  if (!s.window.empty()) {
    s.tokens.clear();
    for (int w : s.window) s.tokens.push_back(*im.token_string(w));
    tok::DecodeStreamState next = s.committed;
    auto scratch = im.pool->acquire();
    const std::string text = im.decoder->decode(s.tokens, next, true, nullptr, scratch->pre.regex);
    if (text.size() > s.emitted) out = text.substr(s.emitted);
  }
  reset();
  return out;
}

}  // namespace hack
