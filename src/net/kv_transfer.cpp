// KV streaming over UCX active messages (include/hack/net/kv_transfer.h).
#include "hack/net/kv_transfer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace hack::net {

namespace {

// Ids of requests that ended by cancel or error, remembered so that their messages still
// in flight (a rendezvous page fetched after the cancel) do not open a request that never
// ends. A message with seq 0 starts the id afresh.
constexpr size_t kEndedIdsKept = 4096;

std::string bytes_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

// ---- receiver -----------------------------------------------------------------

struct KvReceiver::State {
  struct Early {
    WireHeader header;
    std::shared_ptr<const void> owner;   // UCX's buffer, retained (UcxWorker::retain_received_payload)
    std::vector<std::byte> copy;         // else a copy
    std::span<const std::byte> payload;  // in one of them
  };
  struct Request {
    EndpointId from = 0;
    uint32_t next_seq = 0;
    bool failed = false;
    std::map<uint32_t, Early> early;  // seq → message
  };

  UcxWorker& worker;
  KvReceiverCallbacks callbacks;
  WireAuth auth;
  std::unordered_map<uint64_t, Request> requests;
  std::unordered_set<uint64_t> ended;
  std::deque<uint64_t> ended_order;
  const Early* delivering_early = nullptr;  // the held message being delivered now (retain)

  void remember_ended(uint64_t id) {
    if (ended.insert(id).second) ended_order.push_back(id);
    while (ended_order.size() > kEndedIdsKept) {
      ended.erase(ended_order.front());
      ended_order.pop_front();
    }
  }

  State(UcxWorker& w, KvReceiverCallbacks c, WireAuth a) : worker(w), callbacks(std::move(c)), auth(std::move(a)) {}

  void rejected(EndpointId from, const Status& error) {
    spdlog::error("kv receiver: refused a message from endpoint {}: {}", from, error.message());
    if (callbacks.on_rejected) callbacks.on_rejected(from, error);
  }

  void bad_message(EndpointId from, const Status& error) {
    spdlog::warn("kv receiver: dropped a message from endpoint {}: {}", from, error.message());
    if (callbacks.on_bad_message) callbacks.on_bad_message(from, error);
  }

  // A header that does not decode: when its fixed part names a request (only its page table
  // or its length is wrong, wire_header_request), that request fails, as for a bad payload;
  // otherwise no request can be blamed.
  void bad_header(EndpointId from, std::span<const std::byte> header_bytes, const Status& error) {
    const std::optional<uint64_t> id = wire_header_request(header_bytes);
    if (!id || (!requests.contains(*id) && ended.contains(*id))) return bad_message(from, error);
    auto [it, started] = requests.try_emplace(*id);
    if (started) it->second.from = from;
    if (it->second.from != from) return bad_message(from, error);
    fail(*id, it->second, error);
  }

  void fail(uint64_t id, Request& request, const Status& error) {
    if (request.failed) return;
    request.failed = true;
    request.early.clear();
    spdlog::warn("kv receiver: request {} failed: {}", id, error.message());
    if (callbacks.on_request_error) callbacks.on_request_error(id, error);
    // Tell the sender, so it stops streaming and ends the request.
    const auto text = wire_text(error.message());
    auto header = auth.seal(encode_wire_header(make_wire_header(WireType::request_error, id, 0, 0, text)), text,
                            WireChannel::reply);
    worker.send(request.from, kKvReplyAmId, std::move(header), text);
  }

  void on_message(EndpointId from, std::span<const std::byte> sealed, std::span<const std::byte> payload) {
    // Authenticated first: a message without this cluster's tag touches no request.
    std::span<const std::byte> header_bytes;
    if (Status s = auth.open(sealed, payload, WireChannel::data, header_bytes); !s) return rejected(from, s);
    WireHeader header;
    if (Status s = decode_wire_header(header_bytes, header); !s) return bad_header(from, header_bytes, s);
    const uint64_t id = header.request_id;
    const bool control = header.type == WireType::request_cancel || header.type == WireType::request_error;
    if (!requests.contains(id) && ended.contains(id)) {
      if (control || header.seq != 0) return;  // a straggler of a request that has ended
      ended.erase(id);
    }
    auto [it, started] = requests.try_emplace(id);
    Request& request = it->second;
    if (started) request.from = from;
    if (request.from != from) {
      // Another endpoint reusing a live id: blame the message, not the request.
      if (started) requests.erase(it);
      return bad_message(from, Status::error(fmt::format("request {} already streams from endpoint {}", id, request.from)));
    }
    // Data messages are verified in stream order (deliver), so a bad message fails its
    // request after everything sent before it; control messages act on arrival.
    if (control) {
      if (Status s = verify_wire_payload(header, payload); !s) return fail(id, request, s);
    }
    if (header.type == WireType::request_cancel) {
      if (!request.failed && callbacks.on_request_error)
        callbacks.on_request_error(id, Status::error(fmt::format("request {} cancelled by the sender: {}", id,
                                                                  payload.empty() ? "no reason given" : bytes_text(payload))));
      requests.erase(it);
      remember_ended(id);
      return;
    }
    if (header.type == WireType::request_error) {
      // The sender reports its own failure; same as a cancel.
      if (!request.failed && callbacks.on_request_error)
        callbacks.on_request_error(id, Status::error(fmt::format("request {} failed at the sender: {}", id, bytes_text(payload))));
      requests.erase(it);
      remember_ended(id);
      return;
    }
    if (request.failed) return;  // dropped until the sender ends it
    if (header.seq != request.next_seq) {
      if (header.seq < request.next_seq || request.early.contains(header.seq))
        return fail(id, request, Status::error(fmt::format("request {}: message {} arrived twice", id, header.seq)));
      if (request.early.size() >= kKvMaxEarlyMessages)
        return fail(id, request, Status::error(fmt::format("request {}: message {} never arrived", id, request.next_seq)));
      Early early{header, worker.retain_received_payload(payload), {}, payload};
      if (!early.owner) {
        early.copy.assign(payload.begin(), payload.end());
        early.payload = early.copy;
      }
      request.early.emplace(header.seq, std::move(early));
      return;
    }
    if (!deliver(it, header, payload)) return;
    // Messages that were waiting for this one.
    for (;;) {
      auto next = it->second.early.find(it->second.next_seq);
      if (next == it->second.early.end()) break;
      Early early = std::move(next->second);
      it->second.early.erase(next);
      delivering_early = &early;
      const bool more = deliver(it, early.header, early.payload);
      delivering_early = nullptr;
      if (!more) return;
    }
  }

