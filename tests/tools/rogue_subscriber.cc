// Test tool: a subscriber process that behaves as told, to test how the
// server copes with subscribers that are slow, silent, wrong or dying.
//
//   rogue_subscriber --server=ADDR --name=N --mode=MODE [--priority=P]
//                    [--timeout_ms=T] [--fail_open] [--delay_ms=D]
//                    [--kind=parameter|buffer|module]
// MODE: approve, reject, garbage-id (answers with an unknown event id),
// wrong-shape (MODIFY with a [7] tensor), silent (never answers),
// die (SIGKILLs itself on the first event), tag (MODIFY: constant = priority).
// Prints "ready <subscriber id>" on stdout once the server acknowledged it,
// then one line per event it sees.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "client/model_state_client.h"
#include "client/subscriber.h"

namespace {

std::string Flag(int argc, char** argv, const std::string& name,
                 const std::string& dflt) {
  std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      return argv[i] + prefix.size();
    if (std::string(argv[i]) == "--" + name) return "true";
  }
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  using modelstate::v1::HookAnswer;
  std::string mode = Flag(argc, argv, "mode", "approve");
  int delay_ms = std::stoi(Flag(argc, argv, "delay_ms", "0"));
  int priority = std::stoi(Flag(argc, argv, "priority", "0"));
  auto client = modelstate::client::ModelStateClient::Connect(
      Flag(argc, argv, "server", "127.0.0.1:50051"));
  if (!client.ok()) return 1;
  modelstate::v1::Subscription s;
  s.set_name(Flag(argc, argv, "name", "rogue"));
  s.set_priority(priority);
  s.set_timeout_ms(static_cast<uint32_t>(
      std::stoi(Flag(argc, argv, "timeout_ms", "10000"))));
  if (Flag(argc, argv, "fail_open", "") == "true") {
    s.set_failure_policy(modelstate::v1::Subscription::FAIL_OPEN);
  }
  std::string kind = Flag(argc, argv, "kind", "");
  if (kind == "parameter") s.add_kinds(modelstate::v1::ENTRY_KIND_PARAMETER);
  if (kind == "buffer") s.add_kinds(modelstate::v1::ENTRY_KIND_BUFFER);
  if (kind == "module") s.add_kinds(modelstate::v1::ENTRY_KIND_MODULE);
  auto sub = modelstate::client::Subscriber::Start(
      **client, s, [&](const modelstate::v1::HookEventProto& e) {
        std::printf("event %llu %s.%s\n",
                    static_cast<unsigned long long>(e.event_id()),
                    e.path().c_str(), e.name().c_str());
        std::fflush(stdout);
        if (delay_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        HookAnswer a;
        a.set_event_id(e.event_id());
        a.set_verdict(HookAnswer::APPROVE);
        if (mode == "reject") {
          a.set_verdict(HookAnswer::REJECT);
          a.set_reason("rejected by rogue");
        } else if (mode == "garbage-id") {
          a.set_event_id(e.event_id() + 1000000);
        } else if (mode == "wrong-shape") {
          a.set_verdict(HookAnswer::MODIFY);
          auto* t = a.mutable_replacement();
          t->set_dtype(modelstate::v1::DTYPE_FLOAT32);
          t->add_shape(7);
          t->set_data(std::string(28, '\0'));
        } else if (mode == "silent") {
          // Answer nothing: block this thread until the process is killed.
          while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
        } else if (mode == "die") {
          kill(getpid(), SIGKILL);
        } else if (mode == "tag") {
          a.set_verdict(HookAnswer::MODIFY);
          auto* init = a.mutable_transform()->mutable_reinit();
          init->set_kind("constant");
          init->set_a(priority);
        }
        return a;
      });
  if (!sub.ok()) {
    std::fprintf(stderr, "subscribe failed: %s\n",
                 sub.status().ToString().c_str());
    return 1;
  }
  std::printf("ready %llu\n", static_cast<unsigned long long>((*sub)->id()));
  std::fflush(stdout);
  absl::Status end = (*sub)->Wait();
  std::printf("ended %s\n", end.ToString().c_str());
  return 0;
}
