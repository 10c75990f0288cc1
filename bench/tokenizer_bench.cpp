// bench/tokenizer_bench: single-thread encode throughput (MB/s of UTF-8 input, tokens/s) of
// hack::Tokenizer on a fixed mixed corpus, plus decode and incremental-decode rates. The
// bound it is compared to is HF tokenizers on the same corpus: bench/tokenizer_bench_hf.py.
//
//   tokenizer_bench [--tokenizer DIR]... [--corpus FILE] [--corpus-out FILE] [--chunk-bytes N] [--repeat N]
//
// Corpus (unless --corpus): the King James Bible (`bible -f Gen1:1-Rev22:21`, Debian
// bible-kjv; tests/fixtures/tokenizers/kjv-bpe/heldout.txt when it is not installed), then
// the texts of the encode goldens in tests/fixtures/tokenizers/goldens/{qwen3,mistral,
// kjv-bpe}.json (code, numbers, whitespace runs, emoji, CJK, Arabic, Cyrillic, ...), one
// per line. It is cut into documents of about --chunk-bytes at line ends, each encoded by
// one encode() call; the FNV-1a hash printed identifies the corpus for the HF script.
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hack/core/error.h"
#include "hack/core/read_file.h"
#include "hack/tokenizer/tokenizer.h"

namespace {

std::string run_command(const char* command) {
  std::string out;
  FILE* p = popen(command, "r");
  if (!p) return out;
  char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), p)) > 0) out.append(buffer, n);
  pclose(p);
  return out;
}

std::string build_corpus(const std::string& repo) {
  std::string corpus = run_command("bible -f 'Gen1:1-Rev22:21' 2>/dev/null");
  if (corpus.size() < 1000000) {
    std::fprintf(stderr, "tokenizer_bench: `bible` not available; using kjv-bpe/heldout.txt\n");
    corpus = hack::read_file(repo + "/tests/fixtures/tokenizers/kjv-bpe/heldout.txt");
  }
  for (const char* name : {"qwen3", "mistral", "kjv-bpe"}) {
    const std::string path = repo + "/tests/fixtures/tokenizers/goldens/" + name + ".json";
    const nlohmann::json golden = nlohmann::json::parse(hack::read_file(path));
    for (const auto& c : golden["encode"]) {
      corpus += c["text"].get<std::string>();
      corpus += '\n';
    }
  }
  return corpus;
}

// Documents of at least chunk_bytes (the last may be shorter), cut after a '\n'.
std::vector<std::string> split_documents(const std::string& corpus, size_t chunk_bytes) {
  std::vector<std::string> docs;
  size_t start = 0;
  while (start < corpus.size()) {
    size_t end = start + chunk_bytes;
    if (end >= corpus.size()) {
      end = corpus.size();
    } else {
      const size_t nl = corpus.find('\n', end);
      end = nl == std::string::npos ? corpus.size() : nl + 1;
    }
    docs.push_back(corpus.substr(start, end - start));
    start = end;
  }
  return docs;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  // The repository root (CMake compiles this file by its absolute path).
  const std::string repo = std::filesystem::path(__FILE__).parent_path().parent_path().string();
  std::vector<std::string> dirs;
  std::string corpus_path, corpus_out;
  size_t chunk_bytes = 4096;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) dirs.push_back(argv[++i]);
    else if (a == "--corpus" && i + 1 < argc) corpus_path = argv[++i];
    else if (a == "--corpus-out" && i + 1 < argc) corpus_out = argv[++i];
    else if (a == "--chunk-bytes" && i + 1 < argc) chunk_bytes = static_cast<size_t>(std::stoul(argv[++i]));
    else if (a == "--repeat" && i + 1 < argc) repeat = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench [--tokenizer DIR]... (default: the qwen3, mistral, kjv-bpe fixtures)\n"
                   "  [--corpus FILE] [--corpus-out FILE] [--chunk-bytes N (4096)] [--repeat N (3, best run)]\n");
      return 2;
    }
  }
  if (dirs.empty()) {
    dirs = {repo + "/tests/fixtures/shared/tokenizers/qwen3", repo + "/tests/fixtures/shared/tokenizers/mistral",
            repo + "/tests/fixtures/tokenizers/kjv-bpe"};
  }
  try {
    const std::string corpus = corpus_path.empty() ? build_corpus(repo) : hack::read_file(corpus_path);
    if (!corpus_out.empty()) std::ofstream(corpus_out, std::ios::binary) << corpus;
    const std::vector<std::string> docs = split_documents(corpus, chunk_bytes);
    std::printf("cpu: %s (1 thread)\ncorpus: %.2f MB, %zu documents of ~%zu bytes, fnv1a %016llx\n",
                cpu_model().c_str(), corpus.size() / 1e6, docs.size(), chunk_bytes,
                static_cast<unsigned long long>(fnv1a(corpus)));
    for (const std::string& dir : dirs) {
      const auto t_load = std::chrono::steady_clock::now();
      const hack::Tokenizer tok = hack::Tokenizer::load(dir);
      const double load_s = seconds_since(t_load);

      double best_encode_s = 1e30;
      size_t tokens = 0;
      std::vector<std::vector<int>> ids(docs.size());
      for (int r = 0; r < repeat; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        tokens = 0;
        for (size_t d = 0; d < docs.size(); ++d) {
          ids[d] = tok.encode(docs[d], false);
          tokens += ids[d].size();
        }
        best_encode_s = std::min(best_encode_s, seconds_since(t0));
      }
      auto t0 = std::chrono::steady_clock::now();
      size_t decoded_bytes = 0;
      for (const auto& v : ids) decoded_bytes += tok.decode(v, false).size();
      const double decode_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (const auto& v : ids) {
        hack::IncrementalDecoder d(tok, false);
        for (int id : v) decoded_bytes += d.step(id).size();
        decoded_bytes += d.finish().size();
      }
      const double stream_s = seconds_since(t0);
      std::printf(
          "%s: load %.2f s | encode %.2f MB/s, %.0f tokens/s (%zu tokens, %.2f bytes/token, best of %d) | decode "
          "%.0f tokens/s | incremental decode %.0f tokens/s\n",
          dir.c_str(), load_s, corpus.size() / best_encode_s / 1e6, tokens / best_encode_s, tokens,
          static_cast<double>(corpus.size()) / tokens, repeat, tokens / decode_s, tokens / stream_s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
