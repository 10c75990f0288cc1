// transfer_bench: KV bytes and transfer time of one request's KV over UCX, `--kv fp` (bf16
// pages) against `--kv hack` (2-bit HACK pages, bf16 sinks and open block), for prompts of
// 1K..32K tokens at two KV shapes: hack-tiny (models/hack-tiny/config.json) and Llama-3-8B
// (32 layers, 8 KV heads, head_dim 128). Sender and receiver are two UcxWorkers in this
// process, each with its own progress thread, connected over loopback by the receiver's
// worker address (--connect address, as prefill connects to a decode node that publishes one:
// shared memory carries the data when the UCX_TLS list has it) or by host:port (--connect
// sockaddr: UCX 1.13 keeps such a connection's lanes on tcp whatever the list); the KV
// streams through KvSender/KvReceiver layer by layer as prefill sends it (every page of layer
// 0, layer_done, layer 1, ..., request_done). Time per request is from the first send_page
// to the receiver's request_done callback (it includes the XXH3 checksum on both sides, as
// the real path does); the best of --repeats; queue_ms is the part of it the sending thread
// spent in send_page/layer_done/request_done (the page's checksum, and with --send copy the
// copy into the send queue that KvSender's span overload makes; --send borrowed, the default
// and what prefill does, hands UCX the page in place). Consecutive pages of a layer leave
// together as one kv_page message of about --message-kb KiB (default 1024, as prefill; 0:
// one page per message), the pages gathered into one buffer (--gather copy, the default) or
// handed to UCX in place as an iov (--gather iov): "pages" counts pages per request, "msgs"
// the kv_page messages that carried them. The bounds are ucx_perftest ucp_am_bw on the same UCX_TLS, run from here
// as a server and a client process: once with --perftest-bytes messages (the large-message
// ceiling) and once per (shape, kv) with messages of one full page, the size this path sends.
// ucx_perftest's "MB/s" are 2^20 bytes/s; every GB/s printed here is 1e9 bytes/s.
//
// Flow control: layer l is queued only once the receiver has reported layer l − W done (W =
// --window-layers, default 2), as a prefill that computes one layer while the previous one
// is on the wire would. With W = 0 the whole request is queued at once and only KvSender's
// own window (1024 messages / 64 MiB in flight per endpoint) paces it. Before that window
// existed, 8B fp 32K (16K pages of 256 KiB, 4.3 GB) failed 6 runs of 7 with "message N never
// arrived": more than the receiver's 4096 early messages (kKvMaxEarlyMessages) arrived while
// an earlier rendezvous page was still fetched; now it completes (bench/RESULTS.md).
//
// --path rma measures the other way a decode node could take a request's KV (DESIGN.md §4's
// admission handshake; issue 34 asks whether the active-message path is as good): the
// receiver registers its memory (UcxWorker::register_memory), the sender writes each page
// into it with one-sided puts, flushes each layer and then sends a small layer-done message;
// the time ends at the last layer-done. Nothing is checksummed or copied at the receiver.
//
// Pages are built once, before any timing: K/V with per-channel offsets and scales plus
// noise are appended to a CpuPagedKvCache (hack) or packed as bf16 blocks (fp) for
// --source-tokens tokens of every layer; a longer request reuses those pages cyclically
// (page i of layer l is source page i mod count of layer l). Page sizes do not depend on
// content and UCX does not compress, so reuse changes no byte count and no time. A layer's
// fp pages lie back to back in one buffer, as hack-prefill's PagePool slabs hold a layer's
// consecutive pages (so a multi-page message is one span, sent with no copy; HACK pages are
// padded to 64 bytes in their pool, so theirs are gathered); --scatter-pages allocates each
// separately (what this bench did before 2026-11-26).
//
// Per layer a request carries, for N prompt tokens and Π = --block:
//   fp:   ceil(N / Π) bf16 pages [K|V][kv_head][Π][head_dim] (the last one only its tokens)
//   hack: the sinks as one bf16 message [K|V][kv_head][sinks][head_dim], floor((N − sinks)
//         / Π) HACK pages, and the open block's (N − sinks) mod Π tokens as one bf16 message
//
//   transfer_bench [--tls tcp:posix,sysv,cma,self,tcp] [--shapes hack-tiny,llama-8b]
//                  [--kv fp,hack] [--tokens 1024,...,32768] [--max-tokens 32768]
//                  [--repeats 3] [--block 64] [--bits 2] [--sinks 4] [--source-tokens 1024]
//                  [--window-layers 2] [--connect address|sockaddr] [--send borrowed|copy] [--message-kb 1024]
//                  [--gather copy|iov|auto] [--checksum always|auto] [--scatter-pages] [--path am|rma]
//                  [--model-dir models/hack-tiny] [--perftest-bytes 1048576]
//                  [--perftest-iters 200] [--no-perftest] [--json]
// (--tls takes ':'-separated UCX_TLS lists, since a list itself contains commas)
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/logging.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/config.h"
#include "hack/net/kv_transfer.h"
#include "hack/net/ucx_worker.h"

extern char** environ;

using namespace hack;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::vector<std::string> tls = {"tcp", "posix,sysv,cma,self,tcp"};
  std::vector<std::string> shapes = {"hack-tiny", "llama-8b"};
  std::vector<std::string> kv = {"fp", "hack"};
  std::vector<int> tokens = {1024, 2048, 4096, 8192, 16384, 32768};
  int max_tokens = 32768;
  int repeats = 3;
  int block = 64;
  int bits = 2;
  int sinks = 4;
  int source_tokens = 1024;
  int window_layers = 2;
  std::string model_dir = "models/hack-tiny";
  size_t perftest_bytes = size_t{1} << 20;
  int perftest_iters = 200;
  bool perftest = true;
  bool json = false;
  bool auth = false;  // seal every message with HMAC-SHA256 (net::WireAuth), as nodes with a secret do
  bool connect_by_address = true;  // --connect address (else sockaddr: host:port)
  bool borrowed_pages = true;      // --send borrowed (else copy)
  bool peer_errors = true;         // endpoints in UCP_ERR_HANDLING_MODE_PEER, as the nodes' (--no-peer-errors: NONE)
  size_t message_bytes = size_t{1} << 20;  // --message-kb: KvSenderOptions::message_bytes
  net::KvGather gather = net::KvGather::automatic;  // --gather copy|iov|auto
  net::KvChecksum checksum = net::KvChecksum::automatic;  // --checksum always|auto
  bool scatter_pages = false;  // fp pages in separate allocations, not back to back (--scatter-pages)
  bool rma = false;            // --path rma: one-sided puts (RmaLink) instead of KvSender's messages
};

