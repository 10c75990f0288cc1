#include "hack/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "hack/core/error.h"
#include "hack/core/gguf_file.h"
#include "hack/core/read_file.h"
#include "src/tokenizer/json_util.h"
#include "src/tokenizer/gguf_tokenizer.h"
#include "src/tokenizer/tokenizer_impl.h"
#include "src/tokenizer/utf8.h"

namespace hack {

using tok::json;

// ---- scratch pool ------------------------------------------------------------

namespace tok {

ScratchPool::Lease ScratchPool::acquire() {
  std::unique_ptr<Scratch> s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      s = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!s) {
    s = std::make_unique<Scratch>();
    s->pre.ensure_slots(static_cast<size_t>(slots_));
  }
  return Lease(*this, std::move(s));
}

void ScratchPool::release(std::unique_ptr<Scratch> s) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(s));
}

}  // namespace tok

// ---- loading -----------------------------------------------------------------

namespace {

json parse_json(std::string_view text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", name, e.what());
  }
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string special_token_text(const json& config, std::string_view key, const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return tok::get_string(*it, "content", tok::field(where, key));
  fail("{}: expected a string or {{\"content\": ...}}, got {}", tok::field(where, key), it->type_name());
}

tok::PostTemplate parse_template(const json& spec, const std::string& where) {
  const json& single = tok::require(spec, "single", where);
  HACK_CHECK(single.is_array(), "{}: expected an array", tok::field(where, "single"));
  const json empty = json::object();
  const json& specials = spec.contains("special_tokens") ? spec["special_tokens"] : empty;
  tok::PostTemplate items;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string at = fmt::format("{}.single[{}]", where, i);
    const json& piece = single[i];
    tok::TemplateItem item;
    if (piece.is_object() && piece.contains("Sequence")) {
      item.is_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name = tok::get_string(piece["SpecialToken"], "id", at + ".SpecialToken");
      const auto it = specials.find(name);
      HACK_CHECK(it != specials.end(), "{}: special token \"{}\" is not in {}.special_tokens", at, name, where);
      const json& ids = tok::require(*it, "ids", tok::field(tok::field(where, "special_tokens"), name));
      HACK_CHECK(ids.is_array(), "{}.special_tokens.{}.ids: expected an array", where, name);
      for (const json& id : ids) {
        HACK_CHECK(id.is_number_integer(), "{}.special_tokens.{}.ids: expected integers", where, name);
        item.ids.push_back(id.get<int>());
      }
    } else {
      fail("{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", at);
    }
    items.push_back(std::move(item));
  }
  return items;
}

// [cls] $A [sep] for RobertaProcessing / BertProcessing ("cls": ["<s>", 0]).
tok::PostTemplate parse_cls_sep(const json& spec, const std::string& where) {
  auto id_of = [&](std::string_view key) {
    const json& v = tok::require(spec, key, where);
    HACK_CHECK(v.is_array() && v.size() == 2 && v[1].is_number_integer(), "{}: expected [\"token\", id]",
               tok::field(where, key));
    return v[1].get<int>();
  };
  return {tok::TemplateItem{false, {id_of("cls")}}, tok::TemplateItem{true, {}},
          tok::TemplateItem{false, {id_of("sep")}}};
}

void parse_post_processor(const json& spec, const std::string& where, std::vector<tok::PostTemplate>& out) {
  if (spec.is_null()) return;
  const std::string type = tok::get_type(spec, where);
  if (type == "TemplateProcessing") {
    out.push_back(parse_template(spec, where));
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    out.push_back(parse_cls_sep(spec, where));
  } else if (type == "ByteLevel") {
    // Offsets only.
  } else if (type == "Sequence") {
    const json& list = tok::require(spec, "processors", where);
    HACK_CHECK(list.is_array(), "{}: expected an array", tok::field(where, "processors"));
    for (size_t i = 0; i < list.size(); ++i) {
      parse_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), out);
    }
  } else {
    fail("{}: unsupported post-processor type \"{}\" (supported: TemplateProcessing, ByteLevel, RobertaProcessing, "
         "BertProcessing, Sequence)",
         where, type);
  }
}

