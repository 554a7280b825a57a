// File: server_process.h
// Runs a server binary as a child process on 127.0.0.1 with a free port
// (chosen by the server: --listen=127.0.0.1:0, reported via --ready_file)
// and a fresh temporary directory; stops it with a signal. Integration tests
// use it through TestServer (test_server.h); benchmarks directly.
//
// Example:
//   ServerProcess server("/path/modelstate-server", {"--max_tensor_mib=64"});
//   absl::Status started = server.Start();
//   std::unique_ptr<client::ModelStateClient> c = server.NewClient();
#ifndef MODELSTATE_TESTS_TESTING_SERVER_PROCESS_H_
#define MODELSTATE_TESTS_TESTING_SERVER_PROCESS_H_

#include <fcntl.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/model_state_client.h"

namespace modelstate::testing {

class ServerProcess {
 public:
  // Runs `binary` with --listen=127.0.0.1:0, --ready_file=<dir>/ready,
  // --data_dir=<dir>/data when `data_dir`, then `flags` as they are.
  ServerProcess(std::string binary, std::vector<std::string> flags,
                bool data_dir = true)
      : binary_(std::move(binary)),
        flags_(std::move(flags)),
        pass_data_dir_(data_dir) {
    static std::atomic<int> counter{0};
    dir_ =
        std::filesystem::temp_directory_path() /
        absl::StrCat("modelstate-test-", getpid(), "-", counter.fetch_add(1));
    std::filesystem::create_directories(dir_);
  }
  ~ServerProcess() {
    Stop();
    std::error_code ignored;
    if (!keep_dir_) std::filesystem::remove_all(dir_, ignored);
  }

  // Launches the server and waits (up to 60 s) until it serves.
  absl::Status Start() {
    std::filesystem::path ready = dir_ / "ready";
    std::filesystem::remove(ready);
    std::vector<std::string> args = {binary_, "--listen=127.0.0.1:0",
                                     "--ready_file=" + ready.string()};
    if (pass_data_dir_) args.push_back("--data_dir=" + data_dir().string());
    args.insert(args.end(), flags_.begin(), flags_.end());
    // Prepared before fork: the child of a threaded process must not
    // allocate.
    const std::string log_file = log_path().string();
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) return absl::InternalError("fork failed");
    if (pid_ == 0) {
      // The server's log goes to a file the test can read (and show).
      int log = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
      if (max_file_bytes_ > 0) {
        struct rlimit limit = {max_file_bytes_, max_file_bytes_};
        setrlimit(RLIMIT_FSIZE, &limit);
      }
      if (max_data_bytes_ > 0) {
        struct rlimit limit = {max_data_bytes_, max_data_bytes_};
        setrlimit(RLIMIT_DATA, &limit);
      }
      // Root keeps only the capabilities of its bounding set across exec;
      // anyone else never had this one.
      if (without_ptrace_) prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(ready);
      if (in >> address_) return absl::OkStatus();
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("server exited early, status ",
                                                status, "; its log:\n", Log()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::DeadlineExceededError("server did not become ready");
  }

  // Sends `sig` and waits for the process (SIGKILL after `grace`). Returns
  // the exit status from waitpid, or -1 if nothing was running.
  int Stop(int sig = SIGTERM,
           std::chrono::seconds grace = std::chrono::seconds(30)) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    auto deadline = std::chrono::steady_clock::now() + grace;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  // Flags for the next Start() (the data directory stays).
  void set_flags(std::vector<std::string> flags) { flags_ = std::move(flags); }
  // Files the server writes may not grow beyond `bytes` (RLIMIT_FSIZE, set
  // in the child before exec; 0: no limit). Takes effect at the next Start.
  void set_max_file_bytes(rlim_t bytes) { max_file_bytes_ = bytes; }
  // The server's private writable memory (heap, anonymous mappings, thread
  // stacks) may not exceed `bytes` (RLIMIT_DATA; 0: no limit); files it
  // maps read-only do not count. Takes effect at the next Start.
  void set_max_data_bytes(rlim_t bytes) { max_data_bytes_ = bytes; }
  // The server may not write (or read) other processes' memory unless the
  // kernel allows it without CAP_SYS_PTRACE, which it runs without. Takes
  // effect at the next Start.
  void set_without_ptrace(bool without) { without_ptrace_ = without; }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path data_dir() const { return dir_ / "data"; }
  void keep_dir() { keep_dir_ = true; }
  // Everything the server wrote to stderr, over all its starts.
  std::filesystem::path log_path() const { return dir_ / "server.log"; }
  std::string Log() const {
    std::ifstream in(log_path());
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::unique_ptr<client::ModelStateClient> NewClient(
      client::ClientOptions options = {}) const {
    absl::StatusOr<std::unique_ptr<client::ModelStateClient>> c =
        client::ModelStateClient::Connect(address_, std::move(options));
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  std::string binary_;
  std::vector<std::string> flags_;
  bool pass_data_dir_;
  rlim_t max_data_bytes_ = 0;
  bool without_ptrace_ = false;
  rlim_t max_file_bytes_ = 0;
  std::filesystem::path dir_;
  std::string address_;
  pid_t pid_ = -1;
  bool keep_dir_ = false;
};

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_SERVER_PROCESS_H_
