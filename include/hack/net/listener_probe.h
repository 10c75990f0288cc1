/// @file listener_probe.h
/// @brief Whether a UcxWorker's own listener really takes connections: the worker dials its
/// listen address, sends one active message carrying a random nonce over that endpoint, and
/// waits for its own handler to receive it. A passed probe means the whole path a peer uses
/// works (listen socket, connection request, wire-up, AM delivery); a decode node reports
/// itself ready (NodeHealth::ready) only after one, so routers never hand prefill nodes a
/// UCX address that resets their connects.
#pragma once

#include <cstdint>
#include <string>

#include "hack/core/error.h"
#include "hack/net/ucx_worker.h"

namespace hack::net {

/// AM id of the probe message (a worker handles it only during listener_probe()).
inline constexpr uint16_t kListenerProbeAmId = 12;

/// The address to dial for a listener bound to `bind_host` (a wildcard is dialled on loopback;
/// a node that advertises another address to its peers should dial that one instead).
std::string probe_host(const std::string& bind_host);

/// Dials host:port from `worker` (which must be the one listening there), sends the probe
/// and waits up to timeout_s for it to arrive. ok, or why not (connect failed, timed out).
/// The probe endpoint is closed either way. Not reentrant: one probe per worker at a time.
Status listener_probe(UcxWorker& worker, const std::string& host, uint16_t port, double timeout_s);

}  // namespace hack::net
