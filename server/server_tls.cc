// File: server_tls.cc
#include "server/server_tls.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "grpc/grpc.h"

namespace modelstate::server {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// OpenSSL's reason for the last failure, and its error queue emptied.
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return absl::StrCat(" (", text, ")");
}

absl::Status Bad(absl::string_view flag, const std::string& path,
                 absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": ", path, ": ", what));
}

// Every certificate of a PEM bundle: at least one, and nothing that does
// not parse (a truncated copy must not pass as its first half).
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(absl::string_view flag,
                                                       const std::string& path,
                                                       const std::string& pem) {
  ERR_clear_error();
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certificates;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certificates.emplace_back(x);
  }
  const unsigned long end = ERR_peek_last_error();
  // Running out of PEM blocks is the normal end; anything else is damage.
  const bool clean_end = ERR_GET_LIB(end) == ERR_LIB_PEM &&
                         ERR_GET_REASON(end) == PEM_R_NO_START_LINE;
  if (!clean_end) {
    const std::string why = OpenSslError();
    return Bad(flag, path,
               absl::StrCat("certificate ", certificates.size() + 1,
                            " does not parse", why));
  }
  if (certificates.empty()) {
    ERR_clear_error();
    return Bad(flag, path, "holds no PEM certificate");
  }
  ERR_clear_error();
  return certificates;
}

// "CN=..., serial ..., valid until ...": which certificate is in force.
std::string Describe(X509* leaf) {
  char subject[256] = "";
  X509_NAME_oneline(X509_get_subject_name(leaf), subject, sizeof(subject));
  std::string serial = "?";
  if (BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(leaf), nullptr)) {
    if (char* hex = BN_bn2hex(bn)) {
      serial = hex;
      OPENSSL_free(hex);
    }
    BN_free(bn);
  }
  std::string until = "?";
  BioPtr out(BIO_new(BIO_s_mem()));
  if (ASN1_TIME_print(out.get(), X509_get0_notAfter(leaf)) == 1) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    until.assign(data, static_cast<size_t>(n));
  }
  return absl::StrCat("subject ", subject, ", serial ", serial,
                      ", valid until ", until);
}

// Never asks for a pass phrase (the default would prompt on a terminal).
int NoPassphrase(char*, int, int, void*) { return 0; }

// How a reading of the TLS files compares with the set in force, for both
// reloads: a new set to take; or nothing to take, with the error to log
// (each failure once, `last_error` remembering it) or the line that says
// the files read well again.
struct ReloadStep {
  bool take = false;
  std::string error;
  std::string line;
};
ReloadStep Compare(const absl::StatusOr<TlsMaterial>& read,
                   const TlsMaterial& in_force, std::string* last_error) {
  ReloadStep step;
  if (!read.ok()) {
    const std::string error(read.status().message());
    if (error != *last_error) step.error = error;
    *last_error = error;
    return step;
  }
  const bool was_bad = !last_error->empty();
  last_error->clear();
  if (read->cert_chain == in_force.cert_chain &&
      read->private_key == in_force.private_key &&
      read->client_ca == in_force.client_ca) {
    if (was_bad) {
      step.line = absl::StrCat(
          "the TLS files read well again; the set in force is unchanged (",
          in_force.summary, ")");
    }
    return step;
  }
  step.take = true;
  return step;
}

}  // namespace

absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsFiles& files) {
  TlsMaterial material;
  absl::StatusOr<std::string> cert = ReadFile(files.cert);
  if (!cert.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert_file: ", cert.status().message()));
  }
  material.cert_chain = *std::move(cert);
  // Whoever may write the key serves as this server: refused, as at start.
  absl::StatusOr<std::string> key =
      ReadGuardedFile(files.key, &material.key_mode);
  if (!key.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key_file: ", key.status().message()));
  }
  material.private_key = *std::move(key);
  if (!files.client_ca.empty()) {
    // Whoever may write the client CA mints identities.
    absl::StatusOr<std::string> ca = ReadGuardedFile(files.client_ca);
    if (!ca.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", files.client_ca_flag, ": ", ca.status().message()));
    }
    material.client_ca = *std::move(ca);
    if (absl::Status parsed =
            ParseCertificates(files.client_ca_flag, files.client_ca,
                              material.client_ca)
                .status();
        !parsed.ok()) {
      return parsed;
    }
  }
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ParseCertificates("tls_cert_file", files.cert, material.cert_chain);
  if (!chain.ok()) return chain.status();
  ERR_clear_error();
  BioPtr bio = MemoryBio(material.private_key);
  PkeyPtr pkey(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, &NoPassphrase, nullptr));
  if (pkey == nullptr) {
    return Bad(
        "tls_key_file", files.key,
        absl::StrCat("holds no unencrypted PEM private key", OpenSslError()));
  }
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, pkey.get()) != 1) {
    ERR_clear_error();
    return Bad("tls_key_file", files.key,
               absl::StrCat("is not the key of the first certificate in ",
                            files.cert, " (", Describe(leaf), ")"));
  }
  material.summary = Describe(leaf);
  return material;
}

namespace {

// grpc::SslServerCredentials cannot take a certificate config fetcher, so
// the C credentials are made here and added to the server's port the way
// gRPC's own SecureServerCredentials adds them (gRPC 1.51's
// ServerCredentials interface).
class FetchingCredentials final : public grpc::ServerCredentials {
 public:
  explicit FetchingCredentials(grpc_server_credentials* credentials)
      : credentials_(credentials) {}
  ~FetchingCredentials() override {
    grpc_server_credentials_release(credentials_);
  }
  // No metadata processor: callers are authenticated by the handlers.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), credentials_);
  }

