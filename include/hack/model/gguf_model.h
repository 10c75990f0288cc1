/// @file gguf_model.h
/// @brief `--model FILE.gguf`: a GGUF file stands for the Hugging Face directory that
/// scripts/gguf_to_hf.py makes of it (llama and qwen2 architectures; anything else is refused
/// by the converter, by name). The directory is written once, beside the file, as
/// `FILE.gguf.hf/`, and reused while the GGUF's size and modification time are those recorded
/// in its `gguf_source.json`; processes started together (router, prefill, decode) take a
/// lock (`FILE.gguf.hf.lock`), so one converts and the others wait for it.
///
/// The converter is found at $HACK_GGUF_CONVERTER, else scripts/gguf_to_hf.py of the source
/// tree this binary was built from, and run with $PYTHON (default python3), which needs numpy
/// and gguf (scripts/requirements-test.txt).
#pragma once

#include <filesystem>
#include <string>

#include "hack/core/gguf_file.h"  // is_gguf_file

namespace hack {

/// The directory `--model PATH` loads: PATH when it is a directory; for a GGUF file, its
/// converted directory (converting first when that is missing or stale). Throws hack::Error
/// when PATH does not exist, is a file but not a GGUF, or the conversion fails (the message
/// then carries the converter's own, e.g. "architecture 'phi3' is not supported").
std::filesystem::path resolve_model_path(const std::filesystem::path& path);

/// The name a model path is served under: a directory's name, a GGUF file's name without
/// its ".gguf" (models/qwen.gguf -> "qwen").
std::string model_path_name(const std::filesystem::path& path);

/// A `--model` / `--served-model-name` pair as loaded: `model` becomes resolve_model_path's
/// directory, and an empty `served_name` the path's model_path_name. An empty `model` is left.
void resolve_model_flags(std::string& model, std::string& served_name);

}  // namespace hack
