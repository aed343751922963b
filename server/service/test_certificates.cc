#include "server/service/test_certificates.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace materializer::service {
namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "test certificates: " << what << " failed\n";
    std::abort();
  }
}

std::string Pem(int (*write)(BIO*, void*), void* object) {
  BIO* out = BIO_new(BIO_s_mem());
  Require(out != nullptr && write(out, object) == 1, "PEM write");
  char* data = nullptr;
  const long size = BIO_get_mem_data(out, &data);
  std::string pem(data, static_cast<size_t>(size));
  BIO_free(out);
  return pem;
}

int WriteCert(BIO* out, void* cert) {
  return PEM_write_bio_X509(out, static_cast<X509*>(cert));
}

int WriteKey(BIO* out, void* key) {
  return PEM_write_bio_PrivateKey(out, static_cast<EVP_PKEY*>(key), nullptr,
                                  nullptr, 0, nullptr, nullptr);
}

EVP_PKEY* ReadKey(const std::string& pem) {
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  Require(key != nullptr, "reading the CA key");
  return key;
}

X509* ReadCert(const std::string& pem) {
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  Require(cert != nullptr, "reading the CA certificate");
  return cert;
}

void AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension =
      X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  Require(extension != nullptr && X509_add_ext(cert, extension, -1) == 1,
          "adding an extension");
  X509_EXTENSION_free(extension);
}

// Serial numbers differ between certificates of one test binary.
long NextSerial() {
  static long serial = 1000;
  return ++serial;
}

// A certificate for `common_name` with a fresh key, signed by
// `issuer_key` (self-signed when `issuer` is null).
TestIdentity Make(absl::string_view common_name, X509* issuer,
                  EVP_PKEY* issuer_key, bool is_ca, absl::Duration valid_for) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  Require(key != nullptr, "EVP_EC_gen");
  X509* cert = X509_new();
  Require(cert != nullptr, "X509_new");
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), NextSerial());
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert),
                  static_cast<long>(absl::ToInt64Seconds(valid_for)));
  X509_set_pubkey(cert, key);
  const std::string name(common_name);
  X509_NAME_add_entry_by_txt(
      X509_get_subject_name(cert), "CN", MBSTRING_ASC,
      reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert;
  X509_set_issuer_name(cert, X509_get_subject_name(signer));
  if (is_ca) {
    AddExtension(cert, signer, NID_basic_constraints, "critical,CA:TRUE");
    AddExtension(cert, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    AddExtension(cert, signer, NID_basic_constraints, "CA:FALSE");
    AddExtension(cert, signer, NID_subject_alt_name,
                 "DNS:localhost,IP:127.0.0.1");
  }
  Require(X509_sign(cert, issuer_key != nullptr ? issuer_key : key,
                    EVP_sha256()) > 0,
          "X509_sign");
  TestIdentity identity{Pem(WriteKey, key), Pem(WriteCert, cert)};
  X509_free(cert);
  EVP_PKEY_free(key);
  return identity;
}

}  // namespace

TestIdentity MakeTestCa(absl::string_view common_name) {
  return Make(common_name, nullptr, nullptr, true, absl::Hours(24));
}

TestIdentity MakeTestCertificate(absl::string_view common_name,
                                 const TestIdentity& ca,
                                 absl::Duration valid_for) {
  X509* issuer = ReadCert(ca.cert_pem);
  EVP_PKEY* issuer_key = ReadKey(ca.key_pem);
  TestIdentity identity =
      Make(common_name, issuer, issuer_key, false, valid_for);
  EVP_PKEY_free(issuer_key);
  X509_free(issuer);
  return identity;
}

}  // namespace materializer::service
