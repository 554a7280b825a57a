// audit: query, follow (tail) or verify the audit log, on the server or,
// for verify, in a local copy.
#include "client/cli/audit.h"

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
#include "absl/strings/str_join.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "service/audit_log.h"

namespace modelstate::cli {
namespace {

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
  if (!r.replica().empty()) c.out() << r.replica() << "  ";
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
  if (a.cluster) return VerifyCluster(c, a);
  if (a.file.has_value() && (a.key.has_value() || a.checkpoint.has_value())) {
    return VerifyFileTree(c, a);
  }
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
  request.set_cluster(a.cluster);
  uint64_t printed = 0;
  bool warned = false;
  while (printed < limit) {
    request.set_limit(
        static_cast<int32_t>(std::min<uint64_t>(limit - printed, 1000)));
    MODELSTATE_ASSIGN_OR_RETURN(v1::QueryAuditResponse response,
                                rpc->QueryAudit(request));
    if (!warned && !response.missing_replicas().empty()) {
      warned = true;
      c.err() << "warning: left out (no live lease): "
              << absl::StrJoin(response.missing_replicas(), ", ") << "\n";
    }
    for (const v1::AuditRecordProto& r : response.records()) {
      MODELSTATE_RETURN_IF_ERROR(PrintRecord(c, r));
      ++printed;
    }
    if (a.cluster) {
      if (response.next_after_seqs().empty()) break;
      *request.mutable_after_seqs() = response.next_after_seqs();
      continue;
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
  request.set_cluster(a.cluster);
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
  const size_t operands = a.what == "prove"         ? 1
                          : a.what == "consistency" ? 2
                                                    : 0;
  if (a.operands.size() != operands) {
    return UsageError(absl::StrCat("audit ", a.what, " takes ", operands,
                                   " operands, not ", a.operands.size()));
  }
  if (a.what == "verify") return Verify(c, a);
  if (a.what == "query") return Query(c, a);
  if (a.what == "tail") return Tail(c, a);
  if (a.what == "checkpoint") return RunCheckpoint(c, a);
  if (a.what == "key") return RunKey(c, a);
  if (a.what == "prove") return RunProve(c, a);
  if (a.what == "consistency") return RunConsistency(c, a);
  if (a.what == "witness") return RunWitness(c, a);
  return UsageError(absl::StrCat(
      "expected query, tail, verify, checkpoint, key, prove, consistency or "
      "witness, got '",
      a.what, "'"));
}

}  // namespace

void AddAuditCommand(CommandSet& commands) {
  auto args = std::make_shared<AuditArgs>();
  CLI::App* audit = commands.Add(
      {"audit", "query, follow, verify, prove or witness the audit log",
       "query prints the records that match; tail prints them as they are "
       "written, until interrupted; verify walks the hash chain and names the "
       "first broken record (exit 1 if any), on the server or, with --file, "
       "in a local copy of the log (with --key and --checkpoint it also "
       "checks the checkpoint's signature and that the log's tree matches "
       "it, naming the first differing seq). checkpoint prints the latest "
       "signed checkpoint (--fresh: signed now), key the log's verifier key; "
       "prove SEQ [--size N] and consistency OLD NEW fetch and check proofs "
       "against signed checkpoints. witness --key WITNESS_KEY --state DIR "
       "polls the checkpoints, checks each is consistent with the last it "
       "cosigned, and cosigns it; shown one that is not, it prints both and "
       "exits 1.",
       "modelstatectl audit query --module mlp --outcome block"},
      [args](Context& c) { return RunAudit(c, *args); });
  audit
      ->add_option("query|tail|verify|checkpoint|key|prove|consistency|witness",
                   args->what, "what to do")
      ->required();
  audit->add_option("operands", args->operands,
                    "prove: SEQ; consistency: OLD NEW");
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
  AddValue(audit, "--key", args->key, "KEY",
           "the log's verifier key (or a file of it); witness: the witness's "
           "private key file (created if absent)");
  AddValue(audit, "--checkpoint", args->checkpoint, "FILE",
           "a saved checkpoint to check against (verify, prove, consistency)");
  AddValue(audit, "--checkpoint-key", args->checkpoint_key, "KEY",
           "consistency: the verifier key --checkpoint was signed with, when "
           "the log's key was rotated since (default: --key)");
  AddValue(audit, "--hashes", args->hashes, "FILE",
           "verify: a copy of audit.hashes, to name the first differing seq");
  AddValue(audit, "--size", args->size, "N", "prove: the tree size")
      ->check(PositiveInteger());
  AddFlag(audit, "--cluster", args->cluster,
          "verify: every replica of the server's cluster, each against the "
          "checkpoint it recorded in etcd (admin); query and tail: every live "
          "replica's records (query: merged in time order), each line led "
          "by its replica");
  AddFlag(audit, "--fresh", args->fresh,
          "checkpoint: sign one now if records came since the latest");
  AddValue(audit, "--state", args->state, "DIR",
           "witness: where it keeps the last checkpoint it cosigned");
  AddValue(audit, "--name", args->name, "NAME",
           "witness: its key name (default modelstate-witness)");
  AddValue(audit, "--log-key", args->log_key, "KEY",
           "witness: the log's verifier key (default: pinned on first run)");
  AddValue(audit, "--interval", args->interval, "SECONDS",
           "witness: between polls (default 1)")
      ->check(PositiveSeconds());
  AddFlag(audit, "--once", args->once, "witness: one round, then exit");
}

}  // namespace modelstate::cli
