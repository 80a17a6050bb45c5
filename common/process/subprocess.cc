#include "common/process/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <map>
#include <set>
#include <thread>

namespace trellis {
namespace {

std::string ErrnoText(int err) { return std::string(strerror(err)); }

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

bool IsExecutableFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Everything the child needs, prepared before fork(): after fork() in a multi-threaded
// process only async-signal-safe calls are allowed, so no allocation happens there.
struct ChildPlan {
  std::string exe;
  std::vector<std::string> argv_store, env_store;
  std::vector<char*> argv, envp;
  std::string cwd;
  int stdout_fd = -1;   // to dup2 onto 1; -1: inherit
  int stderr_fd = -1;   // to dup2 onto 2; -1: inherit; -2: same as stdout
  int error_pipe = -1;  // write end; exec failure writes errno here
  int pass_fd = -1;     // to dup2 onto 3; -1: none
};

[[noreturn]] void RunChild(const ChildPlan& plan, pid_t parent) {
  auto fail = [&](int stage) {
    int msg[2] = {stage, errno};
    ssize_t ignored = ::write(plan.error_pipe, msg, sizeof(msg));
    (void)ignored;
    _exit(127);
  };
  // Die with the parent; if it already died between fork() and here, go now.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(1);
  if (::getppid() != parent) _exit(137);
  if (::setpgid(0, 0) != 0) fail(2);
  // Signal state is inherited across fork/exec: give the program a clean one.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(s, SIG_DFL);
  if (plan.stdout_fd >= 0 && ::dup2(plan.stdout_fd, STDOUT_FILENO) < 0) fail(3);
  if (plan.stderr_fd == -2) {
    if (::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) fail(3);
  } else if (plan.stderr_fd >= 0 && ::dup2(plan.stderr_fd, STDERR_FILENO) < 0) {
    fail(3);
  }
  if (!plan.cwd.empty() && ::chdir(plan.cwd.c_str()) != 0) fail(4);
  // The one descriptor handed on (dup2 clears close-on-exec; on itself it does not).
  if (plan.pass_fd == 3) {
    if (::fcntl(3, F_SETFD, 0) != 0) fail(3);
  } else if (plan.pass_fd >= 0 && ::dup2(plan.pass_fd, 3) < 0) {
    fail(3);
  }
  // Descriptors the parent leaked without O_CLOEXEC must not reach the program.
#ifdef SYS_close_range
  syscall(SYS_close_range, plan.pass_fd >= 0 ? 4 : 3, UINT_MAX, 4 /* CLOSE_RANGE_CLOEXEC */);
#endif
  ::execve(plan.exe.c_str(), plan.argv.data(), plan.envp.data());
  fail(5);
  _exit(127);
}

// Opens a redirect target for the child (O_CLOEXEC: only dup2 makes it reach the child).
StatusOr<int> OpenOutput(SpawnOptions::Output mode, const std::string& path, const char* what) {
  if (mode == SpawnOptions::Output::kNull) {
    int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return InternalError(std::string("open /dev/null: ") + ErrnoText(errno));
    return fd;
  }
  if (path.empty()) return InvalidArgumentError(std::string(what) + ": file redirect without a path");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return InvalidArgumentError(std::string(what) + " file " + path + ": " + ErrnoText(errno));
  return fd;
}

// The children Subprocess::Start made and their Subprocess has not waited for yet, and the
// statuses ReapEndedChildren waited for on their behalf. Start inserts under `mu` across fork(),
// and every wait for a child happens under `mu`, so a child is never both unknown and ended
// (its status is never taken by the wrong waiter). Never destroyed: children end at exit too.
struct ChildTable {
  Mutex mu;
  std::set<pid_t> owned GUARDED_BY(mu);
  std::map<pid_t, int> statuses GUARDED_BY(mu);  // waitpid statuses of owned children
};

ChildTable& Children() {
  static ChildTable* table = new ChildTable;
  return *table;
}

class FdCloser {
 public:
  ~FdCloser() {
    for (int fd : fds_) if (fd >= 0) ::close(fd);
  }
  void Add(int fd) { fds_.push_back(fd); }
 private:
  std::vector<int> fds_;
};

}  // namespace

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  if (abbrev == nullptr) return "signal " + std::to_string(signo);
  return std::string("SIG") + abbrev;
}

std::string ExitCodeWithSignal(int exit_code) {
  if (exit_code > 128 && exit_code <= 128 + 64) {
    return std::to_string(exit_code) + " (" + SignalName(exit_code - 128) + ")";
  }
  return std::to_string(exit_code);
}

