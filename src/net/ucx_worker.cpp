// UcxWorker: a ucp context and worker owned by one progress thread (include/hack/net/ucx_worker.h).
//
// The progress thread loops: run posted commands, ucp_worker_progress until idle, run
// work deferred from inside UCX callbacks (rendezvous receives, endpoint failures, accepted
// connections — UCX callbacks only record them), then arm the worker and poll() its event
// fd together with our own eventfd, which post() writes to wake the thread.
#include "hack/net/ucx_worker.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "hack/core/hex.h"
#include "hack/core/read_file.h"

namespace hack::net {

namespace {

Status ucx_error(const char* what, ucs_status_t status) {
  return Status::error(fmt::format("{}: {}", what, ucs_status_string(status)));
}

// host:port resolved to one socket address (numeric or by name).
sockaddr_storage resolve(const std::string& host, uint16_t port, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) fail("cannot resolve {}:{}: {}", host, port, gai_strerror(rc));
  sockaddr_storage out{};
  std::memcpy(&out, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return 0;
}

// options.config plus what peer-failure detection needs where neither it nor the
// environment says otherwise. UCX 1.13's shared-memory transports only advertise peer-failure
// handling with MM_ERROR_HANDLING=y, and UCX then finds a dead peer on them by keepalive
// (every KEEPALIVE_INTERVAL, 20 s by default): without the first, an endpoint in PEER mode
// never uses shared memory; without a short interval, a decode node killed mid-transfer would
// go unnoticed on it for 20 s.
std::vector<std::pair<std::string, std::string>> with_defaults(const UcxOptions& options) {
  auto config = options.config;
  if (!options.detect_peer_failure) return config;
  const auto set_default = [&](const std::string& name, const std::string& value) {
    const bool given = std::ranges::any_of(config, [&](const auto& kv) { return kv.first == name; });
    if (!given && std::getenv(("UCX_" + name).c_str()) == nullptr) config.emplace_back(name, value);
  };
  // Only where a shared-memory transport may be enabled (UCX warns of an unused option else).
  std::string tls = "all";
  if (const char* env = std::getenv("UCX_TLS")) tls = env;
  for (const auto& [name, value] : config)
    if (name == "TLS") tls = value;
  const bool shm = tls.starts_with('^') || std::ranges::any_of(std::array{"all", "shm", "mm", "posix", "sysv"}, [&](const char* t) {
    return tls.find(t) != std::string::npos;
  });
  if (shm) set_default("MM_ERROR_HANDLING", "y");
  set_default("KEEPALIVE_INTERVAL", "1s");
  return config;
}

// RAII owners of the ucp handles.
struct ContextHandle {
  ucp_context_h handle = nullptr;
  explicit ContextHandle(const UcxOptions& options) {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) fail("ucp_config_read: {}", ucs_status_string(status));
    for (const auto& [name, value] : with_defaults(options)) {
      status = ucp_config_modify(config, name.c_str(), value.c_str());
      if (status != UCS_OK) {
        ucp_config_release(config);
        fail("UCX option {}={}: {}", name, value, ucs_status_string(status));
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (options.rma ? UCP_FEATURE_RMA : 0);
    status = ucp_init(&params, config, &handle);
    ucp_config_release(config);
    if (status != UCS_OK) fail("ucp_init: {}", ucs_status_string(status));
  }
  ~ContextHandle() {
    if (handle) ucp_cleanup(handle);
  }
  ContextHandle(const ContextHandle&) = delete;
  ContextHandle& operator=(const ContextHandle&) = delete;
};

struct WorkerHandle {
  ucp_worker_h handle = nullptr;
  explicit WorkerHandle(ucp_context_h context) {
    ucp_worker_params_t params{};
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    const ucs_status_t status = ucp_worker_create(context, &params, &handle);
    if (status != UCS_OK) fail("ucp_worker_create: {}", ucs_status_string(status));
  }
  ~WorkerHandle() {
    if (handle) ucp_worker_destroy(handle);
  }
  WorkerHandle(const WorkerHandle&) = delete;
  WorkerHandle& operator=(const WorkerHandle&) = delete;
};

struct EventFd {
  int fd = -1;
  EventFd() : fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd < 0) fail("eventfd: {}", std::strerror(errno));
  }
  ~EventFd() {
    if (fd >= 0) ::close(fd);
  }
  EventFd(const EventFd&) = delete;
  EventFd& operator=(const EventFd&) = delete;
};

}  // namespace

