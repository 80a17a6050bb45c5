#include "common/tls/tls_gen.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <memory>

#include "common/base/file_util.h"
#include "common/tls/tls_stream.h"

namespace trellis {
namespace {

struct Free {
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using X509Ptr = std::unique_ptr<X509, Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;

bool AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

StatusOr<X509Ptr> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                           EVP_PKEY* issuer_key, bool ca, const std::string& dns) {
  X509Ptr cert(X509_new());
  unsigned char serial[16];
  if (!cert || RAND_bytes(serial, sizeof serial) != 1) return InternalError(OpenSslErrors());
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  bool ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  ok = ok && X509_set_version(cert.get(), 2) == 1 &&
       X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) != nullptr &&
       X509_gmtime_adj(X509_getm_notAfter(cert.get()), 30L * 24 * 3600) != nullptr &&
       X509_set_pubkey(cert.get(), key) == 1;
  X509_NAME* name = X509_get_subject_name(cert.get());
  ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                        reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                        -1, 0) == 1;
  X509* iss = issuer != nullptr ? issuer : cert.get();
  ok = ok && X509_set_issuer_name(cert.get(), X509_get_subject_name(iss)) == 1;
  if (ca) {
    ok = ok && AddExt(cert.get(), iss, NID_basic_constraints, "critical,CA:TRUE") &&
         AddExt(cert.get(), iss, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         AddExt(cert.get(), iss, NID_subject_key_identifier, "hash");
  } else {
    ok = ok && AddExt(cert.get(), iss, NID_basic_constraints, "critical,CA:FALSE") &&
         AddExt(cert.get(), iss, NID_key_usage, "critical,digitalSignature") &&
         AddExt(cert.get(), iss, NID_ext_key_usage, "serverAuth,clientAuth") &&
         AddExt(cert.get(), iss, NID_subject_alt_name, ("DNS:" + dns).c_str()) &&
         AddExt(cert.get(), iss, NID_authority_key_identifier, "keyid");
  }
  ok = ok && X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0;
  if (!ok) return InternalError("making a certificate: " + OpenSslErrors());
  return cert;
}

template <typename F>
StatusOr<std::string> Pem(F write) {
  std::unique_ptr<BIO, Free> bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return InternalError("PEM: " + OpenSslErrors());
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

StatusOr<TlsFiles> WriteJobCertificates(const std::string& dir, const std::string& server_name) {
  KeyPtr ca_key(EVP_EC_gen("P-256"));
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!ca_key || !key) return InternalError("EC key generation: " + OpenSslErrors());
  TRELLIS_ASSIGN_OR_RETURN(X509Ptr ca, MakeCert(ca_key.get(), "trellis job CA", nullptr,
                                                ca_key.get(), true, ""));
  TRELLIS_ASSIGN_OR_RETURN(X509Ptr leaf, MakeCert(key.get(), server_name, ca.get(), ca_key.get(),
                                                  false, server_name));
  TRELLIS_ASSIGN_OR_RETURN(std::string ca_pem,
                           Pem([&](BIO* b) { return PEM_write_bio_X509(b, ca.get()); }));
  TRELLIS_ASSIGN_OR_RETURN(std::string cert_pem,
                           Pem([&](BIO* b) { return PEM_write_bio_X509(b, leaf.get()); }));
  TRELLIS_ASSIGN_OR_RETURN(std::string key_pem, Pem([&](BIO* b) {
                             return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0,
                                                             nullptr, nullptr);
                           }));
  TlsFiles f;
  f.ca_file = dir + "/ca.crt";
  f.cert_file = dir + "/tls.crt";
  f.key_file = dir + "/tls.key";
  f.server_name = server_name;
  TRELLIS_RETURN_IF_ERROR(WriteFileAtomic(f.ca_file, ca_pem));
  TRELLIS_RETURN_IF_ERROR(WriteFileAtomic(f.cert_file, cert_pem));
  // Created private (0600) before a byte of the key is in it.
  ::unlink(f.key_file.c_str());
  int fd = ::open(f.key_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return UnavailableError(f.key_file + ": " + std::strerror(errno));
  ssize_t n = ::write(fd, key_pem.data(), key_pem.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(key_pem.size())) return UnavailableError(f.key_file + ": write failed");
  return f;
}

}  // namespace trellis
