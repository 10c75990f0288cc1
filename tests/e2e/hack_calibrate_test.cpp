// hack-calibrate as a user runs it: --hack on hack-tiny writes an allocation that hack-run
// then applies; bad flags fail with a message naming them.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "hack/kv/hack_allocation.h"
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
