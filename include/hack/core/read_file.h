/// @file read_file.h
/// @brief Whole-file reads with errors that name the file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace hack {

/// The bytes of a file. Throws hack::Error "cannot read <what> <path>" when it is missing or
/// unreadable; `what` ("model config", "prompt file") says which file it is to the user.
std::string read_file(const std::filesystem::path& path, std::string_view what = "file");

}  // namespace hack
