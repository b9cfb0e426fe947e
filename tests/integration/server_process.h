// Starts a real fusebox-server as a child process on a free port (--address=
// 127.0.0.1:0), reads the port from its "listening on" line, and always stops it:
// SIGTERM on Stop(), SIGKILL from the destructor or when the test process dies.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace fusebox::testing {

// Path of the server binary: $FUSEBOX_SERVER_BIN, else the compile-time default.
inline std::string ServerBinary() {
  if (const char* env = std::getenv("FUSEBOX_SERVER_BIN")) return env;
#ifdef FUSEBOX_SERVER_PATH
  return FUSEBOX_SERVER_PATH;
#else
  return "fusebox-server";
#endif
}

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Kill(); }

  // Starts the server; false (with error()) if it does not announce its port in time.
  bool Start(std::vector<std::string> extra_args = {},
             std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::vector<std::string> args = {ServerBinary(), "--address=127.0.0.1:0", "--backend=cpu"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Fail("pipe failed");
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return Fail("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      if (getppid() != parent) _exit(127);
      dup2(fds[1], STDOUT_FILENO);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];

    // Read until the first newline (or timeout / EOF).
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string line;
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Fail("server did not print its address within the timeout");
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) return Fail("server exited before announcing its address (" + ServerBinary() + ")");
      line.append(buf, static_cast<size_t>(n));
    }
    first_line_ = line.substr(0, line.find('\n'));
    std::smatch m;
    static const std::regex re(R"(listening on (\S+):(\d+))");
    if (!std::regex_search(first_line_, m, re)) return Fail("cannot parse: " + first_line_);
    port_ = std::stoi(m[2]);
    // Keep draining stdout so the server never blocks on a full pipe.
    drain_ = std::thread([fd = out_fd_] {
      char buf[4096];
      while (read(fd, buf, sizeof buf) > 0) {
      }
    });
    return true;
  }

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& first_line() const { return first_line_; }
  const std::string& error() const { return error_; }
  pid_t pid() const { return pid_; }

  // Sends SIGTERM and waits; returns the exit status (-1 = killed / timed out / signal).
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        Cleanup();
        return exit_status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Kill();
    return -1;
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    Cleanup();
  }

 private:
  bool Fail(const std::string& why) {
    error_ = why;
    Kill();
    return false;
  }
  void Cleanup() {
    if (drain_.joinable()) drain_.join();  // the child is gone, so the pipe hits EOF
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  int exit_status_ = -1;
  std::string first_line_, error_;
  std::thread drain_;
};

}  // namespace fusebox::testing
