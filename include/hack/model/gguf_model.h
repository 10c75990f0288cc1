/// @file gguf_model.h
/// @brief `--model PATH`: a Hugging Face directory or a GGUF file, both read natively
/// (Model::load, Tokenizer::load, load_model_config, find_chat_template take either). A GGUF
/// file is served under its name without ".gguf"; what lies beside a model (an FDC artifact, a
/// HACK bit allocation) is `DIR/NAME` for a directory and `FILE.gguf.NAME` for a GGUF file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "hack/core/gguf_file.h"  // is_gguf_file

namespace hack {

/// PATH itself when it is a directory or a GGUF file. Throws hack::Error when PATH does not
/// exist or is a file but not a GGUF.
std::filesystem::path resolve_model_path(const std::filesystem::path& path);

/// The name a model path is served under: a directory's name, a GGUF file's name without
/// its ".gguf" (models/qwen.gguf -> "qwen").
std::string model_path_name(const std::filesystem::path& path);

/// A `--model` / `--served-model-name` pair as loaded: `model` checked by resolve_model_path,
/// and an empty `served_name` the path's model_path_name. An empty `model` is left.
void resolve_model_flags(std::string& model, std::string& served_name);

/// Where the file `name` (fdc.safetensors, hack_kv.json) beside the model `model` lies:
/// model/name for a directory, model.name for a GGUF file (models/smol.gguf.fdc.safetensors).
std::filesystem::path model_artifact_path(const std::filesystem::path& model, std::string_view name);

}  // namespace hack