struct UcxWorker::Impl {
  struct SendOp;
  struct Endpoint {
    Impl* impl = nullptr;
    EndpointId id = 0;
    ucp_ep_h ep = nullptr;
    // Created by UCX for a peer that connected by worker address (the reply endpoint of its
    // first message): UCX owns it, so it is forgotten, never closed, when we let go.
    bool adopted = false;
    bool by_address = false;  // opened by connect_address (transports() reports only these)
    // Client-server (sockaddr) endpoints start on the connection manager's lane and switch to
    // their final lanes when wireup completes; sends wait here until then (see gate_until_wired).
    bool wired = true;
    std::deque<std::pair<uint16_t, SendOp*>> held;
    std::unordered_map<std::string, ucp_rkey_h> rkeys;  // put: peers' packed keys (bytes) → unpacked on this endpoint
    void destroy_rkeys() {
      for (const auto& [packed, rkey] : rkeys) ucp_rkey_destroy(rkey);
      rkeys.clear();
    }
  };
  struct SendOp {
    Impl* impl = nullptr;
    std::vector<std::byte> header;
    std::vector<std::byte> payload;       // owned, or empty when `borrowed` is sent
    std::span<const std::byte> borrowed;  // the caller's bytes (send_borrowed)
    SendCallback done;
    std::vector<ucp_dt_iov_t> iov;        // send_gather: the caller's segments, in order
    int pending = 0;                      // put: writes not yet complete
    Status first_error = Status::ok();    // put: the first write that failed
    std::span<const std::byte> bytes() const { return payload.empty() ? borrowed : std::span<const std::byte>(payload); }
  };
  struct RecvOp {
    Impl* impl = nullptr;
    uint16_t am_id = 0;
    EndpointId from = 0;
    std::vector<std::byte> header;
    // Where UCX writes a rendezvous payload: left uninitialised (no zero-fill pass over a
    // page that is about to be overwritten).
    std::unique_ptr<std::byte[]> payload;
    size_t payload_bytes = 0;
    std::shared_ptr<std::byte[]> retained;  // the payload once a handler retained it
  };
  // Eager payloads handlers retained (UCP_AM_FLAG_PERSISTENT_DATA): their last owner, on any
  // thread, queues the release here; the progress thread calls ucp_am_data_release. Shared
  // with the owners, which may outlive the worker (their release is then dropped).
  struct Releases {
    std::mutex mutex;
    std::vector<void*> pending;
    bool open = true;
    int wake_fd = -1;
    std::atomic<uint64_t> held_bytes{0};
    void release(void* data, size_t bytes) {
      held_bytes -= bytes;
      std::lock_guard lock(mutex);
      if (!open) return;
      pending.push_back(data);
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
    }
  };
  // The eager message whose handler runs now.
  struct EagerDelivery {
    void* data = nullptr;
    size_t bytes = 0;
    bool retainable = false;
    std::shared_ptr<const void> owner;  // set once the handler retained it
  };
  struct AmHandlers {
    Impl* impl = nullptr;
    uint16_t am_id = 0;
    MessageHandler on_message;
    MessageErrorHandler on_error;
    bool retainable = false;
  };

  UcxOptions options;
  ContextHandle context;
  WorkerHandle worker;
  EventFd wake;
  int ucx_fd = -1;
  std::string address_hex;  // ucp_worker_get_address, fixed for the worker's lifetime
  std::thread thread;
  std::thread::id thread_id;

  std::mutex mutex;  // guards commands, stopping
  std::deque<std::function<void()>> commands;
  bool stopping = false;
  std::atomic<EndpointId> next_id{1};
  std::atomic<uint64_t> messages_received{0}, rndv_received{0}, messages_sent{0}, send_errors{0}, eager_retained{0};
  std::shared_ptr<Releases> releases = std::make_shared<Releases>();

  // Progress-thread state.
  ucp_listener_h listener = nullptr;
  std::unordered_map<EndpointId, std::unique_ptr<Endpoint>> endpoints;
  std::unordered_map<ucp_ep_h, EndpointId> endpoint_by_handle;
  std::vector<std::unique_ptr<Endpoint>> retired;  // closing; UCX may still hold their arg
  std::vector<void*> close_requests;
  std::map<uint16_t, std::unique_ptr<AmHandlers>> handlers;
  std::map<int, DisconnectHandler> disconnect_handlers;
  int next_token = 1;
  std::deque<std::function<void()>> deferred;
  std::unordered_set<SendOp*> sends;
  std::unordered_map<uint64_t, ucp_mem_h> registrations;  // register_memory
  uint64_t next_registration = 1;
  std::unordered_set<RecvOp*> recvs;
  RecvOp* delivering = nullptr;  // the rendezvous message whose handler runs now
  EagerDelivery* delivering_eager = nullptr;

  explicit Impl(UcxOptions opts) : options(std::move(opts)), context(options), worker(context.handle) {
    ucs_status_t status = ucp_worker_get_efd(worker.handle, &ucx_fd);
    if (status != UCS_OK) fail("ucp_worker_get_efd: {}", ucs_status_string(status));
    ucp_address_t* address = nullptr;
    size_t address_bytes = 0;
    status = ucp_worker_get_address(worker.handle, &address, &address_bytes);
    if (status != UCS_OK) fail("ucp_worker_get_address: {}", ucs_status_string(status));
    address_hex = hex_encode(std::span(reinterpret_cast<const uint8_t*>(address), address_bytes));
    ucp_worker_release_address(worker.handle, address);
    releases->wake_fd = wake.fd;
  }