  // Delivers the next in-order message; false once the request has ended.
  bool deliver(std::unordered_map<uint64_t, Request>::iterator it, const WireHeader& header,
               std::span<const std::byte> payload) {
    ++it->second.next_seq;
    const uint64_t id = header.request_id;
    if (Status s = verify_wire_payload(header, payload); !s) {
      fail(id, it->second, s);
      return false;
    }
    switch (header.type) {
      case WireType::kv_page: {
        // One call per page, in order (the page table was checked against the payload).
        size_t offset = 0;
        for (uint32_t bytes : header.page_bytes) {
          if (callbacks.on_page) callbacks.on_page(id, header.layer, payload.subspan(offset, bytes));
          offset += bytes;
        }
        return true;
      }
      case WireType::kv_exact:
        if (callbacks.on_exact) callbacks.on_exact(id, header.layer, payload);
        return true;
      case WireType::kv_exact_copy:
        if (callbacks.on_exact_copy) callbacks.on_exact_copy(id, header.layer, payload);
        return true;
      case WireType::kv_layer_done:
        if (callbacks.on_layer_done) callbacks.on_layer_done(id, header.layer);
        return true;
      case WireType::request_done:
        requests.erase(it);
        if (callbacks.on_request_done) callbacks.on_request_done(id, payload);
        return false;
      case WireType::request_error:
      case WireType::request_cancel:
        break;  // handled before ordering
      default:
        fail(id, it->second,
             Status::error(fmt::format("request {}: {} is not a KV message", id, wire_type_name(header.type))));
        return false;
    }
    return true;
  }

  void on_lost(EndpointId endpoint, const Status& reason) {
    for (auto it = requests.begin(); it != requests.end();) {
      if (it->second.from != endpoint) {
        ++it;
        continue;
      }
      const uint64_t id = it->first;
      const bool failed = it->second.failed;
      it = requests.erase(it);
      if (!failed && callbacks.on_request_error)
        callbacks.on_request_error(id, Status::error(fmt::format("request {}: lost the sender: {}", id, reason.message())));
    }
  }
};

KvReceiver::KvReceiver(UcxWorker& worker, KvReceiverCallbacks callbacks, WireAuth auth)
    : worker_(worker), state_(std::make_unique<State>(worker, std::move(callbacks), std::move(auth))) {
  State* state = state_.get();
  worker_.set_message_handler(
      kKvDataAmId,
      [state](EndpointId from, std::span<const std::byte> header, std::span<const std::byte> payload) {
        state->on_message(from, header, payload);
      },
      [state](EndpointId from, std::span<const std::byte> sealed, const Status& error) {
        // The payload never arrived, so a tag cannot be checked: with auth on, only a request
        // already streaming from this endpoint is failed.
        const bool authed = state->auth.enabled();
        if (authed && sealed.size() < kWireSealedHeaderBytes) return state->bad_message(from, error);
        const auto header_bytes = authed ? sealed.first(sealed.size() - kWireTagBytes) : sealed;
        WireHeader header;
        if (!decode_wire_header(header_bytes, header)) return state->bad_message(from, error);
        auto it = state->requests.find(header.request_id);
        if (authed && (it == state->requests.end() || it->second.from != from)) return state->bad_message(from, error);
        if (it == state->requests.end()) {
          if (state->ended.contains(header.request_id)) return;  // a straggler of an ended request
          it = state->requests.try_emplace(header.request_id).first;
          it->second.from = from;
        }
        state->fail(header.request_id, it->second,
                    Status::error(fmt::format("request {}: lost a {}-byte {}: {}", header.request_id, header.payload_bytes,
                                              wire_type_name(header.type), error.message())));
      },
      /*retainable=*/true);
  disconnect_token_ = worker_.add_disconnect_handler(
      [state](EndpointId endpoint, const Status& reason) { state->on_lost(endpoint, reason); });
}

KvReceiver::~KvReceiver() {
  try {
    worker_.set_message_handler(kKvDataAmId, {});
    worker_.remove_disconnect_handler(disconnect_token_);
  } catch (const std::exception& e) {
    spdlog::error("kv receiver: {}", e.what());
  }
}

std::shared_ptr<const void> KvReceiver::retain_payload(std::span<const std::byte> bytes) {
  if (!worker_.on_worker_thread()) return nullptr;
  if (const State::Early* early = state_->delivering_early; early != nullptr) {
    const auto& held = early->payload;
    if (early->owner && lies_within(bytes, held))
      return std::shared_ptr<const void>(early->owner, bytes.data());
    return nullptr;
  }
  return worker_.retain_received_payload(bytes);
}

size_t KvReceiver::open_requests() const {
  size_t n = 0;
  worker_.run_on_worker([&] { n = state_->requests.size(); });
  return n;
}

// ---- sender -------------------------------------------------------------------

namespace {

// Buffers that multi-page messages are gathered into (KvGather::copy), reused: a fresh
// 1 MiB allocation per message costs its page faults again and again (glibc hands large
// blocks back to the system). Holds at most kKeep idle buffers; thread-safe, and buffers
// handed out may outlive it.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // A buffer of at least `bytes` (contents undefined), returned here when its last owner goes.
  std::shared_ptr<std::byte[]> take(size_t bytes) {
    std::unique_ptr<std::byte[]> buffer;
    size_t capacity = 0;
    {
      std::lock_guard lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->first >= bytes && it->first <= 2 * bytes) {
          capacity = it->first;
          buffer = std::move(it->second);
          idle_.erase(it);
          break;
        }
      }
    }
    if (!buffer) {
      capacity = (bytes + kRound - 1) / kRound * kRound;
      buffer = std::make_unique_for_overwrite<std::byte[]>(capacity);
    }
    std::weak_ptr<StagingPool> pool = weak_from_this();
    return std::shared_ptr<std::byte[]>(buffer.release(), [pool, capacity](std::byte* p) {
      std::unique_ptr<std::byte[]> owned(p);
      if (auto alive = pool.lock()) alive->give_back(capacity, std::move(owned));
    });
  }

 private:
  static constexpr size_t kKeep = 64;           // the default window holds 64 MiB: ~64 messages
  static constexpr size_t kRound = size_t{64} << 10;
  void give_back(size_t capacity, std::unique_ptr<std::byte[]> buffer) {
    std::lock_guard lock(mutex_);
    if (idle_.size() < kKeep) idle_.emplace_back(capacity, std::move(buffer));
  }
  std::mutex mutex_;
  std::vector<std::pair<size_t, std::unique_ptr<std::byte[]>>> idle_;
};

}  // namespace

