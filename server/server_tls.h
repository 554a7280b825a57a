// File: server_tls.h
// The server's TLS material, re-read while it serves: cert-manager (or any
// rotation) replaces a Kubernetes Secret's files in place, and the server
// must present the new certificate, and trust a new client CA, without a
// restart that would drop every stream. A cluster replica's calls to the
// other replicas follow the same files (PeerTls), and its calls to etcd
// follow the --etcd_* files, re-read with them (EtcdTls).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::shared_ptr<ServerTls> tls,
//       ServerTls::Create({"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"}));
//   builder.AddListeningPort("0.0.0.0:50051", tls->Credentials());
//   ...  // build and start the grpc::Server
//   // Every minute and on SIGHUP (Server does both):
//   if (std::string line = tls->Reload(); !line.empty()) LogLine(line);
//
//   // The calls to other replicas:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::unique_ptr<PeerTls> peers,
//       PeerTls::Create({"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt",
//                        "cluster_ca_file"}));
//   router->set_peer_credentials(peers->Credentials());
//   bool taken = false;
//   std::string line = peers->Reload(&taken);  // with tls->Reload()
//   if (taken) router->set_peer_credentials(peers->Credentials());
#ifndef MODELSTATE_SERVER_SERVER_TLS_H_
#define MODELSTATE_SERVER_SERVER_TLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "cluster/etcd_client.h"
#include "grpc/grpc_security.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace modelstate::server {

struct TlsFiles {
  std::string cert;       // certificate chain (PEM), leaf first
  std::string key;        // its private key (PEM)
  std::string client_ca;  // "": no client certificates asked for
  // The flags that name the files, for errors (PeerTls's CA is
  // --cluster_ca_file, EtcdTls's files the --etcd_* ones).
  std::string client_ca_flag = "tls_client_ca_file";
  std::string cert_flag = "tls_cert_file";
  std::string key_flag = "tls_key_file";
};

// One reading of the three files, checked: the chain parses, the key
// parses and is the leaf's, the client CA holds a certificate. The key and
// the client CA are refused when group or others may write them. `cert`
// and `key` both "" read the CA alone (TLS to etcd without a client
// certificate); ServerTls and PeerTls always have them.
struct TlsMaterial {
  std::string cert_chain;
  std::string private_key;
  std::string client_ca;
  // Of the leaf, for the log: "CN=..., serial ..., valid until ...".
  std::string summary;
  // The key's mode, for the warning about a key others may read.
  uint32_t key_mode = 0;
};
absl::StatusOr<TlsMaterial> ReadTlsMaterial(const TlsFiles& files);

// How a reading of the TLS files compares with the set in force, for every
// reload (ServerTls's, PeerTls's, EtcdTls's): a new set to take; or
// nothing to take, with the error to log (each failure once, `last_error`
// remembering it) or the line that says the files read well again.
struct TlsReloadStep {
  bool take = false;
  std::string error;
  std::string line;
};
TlsReloadStep CompareTlsMaterial(const absl::StatusOr<TlsMaterial>& read,
                                 const TlsMaterial& in_force,
                                 std::string* last_error);

// Serves the material in force to gRPC, which asks for it at each TLS
// handshake (the SSL credentials' certificate config fetcher): a
// connection made after a reload sees the new certificate and CA, one made
// before keeps its session. A reload that finds a bad file (unreadable,
// unparsable, a key not the certificate's, a key or CA others may write)
// keeps the material in force, so TLS never goes down and never falls back
// to anything weaker.
class ServerTls {
 public:
  // Refuses (INVALID_ARGUMENT naming the flag) what ReadTlsMaterial does.
  static absl::StatusOr<std::shared_ptr<ServerTls>> Create(TlsFiles files);
  ~ServerTls();

  // Credentials for one listening port. gRPC calls back into this object
  // at each handshake: it must outlive the grpc::Server they are given to.
  std::shared_ptr<grpc::ServerCredentials> Credentials();

  // Re-reads the files. A line for the log when something happened (a new
  // certificate in force, or a bad file kept out), "" when they are as in
  // force. A bad file is reported once until it changes, so that a
  // periodic check does not repeat it every interval.
  std::string Reload();

  // The leaf certificate in force (TlsMaterial::summary).
  std::string summary() const;

 private:
  explicit ServerTls(TlsFiles files, TlsMaterial material);
  // grpc_ssl_server_certificate_config_callback.
  static grpc_ssl_certificate_config_reload_status Fetch(
      void* self, grpc_ssl_server_certificate_config** config);

