// subscribe: a registration hook run from the command line, answered by a
// policy file or by a person at the terminal.
#include <signal.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/signal_pipe.h"
#include "base/status_macros.h"
#include "base/sync.h"
#include "client/cli/command.h"
#include "client/policy.h"
#include "client/subscriber.h"
#include "core/dtype.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "proto/convert.h"

namespace modelstate::cli {
namespace {

struct SubscribeArgs {
  std::optional<std::string> policy;
  bool interactive = false;
  std::optional<std::string> name;
  std::optional<std::string> mode;
  std::optional<std::string> priority;
  std::optional<uint64_t> timeout_ms;
  bool fail_open = false;
  std::optional<std::string> kinds;
  std::optional<std::string> ns;
  std::optional<std::string> type;
  std::optional<std::string> name_glob;
  bool include_data = false;
};

absl::StatusOr<v1::Subscription::Mode> ParseMode(const std::string& mode) {
  if (mode == "intercept") return v1::Subscription::MODE_INTERCEPT;
  if (mode == "observe") return v1::Subscription::MODE_OBSERVE;
  if (mode == "dry-run") return v1::Subscription::MODE_DRY_RUN;
  return UsageError(absl::StrCat(
      "--mode: expected intercept, observe or dry-run, got '", mode, "'"));
}

absl::Status SetKinds(const std::string& kinds, v1::Subscription* s) {
  s->clear_kinds();
  for (absl::string_view k : absl::StrSplit(kinds, ',')) {
    if (k == "parameter") {
      s->add_kinds(v1::ENTRY_KIND_PARAMETER);
    } else if (k == "buffer") {
      s->add_kinds(v1::ENTRY_KIND_BUFFER);
    } else if (k == "module") {
      s->add_kinds(v1::ENTRY_KIND_MODULE);
    } else {
      return UsageError(absl::StrCat("--kinds: '", k,
                                     "' is not parameter, buffer or module"));
    }
  }
  return absl::OkStatus();
}

// The subscription from --policy's file, then the command's options.
absl::StatusOr<v1::Subscription> SubscriptionFromOptions(
    const SubscribeArgs& a, const client::Policy* policy) {
  v1::Subscription s;
  if (policy != nullptr) s = policy->subscription();
  if (a.name.has_value()) s.set_name(*a.name);
  if (s.name().empty()) {
    return absl::InvalidArgumentError("--name: a subscriber name is required");
  }
  if (a.mode.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(v1::Subscription::Mode mode,
                                ParseMode(*a.mode));
    s.set_mode(mode);
  }
  if (a.priority.has_value()) {
    int priority = 0;
    if (!absl::SimpleAtoi(*a.priority, &priority)) {
      return UsageError("--priority: expected an integer");
    }
    s.set_priority(priority);
  }
  if (a.timeout_ms.has_value()) {
    s.set_timeout_ms(static_cast<uint32_t>(*a.timeout_ms));
  }
  if (a.fail_open) s.set_failure_policy(v1::Subscription::FAIL_OPEN);
  if (a.kinds.has_value()) MODELSTATE_RETURN_IF_ERROR(SetKinds(*a.kinds, &s));
  if (a.ns.has_value()) s.add_namespaces(*a.ns);
  if (a.type.has_value()) s.set_module_type_glob(*a.type);
  if (a.name_glob.has_value()) s.set_name_glob(*a.name_glob);
  if (a.include_data) s.set_include_data(true);
  return s;
}

// The answer a person typed, or nullopt when it means nothing.
std::optional<v1::HookAnswer> ParseAnswer(const std::string& line) {
  v1::HookAnswer answer;
  answer.set_verdict(v1::HookAnswer::APPROVE);
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.empty() || words[0] == "a" || words[0] == "approve") return answer;
  if (words[0] == "r" || words[0] == "reject") {
    answer.set_verdict(v1::HookAnswer::REJECT);
    size_t space = line.find(' ');
    answer.set_reason(
        space == std::string::npos
            ? "rejected at the terminal"
            : std::string(absl::StripAsciiWhitespace(line.substr(space + 1))));
    return answer;
  }
  if (words[0] == "cast" && words.size() == 2) {
    absl::StatusOr<DType> d = ParseDType(words[1]);
    if (d.ok()) {
      answer.set_verdict(v1::HookAnswer::MODIFY);
      answer.mutable_transform()->set_cast(convert::DTypeToProto(*d));
      answer.set_reason("cast at the terminal");
      return answer;
    }
  }
  if (words[0] == "freeze") {
    answer.set_verdict(v1::HookAnswer::MODIFY);
    answer.mutable_transform()->set_requires_grad(false);
    answer.set_reason("frozen at the terminal");
    return answer;
  }
  return std::nullopt;
}

// Asks a person at the terminal. Empty line or "a": approve; "r [reason]":
// reject; "cast DTYPE": modify to DTYPE; "freeze": requires_grad false.
v1::HookAnswer AskPerson(Context& c, std::istream& in,
                         const v1::HookEventProto& event) {
  while (true) {
    c.out() << client::DescribeEvent(event)
            << "\n  [a]pprove, [r]eject [reason], cast DTYPE, freeze? "
            << std::flush;
    std::string line;
    // No more input: approve.
    if (!std::getline(in, line)) line.clear();
    if (std::optional<v1::HookAnswer> answer = ParseAnswer(line)) {
      answer->set_event_id(event.event_id());
      return *answer;
    }
    c.out() << "  ? not understood\n";
  }
}

// Answers events with the policy, or asks a person. Prints under `out_mu`,
// as the subscriber's thread and the command's share the output.
client::Subscriber::Handler MakeHandler(
    Context& c, const std::optional<client::Policy>& policy, Mutex& out_mu) {
  return [&c, &policy, &out_mu](const v1::HookEventProto& event) {
    if (policy.has_value()) {
      std::string line;
      v1::HookAnswer answer = policy->Decide(event, &line);
      if (!line.empty()) {
        MutexLock lock(&out_mu);
        if (event.is_outcome()) {
          absl::StrAppend(&line, " [outcome ",
                          v1::Outcome_Name(event.outcome()), "]");
        }
        c.out() << line << std::endl;
      }
      return answer;
    }
    MutexLock lock(&out_mu);
    if (event.is_outcome()) {
      c.out() << client::DescribeEvent(event) << " -> "
              << v1::Outcome_Name(event.outcome()) << std::endl;
      return v1::HookAnswer();
    }
    return AskPerson(c, std::cin, event);
  };
}

absl::StatusOr<std::optional<client::Policy>> ReadPolicy(
    const SubscribeArgs& a) {
  if (!a.policy.has_value()) return std::nullopt;
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadInputFile(*a.policy));
  absl::StatusOr<client::Policy> parsed = client::Policy::FromJson(text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(*a.policy, ": ", parsed.status().message()));
  }
  return *std::move(parsed);
}

