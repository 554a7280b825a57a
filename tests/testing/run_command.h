// File: run_command.h
// Runs a program as a subprocess for tests, capturing its stdout, stderr
// and exit status. stdin is /dev/null; the environment is this process's
// minus MODELSTATE_SERVER (so that a developer's setting cannot leak into a
// test) plus `extra_env`. A child that outlives `timeout` is killed.
//
// Example:
//   CommandResult r = RunCommand({"/bin/echo", "hi"});
//   EXPECT_EQ(r.exit_code, 0);
//   EXPECT_EQ(r.out, "hi\n");
#ifndef MODELSTATE_TESTS_TESTING_RUN_COMMAND_H_
#define MODELSTATE_TESTS_TESTING_RUN_COMMAND_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace modelstate::testing {

struct CommandResult {
  // The exit status, or 128 + the signal that ended the process, or -1 if
  // it could not be started.
  int exit_code = -1;
  std::string out;
  std::string err;
  pid_t pid = -1;
};

inline CommandResult RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env = {},
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  CommandResult result;
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return result;
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  // dup2 clears O_CLOEXEC on the new descriptors; the originals close on
  // exec.
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);

  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MODELSTATE_SERVER=", 18) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> argp;
  for (std::string& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);

  pid_t pid = -1;
  int spawned =
      posix_spawn(&pid, argp[0], &actions, nullptr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (spawned != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = std::string("posix_spawn: ") + std::strerror(spawned);
    return result;
  }
  result.pid = pid;

  // Both pipes are drained together so that a child filling one of them
  // never blocks.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !killed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    int ready = poll(fds, 2, killed ? 1000 : static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[65536];
      ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

// A program running in the background (a subscriber, a tail): its stdout is
// read as lines on demand; stdin is a pipe the test may write to; stderr is
// inherited. Killed (SIGKILL) on destruction if still running.
class BackgroundProcess {
 public:
  explicit BackgroundProcess(const std::vector<std::string>& argv) {
    int out_pipe[2];
    int in_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) return;
    if (pipe2(in_pipe, O_CLOEXEC) != 0) {
      close(out_pipe[0]);
      close(out_pipe[1]);
      return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "MODELSTATE_SERVER=", 18) != 0) env.push_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(),
                    envp.data()) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(out_pipe[1]);
    close(in_pipe[0]);
    out_fd_ = out_pipe[0];
    in_fd_ = in_pipe[1];
  }
  ~BackgroundProcess() {
    Kill(SIGKILL);
    Wait();
    if (out_fd_ >= 0) close(out_fd_);
    if (in_fd_ >= 0) close(in_fd_);
  }
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Reads stdout until a line containing `needle` arrives (true), the
  // process closes stdout, or `timeout` passes (false).
  bool WaitForLine(
      const std::string& needle,
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (size_t i = checked_; i < lines_.size(); ++i) {
        if (lines_[i].find(needle) != std::string::npos) {
          checked_ = i + 1;
          return true;
        }
      }
      checked_ = lines_.size();
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !ReadSome(left)) return false;
    }
  }
  // Every line read so far.
  const std::vector<std::string>& lines() const { return lines_; }

  void WriteLine(const std::string& line) {
    std::string text = line + "\n";
    if (in_fd_ >= 0) (void)!write(in_fd_, text.data(), text.size());
  }
  void Kill(int sig) {
    if (pid_ > 0 && !exited_) kill(pid_, sig);
  }
  // Waits for the process; returns its exit code (128 + signal).
  int Wait() {
    if (pid_ <= 0) return -1;
    if (!exited_) {
      int status = 0;
      waitpid(pid_, &status, 0);
      exited_ = true;
      exit_code_ =
          WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return exit_code_;
  }

 private:
  // Reads what is available within `timeout`; false at end of file.
  bool ReadSome(std::chrono::milliseconds timeout) {
    struct pollfd p = {out_fd_, POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(timeout.count()));
    if (ready <= 0) return ready == 0;
    char buffer[4096];
    ssize_t n = read(out_fd_, buffer, sizeof(buffer));
    if (n <= 0) return false;
    partial_.append(buffer, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      lines_.push_back(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
  std::string partial_;
  std::vector<std::string> lines_;
  size_t checked_ = 0;
};

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_RUN_COMMAND_H_
