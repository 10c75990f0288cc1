// Chained SHA-256 block keys (kv/block_key.h). Goldens from Python's hashlib (an independent
// SHA-256 in another process), computed with:
//   root = sha256(b"hackserve-kv-chain-v1" + u32le(len(fp)) + fp + u32le(len(ns)) + ns)
//   key_i = sha256(key_{i-1} + b"".join(u32le(t) for t in block_i))
//   tail  = sha256(b"hackserve-kv-tail-v1" + key_{i-1} + u32le(n) + b"".join(u32le(t) for t in tail))
// with fp = "a=1\nb=two\n", ns = "default", tokens 100..107, 4-token blocks.
#include <catch2/catch.hpp>

#include "hack/core/error.h"
#include "hack/kv/block_key.h"

using namespace hack;

namespace {

KvFingerprint test_fingerprint() {
  KvFingerprint f;
  f.add("b", "two").add("a", 1);  // added out of order: the text is sorted
  return f;
}

}  // namespace

TEST_CASE("sha256 matches the standard test vector", "[block_key]") {
  const std::string abc = "abc";
  CHECK(to_hex(sha256({reinterpret_cast<const uint8_t*>(abc.data()), abc.size()})) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("chain keys equal an independent implementation's", "[block_key]") {
  const KvFingerprint f = test_fingerprint();
  CHECK(f.text() == "a=1\nb=two\n");
  const BlockKey root = chain_root(f, "default");
  CHECK(to_hex(root) == "7482ac55585e10125d9ea64ac02b5f0026e47980c584935ac7d651dd6210c4fe");
  std::vector<int> tokens;
  for (int t = 100; t < 108; ++t) tokens.push_back(t);
  tokens.push_back(7);  // a partial third block: no key
  const auto keys = chain_keys(root, tokens, 4);
  REQUIRE(keys.size() == 2);
  CHECK(to_hex(keys[0]) == "e6f6832879cdbc41cf71fb7c48f60a00970cd0f1c4eda25708207226001b248a");
  CHECK(to_hex(keys[1]) == "990357f0697663e485eb3a148f0e15c24b78f5358a53513b7657dcf28340bf17");
  CHECK(chain_keys(root, tokens, 4, 1).size() == 1);
  CHECK(parse_block_key(to_hex(keys[1])) == keys[1]);
  // The partial third block's tail key, and not the chain key the same tokens would get.
  const std::vector<int> tail = {7};
  CHECK(to_hex(tail_key(keys[1], tail)) == "0a471a2a25c45640eb6c1c67d95f23cc990bb6ee15577159efce8d33ba8e433f");
  CHECK(to_hex(chain_next(keys[1], tail)) == "4795c574cd3509a20b16247b158640044c7303b222df0fca2fe55044fb35e5a1");
}

TEST_CASE("every fingerprint field, the namespace and every token change the keys", "[block_key]") {
  const std::vector<int> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const BlockKey base = chain_keys(chain_root(test_fingerprint(), "default"), tokens, 4)[1];
  KvFingerprint other_value;
  other_value.add("a", 2).add("b", "two");
  KvFingerprint extra_field = test_fingerprint();
  extra_field.add("c", "");
  CHECK(chain_keys(chain_root(other_value, "default"), tokens, 4)[1] != base);
  CHECK(chain_keys(chain_root(extra_field, "default"), tokens, 4)[1] != base);
  CHECK(chain_keys(chain_root(test_fingerprint(), "tenant-b"), tokens, 4)[1] != base);
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto changed = tokens;
    changed[i] += 1;
    CHECK(chain_keys(chain_root(test_fingerprint(), "default"), changed, 4)[1] != base);
  }
  // A block's key names its whole prefix: the same second block after another first block differs.
  auto first_changed = tokens;
  first_changed[0] = 99;
  CHECK(chain_next(chain_keys(chain_root(test_fingerprint(), "default"), first_changed, 4)[0],
                   std::span<const int>(tokens).subspan(4)) != base);
  // Length-prefixed fields: moving bytes between fingerprint and namespace changes the root.
  KvFingerprint a, b;
  a.add("x", "ab");
  b.add("x", "a");
  CHECK(chain_root(a, "c") != chain_root(b, "bc"));
}

TEST_CASE("bad fingerprints and keys are refused", "[block_key]") {
  KvFingerprint f;
  f.add("a", 1);
  CHECK_THROWS_AS(f.add("a", 2), Error);
  CHECK_THROWS_AS(f.add("", "x"), Error);
  CHECK_THROWS_AS(f.add("x=y", "x"), Error);
  CHECK_THROWS_AS(f.add("x", "two\nlines"), Error);
  CHECK_THROWS_AS(parse_block_key("abc"), Error);
  CHECK_THROWS_AS(parse_block_key(std::string(64, 'g')), Error);
  CHECK_THROWS_AS(chain_keys(BlockKey{}, std::vector<int>{1, 2}, 0), Error);
}
