/// @file ucx_worker.h
/// @brief A UCX (ucp) context + worker driven by its own progress thread: listen on
/// host:port, connect to host:port or to a peer's worker address, send active messages
/// (rendezvous for large payloads), and receive them through per-id handlers. UCX types stay
/// in the .cpp.
///
/// Threading: every ucp call happens on the progress thread. listen/connect/close/send and
/// the handler setters may be called from any thread; they post work to the progress
/// thread (sends are queued and never block on the network). Handlers run on the
/// progress thread and must not block; they may call send().
///
/// Transports: UCX chooses them from its own environment, read when the worker is built:
///   UCX_TLS=tcp                       TCP only (any two hosts)
///   UCX_TLS=posix,sysv,cma,self,tcp   shared memory enabled; tcp must stay in the list,
///                                     the sockaddr connection manager needs it on the
///                                     device it resolved (UCX 1.13 refuses "lo is not
///                                     enabled" otherwise). Only connect_address() puts
///                                     data on shared memory (hack-prefill uses it for a
///                                     decode node on its host): a host:port (sockaddr)
///                                     connection keeps its lanes on tcp in UCX 1.13
///   UCX_TLS unset                     UCX's default: RDMA verbs (rc, ud, dc) where present
///   UCX_NET_DEVICES=eth0 | mlx5_0:1   which NIC(s) to use
/// UcxOptions::config sets the same variables (name without the UCX_ prefix) for one
/// worker and takes precedence over the environment; tests use it to pin transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hack/core/error.h"

namespace hack::net {

/// Names one connection of one UcxWorker (ids are never reused within a worker).
using EndpointId = uint64_t;

struct UcxOptions {
  /// UCX configuration overrides, e.g. {"TLS", "tcp"}, {"RNDV_THRESH", "64K"}.
  std::vector<std::pair<std::string, std::string>> config;
  /// Seconds a synchronous call (listen, connect, handler setters) waits for the progress
  /// thread before throwing.
  double call_timeout_s = 30.0;
  /// Largest payload accepted by rendezvous; a bigger one is refused (message error).
  size_t max_message_bytes = size_t{1} << 31;
  /// Payloads of at least this many bytes are always sent by rendezvous (the receiver
  /// fetches them into its own buffer), whatever UCX's own threshold says; below it UCX
  /// decides. Large KV pages then never pass through bounce buffers.
  size_t rndv_min_bytes = size_t{1} << 20;
  /// Endpoints fail when their peer goes (UCP_ERR_HANDLING_MODE_PEER), which every node needs.
  /// UCX 1.13 offers shared memory to such endpoints only when its mm transports are told to
  /// advertise peer-failure handling (MM_ERROR_HANDLING=y; they then find a dead peer by
  /// keepalive), so with this set the worker sets MM_ERROR_HANDLING=y and KEEPALIVE_INTERVAL=1s
  /// unless `config` or the environment (UCX_...) says otherwise. Its rendezvous then runs
  /// over sysv/posix active messages: cma is refused to PEER endpoints (no memory
  /// invalidation). false (mode NONE) lets cma carry rendezvous data too, for measurement
  /// only: a lost peer may then go unnoticed.
  bool detect_peer_failure = true;
  /// Gives a peer that connected by worker address (connect_address) an EndpointId on its first
  /// message, so replies reach it. Off by default: the nodes are reached only through their
  /// listener, and a message whose endpoint we do not know (one we closed) stays anonymous.
  bool accept_address_peers = false;
  /// Most bytes of eager payloads kept in UCX's memory at once (retain_received_payload): a
  /// bound on what a slow consumer pins in UCX's receive buffers; past it handlers copy.
  size_t max_retained_eager_bytes = size_t{256} << 20;
  /// Enables one-sided writes (UCP_FEATURE_RMA): register_memory, put, flush. Off by default:
  /// the nodes move KV by active messages, and RMA lanes change what UCX wires up.
  bool rma = false;
};

/// Memory a worker registered for peers' writes (UcxWorker::register_memory).
struct RemoteMemory {
  uint64_t id = 0;              ///< for unregister_memory
  uint64_t address = 0;         ///< where the region starts, in the registering process
  std::vector<std::byte> rkey;  ///< the packed remote key a peer passes to put
};

/// Which processes can reach this one over shared memory: the kernel's boot id and this
/// process's IPC and PID namespaces (sysv/posix segments need the first, cma the second),
/// e.g. "3f1c…|ipc:[4026531839]|pid:[4026531836]". Two processes with equal ids are on one
/// host and may connect by worker address to let UCX use shared memory; containers with
/// their own namespaces differ and keep to host:port. "" where /proc cannot tell.
std::string ucx_host_id();

/// Whether `part` lies wholly inside `whole` (what a retained payload's owner may alias).
inline bool lies_within(std::span<const std::byte> part, std::span<const std::byte> whole) {
  return part.data() >= whole.data() && part.size() <= whole.size() &&
         static_cast<size_t>(part.data() - whole.data()) <= whole.size() - part.size();
}

/// Counters for tests and metrics (read from any thread).
struct UcxStats {
  uint64_t messages_received = 0;
  uint64_t rndv_received = 0;      ///< of those, payloads that arrived by rendezvous
  uint64_t eager_retained = 0;     ///< eager payloads a handler kept in UCX's memory (retain_received_payload)
  uint64_t eager_held_bytes = 0;   ///< bytes of those not yet released
  uint64_t messages_sent = 0;      ///< sends that completed successfully
  uint64_t send_errors = 0;
};

class UcxWorker {
 public:
  /// from: the endpoint it came on; header/payload are valid only during the call.
  using MessageHandler = std::function<void(EndpointId from, std::span<const std::byte> header,
                                            std::span<const std::byte> payload)>;
  /// A message whose payload could not be received (e.g. a failed rendezvous).
  using MessageErrorHandler = std::function<void(EndpointId from, std::span<const std::byte> header,
                                                 const Status& error)>;
  /// An endpoint failed (peer gone, connection refused, reset). Called once per endpoint.
  using DisconnectHandler = std::function<void(EndpointId, const Status& reason)>;
  /// Completion of one send: ok once UCX no longer needs the payload (delivered to the
  /// transport, not necessarily to the peer's handler), or the error.
  using SendCallback = std::function<void(const Status&)>;