// Parses the flags (hack::FlagSet: --help, HACK_TRANSFER_BENCH_* mirrors, --config);
// nullopt after --help.
std::optional<Args> parse(int argc, char** argv) {
  Args a;
  std::string tls = "tcp:posix,sysv,cma,self,tcp", shapes = "hack-tiny,llama-8b", kv = "fp,hack",
              tokens = "1024,2048,4096,8192,16384,32768";
  int64_t perftest_bytes = int64_t{1} << 20;
  bool no_perftest = false;
  int64_t message_kb = 1024;
  std::string connect = "address", send = "borrowed", gather = "auto", checksum = "auto", path = "am";
  FlagSet flags("transfer_bench", "One request's KV streamed layer by layer over UCX: bytes and time, fp vs HACK.",
                "HACK_TRANSFER_BENCH");
  flags.add_string("tls", &tls, "':'-separated UCX_TLS lists, one run each");
  flags.add_string("shapes", &shapes, "KV shapes: hack-tiny, llama-8b");
  flags.add_string("kv", &kv, "fp and/or hack");
  flags.add_string("tokens", &tokens, "prompt lengths, comma-separated");
  flags.add_int("max-tokens", &a.max_tokens, "drop prompt lengths above this");
  flags.add_int("repeats", &a.repeats, "repeats per configuration (best is kept)");
  flags.add_int("block", &a.block, "tokens per page (Π)");
  flags.add_int("bits", &a.bits, "HACK code bits");
  flags.add_int("sinks", &a.sinks, "bf16 sink tokens");
  flags.add_int("source-tokens", &a.source_tokens, "tokens of generated K/V per layer, reused cyclically");
  flags.add_int("window-layers", &a.window_layers,
                "queue layer l once the receiver has layer l-N (0: queue the whole request at once)");
  flags.add_string("model-dir", &a.model_dir, "where the hack-tiny shape is read from");
  flags.add_int64("perftest-bytes", &perftest_bytes, "ucx_perftest message size of the main bound");
  flags.add_int("perftest-iters", &a.perftest_iters, "ucx_perftest iterations");
  flags.add_bool("no-perftest", &no_perftest, "skip the ucx_perftest bounds");
  flags.add_bool("json", &a.json, "JSON output");
  flags.add_string("connect", &connect,
                   "address: by the receiver's UCX worker address (shared memory usable); sockaddr: by host:port (tcp lanes)");
  flags.add_string("send", &send, "borrowed: pages sent from where they lie; copy: copied into the send queue first");
  bool no_peer_errors = false;
  flags.add_bool("no-peer-errors", &no_peer_errors,
                 "endpoints without peer-failure detection (UCX 1.13 uses shared memory only then; nodes never run so)");
  flags.add_int64("message-kb", &message_kb,
                  "pages of one layer leave together in kv_page messages of about this many KiB (0: one page each)");
  flags.add_string("gather", &gather,
                   "a multi-page message's pages: copy (into one buffer, sent contiguous), iov (in place, "
                   "UCP_DATATYPE_IOV) or auto (iov where the endpoint's lanes are shared memory, as hack-prefill)");
  flags.add_string("checksum", &checksum,
                   "kv_page checksums: always, or auto (none where the endpoint's lanes are shared memory, as "
                   "hack-prefill)");
  flags.add_bool("scatter-pages", &a.scatter_pages,
                 "fp pages each in their own allocation (before: back to back per layer, as a KV pool's slab holds them)");
  flags.add_string("path", &path,
                   "am: KvSender's kv_page active messages (what the nodes do); rma: one-sided puts into the "
                   "receiver's registered memory, a flush and a layer-done message per layer (worker-address "
                   "connections only)");
  flags.add_bool("auth", &a.auth, "authenticate the data plane (HMAC-SHA256 tag per message, as with --secret-file)");
  if (!flags.parse(argc, argv)) return std::nullopt;
  a.tls = split_list(tls, ':');
  a.shapes = split_list(shapes);
  a.kv = split_list(kv);
  a.tokens = parse_int_list(tokens, "tokens");
  HACK_CHECK(perftest_bytes > 0, "--perftest-bytes must be positive");
  HACK_CHECK(message_kb >= 0 && message_kb <= (int64_t{1} << 20), "--message-kb must be in [0, 1048576]");
  a.message_bytes = static_cast<size_t>(message_kb) << 10;
  a.gather = net::parse_kv_gather(gather);
  a.checksum = net::parse_kv_checksum(checksum);
  a.perftest_bytes = static_cast<size_t>(perftest_bytes);
  a.perftest = !no_perftest;
  HACK_CHECK(connect == "address" || connect == "sockaddr", "--connect takes address or sockaddr, not '{}'", connect);
  HACK_CHECK(send == "borrowed" || send == "copy", "--send takes borrowed or copy, not '{}'", send);
  a.connect_by_address = connect == "address";
  a.borrowed_pages = send == "borrowed";
  a.peer_errors = !no_peer_errors;
  HACK_CHECK(path == "am" || path == "rma", "--path takes am or rma, not '{}'", path);
  a.rma = path == "rma";
  HACK_CHECK(!a.rma || (a.connect_by_address && !a.auth), "--path rma needs --connect address and no --auth");
  std::erase_if(a.tokens, [&](int n) { return n > a.max_tokens; });
  HACK_CHECK(!a.tokens.empty(), "no prompt length left under --max-tokens {}", a.max_tokens);
  HACK_CHECK(a.repeats >= 1, "--repeats must be at least 1");
  HACK_CHECK(a.window_layers >= 0, "--window-layers must be 0 or more");
  HACK_CHECK(a.source_tokens >= a.sinks + a.block, "--source-tokens must hold the sinks and one block");
  for (const auto& m : a.kv) HACK_CHECK(m == "fp" || m == "hack", "--kv takes fp and/or hack, not '{}'", m);
  return a;
}

// ---------------------------------------------------------------------------------------
// KV shapes and the pages of one (shape, kv mode), built once.

struct NamedShape {
  std::string name;
  KvShape shape;
  std::string source;  // where the shape came from
};

NamedShape shape_named(const std::string& name, const Args& args) {
  if (name == "hack-tiny") {
    const auto path = std::filesystem::path(args.model_dir) / "config.json";
    if (std::filesystem::exists(path)) {
      const ModelConfig c = load_model_config(path);
      return {name, {c.num_layers, c.num_kv_heads, c.head_dim, c.group_size()}, path.string()};
    }
    return {name, {6, 2, 64, 2}, "built in (" + path.string() + " not found)"};
  }
  if (name == "llama-8b") {
    const ModelConfig c = synthetic_model_config("llama-8b");
    return {name, {c.num_layers, c.num_kv_heads, c.head_dim, c.group_size()}, "synthetic Llama-3.1-8B shape"};
  }
  fail("unknown shape '{}' (hack-tiny, llama-8b)", name);
}

// Bytes of `tokens` tokens of one layer in the exact (bf16) layout [K|V][kv_head][tokens][head_dim].
size_t exact_bytes(const KvShape& s, int tokens) {
  return size_t{2} * static_cast<size_t>(s.num_kv_heads) * static_cast<size_t>(tokens) *
         static_cast<size_t>(s.head_dim) * sizeof(uint16_t);
}

