// A daemon started for an e2e test: fork/exec with extra environment, stdout read until
// its "ready" line, stderr kept in a temp file for failure messages; SIGTERM (then SIGKILL)
// when it goes out of scope.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace hack::test {

class DaemonProcess {
 public:
  /// Starts argv[0] with argv and `env` (NAME=value entries added to ours, replacing ours of
  /// the same name), then waits up to timeout_s for a stdout line containing "ready".
  /// Throws std::runtime_error with the daemon's stderr when it exits or stays silent.
  DaemonProcess(std::vector<std::string> argv, std::vector<std::string> env = {}, double timeout_s = 60) {
    static std::atomic<int> counter{0};
    err_path_ = std::filesystem::temp_directory_path() /
                ("hack_daemon_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".log");
    // Everything the child needs is built before fork (only async-signal-safe calls after).
    // getenv() takes the first NAME= entry, so ours of the same name must go.
    auto name_of = [](const std::string& entry) { return entry.substr(0, entry.find('=') + 1); };
    std::vector<std::string> env_all;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      const bool replaced =
          std::any_of(env.begin(), env.end(), [&](const std::string& x) { return name_of(x) == name_of(entry); });
      if (!replaced) env_all.push_back(entry);
    }
    for (const std::string& e : env) env_all.push_back(e);
    std::vector<char*> envp, args;
    for (std::string& e : env_all) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const std::string err_file = err_path_.string();
    // Close-on-exec: a process started meanwhile by another thread must not inherit the
    // write end (the daemon's exit would then never read as EOF).
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(out_pipe[1], 1);
      const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (err >= 0) ::dup2(err, 2);
      ::close(out_pipe[0]);
      ::close(out_pipe[1]);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(out_pipe[1]);
    out_fd_ = out_pipe[0];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::string buf;
    while (ready_line_.empty()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{out_fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        fail_start("did not print its ready line in time");
      }
      char chunk[512];
      const ssize_t n = ::read(out_fd_, chunk, sizeof(chunk));
      if (n <= 0) fail_start("exited before it was ready");
      buf.append(chunk, static_cast<size_t>(n));
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
        const std::string line = buf.substr(0, nl);
        if (line.find("ready") != std::string::npos) {
          ready_line_ = line;
          break;
        }
      }
    }
  }

  ~DaemonProcess() { stop(); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& ready_line() const { return ready_line_; }
  /// The integer after `key ` in the ready line ("http 8300" → 8300).
  int ready_int(const std::string& key) const { return std::stoi(ready_word(key)); }
  /// The word after `key ` in the ready line.
  std::string ready_word(const std::string& key) const {
    const size_t at = ready_line_.find(key + " ");
    if (at == std::string::npos) throw std::runtime_error("no '" + key + "' in: " + ready_line_);
    const size_t begin = at + key.size() + 1;
    return ready_line_.substr(begin, ready_line_.find(' ', begin) - begin);
  }
  pid_t pid() const { return pid_; }

  /// kill -9; returns once the process is gone.
  void kill_hard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap();
  }
  /// SIGTERM, up to 10 s for a clean exit, then SIGKILL. Returns the exit status (-1 if killed).
  int stop() {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = -1;
        cleanup();
        return exit_status_;
      }
      ::usleep(20000);
    }
    kill_hard();
    return -1;
  }
  /// What the daemon wrote to stderr so far.
  std::string log() const {
    std::ifstream in(err_path_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  [[noreturn]] void fail_start(const std::string& why) {
    const std::string text = log();
    kill_hard();
    throw std::runtime_error("daemon " + why + "; stderr:\n" + text);
  }
  void reap() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exit_status_ = -1;
    pid_ = -1;
    cleanup();
  }
  void cleanup() {
    if (out_fd_ >= 0) ::close(out_fd_);
    out_fd_ = -1;
    std::error_code ec;
    std::filesystem::remove(err_path_, ec);
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int exit_status_ = -1;
  std::string ready_line_;
  std::filesystem::path err_path_;
};

}  // namespace hack::test
