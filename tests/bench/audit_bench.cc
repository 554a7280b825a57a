// audit_bench: the verifiable audit log at scale, each figure against a
// baseline measured in the same run. Writes one JSON object (--out).
//
//   appends   4 threads append 250-byte records for --seconds, each
//             thread syncing every 32 appends (group commit), while a
//             CheckpointSigner signs a checkpoint each second; baseline:
//             the same lines written to a plain file by the same threads
//             with the same fdatasync pattern (no chain, tree or index).
//   proofs    inclusion and consistency proofs from the log of --records
//             records (median of 1000 random ones, warm page cache).
//   restart   AuditLog::Open of that log after a clean close, in a child
//             process (its time and its RSS growth), against the same for
//             an empty log; and after a crash (a child appends a batch
//             the index has not committed yet and is SIGKILLed: the next
//             Open reads only the records after the last indexed one).
//
//   audit_bench --records=10000000 --seconds=10 --out=audit.json
//   audit_bench --smoke --out=audit.json      (10^4 records, 1 s)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/file_util.h"
#include "base/signed_note.h"
#include "base/sync.h"
#include "nlohmann/json.hpp"
#include "service/audit_log.h"
#include "service/checkpoint_signer.h"
#include "tests/testing/proc_status.h"

ABSL_FLAG(bool, smoke, false, "tiny sizes, for the test suite");
ABSL_FLAG(int64_t, records, 10'000'000,
          "records in the log for proofs and "
          "restarts");
ABSL_FLAG(double, seconds, 10, "duration of each append run");
ABSL_FLAG(int, reps, 3, "append runs (the median is reported)");
ABSL_FLAG(std::string, out, "", "where to write the JSON results");
ABSL_FLAG(std::string, dir, "",
          "scratch directory (default: a new one in "
          "$TMPDIR or /tmp, removed at exit)");
// Internal: the child processes that measure one Open, and that crash.
ABSL_FLAG(std::string, reopen, "", "");
ABSL_FLAG(std::string, crash, "", "");

namespace modelstate {
namespace {

constexpr int kThreads = 4;
// A call's records are synced together (a build of a GPT-2-sized model
// appends a few hundred before its one Sync).
constexpr int kSyncEvery = 32;

AuditLogOptions OptionsIn(const std::string& dir) {
  AuditLogOptions o;
  o.hashes_path = dir + "/audit.hashes";
  o.checkpoint_path = dir + "/audit.checkpoint";
  o.index_path = dir + "/audit.index";
  return o;
}

AuditRecord MakeRecord(int thread, uint64_t i) {
  AuditRecord r;
  r.type = "registration";
  r.ns = "team";
  r.module = absl::StrCat("model-", i % 64);
  r.identity = absl::StrCat("builder-", thread);
  r.correlation_id = absl::StrCat("req-", i);
  r.outcome = "keep";
  r.details_json =
      absl::StrCat("{\"kind\":\"parameter\",\"name\":\"layers.", i % 48,
                   ".weight\",\"dtype\":\"float32\",\"shape\":[768,768]}");
  return r;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::cerr << "audit_bench: " << what << ": " << s << std::endl;
    std::exit(1);
  }
}

// Appends/s of the real log (tree, index, checkpoint each second).
double AuditAppendRate(const std::string& dir, double seconds) {
  std::filesystem::create_directories(dir);
  absl::StatusOr<std::unique_ptr<AuditLog>> log =
      AuditLog::Open(dir + "/audit.log", OptionsIn(dir));
  Check(log.status(), "open");
  absl::StatusOr<Ed25519PrivateKey> key = Ed25519PrivateKey::Generate();
  Check(key.status(), "key");
  absl::StatusOr<std::unique_ptr<CheckpointSigner>> signer =
      CheckpointSigner::Create(log->get(), *key, CheckpointSignerOptions{});
  Check(signer.status(), "signer");
  (*signer)->Start();
  std::atomic<uint64_t> appended{0};
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 1; absl::Now() < end; ++i) {
        absl::StatusOr<uint64_t> seq = (*log)->Append(MakeRecord(t, i));
        Check(seq.status(), "append");
        if (i % kSyncEvery == 0) Check((*log)->Sync(*seq), "sync");
        appended.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  (*signer)->Stop();
  return appended.load() / elapsed;
}

// Appends/s of the same lines to a plain file: write + shared fdatasync.
double RawAppendRate(const std::string& dir, double seconds) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/raw.log";
  std::FILE* file = std::fopen(path.c_str(), "a");
  const int fd = fileno(file);
  Mutex mu;
  std::atomic<uint64_t> appended{0};
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 1; absl::Now() < end; ++i) {
        const std::string line = AuditLog::Serialize(MakeRecord(t, i)) + "\n";
        {
          MutexLock lock(&mu);
          size_t written = 0;
          Check(WriteAll(fd, line, path, &written), "raw write");
        }
        if (i % kSyncEvery == 0) Check(Fdatasync(fd, path), "raw sync");
        appended.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::fclose(file);
  return appended.load() / elapsed;
}

