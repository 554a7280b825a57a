#include "base/shared_memory.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

constexpr int kSizeSeals = F_SEAL_GROW | F_SEAL_SHRINK;

absl::Status SocketError(int error, absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("shared memory socket: ", what, ": ", std::strerror(error)));
}

// The exchange's answer: 0 and `ok_bytes` more, or 1 and an error text.
absl::StatusOr<std::string> ReadAnswer(int socket, size_t ok_bytes,
                                       ScopedFd* fd) {
  char code = 0;
  MODELSTATE_ASSIGN_OR_RETURN(size_t n, ReceiveWithFd(socket, &code, 1, fd));
  if (n == 0) {
    return absl::UnavailableError(
        "shared memory socket: the server closed the connection unanswered");
  }
  if (code != 0) {
    std::string text(4096, '\0');
    ScopedFd ignored;
    MODELSTATE_ASSIGN_OR_RETURN(
        size_t got, ReceiveWithFd(socket, text.data(), text.size(), &ignored));
    text.resize(got);
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory socket: ", text));
  }
  std::string body(ok_bytes, '\0');
  MODELSTATE_ASSIGN_OR_RETURN(
      size_t got, ReceiveWithFd(socket, body.data(), body.size(), fd));
  if (got != ok_bytes) {
    return absl::UnavailableError(
        "shared memory socket: the server's answer was cut short");
  }
  return body;
}

}  // namespace

MappedRegion::~MappedRegion() {
  if (size_ > 0) munmap(data_, size_);
}

MappedRegion::MappedRegion(MappedRegion&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    if (size_ > 0) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

namespace {

absl::Status CheckRingShape(uint32_t slots, uint64_t slot_bytes) {
  if (slots < kMinRingSlots || slots > kMaxRingSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring: ", slots, " slots; from ", kMinRingSlots, " to ",
                     kMaxRingSlots, " may be used"));
  }
  if (slot_bytes == 0 || slot_bytes % 4096 != 0 ||
      slot_bytes > kMaxRingSlotBytes || slots * slot_bytes > kMaxRingBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: slots of ", slot_bytes,
        " bytes; they must be a multiple of 4096, at most ", kMaxRingSlotBytes,
        ", and at most ", kMaxRingBytes, " bytes in all"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MappedRegion> MapShared(int fd, uint64_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED && errno == EPERM) {
    return absl::InvalidArgumentError(
        "ring: the memfd must not be sealed against writes (both sides "
        "write the ring)");
  }
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ring: mapping ", size, " bytes failed: ", std::strerror(errno)));
  }
  return MappedRegion(p, size);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRing>> SharedRing::Create(
    uint32_t slots, uint64_t slot_bytes) {
  MODELSTATE_RETURN_IF_ERROR(CheckRingShape(slots, slot_bytes));
  const uint64_t size = kRingHeaderBytes + slots * slot_bytes;
  ScopedFd fd(memfd_create("modelstate-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ring: memfd_create failed: ", std::strerror(errno)));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS, kSizeSeals) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ring: sizing and sealing the memfd failed: ", std::strerror(errno)));
  }
  MODELSTATE_ASSIGN_OR_RETURN(MappedRegion region, MapShared(fd.get(), size));
  return std::unique_ptr<SharedRing>(
      new SharedRing(std::move(fd), std::move(region), slots, slot_bytes));
}

absl::StatusOr<std::unique_ptr<SharedRing>> SharedRing::Adopt(
    ScopedFd fd, uint32_t slots, uint64_t slot_bytes) {
  MODELSTATE_RETURN_IF_ERROR(CheckRingShape(slots, slot_bytes));
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "ring: the descriptor is not a memfd (it has no seals)");
  }
  if ((static_cast<unsigned>(seals) & kSizeSeals) != kSizeSeals) {
    return absl::InvalidArgumentError(
        "ring: the memfd must be sealed against growing and shrinking "
        "(F_SEAL_GROW | F_SEAL_SHRINK)");
  }
  const uint64_t size = kRingHeaderBytes + slots * slot_bytes;
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring: the memfd must hold 4096 + slots * slot_bytes = ", size,
        " bytes"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(MappedRegion region, MapShared(fd.get(), size));
  return std::unique_ptr<SharedRing>(
      new SharedRing(std::move(fd), std::move(region), slots, slot_bytes));
}