  // Progress thread: hands retained eager payloads whose owners have gone back to UCX.
  void release_retained() {
    std::vector<void*> batch;
    {
      std::lock_guard lock(releases->mutex);
      batch.swap(releases->pending);
    }
    for (void* data : batch) ucp_am_data_release(worker.handle, data);
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mutex);
      commands.push_back(std::move(fn));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake.fd, &one, sizeof one);
  }

  // One synchronous call's rendezvous between the caller and the progress thread. Shared by
  // both and freed by whichever lets go last (a plain counter: no shared_ptr, whose GCC 12
  // release path ThreadSanitizer misreads).
  struct CallWaiter {
    enum class Phase { queued, running, finished, abandoned };
    std::mutex mutex;
    std::condition_variable changed;
    Phase phase = Phase::queued;
    std::exception_ptr error;
    std::atomic<int> refs{2};
    void release() {
      if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }
  };

  // Runs fn on the progress thread and waits. The timeout covers only the wait for the
  // thread to pick fn up: a call that has started runs to completion (fn refers to the
  // caller's stack), one still queued at the deadline is abandoned and never runs.
  void call(const std::function<void()>& fn) {
    if (std::this_thread::get_id() == thread_id) {
      fn();
      return;
    }
    auto* waiter = new CallWaiter;
    post([&fn, waiter] {
      bool abandoned = false;
      {
        std::lock_guard lock(waiter->mutex);
        abandoned = waiter->phase == CallWaiter::Phase::abandoned;
        if (!abandoned) waiter->phase = CallWaiter::Phase::running;
      }
      if (abandoned) {  // released outside the lock: the last release frees the mutex
        waiter->release();
        return;
      }
      std::exception_ptr error;
      try {
        fn();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(waiter->mutex);
        waiter->error = std::move(error);  // the caller alone lets go of it (see below)
        waiter->phase = CallWaiter::Phase::finished;
        waiter->changed.notify_all();
      }
      waiter->release();
    });
    std::unique_lock lock(waiter->mutex);
    const auto timeout = std::chrono::duration<double>(options.call_timeout_s);
    waiter->changed.wait_for(lock, timeout, [&] { return waiter->phase != CallWaiter::Phase::queued; });
    if (waiter->phase == CallWaiter::Phase::queued) {
      waiter->phase = CallWaiter::Phase::abandoned;
      lock.unlock();
      waiter->release();
      fail("UCX progress thread did not answer within {} s", options.call_timeout_s);
    }
    waiter->changed.wait(lock, [&] { return waiter->phase == CallWaiter::Phase::finished; });
    // Moved out, so every reference to the exception ends on this thread: its reference count
    // lives inside libstdc++, where ThreadSanitizer sees no ordering, and a last reference
    // dropped on the progress thread (with the waiter) would free the message this thread read.
    const std::exception_ptr error = std::move(waiter->error);
    lock.unlock();
    waiter->release();
    if (error) std::rethrow_exception(error);
  }

  // ---- progress thread --------------------------------------------------------

  void run() {
    for (;;) {
      std::deque<std::function<void()>> batch;
      {
        std::lock_guard lock(mutex);
        batch.swap(commands);
        if (stopping && batch.empty()) break;
      }
      for (auto& fn : batch) guarded(fn);
      release_retained();
      while (ucp_worker_progress(worker.handle) != 0) {
      }
      run_deferred();
      reap_close_requests();
      {
        std::lock_guard lock(mutex);
        if (!commands.empty() || stopping) continue;
      }
      if (!deferred.empty()) continue;
      const ucs_status_t armed = ucp_worker_arm(worker.handle);
      if (armed == UCS_ERR_BUSY) continue;
      pollfd fds[2] = {{wake.fd, POLLIN, 0}, {ucx_fd, POLLIN, 0}};
      // The timeout only bounds a wake-up lost to a transport without events.
      ::poll(fds, 2, 100);
      uint64_t drained = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake.fd, &drained, sizeof drained);
    }
    shutdown();
  }

  static void guarded(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      spdlog::error("ucx: {}", e.what());
    }
  }

  void run_deferred() {
    while (!deferred.empty()) {
      auto fn = std::move(deferred.front());
      deferred.pop_front();
      guarded(fn);
    }
  }

  void reap_close_requests() {
    std::erase_if(close_requests, [](void* request) {
      if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
      ucp_request_free(request);
      return true;
    });
    if (close_requests.empty()) retired.clear();
  }

  void shutdown() {
    run_deferred();
    release_retained();
    {
      // Owners still holding eager payloads now hold memory that goes with the worker.
      std::lock_guard lock(releases->mutex);
      releases->open = false;
      if (releases->held_bytes != 0)
        spdlog::warn("ucx: worker shut down while {} bytes of received messages were still held", releases->held_bytes.load());
    }
    if (listener) {
      ucp_listener_destroy(listener);
      listener = nullptr;
    }
    std::vector<EndpointId> ids;
    for (const auto& [id, ep] : endpoints) ids.push_back(id);
    for (EndpointId id : ids) close_endpoint(id, true);
    for (const auto& [id, memh] : registrations) ucp_mem_unmap(context.handle, memh);
    registrations.clear();
    // Force-closing fails the outstanding requests; progress until UCX has said so.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((!close_requests.empty() || !sends.empty() || !recvs.empty()) && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker.handle);
      run_deferred();
      reap_close_requests();
    }
    for (void* request : close_requests) ucp_request_free(request);
    close_requests.clear();
    for (SendOp* op : sends) {
      if (op->done) guarded([op] { op->done(Status::error("UCX worker shut down before the send completed")); });
    }
  }

  // Called after the worker is destroyed: requests UCX never completed are ours to free.
  void free_leftovers() {
    for (SendOp* op : sends) delete op;
    for (RecvOp* op : recvs) delete op;
    sends.clear();
    recvs.clear();
  }

  // ---- endpoints --------------------------------------------------------------

  static void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* endpoint = static_cast<Endpoint*>(arg);
    Impl* impl = endpoint->impl;
    const EndpointId id = endpoint->id;
    impl->deferred.push_back([impl, id, status] { impl->endpoint_failed(id, ucx_error("UCX endpoint failed", status)); });
  }

  void endpoint_failed(EndpointId id, const Status& reason) {
    if (!endpoints.contains(id)) return;
    spdlog::info("ucx: endpoint {} lost: {}", id, reason.message());
    close_endpoint(id, true);
    // Copy: a handler may remove itself.
    const auto handlers_now = disconnect_handlers;
    for (const auto& entry : handlers_now)  // not a structured binding: clang 14 cannot capture one
      guarded([&] { entry.second(id, reason); });
  }

  EndpointId add_endpoint(ucp_ep_params_t& params) {
    auto endpoint = std::make_unique<Endpoint>();
    endpoint->impl = this;
    endpoint->id = next_id++;
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = options.detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER  // a dead peer fails the endpoint
                                                  : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb = &Impl::on_endpoint_error;
    params.err_handler.arg = endpoint.get();
    const ucs_status_t status = ucp_ep_create(worker.handle, &params, &endpoint->ep);
    if (status != UCS_OK) fail("ucp_ep_create: {}", ucs_status_string(status));
    const EndpointId id = endpoint->id;
    endpoint_by_handle[endpoint->ep] = id;
    endpoints[id] = std::move(endpoint);
    return id;
  }

  // A peer that connected by worker address: UCX made our side of the connection.
  EndpointId adopt_endpoint(ucp_ep_h ep) {
    auto endpoint = std::make_unique<Endpoint>();
    endpoint->impl = this;
    endpoint->id = next_id++;
    endpoint->ep = ep;
    endpoint->adopted = true;
    const EndpointId id = endpoint->id;
    endpoint_by_handle[ep] = id;
    endpoints[id] = std::move(endpoint);
    spdlog::debug("ucx: endpoint {} opened by a peer connecting by worker address", id);
    return id;
  }

  void close_endpoint(EndpointId id, bool force) {
    auto it = endpoints.find(id);
    if (it == endpoints.end()) return;
    it->second->destroy_rkeys();  // before the endpoint goes
    if (it->second->adopted) {
      endpoint_by_handle.erase(it->second->ep);
      endpoints.erase(it);
      return;
    }
    for (const auto& [am_id, op] : it->second->held)
      finish_send(op, Status::error(fmt::format("UCX endpoint {} closed before it was connected", id)));
    it->second->held.clear();
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(it->second->ep, &params);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) close_requests.push_back(request);
    endpoint_by_handle.erase(it->second->ep);
    retired.push_back(std::move(it->second));
    endpoints.erase(it);
  }

  // UCX 1.13 replays sends queued during a client-server wireup on the final lanes as they were
  // prepared for the first; when those lanes are shared memory (MM_ERROR_HANDLING lets PEER
  // endpoints use it) that aborts the process (proto_am.inl "max_iov > 1") or fails the send
  // ("Invalid am_short_iov length"). So a sockaddr endpoint holds its sends until a flush,
  // which completes only once wireup has, and then starts them in order.
  struct WireGate {  // a pending flush's user data: the endpoint by id, which outlives a closed Endpoint
    Impl* impl;
    EndpointId id;
  };

  void gate_until_wired(EndpointId id) {
    Endpoint* endpoint = endpoints.at(id).get();
    auto gate = std::make_unique<WireGate>(WireGate{this, id});
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = &Impl::on_wired;
    params.user_data = gate.get();
    void* request = ucp_ep_flush_nbx(endpoint->ep, &params);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return;  // wired already, or failing (its error handler says)
    (void)gate.release();  // on_wired frees it
    endpoint->wired = false;
  }

  static void on_wired(void* request, ucs_status_t, void* user_data) {
    const std::unique_ptr<WireGate> gate(static_cast<WireGate*>(user_data));
    ucp_request_free(request);
    // A failed flush (peer gone) also releases the sends: they fail on the endpoint as any would.
    gate->impl->deferred.push_back([impl = gate->impl, id = gate->id] { impl->release_held(id); });
  }

  void release_held(EndpointId id) {
    auto it = endpoints.find(id);
    if (it == endpoints.end() || it->second->wired) return;
    it->second->wired = true;
    auto held = std::move(it->second->held);
    for (const auto& [am_id, op] : held) {
      sends.erase(op);
      start_send(id, am_id, op);
    }
  }

  static void on_connection_request(ucp_conn_request_h request, void* arg) {
    auto* impl = static_cast<Impl*>(arg);
    impl->deferred.push_back([impl, request] {
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
      params.conn_request = request;
      const EndpointId id = impl->add_endpoint(params);
      impl->gate_until_wired(id);
      spdlog::debug("ucx: accepted endpoint {}", id);
    });
  }

  // ---- active messages --------------------------------------------------------

  static ucs_status_t on_active_message(void* arg, const void* header, size_t header_bytes, void* data,
                                        size_t data_bytes, const ucp_am_recv_param_t* param) {
    auto* handlers = static_cast<AmHandlers*>(arg);
    Impl* impl = handlers->impl;
    EndpointId from = 0;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
      auto it = impl->endpoint_by_handle.find(param->reply_ep);
      if (it != impl->endpoint_by_handle.end()) {
        from = it->second;
      } else if (impl->options.accept_address_peers) {
        from = impl->adopt_endpoint(param->reply_ep);
      }
    }
    const auto header_span = std::span(static_cast<const std::byte*>(header), header_bytes);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      // Large payload: the data is a descriptor; fetch it into our buffer once this
      // callback has returned (UCX requires UCS_INPROGRESS first).
      auto* op = new RecvOp{impl, handlers->am_id, from, {header_span.begin(), header_span.end()}, {}};
      impl->deferred.push_back([impl, op, data, data_bytes] { impl->start_rendezvous(op, data, data_bytes); });
      return UCS_INPROGRESS;
    }
    ++impl->messages_received;
    if (!handlers->on_message) return UCS_OK;
    const auto payload = std::span(static_cast<const std::byte*>(data), data_bytes);
    // Persistent (UCP_AM_RECV_ATTR_FLAG_DATA): the handler may keep UCX's buffer; then UCX
    // holds it (UCS_INPROGRESS) until the last owner lets go (ucp_am_data_release).
    EagerDelivery eager{data, data_bytes, handlers->retainable && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0, {}};
    impl->delivering_eager = &eager;
    guarded([&] { handlers->on_message(from, header_span, payload); });
    impl->delivering_eager = nullptr;
    return eager.owner ? UCS_INPROGRESS : UCS_OK;
  }

  void start_rendezvous(RecvOp* op, void* descriptor, size_t bytes) {
    if (bytes > options.max_message_bytes) {
      ucp_am_data_release(worker.handle, descriptor);
      finish_receive(op, Status::error(fmt::format("refused a {}-byte message (limit {})", bytes, options.max_message_bytes)));
      return;
    }
    op->payload = std::make_unique_for_overwrite<std::byte[]>(bytes);
    op->payload_bytes = bytes;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.recv_am = &Impl::on_rendezvous_done;
    params.user_data = op;
    recvs.insert(op);
    void* request = ucp_am_recv_data_nbx(worker.handle, descriptor, op->payload.get(), bytes, &params);
    if (request == nullptr) {
      finish_receive(op, Status::ok());
    } else if (UCS_PTR_IS_ERR(request)) {
      finish_receive(op, ucx_error("ucp_am_recv_data_nbx", UCS_PTR_STATUS(request)));
    }
  }

  static void on_rendezvous_done(void* request, ucs_status_t status, size_t, void* user_data) {
    auto* op = static_cast<RecvOp*>(user_data);
    ucp_request_free(request);
    op->impl->finish_receive(op, status == UCS_OK ? Status::ok() : ucx_error("rendezvous receive", status));
  }

  void finish_receive(RecvOp* op, const Status& status) {
    recvs.erase(op);
    std::unique_ptr<RecvOp> owned(op);
    auto it = handlers.find(op->am_id);
    if (status.is_ok()) {
      ++messages_received;
      ++rndv_received;
      if (it != handlers.end() && it->second->on_message) {
        delivering = op;  // its buffer may be retained during the call (retain_received_payload)
        guarded([&] { it->second->on_message(op->from, op->header, std::span<const std::byte>(op->payload.get(), op->payload_bytes)); });
        delivering = nullptr;
      }
    } else if (it != handlers.end() && it->second->on_error) {
      guarded([&] { it->second->on_error(op->from, op->header, status); });
    } else {
      spdlog::warn("ucx: message on endpoint {} lost: {}", op->from, status.message());
    }
  }

  void start_send(EndpointId id, uint16_t am_id, SendOp* op) {
    auto it = endpoints.find(id);
    if (it == endpoints.end()) {
      finish_send(op, Status::error(fmt::format("UCX endpoint {} is closed or unknown", id)));
      return;
    }
    if (!it->second->wired) {
      sends.insert(op);  // failed at shutdown like any outstanding send
      it->second->held.emplace_back(am_id, op);
      return;
    }
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_REPLY;  // lets the receiver see which endpoint it came on
    const std::span<const std::byte> payload = op->bytes();
    const void* buffer = payload.data();
    size_t count = payload.size(), bytes = payload.size();
    if (!op->iov.empty()) {
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      params.datatype = ucp_dt_make_iov();
      buffer = op->iov.data();
      count = op->iov.size();
      bytes = 0;
      for (const ucp_dt_iov_t& segment : op->iov) bytes += segment.length;
    }
    if (bytes >= options.rndv_min_bytes) params.flags |= UCP_AM_SEND_FLAG_RNDV;
    params.cb.send = &Impl::on_send_done;
    params.user_data = op;
    sends.insert(op);
    finish_request(op, ucp_am_send_nbx(it->second->ep, am_id, op->header.data(), op->header.size(), buffer, count, &params),
                   "ucp_am_send_nbx");
  }

  // ---- one-sided writes --------------------------------------------------------

  // Any thread: true (and `done` told) when the worker is shutting down.
  bool refuse_when_stopping(const SendCallback& done) {
    {
      std::lock_guard lock(mutex);
      if (!stopping) return false;
    }
    if (done) done(Status::error("UCX worker is shutting down"));
    return true;
  }

  // A put or a flush, tracked (and failed at shutdown) as a send with no header or payload.
  SendOp* start_op(EndpointId id, SendCallback done, Endpoint*& endpoint) {
    auto* op = new SendOp{this, {}, {}, {}, std::move(done), {}};
    auto it = endpoints.find(id);
    if (it == endpoints.end() || !it->second->wired) {
      finish_send(op, Status::error(fmt::format("UCX endpoint {} is closed, unknown or not connected yet", id)));
      return nullptr;
    }
    endpoint = it->second.get();
    sends.insert(op);
    return op;
  }

  // A send, put or flush just started: done now (request null), failed, or completing later
  // through its callback.
  void finish_request(SendOp* op, void* request, const char* what) {
    if (request == nullptr) {
      finish_send(op, Status::ok());
    } else if (UCS_PTR_IS_ERR(request)) {
      finish_send(op, ucx_error(what, UCS_PTR_STATUS(request)));
    }
  }

  void start_put(EndpointId id, const std::vector<PutSegment>& segments, const std::string& packed, SendCallback done) {
    Endpoint* endpoint = nullptr;
    SendOp* op = start_op(id, std::move(done), endpoint);
    if (op == nullptr) return;
    auto key = endpoint->rkeys.find(packed);
    if (key == endpoint->rkeys.end()) {
      ucp_rkey_h rkey = nullptr;
      const ucs_status_t status = ucp_ep_rkey_unpack(endpoint->ep, packed.data(), &rkey);
      if (status != UCS_OK) {
        finish_send(op, ucx_error("ucp_ep_rkey_unpack", status));
        return;
      }
      key = endpoint->rkeys.emplace(packed, rkey).first;
    }
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = &Impl::on_put_done;
    params.user_data = op;
    // Completions come from later progress only (never inside ucp_put_nbx), so the count is
    // complete before any of them runs.
    for (const PutSegment& segment : segments) {
      void* request = ucp_put_nbx(endpoint->ep, segment.local.data(), segment.local.size(), segment.remote_address,
                                  key->second, &params);
      if (request == nullptr) continue;
      if (UCS_PTR_IS_ERR(request)) {
        if (op->first_error.is_ok()) op->first_error = ucx_error("ucp_put_nbx", UCS_PTR_STATUS(request));
        break;
      }
      ++op->pending;
    }
    if (op->pending == 0) finish_send(op, op->first_error);
  }

  static void on_put_done(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    ucp_request_free(request);
    if (status != UCS_OK && op->first_error.is_ok()) op->first_error = ucx_error("UCX put", status);
    if (--op->pending == 0) op->impl->finish_send(op, op->first_error);
  }

  void start_flush(EndpointId id, SendCallback done) {
    Endpoint* endpoint = nullptr;
    SendOp* op = start_op(id, std::move(done), endpoint);
    if (op == nullptr) return;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = &Impl::on_send_done;
    params.user_data = op;
    finish_request(op, ucp_ep_flush_nbx(endpoint->ep, &params), "ucp_ep_flush_nbx");
  }

  // Any thread: starts a send now on the progress thread, else posts it there.
  void submit(EndpointId endpoint, uint16_t am_id, SendOp* op) {
    {
      std::lock_guard lock(mutex);
      if (stopping) {
        std::unique_ptr<SendOp> owned(op);
        if (owned->done) owned->done(Status::error("UCX worker is shutting down"));
        return;
      }
    }
    if (std::this_thread::get_id() == thread_id) {
      start_send(endpoint, am_id, op);
      return;
    }
    post([this, endpoint, am_id, op] { start_send(endpoint, am_id, op); });
  }

  static void on_send_done(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    ucp_request_free(request);
    op->impl->finish_send(op, status == UCS_OK ? Status::ok() : ucx_error("UCX send", status));
  }

  void finish_send(SendOp* op, const Status& status) {
    sends.erase(op);
    std::unique_ptr<SendOp> owned(op);
    if (status.is_ok()) {
      ++messages_sent;
    } else {
      ++send_errors;
    }
    if (op->done) guarded([&] { op->done(status); });
  }
};