// A cleanly closed log of `n` records in `dir` (appended unsynced, one
// sync at the end: building it is not what is measured).
void BuildLog(const std::string& dir, uint64_t n) {
  std::filesystem::create_directories(dir);
  absl::StatusOr<std::unique_ptr<AuditLog>> log =
      AuditLog::Open(dir + "/audit.log", OptionsIn(dir));
  Check(log.status(), "open");
  for (uint64_t i = 1; i <= n; ++i) {
    Check(
        (*log)->Append(MakeRecord(static_cast<int>(i % kThreads), i)).status(),
        "append");
  }
  Check((*log)->Sync((*log)->last_seq()), "sync");
}

double MedianMicros(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

nlohmann::json Proofs(const std::string& dir, uint64_t n) {
  absl::StatusOr<std::unique_ptr<AuditLog>> log =
      AuditLog::Open(dir + "/audit.log", OptionsIn(dir));
  Check(log.status(), "open");
  std::mt19937_64 rng(7);
  std::vector<double> inclusion, consistency;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t seq = 1 + rng() % n;
    absl::Time t = absl::Now();
    Check((*log)->InclusionProof(seq, n).status(), "inclusion");
    inclusion.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
    t = absl::Now();
    Check((*log)->ConsistencyProof(seq, n).status(), "consistency");
    consistency.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
  }
  return {{"records", n},
          {"inclusion_us_median", MedianMicros(inclusion)},
          {"consistency_us_median", MedianMicros(consistency)}};
}

// Runs this program as a child that opens the log in `dir` and prints its
// open time and RSS growth as JSON.
nlohmann::json MeasureOpen(const std::string& self, const std::string& dir) {
  const std::string result = dir + "/reopen.json";
  const pid_t pid = fork();
  if (pid == 0) {
    execl(self.c_str(), self.c_str(), ("--reopen=" + dir).c_str(),
          ("--out=" + result).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "audit_bench: the reopen child failed" << std::endl;
    std::exit(1);
  }
  std::ifstream in(result);
  return nlohmann::json::parse(in);
}

// Runs this program as a child that appends to the log in `dir` and is
// killed before it closes it.
void CrashWhileAppending(const std::string& self, const std::string& dir) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(self.c_str(), self.c_str(), ("--crash=" + dir).c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
    std::cerr << "audit_bench: the crashing child did not crash" << std::endl;
    std::exit(1);
  }
}

// One batch short of what the index commits at once (4096 rows): the most
// a crash can leave unindexed.
constexpr int kAppendsBeforeTheCrash = 4095;

int AppendAndCrash(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<AuditLog>> log =
      AuditLog::Open(dir + "/audit.log", OptionsIn(dir));
  Check(log.status(), "open before the crash");
  uint64_t last = 0;
  for (int i = 1; i <= kAppendsBeforeTheCrash; ++i) {
    absl::StatusOr<uint64_t> seq = (*log)->Append(MakeRecord(0, i));
    Check(seq.status(), "append before the crash");
    last = *seq;
  }
  Check((*log)->Sync(last), "sync before the crash");
  raise(SIGKILL);
  return 1;
}

