// Tokenizer::Impl: the loaded pipeline, shared by tokenizer.cpp and
// incremental_decoder.cpp.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hack/tokenizer/tokenizer.h"
#include "src/tokenizer/added_vocabulary.h"
#include "src/tokenizer/bpe_model.h"
#include "src/tokenizer/decoder.h"
#include "src/tokenizer/normalizer.h"
#include "src/tokenizer/pre_tokenizer.h"

namespace hack {

namespace tok {

/// Working memory of one encode / decode call; pooled so steady-state calls do not allocate.
struct Scratch {
  PreTokenizeScratch pre;
  BpeScratch bpe;
  std::vector<AddedSplit> raw_splits, normalized_splits;
  std::string normalized;
  std::string repaired;
};

class ScratchPool {
 public:
  class Lease {
   public:
    Lease(ScratchPool& pool, std::unique_ptr<Scratch> s) : pool_(pool), scratch_(std::move(s)) {}
    ~Lease() { pool_.release(std::move(scratch_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Scratch& operator*() { return *scratch_; }
    Scratch* operator->() { return scratch_.get(); }

   private:
    ScratchPool& pool_;
    std::unique_ptr<Scratch> scratch_;
  };

  explicit ScratchPool(int pre_tokenizer_slots) : slots_(pre_tokenizer_slots) {}
  Lease acquire();

 private:
  void release(std::unique_ptr<Scratch> s);
  int slots_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Scratch>> free_;
};

/// A post-processor step for single sequences: the template's items in order.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int> ids;  // the special token's ids when !is_sequence
};
using PostTemplate = std::vector<TemplateItem>;

}  // namespace tok

struct Tokenizer::Impl {
  std::string origin;  // directory or "<memory>", for messages

  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::BpeModel> model;
  tok::AddedVocabulary added;
  std::unique_ptr<tok::DecoderPipeline> decoder;
  std::vector<tok::PostTemplate> post_processor;  // applied in order
  std::unique_ptr<tok::ScratchPool> pool;

  std::unordered_map<std::string, int> added_by_content;
  std::vector<std::string> added_id_strings;  // parallel to added.tokens(): what decode sees
  std::vector<const std::string*> id_strings;  // [id] -> token string, null when none
  std::vector<uint8_t> id_is_special;          // [id] -> decode skips it with skip_special_tokens
  int vocab_size = 0;

  std::string bos_token, eos_token, unk_token, pad_token;
  int bos_id = -1, eos_id = -1;
  bool add_bos_token = false, add_eos_token = false;
  std::vector<ChatTemplateSource> chat_templates;
  std::string config_json = "{}";

  const std::string* token_string(int id) const {
    return id >= 0 && id < static_cast<int>(id_strings.size()) ? id_strings[id] : nullptr;
  }
};

}  // namespace hack