// Tokens [first, first + n) of a bf16 block [K|V][kv_head][capacity][head_dim], packed
// as [K|V][kv_head][n][head_dim].
std::vector<std::byte> exact_slice(const KvShape& s, std::span<const std::byte> block, int capacity, int first, int n) {
  const size_t row = static_cast<size_t>(s.head_dim) * sizeof(uint16_t);
  std::vector<std::byte> out(exact_bytes(s, n));
  std::byte* dst = out.data();
  for (int kv = 0; kv < 2; ++kv)
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const size_t head = static_cast<size_t>(kv * s.num_kv_heads + h) * static_cast<size_t>(capacity);
      std::memcpy(dst, block.data() + (head + static_cast<size_t>(first)) * row, static_cast<size_t>(n) * row);
      dst += static_cast<size_t>(n) * row;
    }
  return out;
}

// The source pages of one layer.
struct LayerSource {
  // bf16 [K|V][kv_head][Π][head_dim] blocks, back to back in one buffer as a PagePool slab
  // holds a layer's consecutive pages (or each in its own allocation: --scatter-pages).
  std::vector<std::vector<std::byte>> fp_storage;
  std::vector<std::span<const std::byte>> fp_blocks;
  std::vector<std::span<const std::byte>> hack_pages;  // into the cache
  std::vector<std::byte> sinks;                     // bf16 [K|V][kv_head][sinks][head_dim]
};

struct PageSource {
  KvShape shape;
  KvCacheOptions options;
  std::unique_ptr<CpuPagedKvCache> cache;  // hack: owns the HACK pages
  std::vector<LayerSource> layers;

  /// Bytes of one full page: a bf16 block (fp) or a HACK page (hack).
  size_t page_bytes() const {
    return options.mode == KvMode::fp ? exact_bytes(shape, options.block_tokens) : cache->hack_layout().page_bytes();
  }
};

// K/V of `tokens` tokens of one layer, [tokens][kv_head][head_dim] f32: per-channel offset
// and scale (K has a few large channels, as RoPE'd keys do) plus unit noise, drawn from a
// table of normals by a xorshift index (a normal per element would dominate the build).
void structured_kv(const KvShape& s, int tokens, uint64_t seed, std::vector<float>& k, std::vector<float>& v) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int width = s.num_kv_heads * s.head_dim;
  std::vector<float> k_off(static_cast<size_t>(width)), k_scale(k_off.size()), v_off(k_off.size());
  for (int c = 0; c < width; ++c) {
    k_off[static_cast<size_t>(c)] = 2.0f * normal(rng);
    k_scale[static_cast<size_t>(c)] = c % 17 == 0 ? 8.0f : 1.0f;
    v_off[static_cast<size_t>(c)] = 0.5f * normal(rng);
  }
  constexpr size_t kTable = 4096;
  std::vector<float> noise(kTable);
  for (float& x : noise) x = normal(rng);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next_noise = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return noise[state % kTable];
  };
  k.resize(static_cast<size_t>(tokens) * static_cast<size_t>(width));
  v.resize(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t c = i % static_cast<size_t>(width);
    k[i] = k_off[c] + k_scale[c] * next_noise();
    v[i] = v_off[c] + next_noise();
  }
}

PageSource build_pages(const KvShape& shape, KvMode mode, const Args& args) {
  PageSource src;
  src.shape = shape;
  src.options.mode = mode;
  src.options.k_bits = src.options.v_bits = args.bits;
  src.options.block_tokens = args.block;
  src.options.sinks = args.sinks;
  const int T = args.block, S = args.source_tokens;
  if (mode == KvMode::hack) {
    src.cache = make_paged_kv_cache(shape, src.options);
    src.cache->add_sequence(0, S);
  }
  src.layers.resize(static_cast<size_t>(shape.num_layers));
  std::vector<float> k, v;
  const size_t width = static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim);
  for (int l = 0; l < shape.num_layers; ++l) {
    structured_kv(shape, S, 1000 + static_cast<uint64_t>(l), k, v);
    LayerSource& ls = src.layers[static_cast<size_t>(l)];
    // bf16 blocks of Π tokens (the fp pages; the hack sinks and open block are cut from them).
    const size_t block_bytes = exact_bytes(shape, T);
    const size_t blocks = static_cast<size_t>(S / T);
    if (!args.scatter_pages) ls.fp_storage.emplace_back(blocks * block_bytes);
    for (int first = 0; first + T <= S; first += T) {
      if (args.scatter_pages) ls.fp_storage.emplace_back(block_bytes);
      std::byte* const base = args.scatter_pages ? ls.fp_storage.back().data()
                                                 : ls.fp_storage.front().data() + static_cast<size_t>(first / T) * block_bytes;
      const std::span<const std::byte> block(base, block_bytes);
      auto* out = reinterpret_cast<uint16_t*>(base);
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<float>& x = kv == 0 ? k : v;
        for (int h = 0; h < shape.num_kv_heads; ++h)
          for (int t = 0; t < T; ++t)
            for (int d = 0; d < shape.head_dim; ++d)
              *out++ = f32_to_bf16(x[static_cast<size_t>(first + t) * width +
                                     static_cast<size_t>(h * shape.head_dim + d)]);
      }
      ls.fp_blocks.push_back(block);
    }
    if (mode == KvMode::hack) {
      src.cache->append(l, 0, 0, S, k.data(), v.data());
      ls.sinks = exact_slice(shape, ls.fp_blocks.front(), T, 0, args.sinks);
    }
  }
  if (mode == KvMode::hack) {
    src.cache->close_pending_blocks(0);
    for (int l = 0; l < shape.num_layers; ++l) {
      LayerSource& ls = src.layers[static_cast<size_t>(l)];
      for (int i = 0; i < src.cache->hack_page_count(0, l); ++i) ls.hack_pages.push_back(src.cache->hack_page(0, l, i));
      HACK_CHECK(!ls.hack_pages.empty(), "no HACK page in layer {}", l);
    }
  }
  return src;
}

// The messages of one request, per layer, as views (into the source or `owned`).
struct RequestPlan {
  std::vector<std::vector<std::span<const std::byte>>> layers;
  std::vector<std::vector<std::byte>> owned;  // partial fp pages, hack open blocks
  size_t bytes = 0;
  size_t messages = 0;  // pages (kv_page messages when each page goes alone)
};

