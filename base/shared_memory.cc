#include "base/shared_memory.h"

#include <fcntl.h>
#include <linux/capability.h>
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

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
// The direct table's words in the header page (see SharedRing).
constexpr size_t kAnswerOffset = 8;
constexpr size_t kWritingOffset = 16;
constexpr size_t kStoppedOffset = 24;
constexpr size_t kCallOffset = 32;
}  // namespace

uint64_t* SharedRing::word(size_t offset) const {
  return reinterpret_cast<uint64_t*>(region_.data() + offset);
}

uint64_t SharedRing::direct_table() const {
  return __atomic_load_n(word(kAnswerOffset), __ATOMIC_ACQUIRE);
}

uint64_t SharedRing::BeginDirectCall() {
  __atomic_store_n(word(kAnswerOffset), 0, __ATOMIC_RELEASE);
  const uint64_t call =
      __atomic_load_n(word(kCallOffset), __ATOMIC_ACQUIRE) + 1;
  __atomic_store_n(word(kCallOffset), call, __ATOMIC_RELEASE);
  return call;
}

void SharedRing::DeclineDirectTable() {
  __atomic_store_n(word(kAnswerOffset), kDirectTableDeclined, __ATOMIC_RELEASE);
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
  __atomic_store_n(word(kAnswerOffset), uint64_t{targets.size()},
                   __ATOMIC_RELEASE);
  return true;
}

bool SharedRing::StopDirectWrites(uint64_t call, absl::Duration timeout) {
  // With BeginDirectWrite, Dekker's handshake: each side stores its word,
  // then reads the other's (both sequentially consistent), so that either
  // the server sees the stop before it writes or the client sees it
  // writing and waits.
  __atomic_store_n(word(kStoppedOffset), call, __ATOMIC_SEQ_CST);
  const absl::Time deadline = absl::Now() + timeout;
  while (__atomic_load_n(word(kWritingOffset), __ATOMIC_SEQ_CST) != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(20));
  }
  return true;
}

absl::StatusOr<std::optional<SharedRing::DirectTable>>
SharedRing::AwaitDirectTable(uint64_t entries, absl::Duration timeout,
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
  if (count != entries) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the direct table has ", count,
                     " entries; the header has ", entries));
  }
  const uint64_t room = uint64_t{slots_} * slot_bytes_ / sizeof(DirectTarget);
  if (count > room) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a direct table of ", count,
                     " entries; the ring's slots hold at most ", room));
  }
  DirectTable table;
  table.call = __atomic_load_n(word(kCallOffset), __ATOMIC_ACQUIRE);
  table.targets.resize(count);
  const char* in = region_.data() + kRingHeaderBytes;
  for (DirectTarget& target : table.targets) {
    std::memcpy(&target.address, in, 8);
    std::memcpy(&target.length, in + 8, 8);
    in += sizeof(DirectTarget);
  }
  return table;
}

bool SharedRing::BeginDirectWrite(uint64_t call) {
  __atomic_store_n(word(kWritingOffset), 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(word(kStoppedOffset), __ATOMIC_SEQ_CST) >= call) {
    EndDirectWrite();
    return false;
  }
  return true;
}

void SharedRing::EndDirectWrite() {
  __atomic_store_n(word(kWritingOffset), 0, __ATOMIC_RELEASE);
}

