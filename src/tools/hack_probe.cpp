// hack-probe: GET a daemon's /health and exit 0 on HTTP 200, 1 otherwise — the container
// HEALTHCHECK without curl in the image (deploy/docker/). Plain HTTP/1.0 over one socket,
// the whole exchange bounded by --timeout-s.
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "hack/core/error.h"
#include "hack/core/flags.h"

namespace {

constexpr int kHealthy = 0;
constexpr int kUnhealthy = 1;  // what Docker's HEALTHCHECK reads as unhealthy (2 is reserved)

struct Url {
  std::string host, port, path;
};

// http://HOST:PORT/PATH only (the daemons speak plain HTTP); anything else is a usage error.
Url parse_url(const std::string& url) {
  const std::string scheme = "http://";
  HACK_CHECK(url.rfind(scheme, 0) == 0, "'{}': expected http://HOST:PORT/PATH", url);
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  const size_t colon = authority.rfind(':');
  HACK_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < authority.size(),
             "'{}': expected http://HOST:PORT/PATH", url);
  return Url{authority.substr(0, colon), authority.substr(colon + 1),
             slash == std::string::npos ? "/" : rest.substr(slash)};
}

// The status code of the response's first line, or -1 when it cannot be read.
int http_status(const Url& u) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return -1;
  const std::string request = "GET " + u.path + " HTTP/1.0\r\nHost: " + u.host + "\r\nConnection: close\r\n\r\n";
  int status = -1;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char line[64] = {};  // "HTTP/1.1 200 OK" fits; the rest of the response is not read
    size_t n = 0;
    while (n < sizeof(line) - 1) {
      const ssize_t got = recv(fd, line + n, sizeof(line) - 1 - n, 0);
      if (got <= 0) break;
      n += static_cast<size_t>(got);
      if (std::memchr(line, '\n', n) != nullptr) break;
    }
    if (std::sscanf(line, "HTTP/%*d.%*d %d", &status) != 1) status = -1;
  }
  close(fd);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  int timeout_s = 3;
  bool quiet = false;
  std::string url = "http://127.0.0.1:8000/health";
  try {
    hack::FlagSet flags("hack-probe", "GET URL; exit 0 on HTTP 200, 1 otherwise (container health checks).",
                        "HACK_PROBE");
    flags.add_string("url", &url, "what to GET (http://HOST:PORT/PATH)");
    flags.add_int("timeout-s", &timeout_s, "seconds for the whole exchange (resolve, connect, answer)");
    flags.add_bool("quiet", &quiet, "print nothing");
    if (!flags.parse(argc, argv)) return kHealthy;
    HACK_CHECK(timeout_s > 0, "--timeout-s must be positive");
    const Url u = parse_url(url);
    // One deadline over every blocking call: a SYN into a black hole must not outlive the
    // check's own timeout.
    signal(SIGALRM, [](int) { _exit(kUnhealthy); });
    alarm(static_cast<unsigned>(timeout_s));
    const int status = http_status(u);
    if (!quiet) std::printf("hack-probe: %s -> %s\n", url.c_str(), status < 0 ? "no answer" : std::to_string(status).c_str());
    return status == 200 ? kHealthy : kUnhealthy;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hack-probe: error: %s\n", e.what());
    return 2;
  }
}