RequestPlan plan_request(const PageSource& src, int tokens) {
  RequestPlan plan;
  const KvShape& s = src.shape;
  const int T = src.options.block_tokens;
  plan.layers.resize(static_cast<size_t>(s.num_layers));
  // Open blocks are cut from source block 0 (content does not matter for the wire).
  auto add_owned = [&](std::vector<std::byte> bytes, std::vector<std::span<const std::byte>>& layer) {
    plan.owned.push_back(std::move(bytes));
    layer.push_back(plan.owned.back());
  };
  plan.owned.reserve(static_cast<size_t>(s.num_layers));
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerSource& ls = src.layers[static_cast<size_t>(l)];
    auto& layer = plan.layers[static_cast<size_t>(l)];
    if (src.options.mode == KvMode::fp) {
      const int full = tokens / T, rest = tokens % T;
      for (int i = 0; i < full; ++i) layer.push_back(ls.fp_blocks[static_cast<size_t>(i) % ls.fp_blocks.size()]);
      if (rest > 0) add_owned(exact_slice(s, ls.fp_blocks.front(), T, 0, rest), layer);
    } else {
      const int sinks = std::min(tokens, src.options.sinks);
      const int full = (tokens - sinks) / T, rest = (tokens - sinks) % T;
      layer.push_back(std::span<const std::byte>(ls.sinks).first(exact_bytes(s, sinks)));
      for (int i = 0; i < full; ++i) layer.push_back(ls.hack_pages[static_cast<size_t>(i) % ls.hack_pages.size()]);
      if (rest > 0) add_owned(exact_slice(s, ls.fp_blocks.front(), T, 0, rest), layer);
    }
    for (const auto& m : layer) plan.bytes += m.size();
    plan.messages += layer.size();
  }
  return plan;
}

// ---------------------------------------------------------------------------------------
// Sender and receiver workers on loopback.

struct Arrivals {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t request_id = 0;  // the request being timed
  size_t bytes = 0;
  size_t pages = 0, kept = 0;  // pages, and those KvReceiver::retain_payload could keep (hack-decode: 1 copy)
  int layers_done = 0;
  bool done = false;
  Clock::time_point done_at;
  std::string error;

  // Records the first failure and wakes the waiter.
  void fail(std::string message) {
    std::lock_guard lock(mutex);
    if (error.empty()) error = std::move(message);
    changed.notify_all();
  }
  // The window: waits until the receiver has reported `needed` layers of request `id` done.
  void wait_layers(int needed, uint64_t id) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(60), [&] { return layers_done >= needed || !error.empty(); });
    HACK_CHECK(error.empty(), "transfer failed: {}", error);
    HACK_CHECK(layers_done >= needed, "request {}: layer {} not received within 60 s", id, needed - 1);
  }
};

// How a request's KV crosses the link: KvSender's active messages (Link), or one-sided puts
// into the receiver's registered memory (RmaLink, --path rma).
class Transport {
 public:
  virtual ~Transport() = default;
  // Streams one request layer by layer; returns seconds from the first send to the
  // receiver's knowing the whole request has arrived, after checking every byte arrived.
  // window_layers > 0: layer l is queued only once the receiver has reported layer l −
  // window_layers done.
  virtual double transfer(const RequestPlan& plan, int window_layers) = 0;
  // The sender endpoint's lanes as UCX chose them ("" for a host:port endpoint).
  virtual std::string lanes() = 0;
  // Messages (or puts) that carried the latest transfer's pages.
  virtual size_t last_page_messages() const = 0;
  // Seconds the latest transfer() spent queueing on the sending thread.
  virtual double last_queue_s() const = 0;
  // Share of the latest transfer's pages the receiver has where a decode node could keep them.
  virtual double last_kept_share() const = 0;
};

class Link final : public Transport {
 public:
  Link(const std::string& tls, bool auth, bool connect_by_address, bool borrowed_pages, bool peer_errors,
       size_t message_bytes, net::KvGather gather, net::KvChecksum checksum)
      : borrowed_pages_(borrowed_pages) {
    net::UcxOptions options;
    options.config = {{"TLS", tls}};
    options.detect_peer_failure = peer_errors;
    options.accept_address_peers = connect_by_address;  // the receiver's replies (request errors) reach the sender
    receiver_worker_ = std::make_unique<net::UcxWorker>(options);
    sender_worker_ = std::make_unique<net::UcxWorker>(options);
    net::KvReceiverCallbacks cb;
    cb.on_page = [this](uint64_t id, uint32_t, std::span<const std::byte> page) {
      // As hack-decode does: keep the page where UCX received it, for one copy into the pool
      // (dropped at once here; only whether it could be kept is counted).
      const bool kept = receiver_ != nullptr && receiver_->retain_payload(page) != nullptr;
      std::lock_guard lock(arrivals_.mutex);
      if (id != arrivals_.request_id) return;
      arrivals_.bytes += page.size();
      ++arrivals_.pages;
      arrivals_.kept += kept ? 1 : 0;
    };
    cb.on_layer_done = [this](uint64_t id, uint32_t) {
      std::lock_guard lock(arrivals_.mutex);
      if (id != arrivals_.request_id) return;
      ++arrivals_.layers_done;
      arrivals_.changed.notify_all();
    };
    cb.on_request_done = [this](uint64_t id, std::span<const std::byte>) {
      const auto now = Clock::now();
      std::lock_guard lock(arrivals_.mutex);
      if (id != arrivals_.request_id) return;
      arrivals_.done = true;
      arrivals_.done_at = now;
      arrivals_.changed.notify_all();
    };
    cb.on_request_error = [this](uint64_t id, const Status& error) { fail_with("request " + std::to_string(id) + ": " + error.message()); };
    cb.on_bad_message = [this](net::EndpointId, const Status& error) { fail_with("bad message: " + error.message()); };
    const net::WireAuth wire_auth = auth ? net::WireAuth("transfer_bench secret") : net::WireAuth();
    receiver_ = std::make_unique<net::KvReceiver>(*receiver_worker_, cb, wire_auth);
    net::KvSenderOptions so;
    so.auth = wire_auth;
    so.message_bytes = message_bytes;
    so.gather = gather;
    so.checksum = checksum;
    sender_ = std::make_unique<net::KvSender>(
        *sender_worker_, net::KvSenderCallbacks{[this](uint64_t id, const Status& error) {
          fail_with("sender, request " + std::to_string(id) + ": " + error.message());
        }}, so);
    if (connect_by_address) {
      peer_ = sender_worker_->connect_address(receiver_worker_->address());
    } else {
      const uint16_t port = receiver_worker_->listen("127.0.0.1", 0);
      peer_ = sender_worker_->connect("127.0.0.1", port);
    }
  }
  std::string lanes() override { return sender_worker_->transports(peer_); }
  ~Link() override {
    sender_.reset();
    receiver_.reset();
  }

