#include "client/targets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/common/status_macros.h"

namespace materializer::client {
namespace {

// gRPC's URI schemes for targets (a "host:port" item never contains one).
bool HasScheme(absl::string_view target) {
  for (absl::string_view scheme :
       {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(target, scheme)) return true;
  }
  return absl::StrContains(target, "://");
}

struct HostPort {
  std::string host;  // without brackets
  std::string port;
};

absl::StatusOr<HostPort> ParseHostPort(absl::string_view item) {
  const size_t colon = item.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(item.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address \"", item,
                     "\" is not host:port (e.g. 127.0.0.1:50051, [::1]:50051, "
                     "materializer.ml.svc.cluster.local:50051)"));
  }
  absl::string_view host = item.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return HostPort{std::string(host), std::string(item.substr(colon + 1))};
}

bool IsIpAddress(const std::string& host) {
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

// The addresses of `host`: IPv4 ones if it has any, else IPv6 ones.
absl::StatusOr<std::vector<std::string>> LookUp(const HostPort& hp) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(hp.host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot look up ", hp.host, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (const addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
      v4.push_back(absl::StrCat(text, ":", hp.port));
    } else if (ai->ai_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
      v6.push_back(absl::StrCat("[", text, "]:", hp.port));
    }
  }
  freeaddrinfo(result);
  std::vector<std::string>& chosen = v4.empty() ? v6 : v4;
  if (chosen.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot look up ", hp.host, ": it has no address"));
  }
  return chosen;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> SplitTarget(absl::string_view target) {
  target = absl::StripAsciiWhitespace(target);
  if (target.empty()) {
    return absl::InvalidArgumentError("the server address is empty");
  }
  if (HasScheme(target)) return std::vector<std::string>{std::string(target)};
  std::vector<std::string> items;
  for (absl::string_view item : absl::StrSplit(target, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("server address \"", target, "\" has an empty item"));
    }
    RETURN_IF_ERROR(ParseHostPort(item).status());
    items.emplace_back(item);
  }
  return items;
}

absl::StatusOr<Resolved> ResolveTarget(absl::string_view target) {
  ASSIGN_OR_RETURN(const std::vector<std::string> items, SplitTarget(target));
  Resolved resolved;
  auto add = [&resolved](Endpoint endpoint) {
    if (std::find(resolved.endpoints.begin(), resolved.endpoints.end(),
                  endpoint) == resolved.endpoints.end()) {
      resolved.endpoints.push_back(std::move(endpoint));
    }
  };
  for (const std::string& item : items) {
    if (HasScheme(item)) {
      add(Endpoint{item, ""});
      continue;
    }
    ASSIGN_OR_RETURN(const HostPort hp, ParseHostPort(item));
    if (IsIpAddress(hp.host)) {
      add(Endpoint{item, ""});
      continue;
    }
    absl::StatusOr<std::vector<std::string>> addresses = LookUp(hp);
    if (!addresses.ok()) {
      resolved.failures.push_back(addresses.status());
      continue;
    }
    for (std::string& address : *addresses) {
      add(Endpoint{std::move(address), hp.host});
    }
  }
  return resolved;
}

}  // namespace materializer::client
