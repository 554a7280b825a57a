#include "client/cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <utility>

#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "base/sync.h"

namespace modelstate::cli {
namespace {

// What the handler's thread reads when the handler goes away; signals are
// never 0.
constexpr int kStop = 0;

// Signals are per process, so the lock and the cleanups are too.
struct InterruptState {
  Mutex mu;
  std::vector<std::function<void()>> cleanups ABSL_GUARDED_BY(mu);
};

InterruptState& State() {
  static auto* state = new InterruptState();
  return *state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<InterruptHandler>> InterruptHandler::Install() {
  std::unique_ptr<InterruptHandler> handler(new InterruptHandler());
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction previous = {};
    sigaction(sig, nullptr, &previous);
    if (previous.sa_handler == SIG_IGN) continue;
    MODELSTATE_RETURN_IF_ERROR(InstallSignalPipe({sig}));
    handler->previous_.emplace_back(sig, previous);
  }
  handler->waiter_ = std::thread([h = handler.get()] { h->Wait(); });
  return handler;
}

InterruptHandler::~InterruptHandler() {
  NotifySignalWaiter(kStop);
  waiter_.join();
  for (const auto& [sig, previous] : previous_) {
    sigaction(sig, &previous, nullptr);
  }
  InterruptState& state = State();
  MutexLock lock(&state.mu);
  state.cleanups.clear();
}

void InterruptHandler::OnInterrupt(std::function<void()> cleanup) {
  InterruptState& state = State();
  MutexLock lock(&state.mu);
  state.cleanups.push_back(std::move(cleanup));
}

void InterruptHandler::Wait() {
  const int sig = WaitForSignal();
  if (sig == kStop) return;
  InterruptState& state = State();
  // Held to the end: no file step starts once the cleanups have run.
  MutexLock lock(&state.mu);
  for (const std::function<void()>& cleanup : state.cleanups) cleanup();
  // Ended by the signal itself, as without a handler: a shell then stops a
  // loop or script the command runs in, and reports 128 + the signal.
  signal(sig, SIG_DFL);
  raise(sig);
  _exit(128 + sig);
}

absl::Status Uninterrupted(const std::function<absl::Status()>& step) {
  InterruptState& state = State();
  MutexLock lock(&state.mu);
  return step();
}

}  // namespace modelstate::cli
