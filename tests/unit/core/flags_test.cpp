#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "hack/core/error.h"
#include "hack/core/flags.h"

using namespace hack;

namespace {
struct Opts {
  std::string model;
  int max_tokens = 16;
  float temperature = 1.0f;
  bool verbose = false;
  std::optional<uint64_t> seed;
};
FlagSet make(Opts& o) {
  FlagSet f("t", "test", "HACK_FLAGTEST");
  f.add_string("model", &o.model, "model dir");
  f.add_int("max-tokens", &o.max_tokens, "n");
  f.add_float("temperature", &o.temperature, "t");
  f.add_bool("verbose", &o.verbose, "v");
  f.add_optional_uint64("seed", &o.seed, "s");
  return f;
}
}  // namespace

TEST_CASE("flags: command line, env and config file with precedence", "[core][flags]") {
  const auto cfg = std::filesystem::temp_directory_path() / "hack_flags_test.conf";
  {
    std::ofstream out(cfg);
    out << "# comment\nmax-tokens = 5\ntemperature = 0.25\nmodel = \"from-file\"\n";
  }
  ::setenv("HACK_FLAGTEST_MAX_TOKENS", "7", 1);
  Opts o;
  FlagSet f = make(o);
  const std::string cfg_s = cfg.string();
  const char* argv[] = {"t", "--config", cfg_s.c_str(), "--model=cli", "--verbose", "--seed", "9"};
  REQUIRE(f.parse(7, argv));
  ::unsetenv("HACK_FLAGTEST_MAX_TOKENS");
  REQUIRE(o.model == "cli");         // cli beats file
  REQUIRE(o.max_tokens == 7);        // env beats file
  REQUIRE(o.temperature == 0.25f);   // file beats default
  REQUIRE(o.verbose);
  REQUIRE(o.seed == 9u);
  REQUIRE(f.was_set("model"));
  std::filesystem::remove(cfg);
}

TEST_CASE("flags: errors name the flag", "[core][flags]") {
  Opts o;
  FlagSet f = make(o);
  const char* unknown[] = {"t", "--bogus", "1"};
  REQUIRE_THROWS_WITH(f.parse(3, unknown), Catch::Contains("--bogus"));
  const char* bad_int[] = {"t", "--max-tokens", "12x"};
  REQUIRE_THROWS_WITH(make(o).parse(3, bad_int), Catch::Contains("--max-tokens"));
  const char* missing[] = {"t", "--model"};
  REQUIRE_THROWS_WITH(make(o).parse(2, missing), Catch::Contains("--model"));
  REQUIRE(make(o).usage().find("HACK_FLAGTEST_MAX_TOKENS") != std::string::npos);
  // A bool flag takes no separate value: "--verbose 0" is a stray "0", refused.
  const char* stray[] = {"t", "--verbose", "0"};
  REQUIRE_THROWS_WITH(make(o).parse(3, stray), Catch::Contains("unexpected argument '0'"));
  Opts off;
  const char* explicit_false[] = {"t", "--verbose=false"};
  REQUIRE(make(off).parse(2, explicit_false));
  REQUIRE_FALSE(off.verbose);
}

TEST_CASE("flags: list values", "[core][flags]") {
  REQUIRE(split_list("fp32,bf16,,hack2") == std::vector<std::string>{"fp32", "bf16", "hack2"});
  REQUIRE(split_list("tcp:posix,sysv", ':') == std::vector<std::string>{"tcp", "posix,sysv"});
  REQUIRE(split_list("").empty());
  REQUIRE(parse_int_list("1024, 2048,4096", "contexts") == std::vector<int>{1024, 2048, 4096});
  REQUIRE_THROWS_WITH(parse_int_list("1,x", "batch"), Catch::Contains("--batch"));
  REQUIRE_THROWS_WITH(parse_int_list("99999999999", "batch"), Catch::Contains("out of range"));
}

TEST_CASE("flags: token id lists in every form users type", "[core][flags]") {
  const std::vector<int> ids{1, 22, 333};
  REQUIRE(parse_id_list("1,22,333", "prompt-ids") == ids);
  REQUIRE(parse_id_list("1 22\n333", "prompt-ids") == ids);
  REQUIRE(parse_id_list("[1, 22, 333]", "prompt-ids") == ids);
  REQUIRE(parse_id_list(" [ ] ", "prompt-ids").empty());
  REQUIRE_THROWS_WITH(parse_id_list("[1, 2.5]", "prompt-ids"), Catch::Contains("--prompt-ids"));
}

TEST_CASE("flags: a secret comes from a file, the environment or the config, never argv", "[core][flags]") {
  const auto dir = std::filesystem::temp_directory_path();
  const auto file = dir / "hack_flags_secret";
  {
    std::ofstream out(file);
    out << "s3cret \n";
  }
  std::string secret;
  auto make_secret = [&] {
    FlagSet f("t", "test", "HACK_FLAGTEST");
    f.add_secret("secret", &secret, "shared secret");
    return f;
  };
  {
    FlagSet f = make_secret();
    const std::string path = file.string();
    const char* argv[] = {"t", "--secret-file", path.c_str()};
    REQUIRE(f.parse(3, argv));
    CHECK(secret == "s3cret");
  }
  {
    FlagSet f = make_secret();
    const char* argv[] = {"t", "--secret", "visible-in-ps"};
    CHECK_THROWS_WITH(f.parse(3, argv), Catch::Contains("visible to every user") && Catch::Contains("HACK_FLAGTEST_SECRET"));
  }
  {
    ::setenv("HACK_FLAGTEST_SECRET", "from-env", 1);
    FlagSet f = make_secret();
    const char* argv[] = {"t"};
    REQUIRE(f.parse(1, argv));
    CHECK(secret == "from-env");
    ::unsetenv("HACK_FLAGTEST_SECRET");
  }
  {
    const auto cfg = dir / "hack_flags_secret.conf";
    {
      std::ofstream out(cfg);
      out << "secret = from-config\n";
    }
    FlagSet f = make_secret();
    const std::string cfg_s = cfg.string();
    const char* argv[] = {"t", "--config", cfg_s.c_str()};
    REQUIRE(f.parse(3, argv));
    CHECK(secret == "from-config");
  }
  {
    FlagSet f = make_secret();
    const char* argv[] = {"t", "--secret-file", "/nonexistent/secret"};
    CHECK_THROWS_WITH(f.parse(3, argv), Catch::Contains("cannot read"));
  }
  std::filesystem::remove(file);
}