UcxWorker::UcxWorker(UcxOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  std::promise<void> started;
  auto ready = started.get_future();
  impl_->thread = std::thread([this, &started] {
    impl_->thread_id = std::this_thread::get_id();
    started.set_value();
    impl_->run();
  });
  ready.wait();
}

UcxWorker::~UcxWorker() {
  impl_->post([this] {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  });
  impl_->thread.join();
  impl_->handlers.clear();
  Impl& impl = *impl_;
  // Worker before context (member order), then the requests UCX dropped.
  {
    WorkerHandle& worker = impl.worker;
    ucp_worker_destroy(worker.handle);
    worker.handle = nullptr;
  }
  impl.free_leftovers();
}

uint16_t UcxWorker::listen(const std::string& host, uint16_t port) {
  uint16_t bound = 0;
  impl_->call([&] {
    Impl& impl = *impl_;
    HACK_CHECK(impl.listener == nullptr, "this UCX worker already listens");
    socklen_t length = 0;
    const sockaddr_storage address = resolve(host, port, length);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
    params.sockaddr.addrlen = length;
    params.conn_handler.cb = &Impl::on_connection_request;
    params.conn_handler.arg = &impl;
    ucs_status_t status = ucp_listener_create(impl.worker.handle, &params, &impl.listener);
    if (status != UCS_OK) fail("cannot listen on {}:{}: {}", host, port, ucs_status_string(status));
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    status = ucp_listener_query(impl.listener, &attr);
    if (status != UCS_OK) fail("ucp_listener_query: {}", ucs_status_string(status));
    bound = port_of(attr.sockaddr);
  });
  return bound;
}

