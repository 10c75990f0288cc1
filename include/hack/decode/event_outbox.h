/// @file event_outbox.h
/// @brief Decode events leave the engine thread through a bounded FIFO to one output thread,
/// which runs each request's handler: JSON, SSE and metrics happen there, so the engine thread
/// only schedules, runs steps and samples (llama.cpp's server: results out through a queue,
/// formatting on the HTTP side; vLLM v1: detokenization and HTTP outside the engine core).
///
/// Order: one output thread, FIFO, so a request's events arrive in the order they were posted.
/// Bound: `capacity` events; a full outbox makes post() wait for the output thread
/// (backpressure on the engine rather than unbounded memory). The slots are reused, so once
/// each slot has held an event of a request's shape, a post allocates nothing (top logprobs and
/// messages are assigned into the slot's existing capacity).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hack/decode/decode_scheduler.h"

namespace hack::server {

class EventOutbox {
 public:
  explicit EventOutbox(size_t capacity = 16384);
  /// Runs every event still queued, then joins the output thread.
  ~EventOutbox();
  EventOutbox(const EventOutbox&) = delete;
  EventOutbox& operator=(const EventOutbox&) = delete;

  /// Queues `event` for `handler` (any thread; waits while the outbox is full). The handler
  /// runs on the output thread and must not post to this outbox.
  void post(std::shared_ptr<const DecodeEventFn> handler, const DecodeEvent& event);
  /// The scheduler's event function for one request: posts every event to `handler`.
  DecodeEventFn relay(DecodeEventFn handler);
  /// Blocks until every event posted before the call has been handled.
  void flush();

  size_t capacity() const { return slots_.size(); }
  /// Most events queued at once so far (how close the output thread came to the bound).
  size_t high_water() const;
  /// Times post() had to wait for room.
  uint64_t full_waits() const;

 private:
  struct Slot {
    std::shared_ptr<const DecodeEventFn> handler;
    DecodeEvent event;
  };
  void run();

  std::vector<Slot> slots_;  // [capacity] ring
  mutable std::mutex mutex_;
  std::condition_variable not_empty_, not_full_, drained_;
  uint64_t head_ = 0;     // next slot to run (output thread)
  uint64_t tail_ = 0;     // next slot to fill
  uint64_t handled_ = 0;  // events run
  size_t high_water_ = 0;
  uint64_t full_waits_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace hack::server
