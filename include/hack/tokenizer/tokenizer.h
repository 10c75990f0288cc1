/// @file tokenizer.h
/// @brief hack::Tokenizer: Hugging Face tokenizer.json (BPE) encode / decode, exactly as the
/// `tokenizers` library does it, plus hack::IncrementalDecoder for streaming output.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hack {

class GgufFile;  // core/gguf_file.h

/// One entry of tokenizer.json "added_tokens".
struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false;  ///< match only when not inside a word
  bool lstrip = false;       ///< absorb whitespace on the left
  bool rstrip = false;       ///< absorb whitespace on the right
  bool normalized = false;   ///< match against the normalized text
  bool special = false;      ///< dropped by decode(..., skip_special_tokens = true)
};

/// A chat template from tokenizer_config.json ("chat_template": a string, named "default",
/// or a list of {name, template}) or from chat_template.jinja beside it.
struct ChatTemplateSource {
  std::string name;
  std::string source;
};

/// A loaded tokenizer. Immutable after load; encode / decode are thread-safe.
///
/// Pipeline (HF tokenizers): added tokens are cut out of the raw text, the rest is
/// normalized, added tokens with normalized = true are cut out of that, the rest is
/// pre-tokenized and run through the BPE model; then the post-processor adds special
/// tokens. Supported: normalizers NFC NFD NFKC NFKD Prepend Replace Strip Lowercase
/// StripAccents ByteLevel Sequence; pre-tokenizers ByteLevel Split Metaspace Digits
/// Whitespace WhitespaceSplit Punctuation Sequence; model BPE; post-processors
/// TemplateProcessing ByteLevel RobertaProcessing BertProcessing Sequence; decoders
/// ByteLevel Metaspace ByteFallback Fuse Strip Replace BPEDecoder Sequence.
///
/// Special tokens on encode follow transformers: when tokenizer_config.json sets
/// add_bos_token or add_eos_token (or tokenizer.json has no post-processor), the
/// post-processor becomes "[bos] $A [eos]" as those flags say; otherwise tokenizer.json's
/// post-processor is used as is.
///
/// Other HF behaviours kept on purpose: added-token ids are assigned as HF deserializes
/// them (the vocab id when the content is in the vocab, else the next id past it; the
/// file's "id" fields are not trusted); a normalized added token matches, and decodes as,
/// its normalized content; Split regexes match as Oniguruma does (\s, \p{L}, \p{N} with
/// its Unicode tables) and Unicode normalization leaves characters newer than HF's tables
/// alone.
class Tokenizer {
 public:
  /// Loads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json,
  /// `dir`/special_tokens_map.json (special tokens the config lacks) and
  /// `dir`/chat_template.jinja (the "default" template). Throws hack::Error naming the file
  /// and JSON field on a missing file, malformed JSON, or an unsupported model / component.
  ///
  /// `dir` may instead be a GGUF file: its tokenizer.ggml.* metadata and
  /// tokenizer.chat_template (byte-level BPE, tokenizer.ggml.model "gpt2", with the
  /// pre-tokenizers gpt2, smollm and qwen2), read natively.
  static Tokenizer load(const std::filesystem::path& dir);
  /// Builds a tokenizer from the two files' contents ("" for no tokenizer_config.json).
  /// `origin` names the source in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json,
                             std::string origin = "<memory>");
  /// Builds a tokenizer from a GGUF file's metadata (see load).
  static Tokenizer from_gguf(const GgufFile& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Token ids of `text`. Invalid UTF-8 is first repaired (each maximal invalid subpart
  /// becomes U+FFFD). add_special_tokens: apply the post-processor (bos / eos).
  std::vector<int> encode(std::string_view text, bool add_special_tokens) const;
  /// Same, appending to `ids`.
  void encode_append(std::string_view text, bool add_special_tokens, std::vector<int>& ids) const;

  /// Text of `ids`. Ids without a token are skipped; skip_special_tokens drops added tokens
  /// marked special.
  std::string decode(std::span<const int> ids, bool skip_special_tokens) const;

  /// One past the largest token id (model vocab and added tokens).
  int vocab_size() const;
  /// Id of `token` (added tokens first, then the model vocab), or nullopt.
  std::optional<int> token_to_id(std::string_view token) const;
  /// Token string of `id` (what decode consumes), or nullopt.
  std::optional<std::string> id_to_token(int id) const;
  /// Whether decode(..., skip_special_tokens = true) drops `id`: HF checks the token string
  /// against the contents of the special added tokens.
  bool is_special(int id) const;
  /// Ids of all added tokens marked special, ascending.
  std::vector<int> special_ids() const;
  const std::vector<AddedToken>& added_tokens() const;

  /// From tokenizer_config.json (a string or {"content": ...}); "" / -1 when absent.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& unk_token() const;
  const std::string& pad_token() const;
  int bos_id() const;
  int eos_id() const;
  /// tokenizer_config.json add_bos_token / add_eos_token (false when absent).
  bool add_bos_token() const;
  bool add_eos_token() const;

  /// All chat templates, in file order ("default" first when it is a single string).
  const std::vector<ChatTemplateSource>& chat_templates() const;
  /// The template called `name`, or nullopt.
  std::optional<std::string> chat_template(std::string_view name = "default") const;
  /// tokenizer_config.json as text ("{}" when there is none), for callers that need more.
  const std::string& config_json() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Tokenizer build(std::string_view tokenizer_json, std::string_view config_json,
                         std::string_view special_tokens_map_json, std::string origin);
  friend class IncrementalDecoder;
  std::unique_ptr<Impl> impl_;
};

/// Streaming detokenizer: feed ids one at a time and get back only text that later ids
/// cannot change. The concatenation of every step() and the final finish() equals
/// tokenizer.decode(all ids, skip_special_tokens) exactly.
///
/// Text is held back while its tail may still change: an incomplete UTF-8 sequence
/// (ByteLevel), an open run of <0xNN> tokens (ByteFallback groups runs, and an invalid run
/// decodes as one U+FFFD per byte, so a run is released when a non-byte token closes it),
/// trailing characters a Strip decoder may remove. Keeps a reference to the tokenizer.
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  ~IncrementalDecoder();
  IncrementalDecoder(IncrementalDecoder&&) noexcept;
  IncrementalDecoder& operator=(IncrementalDecoder&&) noexcept;

  /// Adds `id`; returns the text it completes (often "", sometimes more than one token's).
  std::string step(int id);
  /// Ends the stream: returns whatever was held back. The decoder is then reset.
  std::string finish();
  /// Forgets everything fed so far.
  void reset();

 private:
  struct State;
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::unique_ptr<State> state_;
};

}  // namespace hack
