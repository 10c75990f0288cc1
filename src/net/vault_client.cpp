// A node's vault client (include/hack/net/vault_client.h).
#include "hack/net/vault_client.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "hack/core/clock.h"
#include "hack/net/wire.h"

namespace hack::net {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// One call waiting for its reply (or replies: a promote's head and layers).
struct VaultCall {
  WireType reply = WireType::vault_count;  // what answers it (promote: vault_promote_head)
  EndpointId endpoint = 0;
  bool failed = false;
  Status error;
  bool answered = false;          // count / stats / promote head arrived
  uint64_t count = 0;
  std::string text;
  std::optional<VaultPromoteHead> head;
  std::map<int, std::vector<std::byte>> layers;  // promote: raw layer payloads, split on demand
};

struct VaultClient::Shared {
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::optional<EndpointId> endpoint;
  // Endpoints UCX reported lost (the newest few): a dial that fails before endpoint_of has
  // stored its result reports the loss first, and must not leave a dead endpoint stored.
  std::deque<EndpointId> lost;
  double last_dial_s = -1e30;
  bool dialling = false;
  uint64_t next_id = 1;
  std::map<uint64_t, std::shared_ptr<VaultCall>> calls;
  size_t store_bytes_in_flight = 0;
  VaultClientStats stats;

  void fail_call(VaultCall& call, std::string message) {
    if (call.failed) return;
    call.failed = true;
    call.error = Status::error(std::move(message));
  }

