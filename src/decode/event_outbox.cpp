#include "hack/decode/event_outbox.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "hack/core/error.h"

namespace hack::server {

EventOutbox::EventOutbox(size_t capacity) : slots_(capacity) {
  HACK_CHECK(capacity > 0, "event outbox: capacity must be positive");
  thread_ = std::thread([this] { run(); });
}

EventOutbox::~EventOutbox() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  not_empty_.notify_all();
  thread_.join();
}

void EventOutbox::post(std::shared_ptr<const DecodeEventFn> handler, const DecodeEvent& event) {
  std::unique_lock lock(mutex_);
  if (tail_ - head_ == slots_.size()) {
    ++full_waits_;
    not_full_.wait(lock, [&] { return tail_ - head_ < slots_.size(); });
  }
  Slot& slot = slots_[tail_ % slots_.size()];
  slot.handler = std::move(handler);
  slot.event = event;  // into the slot's existing capacity
  ++tail_;
  high_water_ = std::max(high_water_, static_cast<size_t>(tail_ - head_));
  lock.unlock();
  not_empty_.notify_one();
}

DecodeEventFn EventOutbox::relay(DecodeEventFn handler) {
  auto shared = std::make_shared<const DecodeEventFn>(std::move(handler));
  return [this, shared](const DecodeEvent& e) { post(shared, e); };
}

void EventOutbox::flush() {
  std::unique_lock lock(mutex_);
  const uint64_t target = tail_;
  drained_.wait(lock, [&] { return handled_ >= target; });
}

size_t EventOutbox::high_water() const {
  std::lock_guard lock(mutex_);
  return high_water_;
}

uint64_t EventOutbox::full_waits() const {
  std::lock_guard lock(mutex_);
  return full_waits_;
}

void EventOutbox::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    not_empty_.wait(lock, [&] { return head_ < tail_ || stopping_; });
    if (head_ == tail_) return;  // stopping and nothing left
    Slot& slot = slots_[head_ % slots_.size()];
    // The slot stays ours until head_ moves: posts never fill it meanwhile.
    std::shared_ptr<const DecodeEventFn> handler = std::move(slot.handler);
    lock.unlock();
    try {
      (*handler)(slot.event);
    } catch (const std::exception& e) {
      spdlog::error("decode output: an event handler failed: {}", e.what());
    }
    handler.reset();  // the last reference to a finished request's state goes here, off the lock
    lock.lock();
    ++head_;
    ++handled_;
    not_full_.notify_one();
    drained_.notify_all();
  }
}

}  // namespace hack::server