absl::Status RunSubscribe(Context& c, const SubscribeArgs& a) {
  if (a.policy.has_value() == a.interactive) {
    return UsageError("give exactly one of --policy FILE and --interactive");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<client::Policy> policy,
                              ReadPolicy(a));
  MODELSTATE_ASSIGN_OR_RETURN(
      v1::Subscription subscription,
      SubscriptionFromOptions(a, policy ? &*policy : nullptr));
  if (!policy.has_value() && subscription.timeout_ms() == 0) {
    subscription.set_timeout_ms(60000);  // a person needs time
  }
  // SIGINT / SIGTERM end the subscription cleanly.
  MODELSTATE_RETURN_IF_ERROR(InstallSignalPipe({SIGINT, SIGTERM}));
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  Mutex out_mu;
  MODELSTATE_ASSIGN_OR_RETURN(
      std::unique_ptr<client::Subscriber> subscriber,
      client::Subscriber::Start(*rpc, subscription,
                                MakeHandler(c, policy, out_mu)));
  {
    MutexLock lock(&out_mu);
    c.out() << "subscribed as " << subscription.name() << " (id "
            << subscriber->id() << ")" << std::endl;
  }
  std::thread waiter([&] {
    WaitForSignal();
    subscriber->Stop();
  });
  absl::Status end = subscriber->Wait();
  // The stream ended on its own (server shutdown, replaced): wake the
  // waiter thread so it can be joined.
  NotifySignalWaiter(SIGTERM);
  waiter.join();
  if (end.code() == absl::StatusCode::kCancelled) return absl::OkStatus();
  return end;
}

