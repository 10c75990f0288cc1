// hack-run as a user runs it: the real binary, real model directories, output parsed.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "hack/core/tensor.h"
#include "support/run_process.h"
#include "support/test_support.h"

using namespace hack;

namespace {

using Result = test::ProcessResult;

Result run_hack_run(const std::string& args) {
  return test::run_process((test::binary_dir() / "bin" / "hack-run").string() + " " + args);
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

TEST_CASE("hack-run greedy output equals Hugging Face generate on a fixture model", "[e2e][hack-run]") {
  const auto dir = test::fixtures_dir() / "models" / "tiny-llama";
  std::ifstream in(dir / "goldens.json");
  const nlohmann::json g = nlohmann::json::parse(in);
  const auto& prompt = g["prompts"][0];
  const std::vector<int> greedy = prompt["greedy"].get<std::vector<int>>();
  const Result r = run_hack_run("--model " + dir.string() + " --prompt-ids " + join_ids(prompt["ids"]) +
                                " --kv fp --kv-dtype f32 --temperature 0 --json --threads 2 --max-tokens " + std::to_string(greedy.size()) +
                                " --min-tokens " + std::to_string(greedy.size()));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json out = nlohmann::json::parse(r.out);
  REQUIRE(out["ids"].get<std::vector<int>>() == greedy);
  REQUIRE(out["finish_reason"] == "length");
  REQUIRE(r.err.find("decode") != std::string::npos);
}

TEST_CASE("hack-run generates text from hack-tiny and reports timing", "[e2e][hack-run]") {
  const auto dir = test::source_dir() / "models" / "hack-tiny";
  const Result r = run_hack_run("--model " + dir.string() +
                                " --prompt 'And God said' --max-tokens 24 --seed 3 --threads 2");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.size() > 10);
  REQUIRE(r.err.find("prefill") != std::string::npos);
  REQUIRE(r.err.find("TTFT") != std::string::npos);
  // Same seed, same text.
  const Result again = run_hack_run("--model " + dir.string() +
                                    " --prompt 'And God said' --max-tokens 24 --seed 3 --threads 1");
  REQUIRE(again.out == r.out);
}

TEST_CASE("hack-run rejects bad input with a clear message", "[e2e][hack-run]") {
  const auto tiny = (test::fixtures_dir() / "models" / "tiny-llama").string();
  Result r = run_hack_run("--model /nonexistent/model --prompt hi");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("/nonexistent/model") != std::string::npos);
  r = run_hack_run("--model " + tiny + " --prompt hi --max-tokens nope");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("--max-tokens") != std::string::npos);
  r = run_hack_run("--model " + tiny + " --prompt hi --prompt-ids 1,2");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("exactly one") != std::string::npos);
  r = run_hack_run("--model " + tiny + " --prompt-ids 1,2 --max-tokens 5000");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("context") != std::string::npos);
  r = run_hack_run("--model " + tiny + " --prompt-ids 1,99999 --max-tokens 4");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("99999") != std::string::npos);
  r = run_hack_run("--model " + tiny + " --prompt-ids 1,2 --max-tokens 4 --cuda-attention fast");
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("--cuda-attention must be kernels or plan") != std::string::npos);
  r = run_hack_run("--help");
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.out.find("HACK_RUN_MAX_TOKENS") != std::string::npos);
}

TEST_CASE("hack-run --device cuda runs where it can and says why where it cannot", "[e2e][hack-run][cuda]") {
  const auto tiny = (test::fixtures_dir() / "models" / "tiny-llama").string();
  const std::string common = "--model " + tiny + " --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 --device cuda";
  if (!cuda_device_available()) {
    // Built without CUDA ("built without CUDA") or no device ("no CUDA device").
    const Result r = run_hack_run(common);
    INFO(r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.find("CUDA") != std::string::npos);
    return;
  }
  Result r = run_hack_run(common + " --kv hack");
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("not yet") != std::string::npos);
  r = run_hack_run(common + " --kv fp --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto ids = nlohmann::json::parse(r.out)["ids"];
  REQUIRE(ids.size() == 4);
  REQUIRE(r.err.find("bf16-paged-cuda") != std::string::npos);
  // The CUDA runner of the AttentionPlan answers as the decode/prefill kernels do.
  r = run_hack_run(common + " --kv fp --json --cuda-attention plan");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(nlohmann::json::parse(r.out)["ids"] == ids);
}

TEST_CASE("hack-run --kv hack generates from hack-tiny over closed HACK blocks", "[e2e][hack-run][hack]") {
  const auto dir = test::source_dir() / "models" / "hack-tiny";
  // A prompt of a few hundred tokens, so several Π=64 blocks are quantized before decoding.
  std::ifstream in(test::source_dir() / "tests" / "fixtures" / "tokenizers" / "kjv-bpe" / "heldout.txt");
  std::string text(1500, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  const test::TempFile prompt("prompt.txt", text);
  const std::string common = "--model " + dir.string() + " --prompt-file " + prompt.arg() +
                             " --max-tokens 32 --temperature 0 --json";
  const Result fp = run_hack_run(common + " --kv fp");
  const Result h8 = run_hack_run(common + " --kv hack --hack-bits 8");
  const Result h2 = run_hack_run(common + " --kv hack --hack-bits 2 --hack-rounding stochastic --seed 5");
  for (const Result* r : {&fp, &h8, &h2}) {
    INFO(r->err);
    REQUIRE(r->exit_code == 0);
  }
  REQUIRE(h2.err.find("hack-2bit") != std::string::npos);
  const auto jfp = nlohmann::json::parse(fp.out), j8 = nlohmann::json::parse(h8.out), j2 = nlohmann::json::parse(h2.out);
  REQUIRE(jfp["prompt_ids"].size() > 3 * 64);
  REQUIRE(j2["ids"].size() == 32);
  REQUIRE(!j2["text"].get<std::string>().empty());
  // 8-bit codes move the next-token distribution by KL ~1e-6 here: greedy text is unchanged.
  REQUIRE(j8["ids"] == jfp["ids"]);

  SECTION("a per-layer allocation file is applied, and a bad one is refused by name") {
    const std::string alloc = (test::fixtures_dir() / "allocations" / "hack-tiny-mixed.hack_kv.json").string();
    const Result a = run_hack_run(common + " --kv hack --hack-allocation " + alloc);
    INFO(a.err);
    REQUIRE(a.exit_code == 0);
    REQUIRE(a.err.find("hack-per-layer") != std::string::npos);
    const test::TempFile bad("bad_alloc.json", R"({"format": "hackserve.hack-allocation", "version": 1, "layers": [{"k_bits": 2, "v_bits": 2}]})");
    const Result b = run_hack_run(common + " --kv hack --hack-allocation " + bad.arg());
    REQUIRE(b.exit_code != 0);
    REQUIRE(b.err.find("1 layers, the model 6") != std::string::npos);
  }
}