std::vector<AddedToken> parse_added_tokens(const json& root, const std::string& file) {
  std::vector<AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  HACK_CHECK(it->is_array(), "{}: added_tokens: expected an array", file);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string where = fmt::format("{}: added_tokens[{}]", file, i);
    AddedToken token;
    const json& id = tok::require(t, "id", where);
    HACK_CHECK(id.is_number_integer() && id.get<long long>() >= 0 && id.get<long long>() < (1ll << 30),
               "{}.id: expected a non-negative integer", where);
    token.id = id.get<int>();
    token.content = tok::get_string(t, "content", where);
    token.single_word = tok::get_bool_or(t, "single_word", false, where);
    token.lstrip = tok::get_bool_or(t, "lstrip", false, where);
    token.rstrip = tok::get_bool_or(t, "rstrip", false, where);
    token.special = tok::get_bool_or(t, "special", false, where);
    token.normalized = tok::get_bool_or(t, "normalized", !token.special, where);
    HACK_CHECK(tok::valid_utf8_prefix(token.content) == token.content.size(), "{}.content: not valid UTF-8", where);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  if (is_gguf_file(dir)) return from_gguf(GgufFile::open(dir));
  const std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  HACK_CHECK(std::filesystem::is_regular_file(tokenizer_path), "tokenizer: {} not found", tokenizer_path.string());
  auto optional_file = [&](const char* name) {
    const std::filesystem::path path = dir / name;
    return std::filesystem::is_regular_file(path) ? read_file(path) : std::string();
  };
  Tokenizer t = build(read_file(tokenizer_path, "tokenizer"), optional_file("tokenizer_config.json"),
                      optional_file("special_tokens_map.json"), dir.string());
  const std::string jinja = optional_file("chat_template.jinja");
  if (!jinja.empty()) {
    // transformers prefers chat_template.jinja to the config's template.
    auto& templates = t.impl_->chat_templates;
    auto it = std::find_if(templates.begin(), templates.end(),
                           [](const ChatTemplateSource& c) { return c.name == "default"; });
    if (it != templates.end()) {
      it->source = jinja;
    } else {
      templates.insert(templates.begin(), ChatTemplateSource{"default", jinja});
    }
  }
  return t;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  const tok::GgufTokenizerJson j = tok::gguf_tokenizer_json(file);
  return build(j.tokenizer_json, j.config_json, "", file.source());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json, std::string origin) {
  return build(tokenizer_json, config_json, "", std::move(origin));
}