  // The end is the receiver's request_done.
  double transfer(const RequestPlan& plan, int window_layers) override {
    const uint64_t id = ++next_id_;
    {
      std::lock_guard lock(arrivals_.mutex);
      arrivals_.request_id = id;
      arrivals_.bytes = 0;
      arrivals_.pages = arrivals_.kept = 0;
      arrivals_.layers_done = 0;
      arrivals_.done = false;
    }
    const uint64_t messages_before = sender_->stats().messages_sent;
    const auto t0 = Clock::now();
    Clock::duration queueing{};
    for (size_t l = 0; l < plan.layers.size(); ++l) {
      const auto layer = static_cast<uint32_t>(l);
      if (window_layers > 0 && static_cast<int>(l) >= window_layers)
        arrivals_.wait_layers(static_cast<int>(l) - window_layers + 1, id);
      const auto q0 = Clock::now();
      for (const auto& page : plan.layers[l])
        check(borrowed_pages_ ? sender_->send_page_borrowed(peer_, id, layer, page) : sender_->send_page(peer_, id, layer, page));
      check(sender_->layer_done(peer_, id, layer));
      queueing += Clock::now() - q0;
    }
    const auto q0 = Clock::now();
    check(sender_->request_done(peer_, id));
    queueing += Clock::now() - q0;
    last_queue_s_ = std::chrono::duration<double>(queueing).count();
    std::unique_lock lock(arrivals_.mutex);
    const bool ended = arrivals_.changed.wait_for(lock, std::chrono::seconds(120),
                                                  [&] { return arrivals_.done || !arrivals_.error.empty(); });
    HACK_CHECK(arrivals_.error.empty(), "transfer failed: {}", arrivals_.error);
    HACK_CHECK(ended, "request {} did not complete within 120 s", id);
    HACK_CHECK(arrivals_.bytes == plan.bytes, "request {}: {} bytes arrived, {} sent", id, arrivals_.bytes, plan.bytes);
    const double seconds = std::chrono::duration<double>(arrivals_.done_at - t0).count();
    last_kept_share_ = arrivals_.pages > 0 ? static_cast<double>(arrivals_.kept) / static_cast<double>(arrivals_.pages) : 0;
    lock.unlock();
    check(sender_->wait_idle(60.0));
    // Every layer's layer_done and the request_done are the messages that are not kv_page.
    last_page_messages_ = sender_->stats().messages_sent - messages_before - plan.layers.size() - 1;
    return seconds;
  }
  // kv_page messages the latest transfer() sent (pages coalesced per --message-kb).
  size_t last_page_messages() const override { return last_page_messages_; }
  // Seconds the latest transfer() spent in KvSender calls (copy and checksum on this thread).
  double last_queue_s() const override { return last_queue_s_; }
  // Share of the latest transfer's pages the receiver could keep in UCX's buffer.
  double last_kept_share() const override { return last_kept_share_; }

 private:
  void fail_with(std::string message) { arrivals_.fail(std::move(message)); }
  static void check(const Status& s) { HACK_CHECK(s.is_ok(), "{}", s.message()); }

  Arrivals arrivals_;
  std::unique_ptr<net::UcxWorker> receiver_worker_, sender_worker_;
  std::unique_ptr<net::KvReceiver> receiver_;
  std::unique_ptr<net::KvSender> sender_;
  net::EndpointId peer_ = 0;
  bool borrowed_pages_ = true;
  uint64_t next_id_ = 0;
  double last_queue_s_ = 0;
  double last_kept_share_ = 0;
  size_t last_page_messages_ = 0;
};

// One-sided: the receiver registers a region as large as the longest request (a decode node
// would register its KV pool and name the pages it reserved for the request); the sender
// puts each page at its offset (a layer's pages in one call), flushes each layer (complete at
// the receiver) and then sends
// a 12-byte layer-done message (request id, layer), which the receiver counts; the last one
// ends the request. No checksum and no copy at the receiver: the bytes land where they stay.
// Every byte is compared with the pages after each request, outside the timing.
class RmaLink final : public Transport {
 public:
  static constexpr uint16_t kLayerDoneAm = 7;

  RmaLink(const std::string& tls, bool peer_errors, size_t region_bytes) {
    net::UcxOptions options;
    options.config = {{"TLS", tls}};
    options.detect_peer_failure = peer_errors;
    options.rma = true;
    receiver_worker_ = std::make_unique<net::UcxWorker>(options);
    sender_worker_ = std::make_unique<net::UcxWorker>(options);
    region_.assign(region_bytes, std::byte{0});  // touched: no page faults inside the timing
    remote_ = receiver_worker_->register_memory(region_);
    receiver_worker_->set_message_handler(kLayerDoneAm, [this](net::EndpointId, std::span<const std::byte> header,
                                                               std::span<const std::byte>) {
      const auto now = Clock::now();
      uint64_t id = 0;
      uint32_t layer = 0;
      if (header.size() != sizeof id + sizeof layer) return fail_with("bad layer-done message");
      std::memcpy(&id, header.data(), sizeof id);
      std::memcpy(&layer, header.data() + sizeof id, sizeof layer);
      std::lock_guard lock(arrivals_.mutex);
      if (id != arrivals_.request_id) return;
      ++arrivals_.layers_done;
      if (static_cast<size_t>(arrivals_.layers_done) == layers_) {
        arrivals_.done = true;
        arrivals_.done_at = now;
      }
      arrivals_.changed.notify_all();
    });
    peer_ = sender_worker_->connect_address(receiver_worker_->address());
  }
  ~RmaLink() override {
    sender_worker_.reset();  // its endpoint (and the remote key unpacked on it) first
    receiver_worker_->unregister_memory(remote_.id);
  }
  std::string lanes() override { return sender_worker_->transports(peer_); }
  size_t last_page_messages() const override { return last_puts_; }
  double last_queue_s() const override { return last_queue_s_; }
  double last_kept_share() const override { return 1.0; }  // every page lies where it was put

  double transfer(const RequestPlan& plan, int window_layers) override {
    HACK_CHECK(plan.bytes <= region_.size(), "a {}-byte request does not fit the {}-byte region", plan.bytes,
               region_.size());
    const uint64_t id = ++next_id_;
    {
      std::lock_guard lock(arrivals_.mutex);
      arrivals_.request_id = id;
      arrivals_.layers_done = 0;
      arrivals_.done = false;
      layers_ = plan.layers.size();
    }
    std::fill(region_.begin(), region_.begin() + static_cast<std::ptrdiff_t>(plan.bytes), std::byte{0});
    auto on_put = [this](const Status& s) {
      if (!s.is_ok()) fail_with("put: " + s.message());
    };
    size_t offset = 0, puts = 0;
    Clock::duration queueing{};
    const auto t0 = Clock::now();
    for (size_t l = 0; l < plan.layers.size(); ++l) {
      if (window_layers > 0 && static_cast<int>(l) >= window_layers)
        arrivals_.wait_layers(static_cast<int>(l) - window_layers + 1, id);
      const auto q0 = Clock::now();
      std::vector<net::UcxWorker::PutSegment> segments;
      segments.reserve(plan.layers[l].size());
      for (const auto& page : plan.layers[l]) {
        segments.push_back({page, remote_.address + offset});
        offset += page.size();
      }
      puts += segments.size();
      sender_worker_->put(peer_, std::move(segments), remote_.rkey, on_put);  // one call per layer
      std::vector<std::byte> header(sizeof id + sizeof(uint32_t));
      const auto layer = static_cast<uint32_t>(l);
      std::memcpy(header.data(), &id, sizeof id);
      std::memcpy(header.data() + sizeof id, &layer, sizeof layer);
      sender_worker_->flush(peer_, [this, header = std::move(header)](const Status& s) {
        if (!s.is_ok()) return fail_with("flush: " + s.message());
        sender_worker_->send(peer_, kLayerDoneAm, header, {}, [this](const Status& sent) {
          if (!sent.is_ok()) fail_with("layer done: " + sent.message());
        });
      });
      queueing += Clock::now() - q0;
    }
    last_queue_s_ = std::chrono::duration<double>(queueing).count();
    last_puts_ = puts;
    std::unique_lock lock(arrivals_.mutex);
    const bool ended = arrivals_.changed.wait_for(lock, std::chrono::seconds(120),
                                                  [&] { return arrivals_.done || !arrivals_.error.empty(); });
    HACK_CHECK(arrivals_.error.empty(), "transfer failed: {}", arrivals_.error);
    HACK_CHECK(ended, "request {} did not complete within 120 s", id);
    const double seconds = std::chrono::duration<double>(arrivals_.done_at - t0).count();
    lock.unlock();
    offset = 0;
    for (const auto& layer : plan.layers)
      for (const auto& page : layer) {
        HACK_CHECK(std::memcmp(region_.data() + offset, page.data(), page.size()) == 0,
                   "request {}: the bytes at offset {} differ from the page put there", id, offset);
        offset += page.size();
      }
    return seconds;
  }