struct KvSender::Shared : std::enable_shared_from_this<KvSender::Shared> {
  // Pages of one layer waiting to leave together as one kv_page message.
  struct Batch {
    uint32_t layer = 0;
    bool unchecked = false;                            // its pages carry no checksum (KvChecksum)
    std::vector<uint64_t> page_checksums;              // wire_checksum of each page (none when unchecked)
    std::vector<std::span<const std::byte>> segments;  // the pages: the caller's, or in `owned`
    std::vector<std::vector<std::byte>> owned;         // pages copied into the queue (moves keep their buffers)
    size_t bytes = 0;
    bool empty() const { return segments.empty(); }
  };
  struct Request {
    EndpointId peer = 0;
    uint32_t next_seq = 0;
    uint32_t in_flight = 0;  // messages queued or handed to UCX, not yet completed
    bool ended = false;
    bool failed = false;
    bool cancelled = false;
    Status error;
    Batch batch;  // pages not yet in a message (not counted in in_flight)
  };
  // One message waiting for its endpoint's window.
  struct Outgoing {
    uint64_t request_id = 0;
    bool counted = false;  // one of the request's messages (not an out-of-sequence cancel)
    std::vector<std::byte> header, payload;
    // A kv_page message (payload empty): its pages in order (adjacent ones merged), sent in
    // place as a UCX iov, or gathered into `staged` (KvGather::copy); `owned` holds the pages
    // that were copied into the queue.
    std::vector<std::span<const std::byte>> segments;
    std::vector<std::vector<std::byte>> owned;
    std::shared_ptr<std::byte[]> staged;
    size_t pages = 0;  // kv_page: pages it carries
    // false while the thread that queued it gathers its pages and computes its MAC outside
    // the lock: drain stops here (so messages still leave in seq order) and nothing else
    // touches it until then.
    bool sealed = true;
    std::vector<std::span<const std::byte>> parts() const {
      if (!segments.empty()) return segments;
      return {std::span<const std::byte>(payload)};
    }
    size_t bytes() const {
      size_t n = payload.size();
      for (const auto& s : segments) n += s.size();
      return n;
    }
  };
  // Per endpoint: messages handed to UCX are numbered; [oldest, next_index) is the window.
  struct Endpoint {
    std::deque<Outgoing> waiting;
    uint64_t next_index = 0;
    uint64_t oldest = 0;            // first index not yet completed (== next_index when none)
    std::deque<uint8_t> completed;  // [oldest, next_index): 1 once completed
    size_t bytes = 0;               // payload bytes handed out and not completed
    bool draining = false;          // a thread is handing messages to UCX
  };
  static constexpr size_t kOutcomesKept = 4096;

