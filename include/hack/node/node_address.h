/// @file node_address.h
/// @brief Where a node listens, as the router's pools and the prefill node's decode peers
/// name it ("host:port").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hack::server {

/// Where a node listens.
struct NodeAddress {
  std::string name;  ///< unique in its pool; used in logs, metrics and exclude sets
  std::string host;
  uint16_t port = 0;
  std::string ucx_address;  ///< decode nodes: "host:port" of the UCX listener prefill connects to
  std::string ucx_worker;   ///< decode nodes: UCX worker address, for a prefill node on the same host
  std::string host_id;      ///< decode nodes: where ucx_worker is usable (ucx_host_id())
  std::string kv_format;    ///< as the node's /health last reported it ("" = unknown)
};

/// Parses "host:port" (the last ':' splits, so "[::1]:80"-style hosts keep theirs; the name
/// is the text as given). `what` labels errors: "--decode '10.0.0.1': expected host:port".
NodeAddress parse_node_address(std::string_view host_port, std::string_view what);

}  // namespace hack::server
