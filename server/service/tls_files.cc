#include "server/service/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace materializer::service {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

BioPtr ReadOnlyBio(absl::string_view data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// OpenSSL's reason for the last failure on this thread ("bad base64
// decode"), and the thread's error queue emptied.
std::string TakeOpenSslReason() {
  const unsigned long error = ERR_peek_last_error();
  const char* reason = error != 0 ? ERR_reason_error_string(error) : nullptr;
  ERR_clear_error();
  return reason != nullptr ? reason : "unknown error";
}

// True when the last failure is only the end of the PEM input.
bool AtEndOfPem() {
  const unsigned long error = ERR_peek_last_error();
  return ERR_GET_LIB(error) == ERR_LIB_PEM &&
         ERR_GET_REASON(error) == PEM_R_NO_START_LINE;
}

// Every certificate in `pem`, in order; INVALID_ARGUMENT when one does not
// parse or there is none. `what` names the file's role for messages.
absl::StatusOr<std::vector<X509Ptr>> ReadCertificates(absl::string_view pem,
                                                      absl::string_view what) {
  ERR_clear_error();
  BioPtr bio = ReadOnlyBio(pem);
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf");
  std::vector<X509Ptr> certs;
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    certs.push_back(std::move(cert));
  }
  if (!AtEndOfPem()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": certificate ", certs.size() + 1,
                     " does not parse (", TakeOpenSslReason(), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no PEM certificate in it"));
  }
  return certs;
}

std::string SubjectOf(X509* cert) {
  BioPtr out(BIO_new(BIO_s_mem()));
  if (out == nullptr ||
      X509_NAME_print_ex(out.get(), X509_get_subject_name(cert), 0,
                         XN_FLAG_RFC2253) < 0) {
    return "(unprintable subject)";
  }
  char* data = nullptr;
  const long size = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<absl::Time> NotAfter(X509* cert) {
  std::tm tm = {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "the certificate's expiry date does not parse");
  }
  return absl::FromTimeT(timegm(&tm));
}

}  // namespace

absl::StatusOr<CertificateSummary> CheckKeyPair(
    absl::string_view cert_chain_pem, absl::string_view private_key_pem,
    absl::Time now) {
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ReadCertificates(cert_chain_pem, "certificate chain");
  if (!chain.ok()) return chain.status();
  X509* leaf = chain->front().get();

  ERR_clear_error();
  BioPtr key_bio = ReadOnlyBio(private_key_pem);
  if (key_bio == nullptr) {
    return absl::ResourceExhaustedError("BIO_new_mem_buf");
  }
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr,
                                     const_cast<char*>("")));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "private key: no PEM private key parses (", TakeOpenSslReason(),
        "); an encrypted key is not supported"));
  }
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "the private key does not belong to the certificate (the first "
        "certificate of the chain); replace both together");
  }

  CertificateSummary summary;
  summary.subject = SubjectOf(leaf);
  summary.chain_length = static_cast<int>(chain->size());
  absl::StatusOr<absl::Time> not_after = NotAfter(leaf);
  if (!not_after.ok()) return not_after.status();
  summary.not_after = *not_after;
  if (summary.not_after <= now) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate (", summary.subject, ") expired at ",
                     absl::FormatTime(absl::RFC3339_sec, summary.not_after,
                                      absl::UTCTimeZone())));
  }
  return summary;
}

absl::StatusOr<int> CheckCaBundle(absl::string_view pem) {
  absl::StatusOr<std::vector<X509Ptr>> certs =
      ReadCertificates(pem, "CA bundle");
  if (!certs.ok()) return certs.status();
  return static_cast<int>(certs->size());
}

}  // namespace materializer::service
