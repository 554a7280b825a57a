// File: shared_memory_exchange.h
// The server's half of the same-host shared-memory path: a Unix-domain
// socket where clients on this host register their rings (base/
// shared_memory.h), and the rings themselves, lent to one call at a time
// by token. The socket only swaps descriptors for tokens: a token travels
// inside a gRPC call, which the service authorises and audits as any
// other, so the socket itself needs no credentials (it is made mode 0600,
// in the data directory: clients of the server's own user). A ring lasts
// as long as the connection that registered it: a client that closes it,
// or exits, takes its ring away. At most `max_rings` rings of
// `max_ring_bytes` in all are kept; a registration beyond is refused (the
// client then uses gRPC messages).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto exchange,
//                               SharedMemoryExchange::Start({"data/shm.sock"}));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       SharedMemoryExchange::Lease lease,
//       exchange->Lend(request.shared_memory_ring(), "shared_memory_ring"));
//   char* first_slot = lease.ring().slot(0);
#ifndef MODELSTATE_SERVER_SHARED_MEMORY_EXCHANGE_H_
#define MODELSTATE_SERVER_SHARED_MEMORY_EXCHANGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/shared_memory.h"
#include "base/sync.h"

namespace modelstate {

class SharedMemoryExchange {
 public:
  struct Options {
    std::string socket_path;
    size_t max_rings = 64;
    uint64_t max_ring_bytes = uint64_t{1} << 30;
    // Whether a lease names the registering process (Lease::peer), so that
    // a call may write into its memory.
    bool direct_writes = true;
  };

  // Binds the socket (replacing a stale one at the path) and starts
  // answering on it.
  static absl::StatusOr<std::unique_ptr<SharedMemoryExchange>> Start(
      Options options);
  // Stops answering and removes the socket.
  ~SharedMemoryExchange();
  SharedMemoryExchange(const SharedMemoryExchange&) = delete;
  SharedMemoryExchange& operator=(const SharedMemoryExchange&) = delete;

  const std::string& socket_path() const { return options_.socket_path; }

  // A registered ring, lent to one call until destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : exchange_(std::exchange(other.exchange_, nullptr)),
          token_(std::move(other.token_)),
          ring_(std::move(other.ring_)),
          peer_(std::move(other.peer_)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    SharedRing& ring() const { return *ring_; }
    // The process that registered the ring, for direct writes; null when
    // the kernel did not name it.
    const PeerMemory* peer() const { return peer_.get(); }

   private:
    friend class SharedMemoryExchange;
    Lease(SharedMemoryExchange* exchange, std::string token,
          std::shared_ptr<SharedRing> ring,
          std::shared_ptr<const PeerMemory> peer)
        : exchange_(exchange),
          token_(std::move(token)),
          ring_(std::move(ring)),
          peer_(std::move(peer)) {}
    SharedMemoryExchange* exchange_;
    std::string token_;
    std::shared_ptr<SharedRing> ring_;
    std::shared_ptr<const PeerMemory> peer_;
  };
  // The ring registered under `token`: INVALID_ARGUMENT naming `field` for
  // a token unknown (or whose registration ended: register again),
  // FAILED_PRECONDITION if another call still holds it after `wait`. Only
  // the registering client knows the token, so a ring still lent is
  // almost always that client's previous call, cancelled and not yet
  // unwound on this side: the client's next call waits for it rather
  // than failing.
  absl::StatusOr<Lease> Lend(absl::string_view token, absl::string_view field,
                             absl::Duration wait = absl::Seconds(2));

 private:
  struct Registered {
    std::shared_ptr<SharedRing> ring;
    std::shared_ptr<const PeerMemory> peer;  // null: unknown
    ScopedFd connection;  // the registration's: its end forgets the ring
    uint64_t bytes = 0;
    bool lent = false;
  };

  SharedMemoryExchange(Options options, ScopedFd listener, ScopedFd wake_read,
                       ScopedFd wake_write);
  // Accepts registrations and watches their connections.
  void Serve();
  // One connection's request; a registration keeps the connection.
  void Answer(ScopedFd connection);
  void Register(uint32_t slots, uint32_t slot_bytes, ScopedFd fd,
                ScopedFd connection);
  void Forget(const std::string& token);
  void GiveBack(const std::string& token);

  const Options options_;
  const ScopedFd listener_;
  const ScopedFd wake_read_;  // readable once the destructor runs
  const ScopedFd wake_write_;
  std::thread thread_;

  Mutex mu_;
  absl::flat_hash_map<std::string, Registered> rings_ ABSL_GUARDED_BY(mu_);
  CondVar given_back_;  // a lease ended
  uint64_t ring_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVER_SHARED_MEMORY_EXCHANGE_H_