// `subscribers release NAME [--force]`.
struct SubscribersArgs {
  std::string what;
  std::string name;
  bool force = false;
};

absl::Status RunSubscribers(Context& c, const SubscribersArgs& a) {
  if (a.what != "release") {
    return UsageError(absl::StrCat("expected release, got '", a.what, "'"));
  }
  if (a.name.empty()) return UsageError("subscribers release takes a NAME");
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::ReleaseSubscriberNameResponse released,
                              rpc->ReleaseSubscriberName(a.name, a.force));
  if (c.json()) return c.PrintJson(released);
  c.out() << "released " << a.name;
  if (!released.owner().empty()) c.out() << " (was " << released.owner() << ")";
  if (released.disconnected()) c.out() << "; its subscriber was disconnected";
  c.out() << "\n";
  return absl::OkStatus();
}

void AddSubscribersCommand(CommandSet& commands) {
  auto args = std::make_shared<SubscribersArgs>();
  CLI::App* subscribers = commands.Add(
      {"subscribers", "manage subscriber names (admin)",
       "release NAME frees a subscriber name bound to the identity that "
       "first used it, so that any identity may use it next (admin role "
       "only). A subscriber connected under the name must be ended first, "
       "or --force ends its stream. The release is recorded in the audit "
       "log and holds after a restart.",
       "modelstatectl subscribers release ci-policy --force"},
      [args](Context& c) { return RunSubscribers(c, *args); });
  subscribers->add_option("release", args->what, "what to do")->required();
  subscribers->add_option("NAME", args->name, "the subscriber name");
  AddFlag(subscribers, "--force", args->force,
          "end the stream of a subscriber connected under NAME");
}

}  // namespace

void AddSubscribeCommand(CommandSet& commands) {
  auto args = std::make_shared<SubscribeArgs>();
  CLI::App* sub = commands.Add(
      {"subscribe", "run a registration hook: a policy file or a person",
       "Subscribes to registration events and answers them until interrupted "
       "(Ctrl-C) or the server ends the stream. With --policy, a rules file "
       "decides (see deploy/policies/); with --interactive, each event is "
       "asked at the terminal: Enter or a to approve, r [reason] to reject, "
       "cast DTYPE or freeze to modify. Options override the policy's "
       "subscription.",
       "modelstatectl subscribe --policy "
       "deploy/policies/block_temp_buffer.json"},
      [args](Context& c) { return RunSubscribe(c, *args); });
  AddValue(sub, "--policy", args->policy, "FILE", "rules file (JSON)");
  AddFlag(sub, "--interactive", args->interactive,
          "ask a person for each event");
  AddValue(sub, "--name", args->name, "NAME", "subscriber name");
  // The values are checked when parsing, so that a bad one is a usage
  // error (exit 2) like any other option's.
  AddValue(sub, "--mode", args->mode, "intercept|observe|dry-run",
           "how answers count (default intercept)")
      ->check(OneOf({"intercept", "observe", "dry-run"}));
  AddValue(sub, "--priority", args->priority, "N",
           "lower runs first (default 0)")
      ->check(Int32());
  AddValue(sub, "--timeout-ms", args->timeout_ms, "MS",
           "per-event timeout (default 10000; 60000 with --interactive)")
      ->check(PositiveInteger(UINT32_MAX));
  AddFlag(sub, "--fail-open", args->fail_open,
          "approve when this subscriber times out or fails (default: block)");
  AddValue(sub, "--kinds", args->kinds, "LIST",
           "parameter,buffer,module (default all)")
      ->check(CommaListOf({"parameter", "buffer", "module"}));
  AddValue(sub, "--namespace", args->ns, "NS", "only this namespace");
  AddValue(sub, "--type", args->type, "GLOB", "only modules of these types");
  AddValue(sub, "--name-glob", args->name_glob, "GLOB",
           "only entries with these names");
  AddFlag(sub, "--include-data", args->include_data,
          "receive tensor values too");
  AddSubscribersCommand(commands);
}

}  // namespace modelstate::cli