  UcxWorker& worker;
  KvSenderOptions options;
  mutable std::mutex mutex;
  std::condition_variable idle;
  KvSenderCallbacks callbacks;  // emptied by ~KvSender
  std::unordered_map<uint64_t, Request> requests;
  std::unordered_map<EndpointId, Endpoint> endpoints;  // references stay valid on insert
  std::unordered_map<uint64_t, Status> outcomes;       // of requests that finished, for wait_request
  std::deque<uint64_t> outcome_order;
  std::unordered_set<uint64_t> corrupt_next_page;  // test hook
  std::shared_ptr<StagingPool> staging = std::make_shared<StagingPool>();
  size_t in_flight = 0;                            // all messages queued or handed out
  std::mutex lanes_mutex;                              // guards shared_memory_of only (never with `mutex` held)
  std::unordered_map<EndpointId, bool> shared_memory_of;  // whether an endpoint's lanes are shared memory
  KvSenderStats counters;

  Shared(UcxWorker& w, KvSenderCallbacks c, KvSenderOptions o)
      : worker(w), options(o), callbacks(std::move(c)) {}

  // Whether UCX put `peer` on shared-memory lanes, asked of the worker once per endpoint (a
  // host:port endpoint reports none). Called without the lock: the worker answers on its
  // progress thread, whose send callbacks take the lock.
  bool shared_memory(EndpointId peer) {
    {
      std::lock_guard lock(lanes_mutex);
      if (auto it = shared_memory_of.find(peer); it != shared_memory_of.end()) return it->second;
    }
    std::string lanes;
    try {
      lanes = worker.transports(peer);
    } catch (const std::exception& e) {  // a worker shutting down: as if over tcp
      spdlog::debug("kv sender: lanes of endpoint {} unknown ({}); treated as not shared memory", peer, e.what());
    }
    const bool shm = lanes.find("sysv/") != std::string::npos || lanes.find("posix/") != std::string::npos;
    std::lock_guard lock(lanes_mutex);
    shared_memory_of.emplace(peer, shm);
    return shm;
  }

  // copy or iov for `peer` (options.gather; for automatic, iov over shared memory).
  KvGather gather_for(EndpointId peer) {
    if (options.gather != KvGather::automatic) return options.gather;
    return shared_memory(peer) ? KvGather::iov : KvGather::copy;
  }

  // Whether pages to `peer` are checksummed (options.checksum; automatic: not over shared
  // memory).
  bool checksummed_for(EndpointId peer) {
    return options.checksum == KvChecksum::always || !shared_memory(peer);
  }

  // Under the lock: a request whose messages are all done leaves the table.
  void maybe_finish(std::unordered_map<uint64_t, Request>::iterator it) {
    const Request& r = it->second;
    if (!r.ended || r.in_flight != 0) return;
    Status outcome = r.failed ? r.error
                     : r.cancelled ? Status::error(fmt::format("request {} was cancelled", it->first))
                                   : Status::ok();
    if (outcomes.insert_or_assign(it->first, std::move(outcome)).second) outcome_order.push_back(it->first);
    while (outcome_order.size() > kOutcomesKept) {
      outcomes.erase(outcome_order.front());
      outcome_order.pop_front();
    }
    requests.erase(it);
    idle.notify_all();  // wait_request_closed
  }

  // Marks a request failed (once) and reports it; its waiting messages are then dropped.
  void fail(uint64_t id, const Status& error) {
    std::function<void(uint64_t, const Status&)> report;
    EndpointId peer = 0;
    {
      std::lock_guard lock(mutex);
      auto it = requests.find(id);
      if (it == requests.end() || it->second.failed || it->second.cancelled) return;
      it->second.failed = true;
      it->second.error = error;
      it->second.batch = {};  // its pages are not sent
      peer = it->second.peer;
      report = callbacks.on_request_error;
      idle.notify_all();
    }
    spdlog::warn("kv sender: request {} failed: {}", id, error.message());
    if (report) report(id, error);
    drain(peer);
  }

  // Under the lock: one message of request `id` is finished (completed or dropped).
  void message_finished(uint64_t id, bool counted) {
    --in_flight;
    if (counted) {
      auto it = requests.find(id);
      if (it != requests.end()) {
        --it->second.in_flight;
        maybe_finish(it);
      }
    }
    idle.notify_all();
  }

  void sent(EndpointId peer, uint64_t index, size_t bytes, size_t pages, uint64_t id, bool counted,
            const Status& status) {
    std::function<void(uint64_t, const Status&)> report;
    Status error;
    if (!status) {
      // First, so the endpoint's owner knows it broke before anyone sees the request fail.
      std::function<void(EndpointId, const Status&)> report_transport;
      {
        std::lock_guard lock(mutex);
        report_transport = callbacks.on_transport_failed;
      }
      if (report_transport) report_transport(peer, status);
    }
    {
      std::lock_guard lock(mutex);
      Endpoint& ep = endpoints[peer];
      ep.completed[static_cast<size_t>(index - ep.oldest)] = 1;
      ep.bytes -= bytes;
      while (!ep.completed.empty() && ep.completed.front() != 0) {
        ep.completed.pop_front();
        ++ep.oldest;
      }
      if (status) {
        ++counters.messages_sent;
        counters.pages_sent += pages;
        counters.bytes_sent += bytes;
      } else if (counted) {
        // Marked here, before the request can finish, so its outcome keeps the error. A failed
        // send means the transport to the receiver broke: worded as on_lost words it, since
        // which of the two notices it first is a race.
        auto it = requests.find(id);
        if (it != requests.end() && !it->second.failed && !it->second.cancelled) {
          error = Status::error(
              fmt::format("request {}: lost the receiver: a send to endpoint {} failed: {}", id, peer, status.message()));
          it->second.failed = true;
          it->second.error = error;
          report = callbacks.on_request_error;
        }
      }
      message_finished(id, counted);
    }
    if (!error.is_ok()) {
      spdlog::warn("kv sender: request {} failed: {}", id, error.message());
      if (report) report(id, error);
    }
    drain(peer);
  }