  // What one port's security connector was handed.
  struct Fetcher {
    ServerTls* tls = nullptr;
    uint64_t handed = 0;
  };
  // Fetch's work: the material in force, if `fetcher` has not had it yet.
  grpc_ssl_certificate_config_reload_status HandOut(
      Fetcher& fetcher, grpc_ssl_server_certificate_config** config);

  const TlsFiles files_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Fetcher>> fetchers_ ABSL_GUARDED_BY(mu_);
  TlsMaterial material_ ABSL_GUARDED_BY(mu_);
  // Bumped by each reload that changes the material; a connector is handed
  // a new config when the one it has is older.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  // The last bad reading reported, so that it is not reported again.
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// The other side of the calls between replicas: the certificate a replica
// presents when it calls another (the listening one's files) and the CA it
// checks the other's certificate against (--cluster_ca_file), re-read with
// the listening side's so that a rotated certificate or CA reaches these
// calls too. TlsFiles::client_ca is that CA, required; the checks and the
// keeping of a bad set are ServerTls's.
//
// gRPC 1.51's SSL channel credentials are fixed when made, and the
// experimental TLS ones take either fixed material or gRPC's file watcher
// (which reads the files without these checks): so each reload that takes
// a new set makes new credentials, and the caller makes new channels with
// them (ClusterRouter::set_peer_credentials). Thread-safe.
class PeerTls {
 public:
  static absl::StatusOr<std::unique_ptr<PeerTls>> Create(TlsFiles files);

  // The credentials of the set in force (a new object after each reload
  // that took a new set).
  std::shared_ptr<grpc::ChannelCredentials> Credentials() const;

  // Re-reads the files: as ServerTls::Reload. `*taken` tells whether a new
  // set is in force (then Credentials() is new).
  std::string Reload(bool* taken);

 private:
  PeerTls(TlsFiles files, TlsMaterial material);

  const TlsFiles files_;
  mutable Mutex mu_;
  TlsMaterial material_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::ChannelCredentials> credentials_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// The files a replica reaches etcd with: --etcd_ca_file, --etcd_cert_file,
// --etcd_key_file and --etcd_password_file, re-read with the server's TLS
// files, so that a rotated client certificate, a rolled etcd CA or a new
// password reach etcd without a restart (which would drop the replica
// from the cluster once etcd refused the old ones). Read and checked as
// ServerTls's (ReadTlsMaterial, CompareTlsMaterial); the password as a
// guarded file. A set with one bad file is kept out whole, and said once.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       std::shared_ptr<EtcdTls> etcd,
//       EtcdTls::Create({"/etcd/ca.crt", "/etcd/tls.crt", "/etcd/tls.key",
//                        "/etcd/password"}));
//   options.etcd.ca_pem = etcd->Credentials().ca_pem;  // ...
//   bool taken = false;
//   std::string line = etcd->Reload(&taken);  // with tls->Reload()
//   if (taken) client.SetCredentials(etcd->Credentials());
struct EtcdFiles {
  std::string ca;    // "": plaintext to etcd
  std::string cert;  // "": no client certificate (then no key)
  std::string key;
  std::string password;  // "": no password
};

// Thread-safe.
class EtcdTls {
 public:
  // INVALID_ARGUMENT naming the flag for what ReadTlsMaterial refuses, a
  // password file others may write, a certificate without its key (or
  // the other way round), or one without a CA.
  static absl::StatusOr<std::shared_ptr<EtcdTls>> Create(EtcdFiles files);

  // The set in force.
  EtcdCredentials Credentials() const;
  // Warnings for the log about the set in force: a key or password that
  // others may read.
  std::vector<std::string> Warnings() const;

  // Re-reads the files: as PeerTls::Reload. `*taken` tells whether a new
  // set is in force (then Credentials() is new).
  std::string Reload(bool* taken);

 private:
  struct Set {
    TlsMaterial tls;  // empty without --etcd_ca_file
    std::string password;
    uint32_t password_mode = 0;
  };
  EtcdTls(EtcdFiles files, Set set)
      : files_(std::move(files)), set_(std::move(set)) {}
  absl::StatusOr<Set> Read() const;
  std::vector<std::string> WarningsOf(const Set& set) const;

  const EtcdFiles files_;
  mutable Mutex mu_;
  Set set_ ABSL_GUARDED_BY(mu_);
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_SERVER_TLS_H_