std::string ExitStatus::Describe() const {
  if (signal != 0) return "killed by " + SignalName(signal) + " (code " + std::to_string(exit_code) + ")";
  return "exited with code " + std::to_string(exit_code);
}

ExitStatus ExitStatusFromWait(int wait_status) {
  ExitStatus s;
  if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
    s.exit_code = 128 + s.signal;
  } else if (WIFEXITED(wait_status)) {
    s.exit_code = WEXITSTATUS(wait_status);
  }
  return s;
}

StatusOr<std::string> FindExecutable(const std::string& name, const std::string& path_list) {
  if (name.empty()) return InvalidArgumentError("empty program name");
  if (name.find('/') != std::string::npos) {
    if (!IsExecutableFile(name)) return NotFoundError("program " + name + ": not an executable file");
    return name;
  }
  size_t start = 0;
  while (start <= path_list.size()) {
    size_t end = path_list.find(':', start);
    if (end == std::string::npos) end = path_list.size();
    std::string dir = path_list.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (IsExecutableFile(candidate)) return candidate;
    start = end + 1;
  }
  return NotFoundError("program " + name + ": not found on PATH (" + path_list + ")");
}

StatusOr<std::string> SelfExeDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return InternalError("readlink /proc/self/exe: " + ErrnoText(errno));
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const SpawnOptions& options) {
  if (options.argv.empty()) return InvalidArgumentError("spawn: empty argv");
  ChildPlan plan;
  std::string path_list = "/usr/local/bin:/usr/bin:/bin";
  if (auto it = options.env.find("PATH"); it != options.env.end()) path_list = it->second;
  TRELLIS_ASSIGN_OR_RETURN(plan.exe, FindExecutable(options.argv[0], path_list));
  if (!options.working_dir.empty()) {
    struct stat st {};
    if (::stat(options.working_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgumentError("working directory " + options.working_dir + ": not a directory");
    }
    plan.cwd = options.working_dir;
  }
  plan.pass_fd = options.pass_fd;
  plan.argv_store = options.argv;
  for (const auto& [k, v] : options.env) plan.env_store.push_back(k + "=" + v);
  for (auto& s : plan.argv_store) plan.argv.push_back(s.data());
  plan.argv.push_back(nullptr);
  for (auto& s : plan.env_store) plan.envp.push_back(s.data());
  plan.envp.push_back(nullptr);

  FdCloser child_side;  // descriptors only the child keeps
  int out_read = -1, err_read = -1;
  using Output = SpawnOptions::Output;
  switch (options.stdout_mode) {
    case Output::kInherit: break;
    case Output::kStdout: return InvalidArgumentError("spawn: stdout cannot be redirected to itself");
    case Output::kPipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) return InternalError("pipe: " + ErrnoText(errno));
      out_read = p[0];
      plan.stdout_fd = p[1];
      child_side.Add(p[1]);
      break;
    }
    case Output::kFile:
    case Output::kNull: {
      TRELLIS_ASSIGN_OR_RETURN(plan.stdout_fd, OpenOutput(options.stdout_mode, options.stdout_path, "stdout"));
      child_side.Add(plan.stdout_fd);
      break;
    }
  }
  switch (options.stderr_mode) {
    case Output::kInherit: break;
    case Output::kStdout: plan.stderr_fd = -2; break;
    case Output::kPipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) {
        if (out_read >= 0) ::close(out_read);
        return InternalError("pipe: " + ErrnoText(errno));
      }
      err_read = p[0];
      plan.stderr_fd = p[1];
      child_side.Add(p[1]);
      break;
    }
    case Output::kFile:
    case Output::kNull: {
      auto fd = OpenOutput(options.stderr_mode, options.stderr_path, "stderr");
      if (!fd.ok()) {
        if (out_read >= 0) ::close(out_read);
        return fd.status();
      }
      plan.stderr_fd = *fd;
      child_side.Add(plan.stderr_fd);
      break;
    }
  }
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return InternalError("pipe: " + ErrnoText(errno));
  plan.error_pipe = err_pipe[1];

  pid_t parent = ::getpid();
  ChildTable& children = Children();
  MutexLock owned_lock(&children.mu);  // the child never touches it
  pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid == 0) RunChild(plan, parent);
  if (pid > 0) children.owned.insert(pid);
  owned_lock.Unlock();
  if (pid < 0) {
    int err = fork_errno;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    if (out_read >= 0) ::close(out_read);
    if (err_read >= 0) ::close(err_read);
    return ResourceExhaustedError("fork: " + ErrnoText(err));
  }

  // Also set the group from the parent side so a signal sent right after Start() reaches it.
  ::setpgid(pid, pid);
  ::close(err_pipe[1]);
  int msg[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(err_pipe[0], msg, sizeof(msg));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(msg))) {
    int ws = 0;
    ::waitpid(pid, &ws, 0);  // ECHILD when ReapEndedChildren was first: its status is dropped below
    {
      MutexLock lock(&children.mu);
      children.owned.erase(pid);
      children.statuses.erase(pid);
    }
    if (out_read >= 0) ::close(out_read);
    if (err_read >= 0) ::close(err_read);
    static constexpr const char* kStages[] = {"", "prctl", "setpgid", "redirect", "chdir", "exec"};
    const char* stage = msg[0] >= 1 && msg[0] <= 5 ? kStages[msg[0]] : "start";
    return InternalError(std::string("cannot start ") + plan.exe + ": " + stage + ": " + ErrnoText(msg[1]));
  }
  int pidfd = PidfdOpen(pid);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pidfd, out_read, err_read));
}