  // Hands waiting messages of `peer` to UCX while its window has room. One thread at a
  // time per endpoint (so messages leave in queue order); the lock is never held across
  // worker.send, whose completion may run inline.
  void drain(EndpointId peer) {
    std::unique_lock lock(mutex);
    Endpoint& ep = endpoints[peer];
    if (ep.draining) return;
    ep.draining = true;
    while (!ep.waiting.empty()) {
      Outgoing& front = ep.waiting.front();
      if (!front.sealed) break;  // its sealer drains once the tag is in
      if (front.counted) {
        auto it = requests.find(front.request_id);
        if (it == requests.end() || it->second.failed || it->second.cancelled) {
          const uint64_t id = front.request_id;
          ep.waiting.pop_front();
          --counters.messages_waiting;
          message_finished(id, true);
          continue;
        }
      }
      const size_t in_window = static_cast<size_t>(ep.next_index - ep.oldest);
      const size_t size = front.bytes();
      if (in_window >= options.max_in_flight_messages) break;
      if (in_window > 0 && ep.bytes + size > options.max_in_flight_bytes) break;
      Outgoing message = std::move(front);
      ep.waiting.pop_front();
      --counters.messages_waiting;
      const uint64_t index = ep.next_index++;
      ep.completed.push_back(0);
      ep.bytes += size;
      counters.max_window_messages = std::max<uint64_t>(counters.max_window_messages, ep.next_index - ep.oldest);
      counters.max_window_bytes = std::max<uint64_t>(counters.max_window_bytes, ep.bytes);
      lock.unlock();
      if (message.segments.empty()) {
        auto done = [self = shared_from_this(), peer, index, size, id = message.request_id,
                     counted = message.counted](const Status& status) {
          self->sent(peer, index, size, 0, id, counted, status);
        };
        worker.send(peer, kKvDataAmId, std::move(message.header), std::move(message.payload), std::move(done));
      } else {
        // The pages' memory (the caller's, or `owned` / `staged`, kept alive here) until UCX is done.
        std::shared_ptr<const void> keep = message.staged;
        if (!message.owned.empty())
          keep = std::make_shared<const std::vector<std::vector<std::byte>>>(std::move(message.owned));
        auto done = [self = shared_from_this(), peer, index, size, pages = message.pages, id = message.request_id,
                     counted = message.counted, keep](const Status& status) {
          self->sent(peer, index, size, pages, id, counted, status);
        };
        worker.send_gather(peer, kKvDataAmId, std::move(message.header), std::move(message.segments), std::move(done));
      }
      lock.lock();
    }
    ep.draining = false;
  }

  // Under the lock: appends a message to its endpoint's queue and returns it (a deque keeps
  // references to its elements on push_back, and an unsealed one is never popped).
  Outgoing& enqueue(EndpointId peer, Outgoing message) {
    ++in_flight;
    auto& waiting = endpoints[peer].waiting;
    waiting.push_back(std::move(message));
    ++counters.messages_waiting;
    counters.max_waiting = std::max(counters.max_waiting, counters.messages_waiting);
    return waiting.back();
  }

  // Under the lock: the request's pending pages become one kv_page message (next seq).
  void flush_batch(EndpointId peer, uint64_t id, Request& request, std::vector<Outgoing*>& unsealed) {
    if (request.batch.empty()) return;
    Batch batch = std::move(request.batch);
    request.batch = {};
    std::vector<uint32_t> page_bytes;
    page_bytes.reserve(batch.segments.size());
    for (const auto& page : batch.segments) page_bytes.push_back(static_cast<uint32_t>(page.size()));
    const WireHeader header = make_pages_header(id, batch.layer, request.next_seq++, std::move(page_bytes),
                                                batch.unchecked ? std::span<const uint64_t>() : batch.page_checksums);
    if (batch.unchecked) ++counters.messages_unchecked;
    ++request.in_flight;
    // Pages that lie back to back in memory (a pool's consecutive pages) go as one segment.
    std::vector<std::span<const std::byte>> segments;
    for (const auto& page : batch.segments) {
      if (!segments.empty() && segments.back().data() + segments.back().size() == page.data())
        segments.back() = {segments.back().data(), segments.back().size() + page.size()};
      else
        segments.push_back(page);
    }
    Outgoing& queued = enqueue(peer, Outgoing{id, true, encode_wire_header(header), {}, std::move(segments),
                                              std::move(batch.owned), nullptr, header.page_bytes.size()});
    if (options.auth.enabled() || (options.gather != KvGather::iov && queued.segments.size() > 1)) {
      queued.sealed = false;
      unsealed.push_back(&queued);
    }
  }

