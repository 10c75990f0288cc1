// hack-calibrate as a user runs it: --hack on hack-tiny writes an allocation that hack-run
// then applies, --fdc an FDC artifact that hack-run loads; bad flags fail with a message
// naming them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "hack/kv/hack_allocation.h"
#include "hack/model/fdc.h"
#include "support/run_process.h"
#include "support/test_support.h"

using namespace hack;

namespace {

test::ProcessResult run_tool(const std::string& tool, const std::string& args) {
  return test::run_process((test::binary_dir() / "bin" / tool).string() + " " + args);
}

}  // namespace

TEST_CASE("hack-calibrate --hack writes an allocation within the budget that hack-run applies", "[e2e][calibrate]") {
  const std::string model = (test::source_dir() / "models" / "hack-tiny").string();
  const std::string text = (test::fixtures_dir() / "tokenizers" / "kjv-bpe" / "heldout.txt").string();
  const test::TempFile out("hack_tiny_alloc.json", "");
  const std::string common = "--hack --model " + model + " --text " + text +
                             " --windows 2 --prefill-tokens 96 --decode-tokens 32 --threads 1 --output " + out.arg();
  const test::ProcessResult r = run_tool("hack-calibrate", common + " --max-bytes-pct 21 --hack-recent 16");
  INFO(r.err << r.out);
  REQUIRE(r.exit_code == 0);
  const HackAllocation a = load_hack_allocation(out.path.string());
  REQUIRE(a.layers.size() == 6);  // hack-tiny's layers
  REQUIRE(a.recent_tokens == 16);
  int raised = 0;
  for (const HackLayerBits& b : a.layers) raised += b == HackLayerBits{4, 2};
  // 6 layers of 2 KV heads × 64: K2/V2 is 16.8 % of bf16, each K4/V2 layer adds ~1.1 points.
  REQUIRE(raised >= 1);
  REQUIRE(raised < 6);
  REQUIRE(r.out.find("layers raised to k4v2") != std::string::npos);
  // One line per measurement on stderr: the base and each of the 6 layers raised alone.
  REQUIRE(r.err.find("layer 5 k4v2") != std::string::npos);

  const test::ProcessResult run = run_tool("hack-run", "--model " + model + " --prompt-ids 1,2,3 --max-tokens 4 --kv hack "
                                                       "--hack-allocation " + out.arg());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  REQUIRE(run.err.find("hack-per-layer") != std::string::npos);

  SECTION("bad flags fail by name") {
    const test::ProcessResult bad = run_tool("hack-calibrate", common + " --base k3v2");
    REQUIRE(bad.exit_code == 1);
    REQUIRE(bad.err.find("--base") != std::string::npos);
    const test::ProcessResult over = run_tool("hack-calibrate", common + " --max-bytes-pct 10");
    REQUIRE(over.exit_code == 1);
    REQUIRE(over.err.find("budget") != std::string::npos);
    const test::ProcessResult none = run_tool("hack-calibrate", "--model " + model);
    REQUIRE(none.exit_code == 1);
    REQUIRE(none.err.find("--hack") != std::string::npos);
  }
}

TEST_CASE("hack-calibrate --fdc writes an artifact at the given rate that hack-run loads", "[e2e][calibrate][fdc]") {
  const std::string model = (test::source_dir() / "models" / "hack-tiny").string();
  const std::string text = (test::fixtures_dir() / "tokenizers" / "kjv-bpe" / "heldout.txt").string();
  const test::TempFile out("hack_tiny_fdc.safetensors", "");
  const std::string common = "--fdc --model " + model + " --text " + text + " --calib-tokens 1024 --calib-seq-len 512 "
                             "--windows 1 --prefill-tokens 96 --decode-tokens 32 --threads 1 --output " + out.arg();
  const test::ProcessResult r = run_tool("hack-calibrate", common + " --fdc-rate 0.1");
  INFO(r.err << r.out);
  REQUIRE(r.exit_code == 0);
  const FdcArtifact a = load_fdc_artifact(out.path);
  REQUIRE(a.num_layers == 6);  // hack-tiny: 6 layers of 2 KV heads × 64
  REQUIRE(a.removal_rate == 0.1);  // the decimal given, not the float flag's 0.10000000149
  REQUIRE(a.ranks == fdc_ranks_for_rate(a, 0.1));
  const nlohmann::json cal = nlohmann::json::parse(a.calibration_json);
  REQUIRE(cal["source"] == "random");
  REQUIRE(cal["tokens"] == 1024);
  REQUIRE(r.out.find("layer  5  d_qk") != std::string::npos);
  REQUIRE(r.out.find("of 1536") != std::string::npos);  // KV dims per token, uncompressed: 6 × 2 × 2 × 64
  REQUIRE(r.out.find("decode-path KL") != std::string::npos);

  const test::ProcessResult run =
      run_tool("hack-run", "--model " + model + " --prompt-ids 1,2,3 --max-tokens 4 --kv fp --fdc " + out.arg());
  INFO(run.err);
  REQUIRE(run.exit_code == 0);

  SECTION("bad flags fail by name") {
    const test::ProcessResult both = run_tool("hack-calibrate", common + " --fdc-rate 0.1 --max-kl 0.01");
    REQUIRE(both.exit_code == 1);
    REQUIRE(both.err.find("exactly one of --fdc-rate") != std::string::npos);
    const test::ProcessResult neither = run_tool("hack-calibrate", common);
    REQUIRE(neither.exit_code == 1);
    REQUIRE(neither.err.find("--max-kl") != std::string::npos);
    const test::ProcessResult modes = run_tool("hack-calibrate", common + " --hack --fdc-rate 0.1");
    REQUIRE(modes.exit_code == 1);
    REQUIRE(modes.err.find("one of --hack and --fdc") != std::string::npos);
    const test::ProcessResult method = run_tool("hack-calibrate", common + " --fdc-rate 0.1 --v-method magic");
    REQUIRE(method.exit_code == 1);
    REQUIRE(method.err.find("magic") != std::string::npos);
  }
}
