// File: cli/interrupt.h
// Ctrl-C (SIGINT) and SIGTERM for the commands that write files. A file is
// written beside its target as FILE.tmp.PID.N and renamed into place when
// complete; the signals' default action ends the process wherever it is,
// which leaves that temporary file behind, as large as what had arrived.
// An InterruptHandler turns the signals into an orderly end instead: its
// thread waits for one, waits for any file step in progress (Uninterrupted)
// to return, runs the cleanups registered (which remove temporary files),
// then ends the process by the same signal, so that shells see 130 or 143
// as they would without it. The target file is never touched.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
//                               InterruptHandler::Install());
//   MODELSTATE_RETURN_IF_ERROR(Uninterrupted(
//       [&] { return WriteFileAtomically(path, text); }));
#ifndef MODELSTATE_CLIENT_CLI_INTERRUPT_H_
#define MODELSTATE_CLIENT_CLI_INTERRUPT_H_

#include <signal.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace modelstate::cli {

// Handles SIGINT and SIGTERM for the life of the object (one at a time per
// process; a signal ignored when the process started stays ignored, as
// for `nohup` or a background job of a script). Thread-safe.
class InterruptHandler {
 public:
  // Installs the handler and starts its thread. INTERNAL if the signal pipe
  // cannot be made.
  static absl::StatusOr<std::unique_ptr<InterruptHandler>> Install();
  // Stops the thread; the signals act as they did before Install().
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

  // Runs `cleanup` when a signal arrives, outside any Uninterrupted step,
  // before the process ends. Cleanups run in the order registered.
  void OnInterrupt(std::function<void()> cleanup);

 private:
  InterruptHandler() = default;
  void Wait();

  std::vector<std::pair<int, struct sigaction>> previous_;
  std::thread waiter_;
};

// Runs `step` (one that creates, writes or renames a file) to its end
// before a signal is acted upon, so that an interrupt finds either no
// temporary file or one a cleanup knows of. Returns what `step` returns.
absl::Status Uninterrupted(const std::function<absl::Status()>& step);

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_INTERRUPT_H_
