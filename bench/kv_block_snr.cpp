// bench/kv_block_snr: what the vault's int8-head codec (kv/kv_block.h, DESIGN.md §3.3) costs
// on real KV. Prefills --tokens of a text with the model into an fp cache with f32 pages,
// encodes every full Π-token block (all layers) into a block value, decodes it back, and
// reports SNR in dB (10·log10(Σx² / Σ(x − x̂)²)) of K and V:
//   int8|f32   int8-head of the f32 KV against the f32 KV (an fp f32 node's blocks)
//   int8|bf16  int8-head of the bf16-rounded KV against the bf16 KV (an fp bf16 node's blocks)
//   bf16|f32   bf16 rounding itself against f32, the yardstick: what bf16 pages already lose
// per layer (over all blocks), the worst single (block, layer), per-layer min and median,
// and overall (all layers' energy together); plus bytes per token of each codec. The design
// target is ≥ 52 dB. Beside it, the uniform-noise model of absmax/127 rows: rounding error
// uniform in ±s/2 (s = absmax/127) gives SNR = 10·log10(12·127² · Σx² / (d · Σ absmax²))
// = 52.9 dB − the rows' crest factor (absmax² over mean square) in dB — the codec's ceiling
// for the data, whatever the implementation.
//   kv_block_snr --model DIR --text FILE [--tokens 1024] [--block 64] [--threads 0]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "hack/backend/backend.h"
#include "hack/backend/cpu_engine.h"
#include "hack/backend/engine.h"
#include "hack/core/dtype.h"
#include "hack/core/error.h"
#include "hack/core/flags.h"
#include "hack/core/read_file.h"
#include "hack/core/thread_pool.h"
#include "hack/kv/kv_block.h"
#include "hack/backend/cpu_paged_kv_cache.h"
#include "hack/model/weights.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

constexpr double kTargetDb = 52.0;

// Energy of the signal and of the error, summed in double.
struct Energy {
  double signal = 0.0, noise = 0.0;
  void add(const std::vector<float>& x, const std::vector<float>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = static_cast<double>(x[i]) - y[i];
      signal += static_cast<double>(x[i]) * x[i];
      noise += e * e;
    }
  }
  // The uniform-noise model of int8-head on rows of `dim` values: noise d·s²/12 per row.
  void add_model(const std::vector<float>& x, size_t dim) {
    for (size_t r = 0; r < x.size() / dim; ++r) {
      double absmax = 0.0;
      for (size_t c = 0; c < dim; ++c) {
        const double xi = x[r * dim + c];
        absmax = std::max(absmax, std::fabs(xi));
        signal += xi * xi;
      }
      const double s = absmax / 127.0;
      noise += static_cast<double>(dim) * s * s / 12.0;
    }
  }
  Energy& operator+=(const Energy& o) {
    signal += o.signal;
    noise += o.noise;
    return *this;
  }
  double db() const {
    return noise == 0.0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(signal / noise);
  }
};

// One comparison (e.g. int8|f32) of K or V: per layer, and the worst (block, layer).
struct Series {
  std::vector<Energy> layers;
  double worst_db = std::numeric_limits<double>::infinity();
  int worst_block = -1, worst_layer = -1;
  void add(int block, int layer, const std::vector<float>& x, const std::vector<float>& y) {
    Energy e;
    e.add(x, y);
    layers[static_cast<size_t>(layer)] += e;
    if (e.db() < worst_db) {
      worst_db = e.db();
      worst_block = block;
      worst_layer = layer;
    }
  }
  Energy overall() const {
    Energy all;
    for (const Energy& e : layers) all += e;
    return all;
  }
};

std::vector<float> bf16_rounded(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = hack::bf16_to_f32(hack::f32_to_bf16(x[i]));
  return out;
}

