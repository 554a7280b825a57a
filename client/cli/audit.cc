// audit: query, follow (tail) or verify the audit log, on the server or,
// for verify, in a local copy.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "service/audit_log.h"

namespace modelstate::cli {
namespace {

struct AuditArgs {
  std::string what;
  std::optional<std::string> since;
  std::optional<std::string> until;
  std::optional<std::string> ns;
  std::optional<std::string> module;
  std::optional<std::string> identity;
  std::optional<std::string> outcome;
  std::optional<std::string> type;
  std::optional<uint64_t> after;
  std::optional<uint64_t> limit;
  std::optional<std::string> file;
};

v1::AuditFilter Filter(const AuditArgs& a) {
  v1::AuditFilter f;
  f.set_since(a.since.value_or(""));
  f.set_until(a.until.value_or(""));
  f.set_namespace_(a.ns.value_or(""));
  f.set_module(a.module.value_or(""));
  f.set_identity(a.identity.value_or(""));
  f.set_outcome(a.outcome.value_or(""));
  f.set_type(a.type.value_or(""));
  return f;
}

// One line per record, flushed: tail's reader sees each as it comes.
absl::Status PrintRecord(Context& c, const v1::AuditRecordProto& r) {
  if (c.json()) return c.PrintJson(r);
  std::string module =
      r.module().empty() ? "" : absl::StrCat(r.namespace_(), "/", r.module());
  c.out() << absl::StrFormat(
                 "%6d  %s  %-15s %-8s %-20s %s  %s", r.seq(), r.time(),
                 r.type(), r.outcome().empty() ? "-" : r.outcome(), module,
                 r.identity().empty() ? "-" : r.identity(), r.details_json())
          << std::endl;
  return absl::OkStatus();
}

// The verdict, and exit status 1 for a broken chain (already shown).
absl::Status ShowVerification(Context& c,
                              const v1::VerifyAuditResponse& response) {
  if (c.json()) {
    MODELSTATE_RETURN_IF_ERROR(c.PrintJson(response));
  } else if (response.ok()) {
    c.out() << "ok: " << response.records()
            << " records, the chain is intact\n";
  } else {
    c.out() << "BROKEN at record " << response.broken_seq() << " (line "
            << response.broken_line() << "): " << response.problem() << "\n";
  }
  if (response.ok()) return absl::OkStatus();
  return AlreadyShown(absl::DataLossError("the audit chain is broken"));
}

absl::Status Verify(Context& c, const AuditArgs& a) {
  if (a.file.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(AuditVerification v, AuditLog::Verify(*a.file));
    v1::VerifyAuditResponse response;
    response.set_records(v.records);
    response.set_ok(v.ok);
    response.set_broken_seq(v.broken_seq);
    response.set_broken_line(v.broken_line);
    response.set_problem(v.problem);
    return ShowVerification(c, response);
  }
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::VerifyAuditResponse response,
                              rpc->VerifyAudit());
  return ShowVerification(c, response);
}

absl::Status Query(Context& c, const AuditArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  const uint64_t limit = a.limit.value_or(UINT64_MAX);
  v1::QueryAuditRequest request;
  *request.mutable_filter() = Filter(a);
  request.set_after_seq(a.after.value_or(0));
  uint64_t printed = 0;
  while (printed < limit) {
    request.set_limit(
        static_cast<int32_t>(std::min<uint64_t>(limit - printed, 1000)));
    MODELSTATE_ASSIGN_OR_RETURN(v1::QueryAuditResponse response,
                                rpc->QueryAudit(request));
    for (const v1::AuditRecordProto& r : response.records()) {
      MODELSTATE_RETURN_IF_ERROR(PrintRecord(c, r));
      ++printed;
    }
    if (response.next_after_seq() == 0) break;
    request.set_after_seq(response.next_after_seq());
  }
  return absl::OkStatus();
}

// Follows the log until SIGINT / SIGTERM, or --limit records.
absl::Status Tail(Context& c, const AuditArgs& a) {
  MODELSTATE_RETURN_IF_ERROR(InstallSignalPipe({SIGINT, SIGTERM}));
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  v1::WatchAuditRequest request;
  *request.mutable_filter() = Filter(a);
  request.set_after_seq(a.after.value_or(0));
  std::unique_ptr<client::AuditWatch> watch = rpc->WatchAudit(request);
  std::thread waiter([&watch] {
    WaitForSignal();
    watch->Cancel();
  });
  const uint64_t limit = a.limit.value_or(UINT64_MAX);
  uint64_t printed = 0;
  absl::Status printing;
  v1::AuditRecordProto record;
  while (printing.ok() && printed < limit && watch->Next(&record)) {
    printing = PrintRecord(c, record);
    ++printed;
  }
  absl::Status status = watch->Finish();
  // Wake the waiter thread so it can be joined.
  NotifySignalWaiter(SIGTERM);
  waiter.join();
  MODELSTATE_RETURN_IF_ERROR(printing);
  if (status.code() == absl::StatusCode::kCancelled) return absl::OkStatus();
  return status;
}

absl::Status RunAudit(Context& c, const AuditArgs& a) {
  if (a.what == "verify") return Verify(c, a);
  if (a.what == "query") return Query(c, a);
  if (a.what == "tail") return Tail(c, a);
  return UsageError(
      absl::StrCat("expected query, tail or verify, got '", a.what, "'"));
}

}  // namespace

void AddAuditCommand(CommandSet& commands) {
  auto args = std::make_shared<AuditArgs>();
  CLI::App* audit = commands.Add(
      {"audit", "query, follow or verify the audit log",
       "query prints the records that match; tail prints them as they are "
       "written, until interrupted; verify walks the hash chain and names the "
       "first broken record (exit 1 if any), on the server or, with --file, "
       "in a local copy of the log.",
       "modelstatectl audit query --module mlp --outcome block"},
      [args](Context& c) { return RunAudit(c, *args); });
  audit->add_option("query|tail|verify", args->what, "what to do")->required();
  AddValue(audit, "--since", args->since, "TIME", "RFC 3339, inclusive");
  AddValue(audit, "--until", args->until, "TIME", "RFC 3339, exclusive");
  AddValue(audit, "--namespace", args->ns, "NS", "only this namespace");
  AddValue(audit, "--module", args->module, "NAME",
           "only this module (without namespace)");
  AddValue(audit, "--identity", args->identity, "ID", "only this caller");
  AddValue(audit, "--outcome", args->outcome, "OUTCOME",
           "keep, replace, block, approve, reject, ok, error, ...");
  AddValue(audit, "--type", args->type, "TYPE",
           "registration, answer, outcome, build, load_state_dict, ...");
  AddValue(audit, "--after", args->after, "SEQ",
           "only records after this sequence number")
      ->check(NonNegativeInteger());
  AddValue(audit, "--limit", args->limit, "N", "print at most N records")
      ->check(PositiveInteger());
  AddValue(audit, "--file", args->file, "FILE",
           "verify: a local audit.log instead");
}

}  // namespace modelstate::cli