EndpointId UcxWorker::connect(const std::string& host, uint16_t port) {
  EndpointId id = 0;
  impl_->call([&] {
    socklen_t length = 0;
    const sockaddr_storage address = resolve(host, port, length);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
    params.sockaddr.addrlen = length;
    id = impl_->add_endpoint(params);
    impl_->gate_until_wired(id);
  });
  return id;
}

const std::string& UcxWorker::address() const { return impl_->address_hex; }

std::string ucx_host_id() {
  std::string id;
  try {
    id = read_file("/proc/sys/kernel/random/boot_id", "kernel boot id");
  } catch (const Error&) {
    return "";
  }
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.empty()) return "";
  for (const char* ns : {"/proc/self/ns/ipc", "/proc/self/ns/pid"}) {
    std::error_code error;
    const std::filesystem::path target = std::filesystem::read_symlink(ns, error);
    if (error || target.empty()) return "";
    id += "|" + target.string();
  }
  return id;
}

bool UcxWorker::cuda_memory() const {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const ucs_status_t status = ucp_context_query(impl_->context.handle, &attr);
  if (status != UCS_OK) fail("ucp_context_query: {}", ucs_status_string(status));
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

std::string UcxWorker::transports(EndpointId endpoint) {
  std::string text;
  impl_->call([&] {
    auto it = impl_->endpoints.find(endpoint);
    // Host:port endpoints are not printed: UCX 1.13's ucp_ep_print_info reads past a heap
    // buffer for them (AddressSanitizer, in ucp_ep_config_lane_info_str).
    if (it == impl_->endpoints.end() || !it->second->by_address) return;
    char* buffer = nullptr;
    size_t bytes = 0;
    FILE* stream = open_memstream(&buffer, &bytes);
    if (stream == nullptr) return;
    ucp_ep_print_info(it->second->ep, stream);
    std::fclose(stream);
    // Keep the lane lines ("lane[0]:  3:sysv/memory.0 md[2] -> ... am am_bw#0 keepalive"),
    // without the comment marks and padding, one per "; ".
    std::string_view all(buffer, bytes);
    while (!all.empty()) {
      const size_t end = std::min(all.find('\n'), all.size());
      std::string_view line = all.substr(0, end);
      all.remove_prefix(std::min(end + 1, all.size()));
      if (line.find("lane[") == std::string_view::npos) continue;
      line.remove_prefix(std::min(line.find("lane["), line.size()));
      std::string compact;
      for (char c : line)
        if (c != ' ' || (!compact.empty() && compact.back() != ' ')) compact += c;
      text += (text.empty() ? "" : "; ") + compact;
    }
    std::free(buffer);
  });
  return text;
}

EndpointId UcxWorker::connect_address(const std::string& hex_address) {
  if (hex_address.empty()) fail("UCX worker address: 0 hex digits (an even, non-zero number expected)");
  const std::vector<uint8_t> address = hex_decode(hex_address, "UCX worker address");
  EndpointId id = 0;
  impl_->call([&] {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    id = impl_->add_endpoint(params);
    impl_->endpoints.at(id)->by_address = true;
  });
  return id;
}

void UcxWorker::close(EndpointId endpoint) {
  impl_->post([impl = impl_.get(), endpoint] { impl->close_endpoint(endpoint, true); });
}

void UcxWorker::set_message_handler(uint16_t am_id, MessageHandler on_message, MessageErrorHandler on_error,
                                    bool retainable) {
  impl_->call([&] {
    Impl& impl = *impl_;
    ucp_am_handler_param_t params{};
    params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                        UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    params.id = am_id;
    params.flags = UCP_AM_FLAG_WHOLE_MSG | (retainable ? static_cast<uint32_t>(UCP_AM_FLAG_PERSISTENT_DATA) : 0u);
    if (!on_message) {
      params.cb = nullptr;
      params.arg = nullptr;
      ucp_worker_set_am_recv_handler(impl.worker.handle, &params);
      impl.handlers.erase(am_id);
      return;
    }
    auto handlers = std::make_unique<Impl::AmHandlers>(
        Impl::AmHandlers{&impl, am_id, std::move(on_message), std::move(on_error), retainable});
    params.cb = &Impl::on_active_message;
    params.arg = handlers.get();
    const ucs_status_t status = ucp_worker_set_am_recv_handler(impl.worker.handle, &params);
    if (status != UCS_OK) fail("ucp_worker_set_am_recv_handler({}): {}", am_id, ucs_status_string(status));
    impl.handlers[am_id] = std::move(handlers);
  });
}

int UcxWorker::add_disconnect_handler(DisconnectHandler handler) {
  int token = 0;
  impl_->call([&] {
    token = impl_->next_token++;
    impl_->disconnect_handlers[token] = std::move(handler);
  });
  return token;
}

void UcxWorker::remove_disconnect_handler(int token) {
  impl_->call([&] { impl_->disconnect_handlers.erase(token); });
}

void UcxWorker::send(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header, std::vector<std::byte> payload,
                     SendCallback done) {
  impl_->submit(endpoint, am_id, new Impl::SendOp{impl_.get(), std::move(header), std::move(payload), {}, std::move(done), {}});
}

void UcxWorker::send_borrowed(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header,
                              std::span<const std::byte> payload, SendCallback done) {
  impl_->submit(endpoint, am_id, new Impl::SendOp{impl_.get(), std::move(header), {}, payload, std::move(done), {}});
}

void UcxWorker::send_gather(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header,
                            std::vector<std::span<const std::byte>> segments, SendCallback done) {
  if (segments.size() == 1) return send_borrowed(endpoint, am_id, std::move(header), segments.front(), std::move(done));
  auto* op = new Impl::SendOp{impl_.get(), std::move(header), {}, {}, std::move(done), {}};
  op->iov.reserve(segments.size());
  for (const auto& segment : segments)
    op->iov.push_back(ucp_dt_iov_t{const_cast<std::byte*>(segment.data()), segment.size()});  // UCX only reads it
  impl_->submit(endpoint, am_id, op);
}

std::shared_ptr<const void> UcxWorker::retain_received_payload(std::span<const std::byte> bytes) {
  if (!on_worker_thread()) return nullptr;
  if (Impl::RecvOp* op = impl_->delivering; op != nullptr) {
    const std::byte* base = op->retained ? op->retained.get() : op->payload.get();
    if (base == nullptr || !lies_within(bytes, std::span<const std::byte>(base, op->payload_bytes))) return nullptr;
    if (!op->retained) op->retained = std::shared_ptr<std::byte[]>(op->payload.release());
    return std::shared_ptr<const void>(op->retained, bytes.data());
  }
  Impl::EagerDelivery* eager = impl_->delivering_eager;
  if (eager == nullptr || !eager->retainable ||
      !lies_within(bytes, std::span<const std::byte>(static_cast<const std::byte*>(eager->data), eager->bytes)))
    return nullptr;
  if (!eager->owner) {
    auto& releases = impl_->releases;
    if (releases->held_bytes + eager->bytes > impl_->options.max_retained_eager_bytes) return nullptr;
    releases->held_bytes += eager->bytes;
    ++impl_->eager_retained;
    eager->owner = std::shared_ptr<const void>(
        eager->data, [releases, bytes = eager->bytes](const void* data) { releases->release(const_cast<void*>(data), bytes); });
  }
  return std::shared_ptr<const void>(eager->owner, bytes.data());
}

RemoteMemory UcxWorker::register_memory(std::span<std::byte> region) {
  HACK_CHECK(impl_->options.rma, "register_memory: this UCX worker was built without UcxOptions::rma");
  HACK_CHECK(!region.empty(), "register_memory: an empty region");
  RemoteMemory out;
  impl_->call([&] {
    Impl& impl = *impl_;
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = region.data();
    params.length = region.size();
    ucp_mem_h memh = nullptr;
    ucs_status_t status = ucp_mem_map(impl.context.handle, &params, &memh);
    if (status != UCS_OK) fail("ucp_mem_map of {} bytes: {}", region.size(), ucs_status_string(status));
    void* packed = nullptr;
    size_t packed_bytes = 0;
    status = ucp_rkey_pack(impl.context.handle, memh, &packed, &packed_bytes);
    if (status != UCS_OK) {
      ucp_mem_unmap(impl.context.handle, memh);
      fail("ucp_rkey_pack: {}", ucs_status_string(status));
    }
    const auto* bytes = static_cast<const std::byte*>(packed);
    out.rkey.assign(bytes, bytes + packed_bytes);
    ucp_rkey_buffer_release(packed);
    out.id = impl.next_registration++;
    out.address = reinterpret_cast<uint64_t>(region.data());
    impl.registrations.emplace(out.id, memh);
  });
  return out;
}

void UcxWorker::unregister_memory(uint64_t id) {
  impl_->call([&] {
    auto it = impl_->registrations.find(id);
    if (it == impl_->registrations.end()) return;
    ucp_mem_unmap(impl_->context.handle, it->second);
    impl_->registrations.erase(it);
  });
}

void UcxWorker::put(EndpointId endpoint, std::vector<PutSegment> segments, std::span<const std::byte> rkey,
                    SendCallback done) {
  if (impl_->refuse_when_stopping(done)) return;
  impl_->post([impl = impl_.get(), endpoint, segments = std::move(segments),
               packed = std::string(reinterpret_cast<const char*>(rkey.data()), rkey.size()),
               done = std::move(done)]() mutable { impl->start_put(endpoint, segments, packed, std::move(done)); });
}

void UcxWorker::flush(EndpointId endpoint, SendCallback done) {
  if (impl_->refuse_when_stopping(done)) return;
  impl_->post([impl = impl_.get(), endpoint, done = std::move(done)]() mutable { impl->start_flush(endpoint, std::move(done)); });
}

void UcxWorker::run_on_worker(const std::function<void()>& fn) { impl_->call(fn); }

bool UcxWorker::on_worker_thread() const { return std::this_thread::get_id() == impl_->thread_id; }

UcxStats UcxWorker::stats() const {
  UcxStats s;
  s.messages_received = impl_->messages_received;
  s.rndv_received = impl_->rndv_received;
  s.messages_sent = impl_->messages_sent;
  s.send_errors = impl_->send_errors;
  s.eager_retained = impl_->eager_retained;
  s.eager_held_bytes = impl_->releases->held_bytes;
  return s;
}

std::string device_kv_path(const UcxWorker& ucx) {
  return ucx.cuda_memory()
             ? "KV pages move between device memory and UCX through host copies; this UCX could send CUDA memory "
               "itself (a cuda transport is loaded), but device-direct sends are not built yet"
             : "KV pages move between device memory and UCX through host copies: this UCX has no CUDA memory "
               "transport (cuda_copy / cuda_ipc)";
}

}  // namespace hack::net
