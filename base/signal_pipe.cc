#include "base/signal_pipe.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "base/file_util.h"

namespace modelstate {
namespace {

int signal_pipe[2] = {-1, -1};

// Async-signal-safe: only write(), and errno is restored.
void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(signal_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

absl::Status InstallSignalPipe(std::initializer_list<int> signals) {
  static std::once_flag once;
  static int pipe_error = 0;
  std::call_once(once, [] {
    if (pipe2(signal_pipe, O_CLOEXEC) != 0) pipe_error = errno;
  });
  if (pipe_error != 0) return ErrnoStatus(pipe_error, "signal pipe", "pipe2");
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int sig : signals) {
    if (sigaction(sig, &action, nullptr) != 0) {
      return ErrnoStatus(errno, "signal pipe", "sigaction");
    }
  }
  return absl::OkStatus();
}

int WaitForSignal() {
  unsigned char byte = 0;
  while (true) {
    ssize_t n = read(signal_pipe[0], &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    return SIGTERM;  // no pipe (never installed) or it broke: stop
  }
}

void NotifySignalWaiter(int value) { OnSignal(value); }

}  // namespace modelstate