uint64_t SharedRing::consumed() const {
  // Little endian on every host this runs on (x86-64, aarch64).
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(region_.data()),
                         __ATOMIC_ACQUIRE);
}

void SharedRing::set_consumed(uint64_t count) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(region_.data()), count,
                   __ATOMIC_RELEASE);
}

bool SharedRing::WaitForSlot(uint64_t chunk, absl::Duration timeout,
                             absl::FunctionRef<bool()> cancelled) const {
  if (consumed() + slots_ > chunk) return true;
  const absl::Time deadline = absl::Now() + timeout;
  // A slot frees up within a chunk's copy (a millisecond for 8 MiB): short
  // sleeps, not a futex, keep both processes simple.
  while (consumed() + slots_ <= chunk) {
    if (absl::Now() >= deadline || cancelled()) return false;
    absl::SleepFor(absl::Microseconds(20));
  }
  return true;
}

namespace {
// The header page: `consumed` at 0, the direct table's answer at 8.
constexpr size_t kDirectTableOffset = 8;
}  // namespace

uint64_t SharedRing::direct_table() const {
  return __atomic_load_n(
      reinterpret_cast<const uint64_t*>(region_.data() + kDirectTableOffset),
      __ATOMIC_ACQUIRE);
}

void SharedRing::ResetDirectTable() {
  __atomic_store_n(
      reinterpret_cast<uint64_t*>(region_.data() + kDirectTableOffset), 0,
      __ATOMIC_RELEASE);
}

void SharedRing::DeclineDirectTable() {
  __atomic_store_n(
      reinterpret_cast<uint64_t*>(region_.data() + kDirectTableOffset),
      kDirectTableDeclined, __ATOMIC_RELEASE);
}

bool SharedRing::OfferDirectTable(const std::vector<DirectTarget>& targets) {
  if (targets.empty() ||
      targets.size() > uint64_t{slots_} * slot_bytes_ / sizeof(DirectTarget)) {
    DeclineDirectTable();
    return false;
  }
  char* out = region_.data() + kRingHeaderBytes;
  for (const DirectTarget& target : targets) {
    // Little endian, as `consumed`.
    std::memcpy(out, &target.address, 8);
    std::memcpy(out + 8, &target.length, 8);
    out += sizeof(DirectTarget);
  }
  __atomic_store_n(
      reinterpret_cast<uint64_t*>(region_.data() + kDirectTableOffset),
      uint64_t{targets.size()}, __ATOMIC_RELEASE);
  return true;
}

absl::StatusOr<std::optional<std::vector<DirectTarget>>>
SharedRing::AwaitDirectTable(absl::Duration timeout,
                             absl::FunctionRef<bool()> cancelled,
                             absl::string_view field) const {
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t count = direct_table();
  while (count == 0) {
    if (cancelled()) return absl::CancelledError("client cancelled");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(field, ": the client wrote no direct table within ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Microseconds(20));
    count = direct_table();
  }
  if (count == kDirectTableDeclined) return std::nullopt;
  const uint64_t room = uint64_t{slots_} * slot_bytes_ / sizeof(DirectTarget);
  if (count > room) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a direct table of ", count,
                     " entries; the ring's slots hold at most ", room));
  }
  std::vector<DirectTarget> targets(count);
  const char* in = region_.data() + kRingHeaderBytes;
  for (DirectTarget& target : targets) {
    std::memcpy(&target.address, in, 8);
    std::memcpy(&target.length, in + 8, 8);
    in += sizeof(DirectTarget);
  }
  return targets;
}

