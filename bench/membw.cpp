// bench/membw: this machine's memory read bandwidth, at 1 thread and at every thread
// count up to --threads. Decode and attention benches report achieved GB/s against it.
//   membw [--threads N] [--mib M] [--json]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hack/core/cpu_features.h"
#include "hack/core/membw.h"
#include "hack/core/thread_pool.h"

int main(int argc, char** argv) {
  int max_threads = 2;
  size_t mib = 1024;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) max_threads = std::atoi(argv[++i]);
    else if (a == "--mib" && i + 1 < argc) mib = static_cast<size_t>(std::atol(argv[++i]));
    else if (a == "--json") json = true;
    else {
      std::fprintf(stderr, "usage: membw [--threads N (default 2)] [--mib M (default 1024)] [--json]\n");
      return 2;
    }
  }
  if (!json) std::printf("cpu features: %s\nbuffer: %zu MiB, best of 5 passes\n", hack::cpu_features().describe().c_str(), mib);
  std::string out = "[";
  for (int t = 1; t <= max_threads; ++t) {
    hack::ThreadPool pool(t);
    const double gbs = hack::measure_read_bandwidth_gbs(pool, mib << 20, 5);
    if (json) {
      out += (t > 1 ? "," : "") + std::string("{\"threads\":") + std::to_string(t) + ",\"read_gbs\":" + std::to_string(gbs) + "}";
    } else {
      std::printf("threads %d: read %.2f GB/s\n", t, gbs);
    }
  }
  if (json) std::printf("%s]\n", out.c_str());
  return 0;
}
