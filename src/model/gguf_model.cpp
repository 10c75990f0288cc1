// --model FILE.gguf: converted once by scripts/gguf_to_hf.py into FILE.gguf.hf/ (see
// gguf_model.h). The conversion is a child process (Python: numpy + gguf dequantize the
// K-quants), written into a temporary directory and renamed into place, so a killed run never
// leaves a half model; a stamp (gguf_source.json) ties the directory to the file's size and
// modification time.
#include "hack/model/gguf_model.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <string_view>
#include <vector>

#include "hack/core/error.h"

extern char** environ;

namespace hack {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStampFile = "gguf_source.json";
// What a converted directory must hold to be used (the files gguf_to_hf.py writes).
constexpr std::array<const char*, 5> kConvertedFiles = {"config.json", "model.safetensors", "tokenizer.json",
                                                        "tokenizer_config.json", "generation_config.json"};

fs::path converted_dir(const fs::path& gguf) { return fs::path(gguf.string() + ".hf"); }

// The stamp that says which file a converted directory came from.
nlohmann::json source_stamp(const fs::path& gguf) {
  struct stat st {};
  HACK_CHECK(::stat(gguf.c_str(), &st) == 0, "{}: {}", gguf.string(), std::strerror(errno));
  return {{"gguf", fs::absolute(gguf).lexically_normal().string()},
          {"size_bytes", static_cast<int64_t>(st.st_size)},
          {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}};
}

bool converted_is_current(const fs::path& dir, const nlohmann::json& stamp) {
  for (const char* f : kConvertedFiles) {
    std::error_code ec;
    if (fs::file_size(dir / f, ec) == 0 || ec) return false;
  }
  std::ifstream in(dir / kStampFile);
  if (!in) return false;
  const nlohmann::json have = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !have.is_discarded() && have.value("size_bytes", nlohmann::json()) == stamp["size_bytes"] &&
         have.value("mtime_ns", nlohmann::json()) == stamp["mtime_ns"];
}

fs::path find_converter() {
  if (const char* env = std::getenv("HACK_GGUF_CONVERTER"); env != nullptr && *env != '\0') {
    HACK_CHECK(fs::is_regular_file(env), "HACK_GGUF_CONVERTER={} is not a file", env);
    return env;
  }
  const fs::path built_from = fs::path(HACK_SCRIPTS_DIR) / "gguf_to_hf.py";
  HACK_CHECK(fs::is_regular_file(built_from),
             "cannot convert a GGUF file: the converter {} is missing (set HACK_GGUF_CONVERTER to "
             "scripts/gguf_to_hf.py, or convert it yourself: python3 scripts/gguf_to_hf.py FILE.gguf DIR)",
             built_from.string());
  return built_from;
}

// Runs argv (argv[0] looked up in PATH) with stdout and stderr captured; returns the exit
// status (or 128 + signal) and the output.
int run_captured(const std::vector<std::string>& args, std::string& output) {
  int fds[2];
  HACK_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "pipe: {}", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (spawned != 0) {
    ::close(fds[0]);
    fail("cannot run {}: {} (set PYTHON to a python3 with numpy and gguf)", args[0], std::strerror(spawned));
  }
  std::array<char, 4096> buf;
  for (ssize_t n; (n = ::read(fds[0], buf.data(), buf.size())) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    output.append(buf.data(), static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// An exclusive flock on FILE.gguf.hf.lock for as long as it lives.
class ConversionLock {
 public:
  explicit ConversionLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    HACK_CHECK(fd_ >= 0, "cannot create {}: {} (the GGUF's directory must be writable to convert it beside the "
               "file; or convert it yourself: python3 scripts/gguf_to_hf.py FILE.gguf DIR)",
               path.string(), std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~ConversionLock() { ::close(fd_); }  // closing releases the lock
  ConversionLock(const ConversionLock&) = delete;
  ConversionLock& operator=(const ConversionLock&) = delete;

 private:
  int fd_ = -1;
};

void convert(const fs::path& gguf, const fs::path& dir, const nlohmann::json& stamp) {
  const fs::path converter = find_converter();
  const char* python = std::getenv("PYTHON");
  const fs::path tmp = fs::path(dir.string() + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp);
  spdlog::info("converting {} into {} (once; reused while the file is unchanged)", gguf.string(), dir.string());
  const auto t0 = std::chrono::steady_clock::now();
  std::string output;
  const int status = run_captured(
      {python != nullptr && *python != '\0' ? python : "python3", converter.string(), gguf.string(), tmp.string()},
      output);
  if (status != 0) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
    constexpr size_t kTail = 2000;  // a Python traceback's end says what failed
    if (output.size() > kTail) output = "..." + output.substr(output.size() - kTail);
    fail("{}: converting it with {} failed (exit status {}): {}", gguf.string(), converter.string(), status,
         output.empty() ? "no output" : output);
  }
  {
    std::ofstream out(tmp / kStampFile);
    out << stamp.dump(1) << "\n";
    HACK_CHECK(out.good(), "cannot write {}", (tmp / kStampFile).string());
  }
  fs::remove_all(dir);
  fs::rename(tmp, dir);
  spdlog::info("converted {} in {:.1f} s", gguf.string(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

fs::path resolve_model_path(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  HACK_CHECK(fs::exists(st), "--model {}: no such file or directory", path.string());
  if (fs::is_directory(st)) return path;
  HACK_CHECK(is_gguf_file(path),
             "--model {}: not a model directory (config.json, safetensors, tokenizer.json) nor a GGUF file",
             path.string());
  const fs::path dir = converted_dir(path);
  const nlohmann::json stamp = source_stamp(path);
  if (converted_is_current(dir, stamp)) return dir;
  const ConversionLock lock(fs::path(dir.string() + ".lock"));
  if (!converted_is_current(dir, stamp)) convert(path, dir, stamp);  // another process may have done it
  return dir;
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

}  // namespace hack
