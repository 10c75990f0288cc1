// Chained SHA-256 block keys (include/hack/kv/block_key.h).
#include "hack/kv/block_key.h"

#include <openssl/evp.h>

#include <algorithm>

#include "hack/core/error.h"
#include "hack/core/hex.h"

namespace hack {

namespace {

// One SHA-256 over several pieces (EVP: the non-deprecated OpenSSL 3 interface).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    HACK_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1, "SHA-256: cannot initialise");
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes) {
    HACK_CHECK(EVP_DigestUpdate(ctx_, data, bytes) == 1, "SHA-256: update failed");
  }
  void update_u32(uint32_t v) {
    const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
                           static_cast<uint8_t>(v >> 24)};
    update(le, 4);
  }
  BlockKey finish() {
    BlockKey out{};
    unsigned int n = 0;
    HACK_CHECK(EVP_DigestFinal_ex(ctx_, out.data(), &n) == 1 && n == out.size(), "SHA-256: final failed");
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::string to_hex(const BlockKey& key) { return hex_encode(key); }

BlockKey parse_block_key(std::string_view hex) {
  HACK_CHECK(hex.size() == 64, "block key: expected 64 hex digits, got {} characters", hex.size());
  const std::vector<uint8_t> bytes = hex_decode(hex, "block key");
  BlockKey key{};
  std::copy(bytes.begin(), bytes.end(), key.begin());
  return key;
}

BlockKey sha256(std::span<const uint8_t> bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.finish();
}

KvFingerprint& KvFingerprint::add(std::string_view name, std::string_view value) {
  HACK_CHECK(!name.empty() && name.find_first_of("=\n") == std::string_view::npos,
             "fingerprint: bad field name '{}'", name);
  HACK_CHECK(value.find('\n') == std::string_view::npos, "fingerprint: field {} has a newline", name);
  for (const auto& f : fields_) HACK_CHECK(f.first != name, "fingerprint: field {} given twice", name);
  fields_.emplace_back(name, value);
  return *this;
}

KvFingerprint& KvFingerprint::add(std::string_view name, int64_t value) { return add(name, std::to_string(value)); }

std::string KvFingerprint::text() const {
  auto sorted = fields_;
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  for (const auto& [name, value] : sorted) out += name + "=" + value + "\n";
  return out;
}

std::string KvFingerprint::digest() const {
  const std::string t = text();
  return to_hex(sha256({reinterpret_cast<const uint8_t*>(t.data()), t.size()}));
}

BlockKey chain_root(const KvFingerprint& fingerprint, std::string_view name_space) {
  static constexpr std::string_view kDomain = "hackserve-kv-chain-v1";
  const std::string text = fingerprint.text();
  Sha256 h;
  h.update(kDomain.data(), kDomain.size());
  h.update_u32(static_cast<uint32_t>(text.size()));
  h.update(text.data(), text.size());
  h.update_u32(static_cast<uint32_t>(name_space.size()));
  h.update(name_space.data(), name_space.size());
  return h.finish();
}

BlockKey chain_next(const BlockKey& previous, std::span<const int> block_tokens) {
  Sha256 h;
  h.update(previous.data(), previous.size());
  for (int t : block_tokens) h.update_u32(static_cast<uint32_t>(t));
  return h.finish();
}

BlockKey tail_key(const BlockKey& previous, std::span<const int> tokens) {
  static constexpr std::string_view kDomain = "hackserve-kv-tail-v1";
  Sha256 h;
  h.update(kDomain.data(), kDomain.size());
  h.update(previous.data(), previous.size());
  h.update_u32(static_cast<uint32_t>(tokens.size()));
  for (int t : tokens) h.update_u32(static_cast<uint32_t>(t));
  return h.finish();
}

std::vector<BlockKey> chain_keys(const BlockKey& root, std::span<const int> tokens, int block_tokens, int max_blocks) {
  HACK_CHECK(block_tokens > 0, "chain_keys: block_tokens must be positive, got {}", block_tokens);
  size_t n = tokens.size() / static_cast<size_t>(block_tokens);
  if (max_blocks >= 0) n = std::min(n, static_cast<size_t>(max_blocks));
  std::vector<BlockKey> keys;
  keys.reserve(n);
  BlockKey h = root;
  for (size_t i = 0; i < n; ++i) {
    h = chain_next(h, tokens.subspan(i * static_cast<size_t>(block_tokens), static_cast<size_t>(block_tokens)));
    keys.push_back(h);
  }
  return keys;
}

}  // namespace hack
