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

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

}  // namespace

absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsFiles& files) {
  TlsMaterial material;
  const bool certificate = !files.cert.empty() || !files.key.empty();
  if (certificate) {
    absl::StatusOr<std::string> cert = ReadFile(files.cert);
    if (!cert.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", files.cert_flag, ": ", cert.status().message()));
    }
    material.cert_chain = *std::move(cert);
    // Whoever may write the key serves as this server: refused, as at
    // start.
    absl::StatusOr<std::string> key =
        ReadGuardedFile(files.key, &material.key_mode);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", files.key_flag, ": ", key.status().message()));
    }
    material.private_key = *std::move(key);
  }
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
  if (!certificate) {
    material.summary = "no client certificate";
    return material;
  }
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ParseCertificates(files.cert_flag, files.cert, material.cert_chain);
  if (!chain.ok()) return chain.status();
  ERR_clear_error();
  BioPtr bio = MemoryBio(material.private_key);
  PkeyPtr pkey(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, &NoPassphrase, nullptr));
  if (pkey == nullptr) {
    return Bad(
        files.key_flag, files.key,
        absl::StrCat("holds no unencrypted PEM private key", OpenSslError()));
  }
  X509* leaf = chain->front().get();
  if (X509_check_private_key(leaf, pkey.get()) != 1) {
    ERR_clear_error();
    return Bad(files.key_flag, files.key,
               absl::StrCat("is not the key of the first certificate in ",
                            files.cert, " (", Describe(leaf), ")"));
  }
  material.summary = Describe(leaf);
  return material;
}

TlsReloadStep CompareTlsMaterial(const absl::StatusOr<TlsMaterial>& read,
                                 const TlsMaterial& in_force,
                                 std::string* last_error) {
  TlsReloadStep step;
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
  TlsReloadStep step = CompareTlsMaterial(read, material_, &last_error_);
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
  TlsReloadStep step = CompareTlsMaterial(read, material_, &last_error_);
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

absl::StatusOr<std::shared_ptr<EtcdTls>> EtcdTls::Create(EtcdFiles files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_cert_file and --etcd_key_file: give both or neither");
  }
  if (!files.cert.empty() && files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--etcd_cert_file: a client certificate for etcd needs "
        "--etcd_ca_file (TLS to etcd)");
  }
  auto tls = std::shared_ptr<EtcdTls>(new EtcdTls(std::move(files), Set()));
  absl::StatusOr<Set> set = tls->Read();
  if (!set.ok()) return set.status();
  MutexLock lock(&tls->mu_);
  tls->set_ = *std::move(set);
  return tls;
}

absl::StatusOr<EtcdTls::Set> EtcdTls::Read() const {
  Set set;
  // Guarded as the server's own: whoever may write the key chooses the
  // identity this replica shows etcd, whoever may write the CA the etcd
  // it believes, and so the membership and placement it reads and writes.
  if (!files_.ca.empty()) {
    TlsFiles tls{files_.cert, files_.key, files_.ca};
    tls.client_ca_flag = "etcd_ca_file";
    tls.cert_flag = "etcd_cert_file";
    tls.key_flag = "etcd_key_file";
    absl::StatusOr<TlsMaterial> material = ReadTlsMaterial(tls);
    if (!material.ok()) return material.status();
    set.tls = *std::move(material);
  }
  if (!files_.password.empty()) {
    // Whoever may write it picks the etcd user this replica logs in as.
    absl::StatusOr<std::string> password =
        ReadGuardedFile(files_.password, &set.password_mode);
    if (!password.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--etcd_password_file: ", password.status().message()));
    }
    set.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  return set;
}

EtcdCredentials EtcdTls::Credentials() const {
  MutexLock lock(&mu_);
  return {set_.tls.client_ca, set_.tls.cert_chain, set_.tls.private_key,
          set_.password};
}

std::vector<std::string> EtcdTls::WarningsOf(const Set& set) const {
  std::vector<std::string> warnings;
  auto readable = [&](absl::string_view flag, const std::string& path,
                      uint32_t mode) {
    if ((mode & S_IROTH) == 0) return;
    warnings.push_back(absl::StrFormat(
        "warning: --%s %s is readable by others (mode %04o); chmod o-r it "
        "(or a Secret's defaultMode 0440)",
        flag, path, mode));
  };
  if (!set.tls.private_key.empty()) {
    readable("etcd_key_file", files_.key, set.tls.key_mode);
  }
  if (!files_.password.empty()) {
    readable("etcd_password_file", files_.password, set.password_mode);
  }
  return warnings;
}

std::vector<std::string> EtcdTls::Warnings() const {
  MutexLock lock(&mu_);
  return WarningsOf(set_);
}

std::string EtcdTls::Reload(bool* taken) {
  *taken = false;
  absl::StatusOr<Set> read = Read();
  MutexLock lock(&mu_);
  // The TLS files compared as the other reloads' are; a bad password file
  // keeps the whole set out as a bad TLS file does.
  const absl::StatusOr<TlsMaterial> tls =
      read.ok() ? absl::StatusOr<TlsMaterial>(read->tls)
                : absl::StatusOr<TlsMaterial>(read.status());
  const TlsReloadStep step = CompareTlsMaterial(tls, set_.tls, &last_error_);
  if (!read.ok()) {
    if (step.error.empty()) return "";
    return absl::StrCat(
        "calls to etcd keep the credentials in force",
        files_.ca.empty() ? "" : absl::StrCat(" (", set_.tls.summary, ")"),
        ": ", step.error);
  }
  const bool new_password = read->password != set_.password;
  if (!step.take && !new_password) {
    if (step.line.empty()) return "";
    return files_.ca.empty()
               ? "calls to etcd: --etcd_password_file reads well again; the "
                 "password in force is unchanged"
               : absl::StrCat("calls to etcd: ", step.line);
  }
  const bool new_certificate = read->tls.cert_chain != set_.tls.cert_chain ||
                               read->tls.private_key != set_.tls.private_key;
  const bool new_ca = read->tls.client_ca != set_.tls.client_ca;
  set_ = *std::move(read);
  *taken = true;
  std::vector<std::string> what;
  if (new_certificate && !set_.tls.cert_chain.empty()) {
    what.push_back(absl::StrCat("present the certificate ", set_.tls.summary));
  }
  if (new_ca) {
    what.push_back("check etcd's certificate against the new --etcd_ca_file");
  }
  if (new_password) {
    what.push_back("log in with the new --etcd_password_file (a new token)");
  }
  std::string line =
      absl::StrCat("new connections to etcd ", absl::StrJoin(what, " and "));
  for (const std::string& warning : WarningsOf(set_)) {
    absl::StrAppend(&line, "; ", warning);
  }
  return line;
}

}  // namespace modelstate::server