  // Under the lock: the request `id` to `peer`, started if new; an error if it cannot take
  // another message.
  Status open_request(EndpointId peer, uint64_t id, Request*& out) {
    auto [it, started] = requests.try_emplace(id);
    Request& request = it->second;
    if (started) {
      request.peer = peer;
      outcomes.erase(id);
    }
    if (request.peer != peer)
      return Status::error(fmt::format("request {} streams to endpoint {}, not {}", id, request.peer, peer));
    if (request.ended) return Status::error(fmt::format("request {} has already ended", id));
    if (request.failed) return request.error;
    out = &request;
    return Status::ok();
  }

  // Outside the lock: gathers (KvGather::copy) and MACs the messages this thread queued
  // (only this thread touches an unsealed message, drain stops at it, so its buffers are read
  // and its header replaced without the lock; the flag flips under it), then hands what the
  // window allows to UCX.
  void seal_and_drain(EndpointId peer, const std::vector<Outgoing*>& unsealed) {
    const KvGather gather = unsealed.empty() ? KvGather::iov : gather_for(peer);
    uint64_t gathered = 0;
    for (Outgoing* message : unsealed) {
      if (gather == KvGather::copy && message->segments.size() > 1) {
        ++gathered;
        const size_t bytes = message->bytes();
        message->staged = staging->take(bytes);
        size_t at = 0;
        for (const auto& segment : message->segments) {
          std::memcpy(message->staged.get() + at, segment.data(), segment.size());
          at += segment.size();
        }
        message->segments = {std::span<const std::byte>(message->staged.get(), bytes)};
        message->owned.clear();
      }
      if (!options.auth.enabled()) continue;
      message->header = options.auth.seal(std::move(message->header), message->parts(), WireChannel::data);
    }
    if (!unsealed.empty()) {
      std::lock_guard lock(mutex);
      for (Outgoing* message : unsealed) message->sealed = true;
      counters.messages_gathered += gathered;
    }
    drain(peer);
  }

  // Adds one page to its request's batch, which leaves as a message once it holds
  // options.message_bytes (or kWireMaxPagesPerMessage pages); a page of another layer sends
  // the pages before it first. The page's checksum is taken before the lock, so concurrent
  // senders do not serialize on it. `owned` (when not empty) is the page, else `borrowed`.
  Status queue_page(EndpointId peer, uint64_t id, uint32_t layer, std::vector<std::byte> owned,
                    std::span<const std::byte> borrowed) {
    const std::span<const std::byte> page = owned.empty() ? borrowed : std::span<const std::byte>(owned);
    if (page.empty()) return Status::error(fmt::format("request {}: an empty page (layer {})", id, layer));
    bool checksummed = checksummed_for(peer);
    uint64_t checksum = checksummed ? wire_checksum(page) : 0;
    std::vector<Outgoing*> unsealed;
    {
      std::lock_guard lock(mutex);
      Request* request = nullptr;
      if (Status s = open_request(peer, id, request); !s) return s;
      Batch& batch = request->batch;
      const bool corrupt = corrupt_next_page.erase(id) != 0;
      if (corrupt && !checksummed) {  // the page the test hook flips is checksummed, so it is caught
        checksummed = true;
        checksum = wire_checksum(page);
      }
      if (!batch.empty() && (batch.layer != layer || batch.unchecked == checksummed))
        flush_batch(peer, id, *request, unsealed);
      if (corrupt) {
        if (owned.empty()) owned.assign(borrowed.begin(), borrowed.end());  // the caller's page stays intact
        owned[owned.size() / 2] ^= std::byte{0x40};  // after the checksum was taken
      }
      batch.layer = layer;
      batch.unchecked = !checksummed;
      if (checksummed) batch.page_checksums.push_back(checksum);
      if (owned.empty()) {
        batch.segments.push_back(borrowed);
      } else {
        batch.owned.push_back(std::move(owned));
        batch.segments.push_back(batch.owned.back());
      }
      batch.bytes += page.size();
      if (batch.bytes >= options.message_bytes || batch.segments.size() >= kWireMaxPagesPerMessage)
        flush_batch(peer, id, *request, unsealed);
    }
    seal_and_drain(peer, unsealed);
    return Status::ok();
  }

  // Sends a request's pending pages now (a partial batch).
  Status flush(EndpointId peer, uint64_t id) {
    std::vector<Outgoing*> unsealed;
    {
      std::lock_guard lock(mutex);
      auto it = requests.find(id);
      if (it == requests.end()) return Status::ok();
      if (it->second.peer != peer)
        return Status::error(fmt::format("request {} streams to endpoint {}, not {}", id, it->second.peer, peer));
      if (it->second.failed) return it->second.error;
      flush_batch(peer, id, it->second, unsealed);
    }
    seal_and_drain(peer, unsealed);
    return Status::ok();
  }

  // Queues one message of a request (after its pending pages); `end` marks the request's
  // last message. The hashing (the payload's XXH3, and with auth its HMAC, both linear in
  // the payload) runs outside the lock so that concurrent senders do not serialize on it: the
  // checksum before taking it, the MAC after the message has its seq and its place in the queue.
  Status queue(EndpointId peer, uint64_t id, WireType type, uint32_t layer, std::vector<std::byte> payload, bool end) {
    WireHeader header = make_wire_header(type, id, layer, 0, payload);
    std::vector<Outgoing*> unsealed;
    {
      std::lock_guard lock(mutex);
      Request* request = nullptr;
      if (Status s = open_request(peer, id, request); !s) return s;
      flush_batch(peer, id, *request, unsealed);
      header.seq = request->next_seq++;
      if (type == WireType::kv_exact && !payload.empty() && corrupt_next_page.erase(id) != 0)
        payload[payload.size() / 2] ^= std::byte{0x40};  // after the checksum was taken
      ++request->in_flight;
      request->ended = end;
      Outgoing& queued = enqueue(peer, Outgoing{id, true, encode_wire_header(header), std::move(payload)});
      if (options.auth.enabled()) {
        queued.sealed = false;
        unsealed.push_back(&queued);
      }
    }
    seal_and_drain(peer, unsealed);
    return Status::ok();
  }

