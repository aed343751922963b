#ifndef MATERIALIZER_SERVER_SERVICE_TEST_CERTIFICATES_H_
#define MATERIALIZER_SERVER_SERVICE_TEST_CERTIFICATES_H_

// Keys and certificates made in memory for tests (EC P-256, OpenSSL).
//
//   TestIdentity ca = MakeTestCa("test-ca");
//   TestIdentity server = MakeTestCertificate("server", ca);
//   // server.cert_pem, server.key_pem; SANs localhost and 127.0.0.1
//
// Thread-compatible; testonly.

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace materializer::service {

struct TestIdentity {
  std::string key_pem;
  std::string cert_pem;
};

// A self-signed CA certificate named `common_name`, valid for a day.
TestIdentity MakeTestCa(absl::string_view common_name);

// A certificate for `common_name` (SANs DNS:localhost, IP:127.0.0.1)
// signed by `ca`, valid from an hour ago until `valid_for` from now
// (negative: expired).
TestIdentity MakeTestCertificate(absl::string_view common_name,
                                 const TestIdentity& ca,
                                 absl::Duration valid_for = absl::Hours(24));

}  // namespace materializer::service

#endif  // MATERIALIZER_SERVER_SERVICE_TEST_CERTIFICATES_H_
