/// @file mapped_file.h
/// @brief A read-only memory-mapped file (RAII).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>

namespace hack {

class MappedFile {
 public:
  /// Maps the whole file read-only. Throws hack::Error naming the path on failure.
  static std::shared_ptr<MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace hack
