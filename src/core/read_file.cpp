#include "hack/core/read_file.h"

#include <fstream>
#include <sstream>

#include "hack/core/error.h"

namespace hack {

std::string read_file(const std::filesystem::path& path, std::string_view what) {
  HACK_CHECK(!std::filesystem::is_directory(path), "cannot read {} {}: it is a directory", what, path.string());
  std::ifstream in(path, std::ios::binary);
  HACK_CHECK(in.good(), "cannot read {} {}: no such file or no permission", what, path.string());
  std::ostringstream text;
  text << in.rdbuf();
  HACK_CHECK(!in.bad(), "cannot read {} {}: I/O error", what, path.string());
  return text.str();
}

}  // namespace hack
