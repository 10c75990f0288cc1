/// @file kv_transfer.h
/// @brief KV streaming over UCX: a KvSender (prefill) streams the HACK pages of a request
/// layer by layer to a decode node; a KvReceiver (decode) hands each page, layer end and
/// request end to callbacks, in the order they were sent, and reports per-request errors.
///
/// Protocol (wire.h headers; `seq` numbers the messages of one request from 0):
///   sender → receiver, AM id kKvDataAmId: kv_page* kv_layer_done ... request_done, or
///                                         request_cancel at any point
///   receiver → sender, AM id kKvReplyAmId: request_error (a bad page, a checksum mismatch)
/// A failed request stays failed on both sides until the sender ends it (request_done or
/// cancel, which then sends request_cancel so the receiver forgets it). A lost endpoint
/// fails every request on it, on both sides. Errors of one request never touch another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hack/core/error.h"
#include "hack/net/ucx_worker.h"
#include "hack/net/wire.h"

namespace hack::net {

inline constexpr uint16_t kKvDataAmId = 10;
inline constexpr uint16_t kKvReplyAmId = 11;

/// All run on the worker's progress thread; they must not block.
struct KvReceiverCallbacks {
  /// page: one HACK page of `layer`, valid only during the call.
  std::function<void(uint64_t request_id, uint32_t layer, std::span<const std::byte> page)> on_page;
  std::function<void(uint64_t request_id, uint32_t layer)> on_layer_done;
  std::function<void(uint64_t request_id)> on_request_done;
  /// Called at most once per request; nothing more arrives for it afterwards.
  std::function<void(uint64_t request_id, const Status& error)> on_request_error;
  /// A message whose header could not be read, so no request can be blamed.
  std::function<void(EndpointId from, const Status& error)> on_bad_message;
};

/// Receives KV from any number of senders on one worker (one receiver per worker).
class KvReceiver {
 public:
  KvReceiver(UcxWorker& worker, KvReceiverCallbacks callbacks);
  /// Unhooks from the worker; no callback runs after it returns.
  ~KvReceiver();
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  /// Requests that have started and not yet ended (done, failed-and-ended, cancelled).
  size_t open_requests() const;

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
};

/// Streams requests to any number of receivers over one worker (one sender per worker).
/// Calls are thread-safe and never wait for the network; a call on a failed request
/// returns its error.
class KvSender {
 public:
  KvSender(UcxWorker& worker, KvSenderCallbacks callbacks = {});
  ~KvSender();
  KvSender(const KvSender&) = delete;
  KvSender& operator=(const KvSender&) = delete;

  /// Queues one HACK page of `layer`. The first message of a request binds it to `peer`.
  Status send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::vector<std::byte> page);
  Status send_page(EndpointId peer, uint64_t request_id, uint32_t layer, std::span<const std::byte> page);
  Status layer_done(EndpointId peer, uint64_t request_id, uint32_t layer);
  /// Ends a request. On a failed request it sends request_cancel and returns the error.
  Status request_done(EndpointId peer, uint64_t request_id);
  /// Abandons a request (the receiver reports it as cancelled unless it already failed).
  void cancel(EndpointId peer, uint64_t request_id, std::string reason);

  /// Waits until every queued message has been handed to the transport or failed.
  Status wait_idle(double timeout_s);
  /// Test hook: the next page of request_id gets one byte flipped after its checksum.
  void corrupt_next_page_for_test(uint64_t request_id);

 private:
  struct Shared;
  UcxWorker& worker_;
  std::shared_ptr<Shared> shared_;  // also held by in-flight send completions
  int disconnect_token_ = 0;
};

}  // namespace hack::net