Tokenizer Tokenizer::build(std::string_view tokenizer_json, std::string_view config_json,
                           std::string_view special_tokens_map_json, std::string origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  const std::string file = origin == "<memory>" ? "tokenizer.json" : origin + "/tokenizer.json";
  const std::string config_file = origin == "<memory>" ? "tokenizer_config.json" : origin + "/tokenizer_config.json";

  const json root = parse_json(tokenizer_json, file);
  HACK_CHECK(root.is_object(), "{}: expected a JSON object at the top level", file);

  // Model.
  const json& model = tok::require(root, "model", file);
  const std::string model_where = file + ": model";
  HACK_CHECK(model.is_object(), "{}: expected an object", model_where);
  const std::string model_type =
      model.contains("type") ? tok::get_string(model, "type", model_where) : (model.contains("merges") ? "BPE" : "");
  HACK_CHECK(model_type == "BPE", "{}.type: unsupported model type \"{}\" (only BPE is supported)", model_where,
             model_type);
  impl->model = std::make_unique<tok::BpeModel>(model, model_where);

  // Pipeline components.
  impl->normalizer =
      tok::make_normalizer(root.contains("normalizer") ? root["normalizer"] : json(), file + ": normalizer");
  int slots = 0;
  impl->pre_tokenizer = tok::make_pre_tokenizer(root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json(),
                                                file + ": pre_tokenizer", &slots);
  impl->pool = std::make_unique<tok::ScratchPool>(slots);
  impl->decoder =
      std::make_unique<tok::DecoderPipeline>(root.contains("decoder") ? root["decoder"] : json(), file + ": decoder");
  const json post = root.contains("post_processor") ? root["post_processor"] : json();
  parse_post_processor(post, file + ": post_processor", impl->post_processor);

  // Added tokens; normalized ones match (and decode) in their normalized form. Ids are
  // assigned the way HF deserializes them (the "id" fields are not trusted): a token already
  // in the model vocab keeps that id, a new one gets the next id past the vocab.
  std::vector<AddedToken> parsed = parse_added_tokens(root, file);
  std::vector<AddedToken> added;
  std::vector<std::string> normalized_contents;
  {
    auto scratch = impl->pool->acquire();
    int next_id = static_cast<int>(impl->model->vocab_entries());
    std::unordered_map<std::string, size_t> index_of;
    for (AddedToken& token : parsed) {
      if (token.content.empty()) continue;
      std::string normalized = token.content;
      if (token.normalized && impl->normalizer) impl->normalizer->normalize(normalized, scratch->pre.regex);
      const auto seen = index_of.find(token.content);
      if (seen != index_of.end()) {
        // A repeated content keeps its id and takes the later flags.
        token.id = added[seen->second].id;
        added[seen->second] = token;
        normalized_contents[seen->second] = normalized;
        continue;
      }
      const int model_id = impl->model->token_to_id(token.normalized ? normalized : token.content);
      token.id = model_id >= 0 ? model_id : next_id++;
      index_of.emplace(token.content, added.size());
      added.push_back(std::move(token));
      normalized_contents.push_back(std::move(normalized));
    }
  }
  impl->added_id_strings.resize(added.size());
  for (size_t i = 0; i < added.size(); ++i) {
    impl->added_by_content.emplace(added[i].content, added[i].id);
    impl->added_id_strings[i] = added[i].normalized ? normalized_contents[i] : added[i].content;
  }
  impl->added = tok::AddedVocabulary(std::move(added), normalized_contents);

  // Id tables for decode.
  int limit = impl->model->id_limit();
  for (const AddedToken& t : impl->added.tokens()) limit = std::max(limit, t.id + 1);
  impl->vocab_size = limit;
  impl->id_strings.assign(static_cast<size_t>(limit), nullptr);
  for (int id = 0; id < impl->model->id_limit(); ++id) impl->id_strings[id] = impl->model->id_to_token(id);
  std::unordered_set<std::string> special_contents;
  const auto& tokens = impl->added.tokens();
  for (size_t i = 0; i < tokens.size(); ++i) {
    impl->id_strings[tokens[i].id] = &impl->added_id_strings[i];
    if (tokens[i].special) special_contents.insert(tokens[i].content);
  }
  impl->id_is_special.assign(static_cast<size_t>(limit), 0);
  for (int id = 0; id < limit; ++id) {
    // HF decides by the token string, so a normalized special token whose normalized form
    // differs from its content is not skipped.
    if (impl->id_strings[id] && special_contents.count(*impl->id_strings[id])) impl->id_is_special[id] = 1;
  }

  Tokenizer t(std::move(impl));
  Impl& im = *t.impl_;

  // tokenizer_config.json, with special tokens it lacks from special_tokens_map.json.
  const std::string map_file =
      origin == "<memory>" ? "special_tokens_map.json" : origin + "/special_tokens_map.json";
  const json special_map = special_tokens_map_json.empty() ? json::object()
                                                           : parse_json(special_tokens_map_json, map_file);
  HACK_CHECK(special_map.is_object(), "{}: expected a JSON object at the top level", map_file);
  auto special_token = [&](const json& config, std::string_view key) {
    std::string text = special_token_text(config, key, config_file);
    return text.empty() ? special_token_text(special_map, key, map_file) : text;
  };
  {
    const json config = config_json.empty() ? json::object() : parse_json(config_json, config_file);
    HACK_CHECK(config.is_object(), "{}: expected a JSON object at the top level", config_file);
    if (!config_json.empty()) im.config_json = std::string(config_json);
    im.bos_token = special_token(config, "bos_token");
    im.eos_token = special_token(config, "eos_token");
    im.unk_token = special_token(config, "unk_token");
    im.pad_token = special_token(config, "pad_token");
    im.add_bos_token = tok::get_bool_or(config, "add_bos_token", false, config_file);
    im.add_eos_token = tok::get_bool_or(config, "add_eos_token", false, config_file);
    const bool explicit_flags = config.contains("add_bos_token") || config.contains("add_eos_token");
    if (config.contains("chat_template") && !config["chat_template"].is_null()) {
      const json& ct = config["chat_template"];
      if (ct.is_string()) {
        im.chat_templates.push_back({"default", ct.get<std::string>()});
      } else if (ct.is_array()) {
        for (size_t i = 0; i < ct.size(); ++i) {
          const std::string at = fmt::format("{}: chat_template[{}]", config_file, i);
          im.chat_templates.push_back({tok::get_string(ct[i], "name", at), tok::get_string(ct[i], "template", at)});
        }
      } else {
        fail("{}: chat_template: expected a string or a list of {{name, template}}", config_file);
      }
    }
    im.bos_id = im.bos_token.empty() ? -1 : t.token_to_id(im.bos_token).value_or(-1);
    im.eos_id = im.eos_token.empty() ? -1 : t.token_to_id(im.eos_token).value_or(-1);
    // transformers rebuilds the post-processor from the flags when they are given.
    if (explicit_flags || post.is_null()) {
      tok::PostTemplate tmpl;
      if (im.add_bos_token && im.bos_id >= 0) tmpl.push_back({false, {im.bos_id}});
      tmpl.push_back({true, {}});
      if (im.add_eos_token && im.eos_id >= 0) tmpl.push_back({false, {im.eos_id}});
      im.post_processor.assign(1, std::move(tmpl));
    }
  }
  return t;
}