int Reopen(const std::string& dir, const std::string& out) {
  const uint64_t before_kib = testing::ProcStatusBytes(0, "VmRSS") / 1024;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<AuditLog>> log =
      AuditLog::Open(dir + "/audit.log", OptionsIn(dir));
  Check(log.status(), "reopen");
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const uint64_t after_kib = testing::ProcStatusBytes(0, "VmHWM") / 1024;
  nlohmann::json j = {{"open_s", seconds},
                      {"rss_growth_bytes", (after_kib - before_kib) * 1024},
                      {"records", (*log)->last_seq()},
                      {"read_whole_log", !(*log)->read_whole_log().empty()},
                      {"read_after_crash", (*log)->read_after_crash()}};
  std::ofstream(out) << j.dump();
  return 0;
}

int Main(const std::string& self) {
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  const uint64_t n =
      smoke ? 10'000 : static_cast<uint64_t>(absl::GetFlag(FLAGS_records));
  const double seconds = smoke ? 1.0 : absl::GetFlag(FLAGS_seconds);
  const int reps = smoke ? 1 : absl::GetFlag(FLAGS_reps);
  std::string dir = absl::GetFlag(FLAGS_dir);
  const bool own_dir = dir.empty();
  if (own_dir) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/audit_bench.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return 1;
    dir = pattern;
  }
  nlohmann::json out;
  std::vector<double> audit_rates, raw_rates;
  for (int r = 0; r < reps; ++r) {
    // Interleaved, so that drift in the machine hits both alike.
    raw_rates.push_back(RawAppendRate(absl::StrCat(dir, "/raw", r), seconds));
    audit_rates.push_back(
        AuditAppendRate(absl::StrCat(dir, "/appends", r), seconds));
    std::filesystem::remove_all(absl::StrCat(dir, "/raw", r));
    std::filesystem::remove_all(absl::StrCat(dir, "/appends", r));
  }
  out["appends"] = {{"threads", kThreads},
                    {"sync_every", kSyncEvery},
                    {"seconds", seconds},
                    {"reps", reps},
                    {"audit_per_s_median", MedianMicros(audit_rates)},
                    {"raw_per_s_median", MedianMicros(raw_rates)}};
  std::cerr << "[audit_bench] appends: " << out["appends"].dump() << std::endl;

  const std::string empty = dir + "/empty", big = dir + "/big";
  BuildLog(empty, 0);
  const absl::Time build_start = absl::Now();
  BuildLog(big, n);
  out["build_records_per_s"] =
      n / absl::ToDoubleSeconds(absl::Now() - build_start);
  out["proofs"] = Proofs(big, n);
  std::cerr << "[audit_bench] proofs: " << out["proofs"].dump() << std::endl;
  out["restart_empty"] = MeasureOpen(self, empty);
  out["restart"] = MeasureOpen(self, big);
  CrashWhileAppending(self, big);
  out["restart_after_crash"] = MeasureOpen(self, big);
  std::cerr << "[audit_bench] restarts: " << out["restart_empty"].dump() << " "
            << out["restart"].dump() << " " << out["restart_after_crash"].dump()
            << std::endl;
  if (own_dir) std::filesystem::remove_all(dir);
  const std::string path = absl::GetFlag(FLAGS_out);
  if (!path.empty()) std::ofstream(path) << out.dump(2) << "\n";
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace
}  // namespace modelstate

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string reopen = absl::GetFlag(FLAGS_reopen);
  if (!reopen.empty()) {
    return modelstate::Reopen(reopen, absl::GetFlag(FLAGS_out));
  }
  const std::string crash = absl::GetFlag(FLAGS_crash);
  if (!crash.empty()) return modelstate::AppendAndCrash(crash);
  return modelstate::Main("/proc/self/exe");
}