  // A request_cancel outside any request's sequence (the receiver handles it on arrival);
  // it follows the request's earlier messages through the same queue.
  void send_cancel(EndpointId peer, uint64_t id, std::string_view reason) {
    auto payload = wire_text(reason);
    auto header = options.auth.seal(encode_wire_header(make_wire_header(WireType::request_cancel, id, 0, 0, payload)),
                                    payload, WireChannel::data);
    {
      std::lock_guard lock(mutex);
      enqueue(peer, Outgoing{id, false, std::move(header), std::move(payload)});
    }
    drain(peer);
  }

  void on_reply(std::span<const std::byte> sealed, std::span<const std::byte> payload) {
    std::span<const std::byte> header_bytes;
    if (Status s = options.auth.open(sealed, payload, WireChannel::reply, header_bytes); !s) {
      spdlog::error("kv sender: refused a reply: {}", s.message());
      return;
    }
    WireHeader header;
    if (Status s = decode_wire_header(header_bytes, header); !s) {
      spdlog::warn("kv sender: dropped a reply: {}", s.message());
      return;
    }
    if (Status s = verify_wire_payload(header, payload); !s) {
      fail(header.request_id, s);
      return;
    }
    if (header.type == WireType::request_error)
      fail(header.request_id, Status::error(fmt::format("request {} rejected by the receiver: {}", header.request_id,
                                                        bytes_text(payload))));
  }

  void on_lost(EndpointId endpoint, const Status& reason) {
    std::vector<uint64_t> lost;
    std::function<void(EndpointId, const Status&)> report;
    {
      std::lock_guard lock(mutex);
      for (const auto& [id, request] : requests)
        if (request.peer == endpoint) lost.push_back(id);
      // Only an endpoint this sender streams on is its owner's to drop (the worker's other
      // users, a vault client, see their own endpoints go).
      if (endpoints.contains(endpoint)) report = callbacks.on_transport_failed;
    }
    if (report) report(endpoint, reason);
    for (uint64_t id : lost)
      fail(id, Status::error(fmt::format("request {}: lost the receiver: {}", id, reason.message())));
    drain(endpoint);  // what still waits goes to UCX, which fails it at once
  }
};

KvGather parse_kv_gather(std::string_view name) {
  if (name == "copy") return KvGather::copy;
  if (name == "iov") return KvGather::iov;
  if (name == "auto") return KvGather::automatic;
  fail("KV gather mode (--kv-gather) must be copy, iov or auto, got '{}'", name);
}

const char* kv_gather_name(KvGather gather) {
  return gather == KvGather::iov ? "iov" : gather == KvGather::automatic ? "auto" : "copy";
}

KvChecksum parse_kv_checksum(std::string_view name) {
  if (name == "always") return KvChecksum::always;
  if (name == "auto") return KvChecksum::automatic;
  fail("KV checksum mode (--kv-checksum) must be always or auto, got '{}'", name);
}

const char* kv_checksum_name(KvChecksum checksum) { return checksum == KvChecksum::automatic ? "auto" : "always"; }

KvSender::KvSender(UcxWorker& worker, KvSenderCallbacks callbacks, KvSenderOptions options)
    : worker_(worker) {
  HACK_CHECK(options.max_in_flight_messages >= 1 && options.max_in_flight_messages <= kKvMaxEarlyMessages,
             "kv sender: max_in_flight_messages must be in [1, {}], got {}", kKvMaxEarlyMessages,
             options.max_in_flight_messages);
  HACK_CHECK(options.max_in_flight_bytes >= 1, "kv sender: max_in_flight_bytes must be positive");
  HACK_CHECK(options.message_bytes <= kWireMaxPayloadBytes, "kv sender: message_bytes must be at most {}, got {}",
             kWireMaxPayloadBytes, options.message_bytes);
  shared_ = std::make_shared<Shared>(worker, std::move(callbacks), options);
  Shared* shared = shared_.get();
  worker_.set_message_handler(kKvReplyAmId,
                              [shared](EndpointId, std::span<const std::byte> header, std::span<const std::byte> payload) {
                                shared->on_reply(header, payload);
                              });
  disconnect_token_ = worker_.add_disconnect_handler(
      [shared](EndpointId endpoint, const Status& reason) { shared->on_lost(endpoint, reason); });
}

KvSender::~KvSender() {
  try {
    worker_.set_message_handler(kKvReplyAmId, {});
    worker_.remove_disconnect_handler(disconnect_token_);
  } catch (const std::exception& e) {
    spdlog::error("kv sender: {}", e.what());
  }
  {
    std::lock_guard lock(shared_->mutex);
    shared_->callbacks = {};
  }
  // Callbacks run on the progress thread from a copy taken under the lock: one round trip
  // through it lets any such call in progress finish before our owner goes away.
  try {
    worker_.run_on_worker([] {});
  } catch (const std::exception& e) {
    spdlog::error("kv sender: {}", e.what());
  }
}

