/// @file kv_transfer.h
/// @brief KV streaming over UCX: a KvSender (prefill) streams the HACK pages of a request
/// layer by layer to a decode node; a KvReceiver (decode) hands each page, layer end and
/// request end to callbacks, in the order they were sent, and reports per-request errors.
///
/// Protocol (wire.h headers; `seq` numbers the messages of one request from 0; a kv_page
/// message carries one or more consecutive pages of one layer, see KvSenderOptions::message_bytes):
///   sender → receiver, AM id kKvDataAmId: (kv_page | kv_exact)* kv_layer_done ...
///                                         request_done (with an optional small payload),
///                                         or request_cancel at any point
///   receiver → sender, AM id kKvReplyAmId: request_error (a bad page, a checksum mismatch)
/// A failed request stays failed on both sides until the sender ends it (request_done or
/// cancel, which then sends request_cancel so the receiver forgets it). A lost endpoint
/// fails every request on it, on both sides. Errors of one request never touch another.
///
/// Flow control (in messages, whatever pages they carry): the receiver delivers a request's
/// messages in order, each page of a kv_page message to on_page in turn, and holds at most
/// kKvMaxEarlyMessages that arrive ahead of one still being fetched (a rendezvous page), so
/// the sender keeps a window per endpoint: at most max_in_flight_messages messages from
/// the oldest one not yet send-completed to the newest handed to UCX, and at most
/// max_in_flight_bytes of payload in them. Messages beyond the window wait in a local
/// queue, in order, and go out as completions open it; no call ever blocks on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/wire.h"

namespace hack::net {

inline constexpr uint16_t kKvDataAmId = 10;
inline constexpr uint16_t kKvReplyAmId = 11;
/// Messages of one request a receiver holds while an earlier one is still arriving; one
/// more fails the request (a sender whose window is larger is broken).
inline constexpr size_t kKvMaxEarlyMessages = 4096;

/// All run on the worker's progress thread; they must not block.
struct KvReceiverCallbacks {
  /// page: one HACK page of `layer`, valid only during the call (KvReceiver::retain_payload
  /// keeps it longer). Called once per page, in the order sent.
  std::function<void(uint64_t request_id, uint32_t layer, std::span<const std::byte> page)> on_page;
  /// exact: one exact-tokens message of `layer` (kv/kv_stream.h), valid only during the call.
  std::function<void(uint64_t request_id, uint32_t layer, std::span<const std::byte> exact)> on_exact;
  /// exact_copy: exact tokens kept beside the cache (kv_stream.h), valid only during the call.
  std::function<void(uint64_t request_id, uint32_t layer, std::span<const std::byte> exact)> on_exact_copy;
  std::function<void(uint64_t request_id, uint32_t layer)> on_layer_done;
  /// payload: what the sender passed to request_done (may be empty), valid during the call.
  std::function<void(uint64_t request_id, std::span<const std::byte> payload)> on_request_done;
  /// Called at most once per request; nothing more arrives for it afterwards.
  std::function<void(uint64_t request_id, const Status& error)> on_request_error;
  /// A message whose header could not be read, so no request can be blamed.
  std::function<void(EndpointId from, const Status& error)> on_bad_message;
  /// A message refused by WireAuth (no tag, bad tag): dropped before it touched any request.
  std::function<void(EndpointId from, const Status& error)> on_rejected;
};

/// Receives KV from any number of senders on one worker (one receiver per worker).
class KvReceiver {
 public:
  /// With `auth` enabled only messages sealed with the same secret are accepted (wire.h).
  KvReceiver(UcxWorker& worker, KvReceiverCallbacks callbacks, WireAuth auth = {});
  /// Unhooks from the worker; no callback runs after it returns.
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  /// Requests that have started and not yet ended (done, failed-and-ended, cancelled).
  size_t open_requests() const;

  /// From a callback: keeps the memory `bytes` (a page or exact message passed to it) lies in
  /// valid after the callback returns, while the returned owner lives, so its consumer copies
  /// it once, from UCX's receive buffer (UcxWorker::retain_received_payload; a message that
  /// arrived ahead of its turn is held the same way). Null when it cannot (outside a callback,
  /// UCX's memory budget spent): then the caller copies.
  std::shared_ptr<const void> retain_payload(std::span<const std::byte> bytes);