  grpc_server_credentials* const credentials_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<ServerTls>> ServerTls::Create(TlsFiles files) {
  absl::StatusOr<TlsMaterial> material = ReadTlsMaterial(files);
  if (!material.ok()) return material.status();
  return std::shared_ptr<ServerTls>(
      new ServerTls(std::move(files), *std::move(material)));
}

ServerTls::ServerTls(TlsFiles files, TlsMaterial material)
    : files_(std::move(files)), material_(std::move(material)) {}

ServerTls::~ServerTls() = default;

std::shared_ptr<grpc::ServerCredentials> ServerTls::Credentials() {
  // Each port's security connector fetches its first config when it is
  // made, and then at each handshake: what it was handed is its own.
  auto fetcher = std::make_unique<Fetcher>();
  fetcher->tls = this;
  Fetcher* raw = fetcher.get();
  {
    MutexLock lock(&mu_);
    fetchers_.push_back(std::move(fetcher));
  }
  const bool mutual = !files_.client_ca.empty();
  grpc_ssl_server_credentials_options* options =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          &ServerTls::Fetch, raw);
  // Takes (and destroys) the options.
  return std::make_shared<FetchingCredentials>(
      grpc_ssl_server_credentials_create_with_options(options));
}

grpc_ssl_certificate_config_reload_status ServerTls::Fetch(
    void* user_data, grpc_ssl_server_certificate_config** config) {
  Fetcher* fetcher = static_cast<Fetcher*>(user_data);
  return fetcher->tls->HandOut(*fetcher, config);
}

grpc_ssl_certificate_config_reload_status ServerTls::HandOut(
    Fetcher& fetcher, grpc_ssl_server_certificate_config** config) {
  MutexLock lock(&mu_);
  if (fetcher.handed == generation_) {
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  }
  grpc_ssl_pem_key_cert_pair pair{material_.private_key.c_str(),
                                  material_.cert_chain.c_str()};
  // gRPC 1.51 asserts that a fetched config has root certificates even
  // when no client certificate is asked for (and then aborts the
  // process), and refuses an empty bundle. Without a client CA the
  // server's own chain stands in: the handshake then never requests a
  // client certificate, so nothing is ever checked against it.
  const std::string& roots =
      material_.client_ca.empty() ? material_.cert_chain : material_.client_ca;
  // Copies the strings.
  *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
  fetcher.handed = generation_;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

std::string ServerTls::Reload() {
  // Read outside the lock: handshakes wait on it.
  absl::StatusOr<TlsMaterial> read = ReadTlsMaterial(files_);
  MutexLock lock(&mu_);
  ReloadStep step = Compare(read, material_, &last_error_);
  if (!step.take) {
    if (step.error.empty()) return step.line;
    return absl::StrCat("kept the TLS certificate in force (",
                        material_.summary, "): ", step.error);
  }
  const bool new_ca = read->client_ca != material_.client_ca;
  material_ = *std::move(read);
  ++generation_;
  std::string line = absl::StrCat(
      "new TLS connections get the certificate ", material_.summary,
      new_ca ? "; client certificates are checked against the new "
               "--tls_client_ca_file"
             : "");
  if ((material_.key_mode & S_IROTH) != 0) {
    absl::StrAppend(&line,
                    absl::StrFormat("; warning: --tls_key_file %s is readable "
                                    "by others (mode %04o)",
                                    files_.key, material_.key_mode));
  }
  return line;
}

std::string ServerTls::summary() const {
  MutexLock lock(&mu_);
  return material_.summary;
}

namespace {

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsOf(
    const TlsMaterial& material) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = material.client_ca;
  ssl.pem_cert_chain = material.cert_chain;
  ssl.pem_private_key = material.private_key;
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerTls>> PeerTls::Create(TlsFiles files) {
  if (files.client_ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", files.client_ca_flag, ": required"));
  }
  absl::StatusOr<TlsMaterial> material = ReadTlsMaterial(files);
  if (!material.ok()) return material.status();
  return std::unique_ptr<PeerTls>(
      new PeerTls(std::move(files), *std::move(material)));
}

PeerTls::PeerTls(TlsFiles files, TlsMaterial material)
    : files_(std::move(files)),
      material_(std::move(material)),
      credentials_(ChannelCredentialsOf(material_)) {}

std::shared_ptr<grpc::ChannelCredentials> PeerTls::Credentials() const {
  MutexLock lock(&mu_);
  return credentials_;
}

std::string PeerTls::Reload(bool* taken) {
  *taken = false;
  absl::StatusOr<TlsMaterial> read = ReadTlsMaterial(files_);
  MutexLock lock(&mu_);
  ReloadStep step = Compare(read, material_, &last_error_);
  if (!step.take) {
    if (step.error.empty()) {
      return step.line.empty()
                 ? ""
                 : absl::StrCat("calls to other replicas: ", step.line);
    }
    return absl::StrCat("calls to other replicas keep the certificate and --",
                        files_.client_ca_flag, " in force (", material_.summary,
                        "): ", step.error);
  }
  const bool new_ca = read->client_ca != material_.client_ca;
  material_ = *std::move(read);
  credentials_ = ChannelCredentialsOf(material_);
  *taken = true;
  return absl::StrCat(
      "new connections to other replicas present the certificate ",
      material_.summary,
      new_ca ? absl::StrCat("; their certificates are checked against the "
                            "new --",
                            files_.client_ca_flag)
             : "");
}

}  // namespace modelstate::server