absl::StatusOr<std::unique_ptr<PeerMemory>> PeerMemory::OfConnection(
    int socket) {
  ucred credentials{};
  socklen_t size = sizeof(credentials);
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
    return SocketError(errno, "SO_PEERCRED");
  }
  if (credentials.pid <= 0) {
    return absl::UnavailableError(
        "shared memory socket: the peer's process is not visible here");
  }
  // A pidfd pins the identity: once the peer exits it turns readable, so a
  // recycled pid is never written to.
  ScopedFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, credentials.pid, 0)));
  if (pidfd.get() < 0) return SocketError(errno, "pidfd_open");
  auto peer = std::unique_ptr<PeerMemory>(
      new PeerMemory(credentials.pid, std::move(pidfd)));
  // The pid was read when the peer connected; it is still that process if
  // it has not exited since (checked after the pidfd was opened).
  pollfd hangup{socket, POLLRDHUP, 0};
  if (poll(&hangup, 1, 0) > 0 && (hangup.revents & (POLLRDHUP | POLLHUP))) {
    return absl::UnavailableError("shared memory socket: the peer went away");
  }
  MODELSTATE_RETURN_IF_ERROR(peer->CheckAlive());
  return peer;
}

absl::Status PeerMemory::CheckAlive() const {
  pollfd exited{pidfd_.get(), POLLIN, 0};
  if (poll(&exited, 1, 0) != 0) {
    return absl::UnavailableError("the client's process exited");
  }
  return absl::OkStatus();
}

absl::Status PeerMemory::Failure(int error, absl::string_view what) const {
  switch (error) {
    case EPERM:
    case ENOSYS:
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": this process may not write the client's memory: ",
          std::strerror(error)));
    case ESRCH:
      return absl::UnavailableError("the client's process exited");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": not the client's memory: ", std::strerror(error)));
  }
}

absl::Status PeerMemory::Probe(uint64_t address) const {
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{reinterpret_cast<void*>(address), 1};
  if (process_vm_readv(pid_, &local, 1, &remote, 1, 0) != 1) {
    return Failure(errno, "direct table");
  }
  return absl::OkStatus();
}

absl::Status PeerMemory::Write(absl::string_view bytes,
                               uint64_t address) const {
  while (!bytes.empty()) {
    iovec local{const_cast<char*>(bytes.data()), bytes.size()};
    iovec remote{reinterpret_cast<void*>(address), bytes.size()};
    const ssize_t n = process_vm_writev(pid_, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Failure(errno, "direct table");
    }
    // A partial write stops at a page the peer does not have.
    if (n == 0) return Failure(EFAULT, "direct table");
    bytes.remove_prefix(static_cast<size_t>(n));
    address += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<RingRegistration> RegisterRing(const std::string& socket_path,
                                              const SharedRing& ring) {
  RingRegistration registration;
  MODELSTATE_ASSIGN_OR_RETURN(
      registration.connection,
      ConnectUnixSocket(socket_path, absl::Seconds(10)));
  MODELSTATE_RETURN_IF_ERROR(SendWithFd(
      registration.connection.get(),
      absl::StrCat(std::string(1, kRegisterRing), EncodeU32(ring.slots()),
                   EncodeU32(static_cast<uint32_t>(ring.slot_bytes()))),
      ring.fd()));
  ScopedFd ignored;
  MODELSTATE_ASSIGN_OR_RETURN(
      registration.token,
      ReadAnswer(registration.connection.get(), kRingTokenBytes, &ignored));
  return registration;
}

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

absl::Status SendWithFd(int socket, absl::string_view bytes, int fd) {
  size_t done = 0;
  while (done < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data()) + done, bytes.size() - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (done == 0 && fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }
    const ssize_t n = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SocketError(errno, "send failed");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> ReceiveWithFd(int socket, char* out, size_t size,
                                     ScopedFd* fd) {
  size_t done = 0;
  while (done < size) {
    iovec iov{out + done, size - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return SocketError(errno, "receive failed");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fd->get() < 0) {
          *fd = ScopedFd(received);
        } else {
          close(received);
        }
      }
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

absl::StatusOr<ScopedFd> ConnectUnixSocket(const std::string& path,
                                           absl::Duration timeout) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory socket: the path '", path, "' is too long"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  ScopedFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return SocketError(errno, "socket failed");
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&address),
              sizeof(address)) != 0) {
    return SocketError(errno, absl::StrCat("connecting to '", path, "'"));
  }
  return fd;
}

std::string EncodeU32(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

uint32_t DecodeU32(const char* bytes) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= uint32_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  }
  return value;
}

}  // namespace modelstate
