// File: signal_pipe.h
// Turns signals into bytes on a pipe that an ordinary thread reads, so that
// a signal is handled the same whichever thread the kernel hands it to (a
// sanitizer's own threads included), and so that the waiting thread can
// also be woken without sending the process a signal.
//
// Example (the server's shutdown):
//   MODELSTATE_RETURN_IF_ERROR(InstallSignalPipe({SIGINT, SIGTERM}));
//   std::thread waiter([] { WaitForSignal(); server->Shutdown(); });
#ifndef MODELSTATE_BASE_SIGNAL_PIPE_H_
#define MODELSTATE_BASE_SIGNAL_PIPE_H_

#include <initializer_list>

#include "absl/status/status.h"

namespace modelstate {

// Handles `signals` by writing their numbers to the pipe. Idempotent per
// signal; the pipe is created once per process.
absl::Status InstallSignalPipe(std::initializer_list<int> signals);

// Blocks until a signal, or a NotifySignalWaiter() call, arrives; returns
// its number.
int WaitForSignal();

// Wakes WaitForSignal() with `value` from ordinary code (for example when
// the work it guards ended on its own).
void NotifySignalWaiter(int value);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_SIGNAL_PIPE_H_