Subprocess::Subprocess(pid_t pid, int pidfd, int stdout_pipe, int stderr_pipe)
    : pid_(pid), pidfd_(pidfd), stdout_pipe_(stdout_pipe), stderr_pipe_(stderr_pipe) {}

Subprocess::~Subprocess() {
  bool running;
  {
    MutexLock lock(&mu_);
    TryReapLocked();
    running = !exit_.has_value();
  }
  if (running) {
    Stop(destructor_grace_);
  } else {
    // The leader is gone; stragglers it left in its group go too. The group id stays reserved
    // while any member lives, so this cannot reach an unrelated process group.
    ::kill(-pid_, SIGKILL);
  }
  if (pidfd_ >= 0) ::close(pidfd_);
  if (stdout_pipe_ >= 0) ::close(stdout_pipe_);
  if (stderr_pipe_ >= 0) ::close(stderr_pipe_);
}

void Subprocess::TryReapLocked() {
  if (exit_) return;
  ChildTable& children = Children();
  MutexLock lock(&children.mu);
  int ws = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &ws, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exit_ = ExitStatusFromWait(ws);
  } else if (r < 0 && errno == ECHILD) {
    if (auto it = children.statuses.find(pid_); it != children.statuses.end()) {
      exit_ = ExitStatusFromWait(it->second);  // ReapEndedChildren waited for it
    } else {
      // Someone else reaped it (should not happen); report it as lost rather than hang.
      exit_ = ExitStatus{255, 0};
    }
  }
  if (exit_) {
    children.owned.erase(pid_);
    children.statuses.erase(pid_);
  }
}

std::optional<ExitStatus> Subprocess::Poll() {
  MutexLock lock(&mu_);
  TryReapLocked();
  return exit_;
}

std::optional<ExitStatus> Subprocess::WaitFor(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (auto s = Poll()) return s;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (pidfd_ >= 0) {
      pollfd pfd{pidfd_, POLLIN, 0};
      int ms = static_cast<int>(std::min<int64_t>(left.count(), INT_MAX));
      ::poll(&pfd, 1, ms);
    } else {
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(5)));
    }
  }
}

Status Subprocess::Signal(int signo) {
  MutexLock lock(&mu_);
  TryReapLocked();
  if (exit_) return FailedPreconditionError("process " + std::to_string(pid_) + " has already exited");
  if (::kill(-pid_, signo) != 0) {
    return InternalError("kill(-" + std::to_string(pid_) + ", " + SignalName(signo) + "): " + ErrnoText(errno));
  }
  return Status::Ok();
}

ExitStatus Subprocess::Stop(std::chrono::milliseconds grace) {
  (void)Signal(SIGTERM);
  if (auto s = WaitFor(grace)) {
    ::kill(-pid_, SIGKILL);  // stragglers in the group
    return *s;
  }
  {
    MutexLock lock(&mu_);
    ::kill(-pid_, SIGKILL);
  }
  while (true) {
    if (auto s = WaitFor(std::chrono::milliseconds(1000))) return *s;
  }
}

int ReapEndedChildren() {
  ChildTable& children = Children();
  MutexLock lock(&children.mu);
  int others = 0;
  while (true) {
    int ws = 0;
    const pid_t r = ::waitpid(-1, &ws, WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // none ended (0), or no children at all (ECHILD)
    if (children.owned.count(r) > 0) {
      children.statuses[r] = ws;  // kept for its Subprocess
    } else {
      ++others;
    }
  }
  return others;
}

StatusOr<std::unique_ptr<Process>> SubprocessSpawner::Spawn(const SpawnOptions& options) {
  TRELLIS_ASSIGN_OR_RETURN(auto p, Subprocess::Start(options));
  return std::unique_ptr<Process>(std::move(p));
}

}  // namespace trellis