void print_summary(const char* name, const Series& s) {
  std::vector<double> per_layer;
  for (const Energy& e : s.layers) per_layer.push_back(e.db());
  std::vector<double> sorted = per_layer;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  const auto min_layer = std::min_element(per_layer.begin(), per_layer.end()) - per_layer.begin();
  std::printf("  %-11s overall %6.2f dB | per layer min %6.2f (layer %2td), median %6.2f | worst block %6.2f "
              "(block %d, layer %d)\n",
              name, s.overall().db(), sorted.front(), min_layer, median, s.worst_db, s.worst_block, s.worst_layer);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = "models/smollm2-135m-instruct", text_path = "tests/fixtures/tokenizers/kjv-bpe/heldout.txt";
  int max_tokens = 1024, block = 64, threads = 0;
  hack::FlagSet flags("kv_block_snr", "SNR of the int8-head vault codec on a model's real KV.", "HACK_KV_BLOCK_SNR");
  flags.add_string("model", &model_dir, "model directory (Hugging Face layout)");
  flags.add_string("text", &text_path, "text file to prefill");
  flags.add_int("tokens", &max_tokens, "tokens prefilled (bos included)");
  flags.add_int("block", &block, "Π: tokens per vault block (and per fp page)");
  flags.add_int("threads", &threads, "threads (0 = all)");
  try {
    if (!flags.parse(argc, argv)) return 0;
    HACK_CHECK(max_tokens >= block && block > 0 && block % 16 == 0,
               "--tokens must hold at least one block and --block be a positive multiple of 16");

    const hack::Model model = hack::Model::load(model_dir);
    const hack::Tokenizer tok = hack::Tokenizer::load(model_dir);
    const hack::ModelConfig& cfg = model.config;
    std::vector<int> tokens;
    const int bos = cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id();
    if (bos >= 0) tokens.push_back(bos);
    const std::vector<int> text = tok.encode(hack::read_file(text_path, "text"), false);
    tokens.insert(tokens.end(), text.begin(), text.begin() + std::min<std::ptrdiff_t>(
                                                             static_cast<std::ptrdiff_t>(text.size()),
                                                             max_tokens - static_cast<std::ptrdiff_t>(tokens.size())));
    const int n = static_cast<int>(tokens.size());
    const int blocks = n / block;
    HACK_CHECK(blocks > 0, "{}: {} tokens, fewer than one block of {}", text_path, n, block);

    hack::KvCacheOptions fp32;
    fp32.mode = hack::KvMode::fp;
    fp32.fp_dtype = hack::DType::f32;
    fp32.block_tokens = block;
    hack::ThreadPool pool(threads);
    hack::CpuEngine e = hack::make_cpu_engine(model, pool, fp32);
    e.engine->add_sequence(0, n);
    std::vector<float> logits;
    e.engine->prefill(0, tokens, logits);
    const hack::CpuPagedKvCache& kv = *e.kv;
    const hack::KvShape shape = kv.shape();
    const int L = shape.num_layers, H = shape.num_kv_heads, d = shape.head_dim;

    std::printf("kv_block_snr: %s (%d layers, %d KV heads, head_dim %d), cache %s\n", model_dir.c_str(), L, H, d,
                hack::describe(fp32).c_str());
    std::printf("text: %s, %d tokens prefilled (bos included) → %d blocks of %d\n", text_path.c_str(), n, blocks, block);

    // Bytes per token, all layers, K and V; a value adds its header and table per block.
    const auto per_token = [&](hack::BlockCodec codec, hack::DType dtype) {
      return static_cast<double>(L) *
             static_cast<double>(hack::kv_block_layer_bytes(codec, dtype, block, H, d)) / block;
    };
    const auto value_per_token = [&](hack::BlockCodec codec, hack::DType dtype) {
      return static_cast<double>(hack::kv_block_bytes(codec, dtype, shape, block)) / block;
    };
    const double int8 = per_token(hack::BlockCodec::int8_head, hack::DType::i8);
    const double bf16 = per_token(hack::BlockCodec::exact, hack::DType::bf16);
    const double f32 = per_token(hack::BlockCodec::exact, hack::DType::f32);
    std::printf("bytes/token (K+V, all layers): int8-head %.0f (value %.2f with header+table), exact bf16 %.0f "
                "(value %.2f), exact f32 %.0f (value %.2f); int8-head = %.3f × bf16, per (token, head, K|V) %zu "
                "vs %zu bytes\n",
                int8, value_per_token(hack::BlockCodec::int8_head, hack::DType::i8), bf16,
                value_per_token(hack::BlockCodec::exact, hack::DType::bf16), f32,
                value_per_token(hack::BlockCodec::exact, hack::DType::f32), int8 / bf16,
                hack::kv_block_layer_bytes(hack::BlockCodec::int8_head, hack::DType::i8, 1, 1, d) / 2,
                hack::kv_block_layer_bytes(hack::BlockCodec::exact, hack::DType::bf16, 1, 1, d) / 2);

    Series k_int8_f32, v_int8_f32, k_int8_bf16, v_int8_bf16, k_bf16_f32, v_bf16_f32;
    Energy k_model, v_model;
    for (Series* s : {&k_int8_f32, &v_int8_f32, &k_int8_bf16, &v_int8_bf16, &k_bf16_f32, &v_bf16_f32})
      s->layers.resize(static_cast<size_t>(L));
    const size_t elems = static_cast<size_t>(block) * static_cast<size_t>(H) * static_cast<size_t>(d);
    std::vector<float> k(elems), v(elems), kq(elems), vq(elems);
    std::vector<std::vector<std::byte>> slices(static_cast<size_t>(L)), slices_bf16(static_cast<size_t>(L));
    for (int b = 0; b < blocks; ++b) {
      // The value as a prefill node would store it: every layer encoded from the cache.
      for (int l = 0; l < L; ++l) {
        slices[static_cast<size_t>(l)].clear();
        hack::encode_kv_block_layer(kv, 0, l, b * block, block, hack::BlockCodec::int8_head,
                                    slices[static_cast<size_t>(l)]);
        kv.read_exact_tokens(0, l, b * block, block, k.data(), v.data());
        slices_bf16[static_cast<size_t>(l)].clear();
        hack::encode_kv_block_layer(bf16_rounded(k).data(), bf16_rounded(v).data(), block, H, d,
                                    hack::BlockCodec::int8_head, hack::DType::i8, slices_bf16[static_cast<size_t>(l)]);
      }
      const auto value = hack::assemble_kv_block(hack::BlockCodec::int8_head, hack::DType::i8, shape, b * block, block,
                                                 slices);
      const auto value_bf16 = hack::assemble_kv_block(hack::BlockCodec::int8_head, hack::DType::i8, shape, b * block,
                                                      block, slices_bf16);
      const hack::KvBlockHeader h = hack::decode_kv_block_header(value);
      HACK_CHECK(h.first_token == b * block && h.tokens == block, "block {}: header does not describe it", b);
      for (int l = 0; l < L; ++l) {
        const hack::KvBlockLayer& entry = h.layers[static_cast<size_t>(l)];
        HACK_CHECK(hack::verify_kv_block_layer(h, l, value), "block {} layer {}: checksum", b, l);
        kv.read_exact_tokens(0, l, b * block, block, k.data(), v.data());
        hack::decode_kv_block_layer(h, std::span(value).subspan(entry.offset, entry.bytes), kq.data(), vq.data());
        k_int8_f32.add(b, l, k, kq);
        v_int8_f32.add(b, l, v, vq);
        k_model.add_model(k, static_cast<size_t>(d));
        v_model.add_model(v, static_cast<size_t>(d));
        const std::vector<float> kb = bf16_rounded(k), vb = bf16_rounded(v);
        k_bf16_f32.add(b, l, k, kb);
        v_bf16_f32.add(b, l, v, vb);
        hack::decode_kv_block_layer(h, std::span(value_bf16).subspan(entry.offset, entry.bytes), kq.data(), vq.data());
        k_int8_bf16.add(b, l, kb, kq);
        v_int8_bf16.add(b, l, vb, vq);
      }
    }

    std::printf("\nSNR dB per layer (all %d blocks):\n", blocks);
    std::printf("layer | K int8|f32  V int8|f32 | K int8|bf16  V int8|bf16 | K bf16|f32  V bf16|f32\n");
    for (int l = 0; l < L; ++l) {
      const size_t i = static_cast<size_t>(l);
      std::printf("%5d | %10.2f  %10.2f | %11.2f  %11.2f | %10.2f  %10.2f\n", l, k_int8_f32.layers[i].db(),
                  v_int8_f32.layers[i].db(), k_int8_bf16.layers[i].db(), v_int8_bf16.layers[i].db(),
                  k_bf16_f32.layers[i].db(), v_bf16_f32.layers[i].db());
    }
    std::printf("\nsummary (target: int8-head ≥ %.0f dB):\n", kTargetDb);
    print_summary("K int8|f32", k_int8_f32);
    print_summary("V int8|f32", v_int8_f32);
    print_summary("K int8|bf16", k_int8_bf16);
    print_summary("V int8|bf16", v_int8_bf16);
    print_summary("K bf16|f32", k_bf16_f32);
    print_summary("V bf16|f32", v_bf16_f32);
    std::printf("  uniform-noise model of int8-head (its ceiling on this KV): K %.2f dB, V %.2f dB "
                "(crest factor K %.2f dB, V %.2f dB)\n",
                k_model.db(), v_model.db(), 10.0 * std::log10(12.0 * 127 * 127) - k_model.db(),
                10.0 * std::log10(12.0 * 127 * 127) - v_model.db());
    Energy int8_all = k_int8_f32.overall();
    int8_all += v_int8_f32.overall();
    std::printf("int8-head vs f32, K and V together: %.2f dB — %s the %.0f dB target\n", int8_all.db(),
                int8_all.db() >= kTargetDb ? "meets" : "misses", kTargetDb);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "kv_block_snr: %s\n", ex.what());
    return 1;
  }
  return 0;
}