  // Progress thread: one reply, authenticated first.
  void on_reply(const WireAuth& auth, std::span<const std::byte> sealed, std::span<const std::byte> payload) {
    std::span<const std::byte> header_bytes;
    if (const Status s = auth.open(sealed, payload, WireChannel::reply, header_bytes); !s) {
      spdlog::error("vault client: refused a reply: {}", s.message());
      std::lock_guard lock(mutex);
      ++stats.replies_rejected;
      return;
    }
    WireHeader h;
    if (!decode_wire_header(header_bytes, h)) {
      spdlog::warn("vault client: dropped a reply with an unreadable header");
      return;
    }
    std::lock_guard lock(mutex);
    auto it = calls.find(h.request_id);
    if (it == calls.end()) return;  // abandoned (timed out, promotion destroyed)
    VaultCall& call = *it->second;
    try {
      if (const Status s = verify_wire_payload(h, payload); !s) fail("{}", s.message());
      switch (h.type) {
        case WireType::vault_error:
          fail_call(call, "vault: " + std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
          break;
        case WireType::vault_count:
          HACK_CHECK(call.reply == WireType::vault_count, "vault sent a count to a {} call", wire_type_name(call.reply));
          call.count = decode_vault_count(payload);
          call.answered = true;
          break;
        case WireType::vault_stats_reply:
          HACK_CHECK(call.reply == WireType::vault_stats_reply, "vault sent stats to another call");
          call.text.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
          call.answered = true;
          break;
        case WireType::vault_promote_head:
          HACK_CHECK(call.reply == WireType::vault_promote_head && !call.head, "unexpected promote head");
          call.head = decode_vault_promote_head(payload);
          call.answered = true;
          break;
        case WireType::vault_promote_layer:
          HACK_CHECK(call.reply == WireType::vault_promote_head, "unexpected promote layer");
          HACK_CHECK(h.layer < 1024 && !call.layers.contains(static_cast<int>(h.layer)),
                     "promote layer {} twice or out of range", h.layer);
          call.layers[static_cast<int>(h.layer)].assign(payload.begin(), payload.end());
          break;
        default:
          fail("unexpected reply type {}", wire_type_name(h.type));
      }
    } catch (const std::exception& e) {
      fail_call(call, std::string("bad vault reply: ") + e.what());
    }
    changed.notify_all();
  }

  void on_disconnect(EndpointId ep, const Status& reason) {
    std::lock_guard lock(mutex);
    lost.push_back(ep);
    if (lost.size() > 16) lost.pop_front();
    forget_endpoint(ep);
    for (auto& [id, call] : calls)
      if (call->endpoint == ep) fail_call(*call, "lost the vault: " + reason.message());
    changed.notify_all();
  }

  // Under the lock: the next call dials again if `ep` is the one in use.
  void forget_endpoint(EndpointId ep) {
    if (endpoint && *endpoint == ep) {
      endpoint.reset();
      ++stats.disconnects;
    }
  }

  // Waits until `call` is answered or failed, then forgets it.
  Status wait(uint64_t id, const std::shared_ptr<VaultCall>& call, double timeout_s) {
    std::unique_lock lock(mutex);
    const bool done = changed.wait_until(lock, deadline_after(timeout_s), [&] { return call->answered || call->failed; });
    Status s;
    if (call->failed) {
      s = call->error;
    } else if (!done) {
      s = Status::error(fmt::format("vault did not answer within {} s", timeout_s));
    }
    if (!s) ++stats.call_errors;
    calls.erase(id);
    return s;
  }
};

namespace {

class Promotion final : public VaultPromotion {
 public:
  Promotion(std::shared_ptr<VaultClient::Shared> shared, uint64_t id, std::shared_ptr<VaultCall> call,
            Status start_error)
      : shared_(std::move(shared)), id_(id), call_(std::move(call)), start_error_(std::move(start_error)) {}
  ~Promotion() override {
    std::lock_guard lock(shared_->mutex);
    shared_->calls.erase(id_);
  }
  Status wait_head(double timeout_s) override {
    if (!start_error_) return start_error_;
    std::unique_lock lock(shared_->mutex);
    const bool done = shared_->changed.wait_until(lock, deadline_after(timeout_s),
                                                  [&] { return call_->answered || call_->failed; });
    if (call_->failed) return count_error(call_->error);
    if (!done) return count_error(Status::error(fmt::format("vault promote: no answer within {} s", timeout_s)));
    return Status::ok();
  }
  const VaultPromoteHead& head() const override {
    HACK_CHECK(call_->head.has_value(), "vault promote: head() before wait_head succeeded");
    return *call_->head;
  }
  Status wait_layer(int layer, double timeout_s, std::vector<std::span<const std::byte>>& slices) override {
    if (!start_error_) return start_error_;
    std::unique_lock lock(shared_->mutex);
    const bool done = shared_->changed.wait_until(lock, deadline_after(timeout_s), [&] {
      return call_->failed || (call_->head && call_->layers.contains(layer));
    });
    if (call_->failed) return count_error(call_->error);
    if (!done)
      return count_error(Status::error(fmt::format("vault promote: layer {} not received within {} s", layer, timeout_s)));
    try {
      slices = split_vault_promote_layer(*call_->head, layer, call_->layers.at(layer));
    } catch (const std::exception& e) {
      shared_->fail_call(*call_, e.what());
      return count_error(call_->error);
    }
    return Status::ok();
  }

 private:
  // Counts a failed promotion once in the client's call errors (the lock is held). A failure
  // before the send was counted when the call started.
  Status count_error(Status s) {
    if (!counted_) ++shared_->stats.call_errors;
    counted_ = true;
    return s;
  }