 private:
  void fail_with(std::string message) { arrivals_.fail(std::move(message)); }

  Arrivals arrivals_;
  size_t layers_ = 0;  // of the request being timed (guarded by arrivals_.mutex)
  std::unique_ptr<net::UcxWorker> receiver_worker_, sender_worker_;
  std::vector<std::byte> region_;
  net::RemoteMemory remote_;
  net::EndpointId peer_ = 0;
  uint64_t next_id_ = 0;
  double last_queue_s_ = 0;
  size_t last_puts_ = 0;
};

// ---------------------------------------------------------------------------------------
// The bound: ucx_perftest ucp_am_bw between a server and a client process.

struct PerftestResult {
  std::optional<double> gbs;  // 1e9 bytes/s
  std::string note;           // why there is no number, or the command
};

uint16_t free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 13337;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  uint16_t port = 13337;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// A child process with UCX_TLS set and stdout+stderr sent to out_fd (or /dev/null).
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& tls, int out_fd) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) env_strings.emplace_back(*e);
    env_strings.push_back("UCX_TLS=" + tls);
    std::vector<char*> envp, args;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (out_fd >= 0) {
      posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
      posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
    } else {
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    }
    if (posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  // Exit status once it exits within `seconds`, else nullopt (the destructor kills it).
  std::optional<int> wait(double seconds) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (pid_ > 0 && !exited_) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (Clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

// Runs one client against a started server; returns its output and exit status.
std::pair<std::optional<int>, std::string> run_client(const std::vector<std::string>& argv, const std::string& tls,
                                                      double seconds) {
  int fds[2];
  if (::pipe(fds) != 0) return {std::nullopt, "pipe failed"};
  std::string output;
  std::optional<int> rc;
  {
    Child client(argv, tls, fds[1]);
    ::close(fds[1]);
    if (!client.started()) {
      ::close(fds[0]);
      return {std::nullopt, "could not start " + argv[0]};
    }
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    for (;;) {
      const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left_ms <= 0) break;
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left_ms)) <= 0) break;
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      output.append(buf, static_cast<size_t>(n));
    }
    rc = client.wait(1.0);
  }
  ::close(fds[0]);
  return {rc, output};
}

// Bandwidth of the "Final:" line: "Final: iters p50 avg overall bw_avg bw_overall ..." with
// bandwidth in MB/s, where ucx_perftest's MB is 2^20 bytes.
std::optional<double> parse_perftest_gbs(const std::string& output) {
  std::stringstream ss(output);
  std::string line;
  while (std::getline(ss, line)) {
    const size_t at = line.find("Final:");
    if (at == std::string::npos) continue;
    std::stringstream fields(line.substr(at + 6));
    double v[6];
    for (double& x : v)
      if (!(fields >> x)) return std::nullopt;
    return v[5] * 1048576.0 / 1e9;
  }
  return std::nullopt;
}

// peer_errors: both sides with -e (UCP_ERR_HANDLING_MODE_PEER, as our endpoints; the caller's
// UCX_MM_ERROR_HANDLING=y lets shared memory serve such endpoints, as UcxWorker does).
PerftestResult run_perftest(const std::string& tls, size_t message_bytes, int iterations, bool peer_errors) {
  const std::string size = std::to_string(message_bytes), iters = std::to_string(iterations);
  std::string last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string port = std::to_string(free_tcp_port());
    std::vector<std::string> server_argv = {"ucx_perftest", "-p", port};
    std::vector<std::string> client_argv = {"ucx_perftest", "127.0.0.1", "-p", port, "-t", "ucp_am_bw",
                                            "-s", size, "-n", iters, "-w", "20"};
    if (peer_errors) {
      server_argv.push_back("-e");
      client_argv.push_back("-e");
    }
    Child server(server_argv, tls, -1);
    if (!server.started()) return {std::nullopt, "ucx_perftest not found on PATH"};
    // The server needs a moment to listen; a refused client exits at once, so retry.
    for (int tries = 0; tries < 50; ++tries) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto [rc, output] = run_client(client_argv, tls, 60.0);
      if (auto gbs = parse_perftest_gbs(output); rc == 0 && gbs) {
        server.wait(5.0);
        std::string cmd = (peer_errors ? "UCX_MM_ERROR_HANDLING=y UCX_TLS=" : "UCX_TLS=") + tls;
        for (const auto& a : client_argv) cmd += " " + a;
        return {gbs, cmd};
      }
      last = output.empty() ? "no output" : output.substr(0, output.find('\n'));
      if (output.find("Connection refused") == std::string::npos) break;
      if (server.wait(0.0)) break;  // the server itself gave up
    }
  }
  return {std::nullopt, "ucx_perftest failed: " + last};
}

// ---------------------------------------------------------------------------------------

struct Row {
  std::string tls, shape, kv;
  int tokens = 0;
  size_t bytes = 0, messages = 0;
  double best_s = 0;
};

