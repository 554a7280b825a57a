#include "base/mapped_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "base/file_util.h"

namespace modelstate {

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(
    const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, path, "open failed");
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, path, "stat failed");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));
  }
  // Shared, not private: the pages are the page cache's own, so nothing is
  // copied and nothing counts against the process's data limit.
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, path, "mmap failed");
  return std::shared_ptr<const MappedFile>(
      new MappedFile(path, static_cast<const char*>(p), size));
}

MappedFile::~MappedFile() {
  if (size_ > 0) munmap(const_cast<char*>(data_), size_);
}

namespace {

// The bytes a thread is reading under ReadCatchingBusErrors, and where to
// go back to when they fault.
struct BusErrorGuard {
  sigjmp_buf resume;
  const char* begin;
  const char* end;
};
thread_local BusErrorGuard* bus_error_guard = nullptr;
struct sigaction previous_sigbus;

void OnSigbus(int signal, siginfo_t* info, void* context) {
  const BusErrorGuard* guard = bus_error_guard;
  const char* at = static_cast<const char*>(info->si_addr);
  // si_code > 0: raised by the kernel for a fault, not sent by a process.
  if (guard != nullptr && info->si_code > 0 && at >= guard->begin &&
      at < guard->end) {
    siglongjmp(const_cast<BusErrorGuard*>(guard)->resume, 1);
  }
  // Not a read this guards: what would have happened without it.
  if ((previous_sigbus.sa_flags & SA_SIGINFO) != 0 &&
      previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_sigbus.sa_handler != SIG_DFL &&
      previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(signal);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

}  // namespace

bool MappedFile::ReadCatchingBusErrors(absl::string_view bytes,
                                       absl::FunctionRef<void()> read) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  });
  BusErrorGuard guard;
  guard.begin = bytes.data();
  guard.end = bytes.data() + bytes.size();
  BusErrorGuard* const outer = bus_error_guard;
  // The mask is not saved (that is a system call per read, and scrubs make
  // one per tensor): the handler runs with SIGBUS alone added to it, which
  // is unblocked again after the jump back.
  if (sigsetjmp(guard.resume, 0) != 0) {
    bus_error_guard = outer;
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    return false;
  }
  bus_error_guard = &guard;
  read();
  bus_error_guard = outer;
  return true;
}

}  // namespace modelstate
