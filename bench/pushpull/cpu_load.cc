#include "bench/pushpull/cpu_load.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace trellis::bench {
namespace {

Status Errno(const char* what) { return InternalError(std::string(what) + ": " + std::strerror(errno)); }

// The child's whole life: spin until killed. xorshift into a small buffer, so the work is not
// optimized away and touches memory the way real compute does, without a syscall.
[[noreturn]] void Spin(pid_t parent) {
  (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);  // the parent died before prctl took effect
  static uint64_t buffer[8192];       // 64 KiB
  uint64_t x = 88172645463325252ull;
  for (uint64_t i = 0;; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buffer[i % 8192] += x;
    if ((i & 0xffffff) == 0) asm volatile("" : : "r"(buffer[x % 8192]) : "memory");
  }
}

// Waits until `pid` reports stopped (or is gone).
Status WaitStopped(pid_t pid) {
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WUNTRACED);
    if (r == pid && WIFSTOPPED(status)) return Status::Ok();
    if (r == pid) return InternalError("load process " + std::to_string(pid) + " ended");
    if (r < 0 && errno != EINTR) return Errno("waitpid");
  }
}

}  // namespace

StatusOr<std::unique_ptr<CpuLoad>> CpuLoad::Start(int processes) {
  if (processes < 1 || processes > 256) {
    return InvalidArgumentError("load processes must be in [1, 256], got " + std::to_string(processes));
  }
  std::unique_ptr<CpuLoad> load(new CpuLoad());
  const pid_t parent = getpid();
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = fork();
    if (pid < 0) return Errno("fork");
    if (pid == 0) Spin(parent);
    load->children_.push_back(pid);
    if (kill(pid, SIGSTOP) != 0) return Errno("kill(SIGSTOP)");
    TRELLIS_RETURN_IF_ERROR(WaitStopped(pid));
  }
  return load;
}

CpuLoad::~CpuLoad() {
  for (pid_t pid : children_) kill(pid, SIGKILL);
  for (pid_t pid : children_) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

Status CpuLoad::Resume() {
  for (pid_t pid : children_) {
    if (kill(pid, SIGCONT) != 0) return Errno("kill(SIGCONT)");
  }
  return Status::Ok();
}

Status CpuLoad::Pause() {
  for (pid_t pid : children_) {
    if (kill(pid, SIGSTOP) != 0) return Errno("kill(SIGSTOP)");
  }
  for (pid_t pid : children_) TRELLIS_RETURN_IF_ERROR(WaitStopped(pid));
  return Status::Ok();
}

}  // namespace trellis::bench
