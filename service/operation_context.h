// File: operation_context.h
// Who asked for a change, and which request caused it: what hooks see and
// what the audit log records with every change.
//
// Example:
//   OperationContext ctx;
//   ctx.identity = "alice";
//   ctx.correlation_id = "req-7";
//   store.Delete(ctx, name);
#ifndef MODELSTATE_SERVICE_OPERATION_CONTEXT_H_
#define MODELSTATE_SERVICE_OPERATION_CONTEXT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace modelstate {

struct OperationContext {
  std::string identity;
  std::string correlation_id;
  // This call, unique in this process (AccessGate::Authenticate numbers
  // each one; 0 for work no call asked for). The correlation id is the
  // client's to choose, so two calls may share it; this tells their audit
  // records apart (AuditRecord::call_id) and is never stored.
  uint64_t call_id = 0;
  // The request's seed (BuildModule's; 0 for requests without one). A
  // subscriber's re-initialise transform without its own seed derives one
  // from it and the entry's path, so the same request builds the same values.
  uint64_t seed = 0;
  // How long the call may wait for other calls' work (a build of a name
  // that another build holds waits for its outcome): until `deadline`, or
  // until `cancelled` (may be null: never) says its client stopped the
  // call. Never stored or sent to hooks.
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled = nullptr;
  // Asked once such a wait is over, before the work it waited for goes on
  // (may be null: nothing to ask): the caller's rights may have been
  // revoked meanwhile (a token file reload), and the call must then fail as
  // a fresh one would, recorded.
  std::function<absl::Status()> still_allowed = nullptr;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_OPERATION_CONTEXT_H_