// ---- encode ------------------------------------------------------------------

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> ids;
  encode_append(text, add_special_tokens, ids);
  return ids;
}

void Tokenizer::encode_append(std::string_view text, bool add_special_tokens, std::vector<int>& ids) const {
  const Impl& im = *impl_;
  auto scratch = im.pool->acquire();
  std::string_view input = text;
  if (tok::valid_utf8_prefix(text) != text.size()) {
    scratch->repaired.clear();
    tok::append_utf8_lossy(scratch->repaired, text);
    input = scratch->repaired;
  }
  const size_t first = ids.size();

  auto tokenize_piece = [&](std::string_view piece, bool at_input_start) {
    if (!im.pre_tokenizer) {
      im.model->tokenize(piece, scratch->bpe, ids);
      return;
    }
    im.pre_tokenizer->pre_tokenize(piece, at_input_start, scratch->pre, [&](std::string_view word, bool) {
      im.model->tokenize(word, scratch->bpe, ids);
    });
  };

  im.added.split(input, false, scratch->raw_splits);
  for (const tok::AddedSplit& split : scratch->raw_splits) {
    if (split.token_id >= 0) {
      ids.push_back(split.token_id);
      continue;
    }
    if (split.end <= split.start) continue;
    std::string_view piece = input.substr(split.start, split.end - split.start);
    const bool at_input_start = split.start == 0;
    if (im.normalizer) {
      scratch->normalized.assign(piece);
      im.normalizer->normalize(scratch->normalized, scratch->pre.regex);
      piece = scratch->normalized;
    }
    if (piece.empty()) continue;
    im.added.split(piece, true, scratch->normalized_splits);
    for (const tok::AddedSplit& sub : scratch->normalized_splits) {
      if (sub.token_id >= 0) {
        ids.push_back(sub.token_id);
      } else if (sub.end > sub.start) {
        tokenize_piece(piece.substr(sub.start, sub.end - sub.start), at_input_start && sub.start == 0);
      }
    }
  }

  if (!add_special_tokens) return;
  for (const tok::PostTemplate& tmpl : im.post_processor) {
    std::vector<int> body(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end());
    ids.resize(first);
    for (const tok::TemplateItem& item : tmpl) {
      if (item.is_sequence) {
        ids.insert(ids.end(), body.begin(), body.end());
      } else {
        ids.insert(ids.end(), item.ids.begin(), item.ids.end());
      }
    }
  }
}

// ---- decode ------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    const std::string* t = im.token_string(id);
    if (!t || (skip_special_tokens && im.id_is_special[id])) continue;
    tokens.push_back(*t);
  }
  auto scratch = im.pool->acquire();
  tok::DecodeStreamState state = im.decoder->initial_state();
  return im.decoder->decode(tokens, state, true, nullptr, scratch->pre.regex);
}

// ---- accessors ---------------------------------------------------------------

int Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return it->second;
  const int id = impl_->model->token_to_id(token);
  return id >= 0 ? std::optional<int>(id) : std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int id) const {
  const std::string* t = impl_->token_string(id);
  return t ? std::optional<std::string>(*t) : std::nullopt;
}

bool Tokenizer::is_special(int id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->id_is_special[id];
}

std::vector<int> Tokenizer::special_ids() const {
  std::vector<int> ids;
  for (const AddedToken& t : impl_->added.tokens())
    if (t.special) ids.push_back(t.id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added.tokens(); }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }
const std::string& Tokenizer::unk_token() const { return impl_->unk_token; }
const std::string& Tokenizer::pad_token() const { return impl_->pad_token; }
int Tokenizer::bos_id() const { return impl_->bos_id; }
int Tokenizer::eos_id() const { return impl_->eos_id; }
bool Tokenizer::add_bos_token() const { return impl_->add_bos_token; }
bool Tokenizer::add_eos_token() const { return impl_->add_eos_token; }
const std::vector<ChatTemplateSource>& Tokenizer::chat_templates() const { return impl_->chat_templates; }
const std::string& Tokenizer::config_json() const { return impl_->config_json; }

std::optional<std::string> Tokenizer::chat_template(std::string_view name) const {
  for (const auto& c : impl_->chat_templates)
    if (c.name == name) return c.source;
  return std::nullopt;
}

}  // namespace hack
