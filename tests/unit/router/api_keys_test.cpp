#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/router/api_keys.h"
#include "support/run_process.h"

using namespace hack::server;
using hack::test::TempFile;

TEST_CASE("api keys: none configured means auth is off") {
  ApiKeys keys;
  CHECK_FALSE(keys.enabled());
  CHECK(keys.authorized(""));
  CHECK(keys.authorized("Bearer anything"));
}

TEST_CASE("api keys: Bearer tokens against --api-key values") {
  const std::vector<std::string> flags = {"sk-alpha", "  sk-beta  ", ""};
  const ApiKeys keys = ApiKeys::from_flags(flags, {});
  CHECK(keys.enabled());
  CHECK(keys.size() == 2);  // trimmed; the empty one ignored
  CHECK(keys.authorized("Bearer sk-alpha"));
  CHECK(keys.authorized("Bearer sk-beta"));
  CHECK(keys.authorized("bearer sk-alpha"));    // scheme is case-insensitive
  CHECK(keys.authorized("BEARER   sk-alpha "));  // extra whitespace around the token
  CHECK_FALSE(keys.authorized(""));
  CHECK_FALSE(keys.authorized("Bearer"));
  CHECK_FALSE(keys.authorized("Bearer "));
  CHECK_FALSE(keys.authorized("sk-alpha"));          // no scheme
  CHECK_FALSE(keys.authorized("Basic sk-alpha"));    // wrong scheme
  CHECK_FALSE(keys.authorized("Bearersk-alpha"));    // no separator
  CHECK_FALSE(keys.authorized("Bearer sk-alph"));    // a prefix of a key
  CHECK_FALSE(keys.authorized("Bearer sk-alphaa"));  // a key as prefix
  CHECK_FALSE(keys.authorized("Bearer sk-Alpha"));   // keys are case-sensitive
  CHECK_FALSE(keys.authorized("Bearer sk-gamma"));
  CHECK_FALSE(keys.authorized(std::string("Bearer sk-alpha\0x", 17)));
}

TEST_CASE("api keys: --api-key-file, one key per line, blanks and comments ignored") {
  TempFile file("api_keys.txt", "# team keys\nkey-one\n\n   \n  key-two\t\r\n#key-commented\nkey-three");
  const std::vector<std::string> flags = {"flag-key"};
  const ApiKeys keys = ApiKeys::from_flags(flags, file.path);
  CHECK(keys.size() == 4);
  CHECK(keys.authorized("Bearer flag-key"));
  CHECK(keys.authorized("Bearer key-one"));
  CHECK(keys.authorized("Bearer key-two"));
  CHECK(keys.authorized("Bearer key-three"));  // last line without a newline
  CHECK_FALSE(keys.authorized("Bearer #key-commented"));
  CHECK_FALSE(keys.authorized("Bearer key-commented"));
  CHECK_FALSE(keys.authorized("Bearer # team keys"));

  ApiKeys missing;
  CHECK_THROWS_WITH(missing.load_file("/nonexistent/hack_keys.txt"), Catch::Contains("/nonexistent/hack_keys.txt"));
  CHECK_THROWS_AS(missing.load_file("/nonexistent/hack_keys.txt"), hack::Error);
}
