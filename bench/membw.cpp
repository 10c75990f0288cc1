// bench/membw: this machine's memory read bandwidth, at 1 thread and at every thread
// count up to --threads. Decode and attention benches report achieved GB/s against it.
//   membw [--threads N] [--mib M] [--json]   (--help for all flags)
#include <cstdio>
#include <string>

#include "hack/core/cpu_features.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/membw.h"
#include "hack/core/thread_pool.h"

int main(int argc, char** argv) {
  int max_threads = 2;
  int64_t mib = 1024;
  bool json = false;
  hack::FlagSet flags("membw", "Memory read bandwidth at 1 .. --threads threads.", "HACK_MEMBW");
  flags.add_int("threads", &max_threads, "largest thread count measured");
  flags.add_int64("mib", &mib, "buffer size in MiB");
  flags.add_bool("json", &json, "JSON output");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(max_threads >= 1 && mib >= 1, "--threads and --mib must be positive");
  } catch (const hack::Error& e) {
    std::fprintf(stderr, "membw: %s\n", e.what());
    return 2;
  }
  if (!json) std::printf("cpu features: %s\nbuffer: %lld MiB, best of 5 passes\n", hack::cpu_features().describe().c_str(),
                         static_cast<long long>(mib));
  std::string out = "[";
  for (int t = 1; t <= max_threads; ++t) {
    hack::ThreadPool pool(t);
    const double gbs = hack::measure_read_bandwidth_gbs(pool, static_cast<size_t>(mib) << 20, 5);
    if (json) {
      out += (t > 1 ? "," : "") + std::string("{\"threads\":") + std::to_string(t) + ",\"read_gbs\":" + std::to_string(gbs) + "}";
    } else {
      std::printf("threads %d: read %.2f GB/s\n", t, gbs);
    }
  }
  if (json) std::printf("%s]\n", out.c_str());
  return 0;
}