  /// Builds the context and worker and starts the progress thread. Throws hack::Error.
  explicit UcxWorker(UcxOptions options = {});
  /// Closes every endpoint (outstanding sends complete with an error), stops the thread.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  /// Listens on host:port (port 0: an ephemeral port) and returns the bound port.
  /// Accepted connections become endpoints. One listener per worker.
  uint16_t listen(const std::string& host, uint16_t port);
  /// Starts connecting to host:port. Failure to connect arrives as a disconnect.
  EndpointId connect(const std::string& host, uint16_t port);
  /// This worker's UCX address (ucp_worker_get_address) as lowercase hex, what a peer passes
  /// to connect_address(). It lists every transport the worker enabled: a peer on the same
  /// host reaches it over shared memory when both enabled posix/sysv/cma, else over tcp or
  /// RDMA. A few hundred bytes; valid for this worker's lifetime only.
  const std::string& address() const;
  /// Starts connecting to a worker address (hex, from address()). UCX picks the lanes from
  /// both sides' transports, shared memory included. Throws hack::Error for a malformed or
  /// unusable address; a peer that is gone arrives as a disconnect.
  ///
  /// The peer sees no connection request: its endpoint for us appears, unnamed by UCX, with
  /// our first message; a peer with accept_address_peers gives it an EndpointId then (replies
  /// work). It has no error handler, so the peer is not told when we go (its own timeouts
  /// cover that).
  EndpointId connect_address(const std::string& hex_address);
  /// UCX's lanes of an endpoint, from ucp_ep_print_info, "; "-separated, each naming its
  /// transport/device and uses, e.g. "lane[0]: 3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255]
  /// am am_bw#0 keepalive"; empty for an unknown endpoint and for any endpoint not opened by
  /// connect_address (UCX 1.13's ucp_ep_print_info reads past a buffer for host:port ones).
  /// An endpoint opened by worker address has its lanes at once.
  std::string transports(EndpointId endpoint);
  /// Whether this UCX can send from and receive into CUDA device memory (a transport such as
  /// cuda_copy or cuda_ipc is loaded: ucp_context_query's memory types). Debian's UCX has none,
  /// so a node on --device cuda stages its KV pages through host memory (device_kv_path).
  bool cuda_memory() const;
  /// Closes an endpoint without waiting (pending sends fail); no disconnect callback.
  void close(EndpointId endpoint);

