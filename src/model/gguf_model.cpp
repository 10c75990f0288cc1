// --model PATH: a directory or a GGUF file, both loaded natively (no conversion step), and the
// names and neighbour files that follow from the path.
#include "hack/model/gguf_model.h"

#include "hack/core/error.h"

namespace hack {

namespace fs = std::filesystem;

fs::path resolve_model_path(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  HACK_CHECK(fs::exists(st), "--model {}: no such file or directory", path.string());
  if (fs::is_directory(st)) return path;
  HACK_CHECK(is_gguf_file(path),
             "--model {}: not a model directory (config.json, safetensors, tokenizer.json) nor a GGUF file",
             path.string());
  return path;
}

std::string model_path_name(const fs::path& path) {
  const fs::path p = path.lexically_normal();
  if (is_gguf_file(p) && p.extension() == ".gguf") return p.stem().string();
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

void resolve_model_flags(std::string& model, std::string& served_name) {
  if (model.empty()) return;
  if (served_name.empty()) served_name = model_path_name(model);
  model = resolve_model_path(model).string();
}

fs::path model_artifact_path(const fs::path& model, std::string_view name) {
  if (is_gguf_file(model)) return fs::path(model.string() + "." + std::string(name));
  return model / name;
}

}  // namespace hack