 private:
  struct State;
  UcxWorker& worker_;
  std::unique_ptr<State> state_;  // touched only on the progress thread
  int disconnect_token_ = 0;
};

struct KvSenderCallbacks {
  /// A request failed: a send failed, the receiver rejected it, or the peer was lost.
  /// Called at most once per request, on the progress thread.
  std::function<void(uint64_t request_id, const Status& error)> on_request_error;
  /// The transport to `endpoint` broke: a send on it completed with an error (reset, timeout,
  /// closed; whether or not UCX also fails the endpoint) or the endpoint was lost. Called on
  /// the progress thread, before the requests on it are failed (so their owner sees the
  /// endpoint as broken when it learns of the failure), possibly more than once per endpoint.
  /// The owner of the endpoint drops it.
  std::function<void(EndpointId endpoint, const Status& error)> on_transport_failed;
};

/// How the pages of a multi-page kv_page message reach UCX (pages that lie back to back in
/// memory always go as one span, copied by neither).
enum class KvGather : uint8_t {
  /// Copied into one buffer by the thread that ends the message (outside the sender's lock),
  /// which UCX sends as one contiguous payload. UCX 1.13 moves a contiguous rendezvous
  /// payload over tcp by put_zcopy straight into the receiver's buffer, but an iov one in
  /// 64 KiB active-message fragments the receiver copies again: about half the speed
  /// (bench/RESULTS.md, 2026-11-26), so the copy here is the cheaper one.
  copy,
  /// The pages in place, as a UCX iov (UCP_DATATYPE_IOV): no copy in this process.
  iov,
  /// Per endpoint, from the lanes UCX chose for it (UcxWorker::transports, known for endpoints
  /// opened by worker address): iov over shared memory (sysv/posix pack an iov straight into
  /// their FIFO: 42 KiB HACK pages moved 2-2.7x faster than gathered by copy,
  /// bench/RESULTS.md), copy otherwise.
  automatic,
};

/// "copy" | "iov" | "auto" (the --kv-gather / --gather flags); hack::Error for anything else.
KvGather parse_kv_gather(std::string_view name);
const char* kv_gather_name(KvGather gather);

/// Whether kv_page messages carry their pages' checksums (wire.h, kWireFlagUnchecked).
enum class KvChecksum : uint8_t {
  /// Every page hashed as it is queued and again on arrival.
  always,
  /// Not where the endpoint's lanes are shared memory (as KvGather::automatic tells them),
  /// where the bytes never leave the host's memory and hashing at both ends cost a third of
  /// the transfer's memory traffic; always elsewhere. With auth the tag still covers them.
  automatic,
};

/// "always" | "auto" (the --kv-checksum / --checksum flags); hack::Error for anything else.
KvChecksum parse_kv_checksum(std::string_view name);
const char* kv_checksum_name(KvChecksum checksum);

struct KvSenderOptions {
  /// Window per endpoint (see the file comment). At most kKvMaxEarlyMessages messages; a
  /// single message larger than max_in_flight_bytes still goes out, alone.
  size_t max_in_flight_messages = 1024;
  size_t max_in_flight_bytes = size_t{64} << 20;
  /// Pages of one request and layer queued one after another leave together, as one kv_page
  /// message of at least this many payload bytes (or kWireMaxPagesPerMessage pages); tcp moves
  /// 1 MiB messages ~2× faster per byte than 256 KiB ones. Fewer leave at layer_done, flush,
  /// request_done, or when a page of another layer or any other message of the request
  /// follows; cancel drops them. 0: every page is its own message.
  size_t message_bytes = size_t{1} << 20;
  KvGather gather = KvGather::copy;
  KvChecksum checksum = KvChecksum::always;
  /// Seals every message (and checks replies) with the cluster secret when enabled (wire.h).
  WireAuth auth;
};

/// Counters (read from any thread).
struct KvSenderStats {
  uint64_t messages_sent = 0;    ///< send-completed successfully
  uint64_t pages_sent = 0;       ///< pages in those messages
  uint64_t bytes_sent = 0;       ///< their payload bytes
  uint64_t messages_gathered = 0;  ///< multi-segment messages copied into one buffer (KvGather)
  uint64_t messages_unchecked = 0; ///< kv_page messages sent without checksums (KvChecksum)
  uint64_t messages_waiting = 0; ///< now waiting for the window (not yet handed to UCX)
  uint64_t max_waiting = 0;      ///< the most ever waiting at once
  uint64_t max_window_messages = 0;  ///< the widest window any endpoint reached (messages)
  uint64_t max_window_bytes = 0;     ///< the most payload bytes any endpoint had in its window
};

/// Streams requests to any number of receivers over one worker (one sender per worker).
/// Calls are thread-safe and never wait for the network; a call on a failed request
/// returns its error.
class KvSender {
 public:
  /// Throws hack::Error for options out of range.
  KvSender(UcxWorker& worker, KvSenderCallbacks callbacks = {}, KvSenderOptions options = {});
  ~KvSender();
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  /// Queues one HACK page of `layer` (into the request's pending message, see
  /// KvSenderOptions::message_bytes). The first message of a request binds it to `peer`.
  Status send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> page);
  /// Copies the page into the send queue.
  Status send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::span<const std::byte> page);
  /// Sends the page from the caller's memory, with no copy: it must stay valid and unchanged
  /// until the request has left the sender (wait_request_closed, or wait_request ok).
  Status send_page_borrowed(EndpointId peer, uint64_t request_id, uint32_t layer, std::span<const std::byte> page);
  /// Sends the request's pending pages now, as a message of fewer than message_bytes (a
  /// prefill chunk's pages of one layer, so they need not wait for the next chunk). Ok when
  /// nothing is pending or the request is unknown; the error of a failed request.
  Status flush(EndpointId peer, uint64_t request_id);
  /// Queues one exact-tokens message (kv/kv_stream.h) of `layer`.
  Status send_exact(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> exact);
  /// Queues an exact message the receiver keeps beside its cache (KvMessageKind::exact_copy).
  Status send_exact_copy(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> exact);
  Status layer_done(EndpointId peer, uint64_t request_id, uint32_t layer);
  /// Ends a request; `payload` (≤ kWireMaxDoneBytes, e.g. JSON with the first token) goes
  /// to the receiver's on_request_done. On a failed request it sends request_cancel and
  /// returns the error.
  Status request_done(EndpointId peer, uint64_t request_id, std::vector<std::byte> payload = {});
  /// Abandons a request (the receiver reports it as cancelled unless it already failed).
  void cancel(EndpointId peer, uint64_t request_id, std::string reason);

  /// Waits until every queued message has been handed to the transport or failed (pages
  /// pending in a partial message are not queued yet: flush or layer_done first).
  Status wait_idle(double timeout_s);
  /// Waits until every message of a request has send-completed: ok once it has ended
  /// (request_done) and all its messages are out, its error if it failed or was cancelled
  /// meanwhile, an error after timeout_s. An unknown (or finished) id is ok.
  Status wait_request(uint64_t request_id, double timeout_s);
  /// Whether a request still has messages on their way and has neither failed nor been
  /// cancelled (so a wait_request timeout was only a timeout).
  bool request_pending(uint64_t request_id) const;
  /// Waits until a request has left the sender (ended, every message finished or dropped), so
  /// its id may stream again from seq 0, to any endpoint. False after timeout_s.
  bool wait_request_closed(uint64_t request_id, double timeout_s);
  KvSenderStats stats() const;
  /// Test hook: the next KV message (page or exact tokens) of request_id gets one byte flipped after its checksum.
  void corrupt_next_page_for_test(uint64_t request_id);

 private:
  struct Shared;
  UcxWorker& worker_;
  std::shared_ptr<Shared> shared_;  // also held by in-flight send completions
  int disconnect_token_ = 0;
};

}  // namespace hack::net