namespace {

// getsockopt(SO_PEERPIDFD): a pidfd of the process that connected, taken
// when it connected (Linux 6.5 and later).
constexpr int kPeerPidfd = 77;

// The pid a pidfd refers to (its fdinfo's "Pid:" line): -1 once the process
// exited, 0 when it is in no PID namespace this process sees.
int PidOfPidfd(int pidfd) {
  std::ifstream in(absl::StrCat("/proc/self/fdinfo/", pidfd));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    int pid = 0;
    if (absl::ConsumePrefix(&rest, "Pid:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &pid)) {
      return pid;
    }
  }
  return 0;
}

// While alive, this thread acts without CAP_SYS_PTRACE (capabilities are
// per thread; the permitted set keeps it, so it comes back after): the
// kernel then lets it write another process's memory only where a debugger
// of the same user could, never a process that became privileged (a setuid
// program, not dumpable) after it registered its ring.
class ScopedWithoutPtrace {
 public:
  ScopedWithoutPtrace() {
    if (syscall(SYS_capget, &header_, data_) != 0) return;
    constexpr uint32_t bit = 1u << (CAP_SYS_PTRACE % 32);
    __user_cap_data_struct* word = &data_[CAP_SYS_PTRACE / 32];
    if ((word->effective & bit) == 0) return;
    __user_cap_data_struct lowered[2] = {data_[0], data_[1]};
    lowered[CAP_SYS_PTRACE / 32].effective &= ~bit;
    dropped_ = syscall(SYS_capset, &header_, lowered) == 0;
  }
  ~ScopedWithoutPtrace() {
    if (dropped_) syscall(SYS_capset, &header_, data_);
  }
  ScopedWithoutPtrace(const ScopedWithoutPtrace&) = delete;
  ScopedWithoutPtrace& operator=(const ScopedWithoutPtrace&) = delete;

 private:
  __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data_[2] = {};
  bool dropped_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerMemory>> PeerMemory::OfConnection(
    int socket) {
  // The peer's identity, pinned by a pidfd: once it exits the pidfd turns
  // readable, so a recycled pid is never written. SO_PEERPIDFD pins the
  // very process that connected; older kernels get the pid it had then and
  // open a pidfd now, checking that the connection is still open (a
  // process that exited in between cannot be confused with a newcomer of
  // another user: the kernel checks the user at every write).
  ScopedFd pidfd;
  int pid = 0;
  int raw_pidfd = -1;
  socklen_t size = sizeof(raw_pidfd);
  if (getsockopt(socket, SOL_SOCKET, kPeerPidfd, &raw_pidfd, &size) == 0 &&
      raw_pidfd >= 0) {
    pidfd = ScopedFd(raw_pidfd);
    pid = PidOfPidfd(pidfd.get());
  } else {
    ucred credentials{};
    size = sizeof(credentials);
    if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
      return SocketError(errno, "SO_PEERCRED");
    }
    pid = credentials.pid;
    if (pid > 0) {
      pidfd = ScopedFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
      if (pidfd.get() < 0) return SocketError(errno, "pidfd_open");
    }
  }
  if (pid <= 0) {
    return absl::UnavailableError(
        "shared memory socket: the peer's process is not visible here, or "
        "is gone");
  }
  auto peer =
      std::unique_ptr<PeerMemory>(new PeerMemory(pid, std::move(pidfd)));
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
    return absl::UnavailableError(
        "shared_memory_direct: the client's process exited");
  }
  return absl::OkStatus();
}

absl::Status PeerMemory::Failure(int error) const {
  switch (error) {
    case EPERM:
    case ENOSYS:
      return absl::FailedPreconditionError(absl::StrCat(
          "shared_memory_direct: the kernel does not let the server write "
          "the client's memory: ",
          std::strerror(error)));
    case ESRCH:
      return absl::UnavailableError(
          "shared_memory_direct: the client's process exited");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("shared_memory_direct: not the client's memory: ",
                       std::strerror(error)));
  }
}

absl::Status PeerMemory::Probe(uint64_t address) const {
  const ScopedWithoutPtrace as_any_debugger;
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{reinterpret_cast<void*>(address), 1};
  if (process_vm_readv(pid_, &local, 1, &remote, 1, 0) != 1) {
    return Failure(errno);
  }
  return absl::OkStatus();
}

absl::Status PeerMemory::Write(absl::string_view bytes,
                               uint64_t address) const {
  const ScopedWithoutPtrace as_any_debugger;
  while (!bytes.empty()) {
    iovec local{const_cast<char*>(bytes.data()), bytes.size()};
    iovec remote{reinterpret_cast<void*>(address), bytes.size()};
    const ssize_t n = process_vm_writev(pid_, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Failure(errno);
    }
    // A partial write stops at a page the peer does not have.
    if (n == 0) return Failure(EFAULT);
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