  /// Sets (or with an empty function clears) the handlers of active-message id `am_id`.
  /// Returns once the progress thread has installed them. `retainable`: UCX keeps eager
  /// payloads of this id alive past the handler on request (UCP_AM_FLAG_PERSISTENT_DATA), so
  /// retain_received_payload works for them too.
  void set_message_handler(uint16_t am_id, MessageHandler on_message, MessageErrorHandler on_error = {},
                           bool retainable = false);
  /// Adds a disconnect handler; returns a token for remove_disconnect_handler. After
  /// remove returns, the handler is never called again.
  int add_disconnect_handler(DisconnectHandler handler);
  void remove_disconnect_handler(int token);

  /// Queues one active message. `header` is at most a few hundred bytes; `payload` is any
  /// size (UCX switches to rendezvous above its threshold). `done` runs on the progress
  /// thread (an unknown or failed endpoint completes it with an error).
  void send(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header, std::vector<std::byte> payload,
            SendCallback done = {});
  /// Same, but UCX reads the payload from the caller's memory (no copy here): `payload` must
  /// stay valid and unchanged until `done` has run.
  void send_borrowed(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header,
                     std::span<const std::byte> payload, SendCallback done);

  /// Same, with the payload gathered from `segments` in order (UCP_DATATYPE_IOV): UCX reads
  /// each from the caller's memory, which must stay valid and unchanged until `done` has run.
  void send_gather(EndpointId endpoint, uint16_t am_id, std::vector<std::byte> header,
                   std::vector<std::span<const std::byte>> segments, SendCallback done);

  /// From a message handler: keeps the memory `bytes` lies in (all or part of the payload
  /// being delivered) valid after the handler returns, for as long as the returned owner (or
  /// a copy) lives, so the bytes are used without copying them. Works for rendezvous payloads
  /// (our receive buffer, shared by every owner of the message) and, on a retainable handler,
  /// for eager ones (UCX's memory, released on the progress thread once the last owner goes;
  /// owners must go before the worker). Null for any other span, outside a handler, or when
  /// eager payloads already hold max_retained_eager_bytes: then the caller copies.
  std::shared_ptr<const void> retain_received_payload(std::span<const std::byte> bytes);

  // ---- one-sided writes (UcxOptions::rma) ----
  /// Registers `region` of this process's memory so that peers may write into it
  /// (ucp_mem_map); it must stay allocated until unregister_memory. Throws hack::Error.
  RemoteMemory register_memory(std::span<std::byte> region);
  void unregister_memory(uint64_t id);
  /// One write of a put: `local` bytes to the peer's `remote_address`.
  struct PutSegment {
    std::span<const std::byte> local;
    uint64_t remote_address = 0;
  };
  /// Writes each segment into the peer's registered memory (inside one region, whose packed
  /// key is `rkey`), in one call of the progress thread. `done` runs there once UCX no longer
  /// needs any segment's bytes (which must stay valid and unchanged until then), with the
  /// first error if one failed — not when the peer can see the bytes: flush says that.
  void put(EndpointId endpoint, std::vector<PutSegment> segments, std::span<const std::byte> rkey, SendCallback done);
  /// `done` runs once every put issued on the endpoint before it is complete at the peer
  /// (ucp_ep_flush_nbx); a message sent after that point finds the bytes in place.
  void flush(EndpointId endpoint, SendCallback done);

  /// Runs fn on the progress thread (now, if called from it) and waits for it.
  void run_on_worker(const std::function<void()>& fn);
  bool on_worker_thread() const;
  UcxStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What a node on --device cuda logs at start: how its KV pages move between device memory
/// and UCX (today always through host copies; whether this UCX could move device memory itself).
std::string device_kv_path(const UcxWorker& ucx);

}  // namespace hack::net
