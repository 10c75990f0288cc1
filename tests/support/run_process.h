// Runs a command line through the shell and captures its exit code, stdout and stderr:
// for e2e tests of the CLIs as a user runs them.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace hack::test {

struct ProcessResult {
  int exit_code = -1;  ///< -1 when the process did not exit normally
  std::string out;     ///< stdout
  std::string err;     ///< stderr
};

inline ProcessResult run_process(const std::string& command) {
  // ctest runs test cases as parallel processes, and tests call this from several threads:
  // one stderr file per process and call.
  static std::atomic<int> call{0};
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() /
      ("hack_e2e_" + std::to_string(::getpid()) + "_" + std::to_string(call++) + ".txt");
  ProcessResult r;
  FILE* p = ::popen((command + " 2>" + err_path.string()).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_path);
  return r;
}

/// `text` as one single-quoted shell word.
inline std::string shell_quote(const std::string& text) {
  std::string q = "'";
  for (char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// A file in the temp directory holding `text`, removed when it goes out of scope.
struct TempFile {
  TempFile(const std::string& name, const std::string& text)
      : path(std::filesystem::temp_directory_path() / ("hack_e2e_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  /// The path as one shell word.
  std::string arg() const { return shell_quote(path.string()); }
  std::filesystem::path path;
};

}  // namespace hack::test