Status KvSender::send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> page) {
  if (page.size() > kWireMaxPayloadBytes)
    return Status::error(fmt::format("request {}: a {}-byte page exceeds the wire limit", request_id, page.size()));
  return shared_->queue_page(peer, request_id, layer, std::move(page), {});
}

Status KvSender::send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::span<const std::byte> page) {
  return send_page(peer, request_id, layer, std::vector<std::byte>(page.begin(), page.end()));
}

Status KvSender::send_page_borrowed(EndpointId peer, uint64_t request_id, uint32_t layer,
                                  std::span<const std::byte> page) {
  if (page.size() > kWireMaxPayloadBytes)
    return Status::error(fmt::format("request {}: a {}-byte page exceeds the wire limit", request_id, page.size()));
  return shared_->queue_page(peer, request_id, layer, {}, page);
}

Status KvSender::flush(EndpointId peer, uint64_t request_id) { return shared_->flush(peer, request_id); }

Status KvSender::send_exact_copy(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> exact) {
  return shared_->queue(peer, request_id, WireType::kv_exact_copy, layer, std::move(exact), false);
}

Status KvSender::send_exact(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> exact) {
  if (exact.size() > kWireMaxPayloadBytes)
    return Status::error(fmt::format("request {}: a {}-byte exact message exceeds the wire limit", request_id,
                                     exact.size()));
  return shared_->queue(peer, request_id, WireType::kv_exact, layer, std::move(exact), false);
}

Status KvSender::layer_done(EndpointId peer, uint64_t request_id, uint32_t layer) {
  return shared_->queue(peer, request_id, WireType::kv_layer_done, layer, {}, false);
}

Status KvSender::request_done(EndpointId peer, uint64_t request_id, std::vector<std::byte> payload) {
  if (payload.size() > kWireMaxDoneBytes)
    return Status::error(fmt::format("request {}: a {}-byte request_done payload exceeds the limit of {}", request_id,
                                     payload.size(), kWireMaxDoneBytes));
  Status error;
  {
    std::lock_guard lock(shared_->mutex);
    auto it = shared_->requests.find(request_id);
    if (it != shared_->requests.end() && it->second.failed) {
      error = it->second.error;
      it->second.ended = true;
      it->second.batch = {};
      shared_->maybe_finish(it);
    }
  }
  if (!error) {
    shared_->send_cancel(peer, request_id, "ended by the sender after an error");
    return error;
  }
  return shared_->queue(peer, request_id, WireType::request_done, 0, std::move(payload), true);
}

void KvSender::cancel(EndpointId peer, uint64_t request_id, std::string reason) {
  {
    std::lock_guard lock(shared_->mutex);
    auto it = shared_->requests.find(request_id);
    if (it != shared_->requests.end()) {
      it->second.ended = true;
      it->second.cancelled = true;
      it->second.batch = {};  // pages not yet sent are dropped
      shared_->idle.notify_all();
      shared_->maybe_finish(it);
    }
  }
  shared_->send_cancel(peer, request_id, reason);
}

Status KvSender::wait_idle(double timeout_s) {
  std::unique_lock lock(shared_->mutex);
  const bool done = shared_->idle.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                           [&] { return shared_->in_flight == 0; });
  if (!done)
    return Status::error(fmt::format("kv sender: {} messages still queued after {} s", shared_->in_flight, timeout_s));
  return Status::ok();
}

Status KvSender::wait_request(uint64_t request_id, double timeout_s) {
  std::unique_lock lock(shared_->mutex);
  auto settled = [&] {
    auto it = shared_->requests.find(request_id);
    return it == shared_->requests.end() || it->second.failed || it->second.cancelled;
  };
  if (!shared_->idle.wait_for(lock, std::chrono::duration<double>(timeout_s), settled)) {
    const auto& r = shared_->requests.at(request_id);
    return Status::error(fmt::format("request {}: {} messages not yet sent after {} s{}", request_id, r.in_flight,
                                     timeout_s, r.ended ? "" : " (the request was never ended)"));
  }
  auto it = shared_->requests.find(request_id);
  if (it != shared_->requests.end()) {
    return it->second.failed ? it->second.error
                             : Status::error(fmt::format("request {} was cancelled", request_id));
  }
  auto outcome = shared_->outcomes.find(request_id);
  return outcome == shared_->outcomes.end() ? Status::ok() : outcome->second;
}

bool KvSender::request_pending(uint64_t request_id) const {
  std::lock_guard lock(shared_->mutex);
  auto it = shared_->requests.find(request_id);
  return it != shared_->requests.end() && !it->second.failed && !it->second.cancelled;
}

bool KvSender::wait_request_closed(uint64_t request_id, double timeout_s) {
  std::unique_lock lock(shared_->mutex);
  return shared_->idle.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                [&] { return !shared_->requests.contains(request_id); });
}

KvSenderStats KvSender::stats() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->counters;
}

void KvSender::corrupt_next_page_for_test(uint64_t request_id) {
  std::lock_guard lock(shared_->mutex);
  shared_->corrupt_next_page.insert(request_id);
}

}  // namespace hack::net
