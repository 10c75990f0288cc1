#include "hack/node/node_address.h"

#include <algorithm>
#include <string>

#include "hack/core/error.h"

namespace hack::server {

NodeAddress parse_node_address(std::string_view host_port, std::string_view what) {
  const size_t colon = host_port.rfind(':');
  const std::string_view port_text = colon == std::string_view::npos ? "" : host_port.substr(colon + 1);
  HACK_CHECK(colon != std::string_view::npos && colon > 0 && !port_text.empty() && port_text.size() <= 5 &&
                 std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }),
             "{} '{}': expected host:port", what, host_port);
  const int port = std::stoi(std::string(port_text));
  HACK_CHECK(port > 0 && port < 65536, "{} '{}': port out of range", what, host_port);
  return NodeAddress{std::string(host_port), std::string(host_port.substr(0, colon)), static_cast<uint16_t>(port), ""};
}

}  // namespace hack::server