bool uses_shared_memory(const std::string& tls) {
  for (const auto& t : split_list(tls, ','))
    if (t == "posix" || t == "sysv" || t == "cma" || t == "shm" || t == "sm") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Args> parsed;
  try {
    parsed = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transfer_bench: %s\n", e.what());
    return 2;
  }
  if (!parsed) return 0;
  const Args& args = *parsed;
  // ucx_perftest -e (the bounds with peer-failure detection) gets what UcxWorker sets for its own.
  if (args.peer_errors) setenv("UCX_MM_ERROR_HANDLING", "y", 0);
  try {
    setup_logging("warn");  // keep the workers' info lines (endpoint closed at teardown) off the output
    std::vector<NamedShape> shapes;
    for (const auto& s : args.shapes) shapes.push_back(shape_named(s, args));

    // Pages first, so that only the transfer is timed.
    struct Source {
      const NamedShape* shape;
      std::string kv;
      PageSource pages;
      std::vector<RequestPlan> plans;  // one per args.tokens
    };
    std::vector<Source> sources;
    const auto t_build = Clock::now();
    for (const auto& shape : shapes)
      for (const auto& kv : args.kv) {
        Source src{&shape, kv, build_pages(shape.shape, parse_kv_mode(kv), args), {}};
        for (int n : args.tokens) src.plans.push_back(plan_request(src.pages, n));
        sources.push_back(std::move(src));
      }
    const double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();

    const char* data_note =
        args.connect_by_address && !args.peer_errors
            ? "connected by worker address without peer-failure detection (ucx_perftest likewise, no -e): with shared "
              "memory in UCX_TLS, UCX puts the lanes on it (sysv am, cma rma_bw), so each list's own ucx_perftest "
              "number is its bound; nodes cannot run so (a lost peer goes unnoticed)"
        : args.connect_by_address
            ? "connected by worker address with peer-failure detection (UCP_ERR_HANDLING_MODE_PEER, as a prefill node "
              "to a decode node on its host; ucx_perftest likewise, -e): UcxWorker sets UCX_MM_ERROR_HANDLING=y, so with "
              "shared memory in UCX_TLS the lanes are sysv/posix, rendezvous included (as AM fragments: UCX 1.13 "
              "refuses cma to PEER endpoints), and each list's own ucx_perftest number is its bound"
            : "UCX 1.13 host:port (sockaddr) connections put the AM and rendezvous lanes on tcp even when shared "
              "memory is enabled (UCX_LOG_LEVEL=debug: am and rma_bw on tcp/lo.0, a second rma_bw lane on tcp/eth0.0), "
              "so every row here moves its bytes over tcp; ucx_perftest connects by worker "
              "address and does use shared memory when it is listed, so for such lists its number bounds shared "
              "memory, not this path, and the tcp bound is the one to compare with";
    if (!args.json) {
      std::printf("transfer_bench: one request's KV streamed layer by layer over UCX between two workers of this "
                  "process (loopback, separate progress threads); best of %d; layer l queued once layer l-%d "
                  "has arrived%s\n",
                  args.repeats, args.window_layers, args.window_layers == 0 ? " (0: no window, whole request queued at once)" : "");
      for (const auto& s : shapes)
        std::printf("shape %s: %d layers, %d KV heads, head_dim %d (%s)\n", s.name.c_str(), s.shape.num_layers,
                    s.shape.num_kv_heads, s.shape.head_dim, s.source.c_str());
      for (const auto& src : sources)
        std::printf("  %s --kv %s: %s, %.1f KV bytes/token (closed blocks, all layers)\n", src.shape->name.c_str(),
                    src.kv.c_str(), describe(src.pages.options).c_str(),
                    kv_bytes_per_token(src.shape->shape, src.pages.options));
      std::printf("pages built in %.1f s from %d source tokens per layer, reused cyclically for longer prompts\n",
                  build_s, args.source_tokens);
      std::printf("note: %s\n", data_note);
    }

    nlohmann::json perftests = nlohmann::json::array();
    nlohmann::json results = nlohmann::json::array();
    auto rounded = [](double x) { return std::round(x * 1000.0) / 1000.0; };  // JSON numbers to 3 decimals
    auto opt_json = [&](const std::optional<double>& x) { return x ? nlohmann::json(rounded(*x)) : nlohmann::json(nullptr); };
    auto measure = [&](const std::string& tls, size_t bytes, int iterations) {
      PerftestResult r;
      if (args.perftest) r = run_perftest(tls, bytes, iterations, args.peer_errors);
      else r.note = "ucx_perftest skipped (--no-perftest)";
      perftests.push_back({{"tls", tls}, {"message_bytes", bytes}, {"iterations", iterations}, {"gbs", opt_json(r.gbs)},
                           {"note", r.note}});
      return r;
    };
    // ucx_perftest iterations for one message size: about 256 MiB, 200..20000 messages.
    auto iterations_for = [&](size_t bytes) {
      return static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / bytes, static_cast<size_t>(args.perftest_iters), 20000));
    };
    std::optional<double> tcp_bound;                                   // 1 MiB messages over tcp
    std::vector<std::optional<double>> tcp_page_bound(sources.size());  // page-size messages over tcp
    for (const auto& tls : args.tls) {
      const bool shm = uses_shared_memory(tls);
      const PerftestResult bound = measure(tls, args.perftest_bytes, args.perftest_iters);
      if (tls == "tcp") tcp_bound = bound.gbs;
      std::vector<PerftestResult> page_bound;
      for (size_t s = 0; s < sources.size(); ++s) {
        const size_t bytes = sources[s].pages.page_bytes();
        page_bound.push_back(measure(tls, bytes, iterations_for(bytes)));
        if (tls == "tcp") tcp_page_bound[s] = page_bound.back().gbs;
      }
      const bool vs_tcp = shm && tls != "tcp" && tcp_bound.has_value();
      // Where the bytes go: sockaddr connections keep tcp lanes (see data_note).
      const bool data_on_shm = shm && args.connect_by_address;
      if (!args.json) {
        std::printf("\nUCX_TLS=%s: data over %s (%s connection), pages %s, %zu KiB per kv_page message (%s), "
                    "checksums %s\n",
                    tls.c_str(), data_on_shm ? "shared memory" : "tcp",
                    args.connect_by_address ? "worker-address" : "sockaddr",
                    args.borrowed_pages ? "sent in place" : "copied into the send queue", args.message_bytes >> 10,
                    args.gather == net::KvGather::iov         ? "pages as a UCX iov"
                    : args.gather == net::KvGather::automatic ? (data_on_shm ? "auto: pages as a UCX iov" : "auto: pages gathered into one buffer")
                                                              : "pages gathered into one buffer",
                    args.checksum == net::KvChecksum::always ? "always" : data_on_shm ? "auto: none" : "auto: on");
        if (bound.gbs)
          std::printf("bound: ucx_perftest ucp_am_bw, %zu-byte messages: %.3f GB/s%s\n  (%s)\n", args.perftest_bytes,
                      *bound.gbs, shm && !data_on_shm ? ", over shared memory, not this path's transport" : "",
                      bound.note.c_str());
        else
          std::printf("bound: NONE, %s\n", bound.note.c_str());
        std::printf("page bound: ucx_perftest ucp_am_bw with messages of one page (fp page / HACK page)\n");
        std::printf("%-9s %-4s %6s %10s %6s %6s %9s %8s %7s %7s %8s %8s %7s%s\n", "shape", "kv", "tokens", "MB/req", "pages", "msgs",
                    "ms/req", "queue_ms", "GB/s", "%bound", "page_KiB", "pg_GB/s", "%page",
                    vs_tcp ? "  %tcp-bound %tcp-page" : "");
        std::printf("(kept: share of pages the receiver kept in UCX's buffer, so hack-decode copies them once; "
                    "the rest twice)\n");
      }
      std::unique_ptr<Transport> transport;
      if (args.rma) {
        size_t largest = 0;
        for (const Source& src : sources)
          for (const RequestPlan& plan : src.plans) largest = std::max(largest, plan.bytes);
        transport = std::make_unique<RmaLink>(tls, args.peer_errors, largest);
      } else {
        transport = std::make_unique<Link>(tls, args.auth, args.connect_by_address, args.borrowed_pages, args.peer_errors,
                                           args.message_bytes, args.gather, args.checksum);
      }
      Transport& link = *transport;
      // Warm-up: the connection is set up lazily, so the first request would pay for it.
      link.transfer(sources.front().plans.front(), args.window_layers);
      if (!args.json && args.rma)
        std::printf("path: one-sided puts into the receiver's registered memory, one per page; per layer a flush, "
                    "then a layer-done message (msgs = puts; nothing to keep or copy at the receiver)\n");
      if (!args.json && args.connect_by_address) std::printf("lanes: %s\n", link.lanes().c_str());
      for (size_t s = 0; s < sources.size(); ++s) {
        const Source& src = sources[s];
        const std::optional<double> page_gbs = page_bound[s].gbs;
        for (size_t i = 0; i < args.tokens.size(); ++i) {
          const RequestPlan& plan = src.plans[i];
          double best = 1e30, best_queue = 0;
          size_t page_messages = 0;
          double kept_share = 0;
          for (int r = 0; r < args.repeats; ++r) {
            const double t = link.transfer(plan, args.window_layers);
            if (t < best) {
              best = t;
              best_queue = link.last_queue_s();
              page_messages = link.last_page_messages();
              kept_share = link.last_kept_share();
            }
          }
          const double gbs = static_cast<double>(plan.bytes) / best / 1e9;
          auto share = [&](const std::optional<double>& of) -> std::optional<double> {
            if (!of) return std::nullopt;
            return gbs / *of;
          };
          nlohmann::json row = {{"tls", tls},
                                {"path", args.rma ? "rma" : "am"},
                                {"data_transport", data_on_shm ? "shared memory" : "tcp"},
                                {"connect", args.connect_by_address ? "address" : "sockaddr"},
                                {"send", args.borrowed_pages ? "borrowed" : "copy"},
                                {"shape", src.shape->name},
                                {"kv", src.kv},
                                {"tokens", args.tokens[i]},
                                {"bytes", plan.bytes},
                                {"pages", plan.messages},
                                {"messages", page_messages},
                                {"message_bytes", args.message_bytes},
                                {"gather", net::kv_gather_name(args.gather)},
                                {"checksum", net::kv_checksum_name(args.checksum)},
                                {"pages_kept_in_place", rounded(kept_share)},
                                {"page_bytes", src.pages.page_bytes()},
                                {"ms", rounded(best * 1e3)},
                                {"queue_ms", rounded(best_queue * 1e3)},
                                {"gbs", rounded(gbs)},
                                {"bound_gbs", opt_json(bound.gbs)},
                                {"fraction_of_bound", opt_json(share(bound.gbs))},
                                {"page_bound_gbs", opt_json(page_gbs)},
                                {"fraction_of_page_bound", opt_json(share(page_gbs))}};
          if (vs_tcp) {
            row["fraction_of_tcp_bound"] = opt_json(share(tcp_bound));
            row["fraction_of_tcp_page_bound"] = opt_json(share(tcp_page_bound[s]));
          }
          results.push_back(row);
          if (!args.json) {
            auto pct = [&](const std::optional<double>& of, int width) {
              if (auto f = share(of)) std::printf(" %*.1f%%", width - 1, 100.0 * *f);
              else std::printf(" %*s", width, "n/a");
            };
            std::printf("%-9s %-4s %6d %10.3f %6zu %6zu %9.2f %8.2f %7.3f", src.shape->name.c_str(), src.kv.c_str(),
                        args.tokens[i], static_cast<double>(plan.bytes) / 1e6, plan.messages, page_messages, best * 1e3,
                        best_queue * 1e3, gbs);
            pct(bound.gbs, 7);
            std::printf(" %8.1f", static_cast<double>(src.pages.page_bytes()) / 1024.0);
            if (page_gbs) std::printf(" %8.3f", *page_gbs);
            else std::printf(" %8s", "n/a");
            pct(page_gbs, 7);
            if (vs_tcp) {
              pct(tcp_bound, 11);
              pct(tcp_page_bound[s], 9);
            }
            std::printf("  kept %.0f%%\n", 100.0 * kept_share);
          }
        }
      }
    }
    if (!args.json) {
      // fp vs hack bytes per request, from the plans (independent of transport).
      std::printf("\nbytes per request, hack vs fp:\n");
      for (const auto& shape : shapes) {
        const Source* fp = nullptr;
        const Source* hk = nullptr;
        for (const auto& s : sources)
          if (s.shape == &shape) (s.kv == "fp" ? fp : hk) = &s;
        if (!fp || !hk) continue;
        for (size_t i = 0; i < args.tokens.size(); ++i)
          std::printf("  %-10s %6d tokens: fp %10.3f MB, hack %9.3f MB (%.1f%% of fp, %.2fx smaller)\n",
                      shape.name.c_str(), args.tokens[i], static_cast<double>(fp->plans[i].bytes) / 1e6,
                      static_cast<double>(hk->plans[i].bytes) / 1e6,
                      100.0 * static_cast<double>(hk->plans[i].bytes) / static_cast<double>(fp->plans[i].bytes),
                      static_cast<double>(fp->plans[i].bytes) / static_cast<double>(hk->plans[i].bytes));
      }
    } else {
      nlohmann::json shape_json = nlohmann::json::array();
      for (const auto& src : sources)
        shape_json.push_back({{"shape", src.shape->name},
                              {"layers", src.shape->shape.num_layers},
                              {"kv_heads", src.shape->shape.num_kv_heads},
                              {"head_dim", src.shape->shape.head_dim},
                              {"from", src.shape->source},
                              {"kv", src.kv},
                              {"kv_config", describe(src.pages.options)},
                              {"kv_bytes_per_token", kv_bytes_per_token(src.shape->shape, src.pages.options)},
                              {"page_bytes", src.pages.page_bytes()}});
      nlohmann::json doc = {{"bench", "transfer_bench"},
                            {"repeats", args.repeats},
                            {"block_tokens", args.block},
                            {"bits", args.bits},
                            {"sinks", args.sinks},
                            {"source_tokens", args.source_tokens},
                            {"window_layers", args.window_layers},
                            {"note", data_note},
                            {"shapes", shape_json},
                            {"perftest", perftests}};
      // One line per result row, so the output stays readable and diffable.
      std::string text = doc.dump();
      text.pop_back();  // the closing brace
      text += ",\"results\":[";
      for (size_t r = 0; r < results.size(); ++r) text += (r ? ",\n  " : "\n  ") + results[r].dump();
      std::printf("%s\n]}\n", text.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transfer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
