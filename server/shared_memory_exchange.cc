#include "server/shared_memory_exchange.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

// A client that connects and then stalls holds the one answering thread up
// to this long.
constexpr absl::Duration kConnectionTimeout = absl::Seconds(2);

std::string Failure(absl::string_view text) {
  return absl::StrCat(std::string(1, '\1'), text);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemoryExchange>>
SharedMemoryExchange::Start(Options options) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string& path = options.socket_path;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm_socket='", path, "': a Unix socket path needs 1 to ",
        sizeof(address.sun_path) - 1, " characters"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  ScopedFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return ErrnoStatus(errno, path, "socket failed");
  unlink(path.c_str());  // a socket left by an earlier run of this server
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&address),
           sizeof(address)) != 0) {
    return ErrnoStatus(errno, path, "bind failed");
  }
  if (chmod(path.c_str(), 0600) != 0 || listen(listener.get(), 64) != 0) {
    const int error = errno;
    unlink(path.c_str());
    return ErrnoStatus(error, path, "listen failed");
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return ErrnoStatus(errno, path, "pipe failed");
  }
  return std::unique_ptr<SharedMemoryExchange>(
      new SharedMemoryExchange(std::move(options), std::move(listener),
                               ScopedFd(pipe_fds[0]), ScopedFd(pipe_fds[1])));
}

SharedMemoryExchange::SharedMemoryExchange(Options options, ScopedFd listener,
                                           ScopedFd wake_read,
                                           ScopedFd wake_write)
    : options_(std::move(options)),
      listener_(std::move(listener)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)) {
  thread_ = std::thread([this] { Serve(); });
}

SharedMemoryExchange::~SharedMemoryExchange() {
  const char stop = 0;
  while (write(wake_write_.get(), &stop, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  unlink(options_.socket_path.c_str());
}

void SharedMemoryExchange::Serve() {
  while (true) {
    // The listener, the stop pipe, then every registration's connection,
    // whose end (the client closed it, or exited) forgets its ring.
    std::vector<pollfd> fds = {{listener_.get(), POLLIN, 0},
                               {wake_read_.get(), POLLIN, 0}};
    std::vector<std::string> tokens;
    {
      MutexLock lock(&mu_);
      for (const auto& [token, registered] : rings_) {
        fds.push_back({registered.connection.get(), POLLIN, 0});
        tokens.push_back(token);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      Log(LogLevel::kError, absl::StrCat("shared memory socket: poll failed: ",
                                         std::strerror(errno)));
      return;
    }
    if (fds[1].revents != 0) return;
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Forget(tokens[i - 2]);
    }
    if (fds[0].revents == 0) continue;
    ScopedFd connection(
        accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (connection.get() < 0) continue;
    const timeval tv = absl::ToTimeval(kConnectionTimeout);
    setsockopt(connection.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(connection.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    Answer(std::move(connection));
  }
}

void SharedMemoryExchange::Answer(ScopedFd connection) {
  char request[1 + 4 + 4] = {};
  ScopedFd fd;
  absl::StatusOr<size_t> n = ReceiveWithFd(connection.get(), request, 1, &fd);
  if (!n.ok() || *n == 0) return;  // a client checking the socket is there
  if (request[0] != kRegisterRing) {
    SendWithFd(connection.get(),
               Failure("unknown request: 'R' registers a ring"), -1)
        .IgnoreError();
    return;
  }
  n = ReceiveWithFd(connection.get(), request + 1, 8, &fd);
  if (!n.ok() || *n != 8) {
    SendWithFd(connection.get(),
               Failure("'R' takes slots and slot bytes, 4 bytes each"), -1)
        .IgnoreError();
    return;
  }
  Register(DecodeU32(request + 1), DecodeU32(request + 5), std::move(fd),
           std::move(connection));
}

void SharedMemoryExchange::Register(uint32_t slots, uint32_t slot_bytes,
                                    ScopedFd fd, ScopedFd connection) {
  auto refuse = [&](absl::string_view why) {
    SendWithFd(connection.get(), Failure(why), -1).IgnoreError();
  };
  if (fd.get() < 0) return refuse("'R' must carry the ring's memfd");
  const uint64_t bytes = kRingHeaderBytes + uint64_t{slots} * slot_bytes;
  // Why the server takes no ring of `bytes` more ("" when it does).
  auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::string {
    if (rings_.size() < options_.max_rings &&
        ring_bytes_ + bytes <= options_.max_ring_bytes) {
      return "";
    }
    return absl::StrCat("the server holds ", rings_.size(), " rings of ",
                        ring_bytes_, " bytes already (at most ",
                        options_.max_rings, " and ", options_.max_ring_bytes,
                        " bytes); use gRPC messages");
  };
  // Refused before the ring is mapped: mapping faults in all of it.
  {
    MutexLock lock(&mu_);
    if (std::string why = full(); !why.empty()) return refuse(why);
  }
  absl::StatusOr<std::unique_ptr<SharedRing>> ring =
      SharedRing::Adopt(std::move(fd), slots, slot_bytes);
  if (!ring.ok()) return refuse(ring.status().message());
  std::string token(kRingTokenBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(token.data()),
                 static_cast<int>(token.size())) != 1) {
    return refuse("no random bytes for a token");
  }
  // Unknown (another PID namespace, an old kernel): the ring's slots only.
  absl::StatusOr<std::unique_ptr<PeerMemory>> peer =
      options_.direct_writes ? PeerMemory::OfConnection(connection.get())
                             : absl::UnavailableError("direct writes are off");
  MutexLock lock(&mu_);
  if (std::string why = full(); !why.empty()) return refuse(why);
  // Answered before the ring is kept: a client that cannot read the
  // answer has no token to use it with.
  if (!SendWithFd(connection.get(), absl::StrCat(std::string(1, '\0'), token),
                  -1)
           .ok()) {
    return;
  }
  ring_bytes_ += bytes;
  rings_[token] = {
      *std::move(ring),
      peer.ok() ? std::shared_ptr<const PeerMemory>(*std::move(peer)) : nullptr,
      std::move(connection), bytes, false};
}

void SharedMemoryExchange::Forget(const std::string& token) {
  MutexLock lock(&mu_);
  auto it = rings_.find(token);
  if (it == rings_.end()) return;
  ring_bytes_ -= it->second.bytes;
  // A call holding the ring keeps its mapping until it ends.
  rings_.erase(it);
  given_back_.SignalAll();  // a call waiting for it learns it is gone
}

absl::StatusOr<SharedMemoryExchange::Lease> SharedMemoryExchange::Lend(
    absl::string_view token, absl::string_view field, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  MutexLock lock(&mu_);
  auto it = rings_.find(token);
  while (it != rings_.end() && it->second.lent) {
    const bool timed_out = given_back_.WaitWithDeadline(&mu_, deadline);
    // Looked up again: the registration may have ended meanwhile.
    it = rings_.find(token);
    if (timed_out) break;
  }
  if (it == rings_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ": no ring is registered under this token (a ring lasts as long as "
        "the connection that registered it): register the ring again"));
  }
  if (it->second.lent) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": another call is using this ring"));
  }
  it->second.lent = true;
  return Lease(this, it->first, it->second.ring, it->second.peer);
}

void SharedMemoryExchange::GiveBack(const std::string& token) {
  MutexLock lock(&mu_);
  auto it = rings_.find(token);
  if (it != rings_.end()) it->second.lent = false;
  given_back_.SignalAll();
}

SharedMemoryExchange::Lease::~Lease() {
  if (exchange_ != nullptr) exchange_->GiveBack(token_);
}

}  // namespace modelstate