  std::shared_ptr<VaultClient::Shared> shared_;
  uint64_t id_;
  std::shared_ptr<VaultCall> call_;
  Status start_error_;
  bool counted_ = false;
};

}  // namespace

VaultClient::VaultClient(UcxWorker& worker, VaultClientOptions options)
    : worker_(worker), options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  HACK_CHECK(!options_.host.empty() && options_.port != 0, "vault client: no vault address");
  std::weak_ptr<Shared> weak = shared_;
  worker_.set_message_handler(kVaultReplyAmId,
                              [weak, auth = options_.auth](EndpointId, std::span<const std::byte> header,
                                                           std::span<const std::byte> payload) {
                                if (auto s = weak.lock()) s->on_reply(auth, header, payload);
                              });
  disconnect_token_ = worker_.add_disconnect_handler([weak](EndpointId ep, const Status& reason) {
    if (auto s = weak.lock()) s->on_disconnect(ep, reason);
  });
}

VaultClient::~VaultClient() {
  try {
    worker_.set_message_handler(kVaultReplyAmId, {});
    worker_.remove_disconnect_handler(disconnect_token_);
    std::optional<EndpointId> ep;
    {
      std::lock_guard lock(shared_->mutex);
      ep = shared_->endpoint;
    }
    if (ep) worker_.close(*ep);
  } catch (const std::exception& e) {
    spdlog::error("vault client: {}", e.what());
  }
}

namespace {

// The endpoint, dialling when there is none and the last dial is old enough. A caller that
// finds a dial in progress waits for it rather than giving up.
std::optional<EndpointId> endpoint_of(VaultClient::Shared& s, UcxWorker& worker, const VaultClientOptions& o) {
  {
    std::unique_lock lock(s.mutex);
    s.changed.wait(lock, [&] { return !s.dialling; });
    if (s.endpoint) return s.endpoint;
    if (monotonic_s() - s.last_dial_s < o.reconnect_interval_s) return std::nullopt;
    s.last_dial_s = monotonic_s();
    s.dialling = true;
  }
  // Not under the lock: connect waits for the progress thread, whose handlers take it.
  std::optional<EndpointId> ep;
  std::string error;
  try {
    ep = worker.connect(o.host, o.port);
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::lock_guard lock(s.mutex);
  s.dialling = false;
  if (ep && !s.endpoint && std::find(s.lost.begin(), s.lost.end(), *ep) == s.lost.end()) s.endpoint = ep;
  s.changed.notify_all();
  if (!error.empty()) throw Error(error);
  return s.endpoint;
}

}  // namespace

void VaultClient::store(const std::string& name_space, const BlockKey& key, const BlockKey& parent, bool first,
                        uint8_t codec, std::span<const std::byte> value) {
  VaultStoreMessage m{name_space, first, codec, key, parent, 0, value};
  m.checksum = XXH64(value.data(), value.size(), 0);
  std::optional<EndpointId> ep;
  try {
    ep = endpoint_of(*shared_, worker_, options_);
  } catch (const std::exception& e) {
    spdlog::debug("vault client: store dropped: {}", e.what());
  }
  {
    std::lock_guard lock(shared_->mutex);
    if (!ep || shared_->store_bytes_in_flight + value.size() > options_.max_store_bytes_in_flight) {
      ++shared_->stats.stores_dropped;
      return;
    }
    shared_->store_bytes_in_flight += value.size();
    ++shared_->stats.stores;
    shared_->stats.store_bytes += value.size();
  }
  std::vector<std::byte> payload = encode_vault_store(m);
  std::vector<std::byte> header = options_.auth.seal(
      encode_wire_header(make_wire_header(WireType::vault_store, 0, 0, 0, payload)), payload, WireChannel::data);
  std::weak_ptr<Shared> weak = shared_;
  const size_t bytes = value.size();
  worker_.send(*ep, kVaultRequestAmId, std::move(header), std::move(payload), [weak, bytes, ep = *ep](const Status& s) {
    auto sh = weak.lock();
    if (!sh) return;
    std::lock_guard lock(sh->mutex);
    sh->store_bytes_in_flight -= bytes;
    if (!s) {
      ++sh->stats.store_errors;
      sh->forget_endpoint(ep);
    }
    sh->changed.notify_all();
  });
}

namespace {

// Registers a call and sends its request; the call fails at once when there is no
// connection or the send fails.
struct StartedCall {
  uint64_t id = 0;
  std::shared_ptr<VaultCall> call;
  Status error;  // set when the call failed before it was sent; read without the lock
};

StartedCall start_call(VaultClient::Shared& s, UcxWorker& worker,
                                                           const VaultClientOptions& o,
                                                           const std::shared_ptr<VaultClient::Shared>& owner,
                                                           WireType type, WireType reply,
                                                           std::vector<std::byte> payload) {
  auto call = std::make_shared<VaultCall>();
  call->reply = reply;
  std::optional<EndpointId> ep;
  try {
    ep = endpoint_of(s, worker, o);
  } catch (const std::exception& e) {
    call->failed = true;
    call->error = Status::error(std::string("vault unreachable: ") + e.what());
  }
  uint64_t id = 0;
  {
    std::lock_guard lock(s.mutex);
    ++s.stats.calls;
    id = s.next_id++;
    if (!call->failed && !ep) {
      call->failed = true;
      call->error = Status::error(fmt::format("vault {}:{} unreachable (redialled at most every {} s)", o.host,
                                              o.port, o.reconnect_interval_s));
    }
    if (call->failed) {
      ++s.stats.call_errors;
      return {id, call, call->error};
    }
    call->endpoint = *ep;
    s.calls[id] = call;
  }
  std::vector<std::byte> header =
      o.auth.seal(encode_wire_header(make_wire_header(type, id, 0, 0, payload)), payload, WireChannel::data);
  std::weak_ptr<VaultClient::Shared> weak = owner;
  worker.send(*ep, kVaultRequestAmId, std::move(header), std::move(payload), [weak, id, ep = *ep](const Status& st) {
    if (st) return;
    auto sh = weak.lock();
    if (!sh) return;
    std::lock_guard lock(sh->mutex);
    sh->forget_endpoint(ep);  // a send that fails on it: the next call dials again
    if (auto it = sh->calls.find(id); it != sh->calls.end()) sh->fail_call(*it->second, "vault send failed: " + st.message());
    sh->changed.notify_all();
  });
  return {id, call, Status::ok()};
}

}  // namespace

Status VaultClient::lookup(const std::string& name_space, std::span<const BlockKey> keys, double timeout_s,
                           size_t& found) {
  found = 0;
  const StartedCall started = start_call(*shared_, worker_, options_, shared_, WireType::vault_lookup, WireType::vault_count,
                               encode_vault_keys({name_space, 0, {keys.begin(), keys.end()}}));
  if (!started.error) return started.error;
  const Status s = shared_->wait(started.id, started.call, timeout_s);
  if (!s) return s;
  if (started.call->count > keys.size())
    return Status::error(fmt::format("vault lookup: {} blocks found of {} asked", started.call->count, keys.size()));
  found = static_cast<size_t>(started.call->count);
  return Status::ok();
}

std::unique_ptr<VaultPromotion> VaultClient::promote(const std::string& name_space, std::span<const BlockKey> keys,
                                                     uint32_t max_blocks) {
  const StartedCall started = start_call(*shared_, worker_, options_, shared_, WireType::vault_promote,
                               WireType::vault_promote_head,
                               encode_vault_keys({name_space, max_blocks, {keys.begin(), keys.end()}}));
  return std::make_unique<Promotion>(shared_, started.id, started.call, started.error);
}

Status VaultClient::remove(const std::string& name_space, const BlockKey& key, double timeout_s, size_t& removed) {
  removed = 0;
  const StartedCall started = start_call(*shared_, worker_, options_, shared_, WireType::vault_delete, WireType::vault_count,
                               encode_vault_keys({name_space, 0, {key}}));
  if (!started.error) return started.error;
  const Status s = shared_->wait(started.id, started.call, timeout_s);
  if (s) removed = static_cast<size_t>(started.call->count);
  return s;
}

Status VaultClient::stats_json(double timeout_s, std::string& json) {
  const StartedCall started = start_call(*shared_, worker_, options_, shared_, WireType::vault_stats,
                               WireType::vault_stats_reply, {});
  if (!started.error) return started.error;
  const Status s = shared_->wait(started.id, started.call, timeout_s);
  if (s) json = started.call->text;
  return s;
}

Status VaultClient::flush(double timeout_s) {
  std::unique_lock lock(shared_->mutex);
  if (!shared_->changed.wait_until(lock, deadline_after(timeout_s), [&] { return shared_->store_bytes_in_flight == 0; }))
    return Status::error(fmt::format("vault stores not sent within {} s", timeout_s));
  return Status::ok();
}

VaultClientStats VaultClient::stats() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->stats;
}

}  // namespace hack::net
