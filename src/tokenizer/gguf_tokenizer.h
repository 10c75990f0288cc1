// Internal: a GGUF file's tokenizer metadata as the tokenizer.json and tokenizer_config.json
// it stands for (src/tokenizer/gguf_tokenizer.cpp), which Tokenizer::build then parses like
// any other, so both sources get the same checks.
#pragma once

#include <string>

#include "hack/core/gguf_file.h"

namespace hack::tok {

struct GgufTokenizerJson {
  std::string tokenizer_json;
  std::string config_json;
};

/// Throws hack::Error naming the key for an unsupported tokenizer model, pre-tokenizer or
/// setting, or malformed vocabulary / merges.
GgufTokenizerJson gguf_tokenizer_json(const GgufFile& file);

}  // namespace hack::tok
