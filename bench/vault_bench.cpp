// hack-vault's data plane in one process pair of workers: Lookup latency of a chain and
// BatchPromote (restore) throughput, over the UCX transport UCX_TLS selects. The vault runs
// in process (its own UCX worker and progress thread), the client on another worker, so
// every byte crosses the transport as it would between processes on one machine.
//
//   vault_bench [--blocks 128] [--layers 30 --kv-heads 3 --head-dim 64 --block-tokens 64]
//               [--codec int8-head|exact] [--lookups 2000] [--promotes 20]
//
// The bound for restore GB/s is ucx_perftest ucp_am_bw on the same UCX_TLS (run it beside
// this; bench/RESULTS.md records both). Lookup's target: p99 ≤ 1 ms for a 128-block chain.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "hack/core/clock.h"
#include "hack/core/flags.h"
#include "hack/kv/kv_block.h"
#include "hack/net/vault_client.h"
#include "hack/vault/vault_server.h"

using namespace hack;

namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int blocks = 128, layers = 30, kv_heads = 3, head_dim = 64, block_tokens = 64, lookups = 2000, promotes = 20;
    std::string codec_name = "int8-head";
    FlagSet flags("vault_bench", "hack-vault Lookup latency and BatchPromote throughput.", "HACK_VAULT_BENCH");
    flags.add_int("blocks", &blocks, "blocks in the chain");
    flags.add_int("layers", &layers, "layers per block (SmolLM2-135M: 30)");
    flags.add_int("kv-heads", &kv_heads, "KV heads (SmolLM2-135M: 3)");
    flags.add_int("head-dim", &head_dim, "head dim");
    flags.add_int("block-tokens", &block_tokens, "tokens per block (Π)");
    flags.add_string("codec", &codec_name, "int8-head | exact (bf16)");
    flags.add_int("lookups", &lookups, "Lookup calls timed");
    flags.add_int("promotes", &promotes, "BatchPromote calls timed");
    if (!flags.parse(argc, argv)) return 0;
    const BlockCodec codec = parse_block_codec(codec_name);
    const DType dtype = codec == BlockCodec::exact ? DType::bf16 : DType::i8;
    const KvShape shape{layers, kv_heads, head_dim, 1};

    vault::VaultServerConfig vc;
    vc.port = 0;
    vc.ucx_port = 0;
    vc.max_bytes = "16G";
    vault::VaultServer server(vc);
    net::UcxWorker worker;
    net::VaultClient client(worker, net::VaultClientOptions{"127.0.0.1", static_cast<uint16_t>(server.ucx_port())});

    KvFingerprint f;
    f.add("bench", "vault");
    const BlockKey root = chain_root(f, "default");
    std::vector<int> tokens(static_cast<size_t>(blocks * block_tokens));
    std::mt19937_64 rng(1);
    for (int& t : tokens) t = static_cast<int>(rng() % 49152);
    const std::vector<BlockKey> keys = chain_keys(root, tokens, block_tokens);
    std::normal_distribution<float> normal;
    std::vector<float> k(static_cast<size_t>(block_tokens * kv_heads * head_dim)), v(k.size());
    size_t value_bytes = 0;
    const double t_store = monotonic_s();
    for (int b = 0; b < blocks; ++b) {
      std::vector<std::vector<std::byte>> slices(static_cast<size_t>(layers));
      for (auto& s : slices) {
        for (auto& x : k) x = normal(rng);
        for (auto& x : v) x = normal(rng);
        encode_kv_block_layer(k.data(), v.data(), block_tokens, kv_heads, head_dim, codec, DType::bf16, s);
      }
      const auto value = assemble_kv_block(codec, dtype, shape, int64_t{b} * block_tokens, block_tokens, slices);
      value_bytes += value.size();
      const auto bi = static_cast<size_t>(b);
      client.store("default", keys[bi], b == 0 ? root : keys[bi - 1], b == 0, static_cast<uint8_t>(codec), value);
      if (const Status s = client.flush(60); !s) fail("{}", s.message());
    }
    for (int i = 0; i < 1000 && server.stats().blocks < static_cast<uint64_t>(blocks); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    HACK_CHECK(server.stats().blocks == static_cast<uint64_t>(blocks), "only {} of {} blocks stored",
               server.stats().blocks, blocks);
    const double store_s = monotonic_s() - t_store;
    std::printf("vault_bench: %d blocks of %s, %d layers x %d kv heads x %d dims x %d tokens: %.1f MB (%.0f KB/block), "
                "stored in %.3f s (incl. encoding)\n",
                blocks, codec_name.c_str(), layers, kv_heads, head_dim, block_tokens, value_bytes / 1e6,
                value_bytes / 1e3 / blocks, store_s);

    std::vector<double> lat;
    for (int i = 0; i < lookups; ++i) {
      size_t found = 0;
      const double t0 = monotonic_s();
      if (const Status s = client.lookup("default", keys, 5.0, found); !s) fail("{}", s.message());
      lat.push_back(monotonic_s() - t0);
      HACK_CHECK(found == keys.size(), "lookup found {} of {}", found, keys.size());
    }
    std::printf("lookup (%d-block chain, one round trip): p50 %.1f us, p99 %.1f us, max %.1f us over %d calls "
                "(target p99 <= 1000 us)\n",
                blocks, percentile(lat, 0.5) * 1e6, percentile(lat, 0.99) * 1e6, percentile(lat, 1.0) * 1e6, lookups);

    std::vector<double> times, first_layer;
    size_t payload = 0;
    for (int i = 0; i < promotes; ++i) {
      const double t0 = monotonic_s();
      auto p = client.promote("default", keys);
      if (const Status s = p->wait_head(30); !s) fail("{}", s.message());
      HACK_CHECK(p->head().headers.size() == keys.size(), "promote returned {} blocks", p->head().headers.size());
      payload = 0;
      for (int l = 0; l < layers; ++l) {
        std::vector<std::span<const std::byte>> slices;
        if (const Status s = p->wait_layer(l, 30, slices); !s) fail("{}", s.message());
        if (l == 0) first_layer.push_back(monotonic_s() - t0);
        for (auto s : slices) payload += s.size();
      }
      times.push_back(monotonic_s() - t0);
    }
    const double med = percentile(times, 0.5);
    std::printf("promote (all %d blocks, %d layer messages, checksums verified): median %.1f ms = %.2f GB/s of "
                "slices, first layer after %.2f ms, best %.2f GB/s over %d calls\n",
                blocks, layers, med * 1e3, payload / med / 1e9, percentile(first_layer, 0.5) * 1e3,
                payload / percentile(times, 0.0) / 1e9, promotes);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vault_bench: error: %s\n", e.what());
    return 1;
  }
}
