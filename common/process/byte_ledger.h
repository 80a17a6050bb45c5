// A worker rank's data-path byte counts that outlive its program (docs/user-guide.md#byte-totals).
// The agent owns one small shared-memory page (a memfd) per rank and hands it to every start of
// the program as descriptor 3 (TRELLIS_LEDGER_FD=3). The program adds what it moves into the
// page's `live` counters as it goes; when the program ends, however it ends (a SIGKILL
// included), the agent folds `live` into `ended`. A restarted program's totals are then `ended`
// (its killed predecessors' bytes, none lost) plus its own: exact across restarts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/config/env_names.h"
#include "common/base/status.h"

namespace trellis {

inline constexpr auto& kLedgerFdEnv = kEnvLedgerFd;  // the older spelling (tests, benchmarks)
inline constexpr int kLedgerChildFd = 3;  // where the agent puts the page in the program

class ByteLedger {
 public:
  // The agent's side: a fresh page (memfd, zeroed). The descriptor stays with the ledger.
  static StatusOr<std::unique_ptr<ByteLedger>> Create();
  // The program's side: the page its agent handed it (TRELLIS_LEDGER_FD), mapped once per
  // process; nullptr when the variable is unset or names no ledger page (a program not under an
  // agent, a test). Never fails the program: a bad descriptor is logged once and ignored.
  static ByteLedger* ForThisProgram();
  ~ByteLedger();
  ByteLedger(const ByteLedger&) = delete;
  ByteLedger& operator=(const ByteLedger&) = delete;

  int fd() const { return fd_; }
  // The program: bytes it moved just now.
  void AddPushed(uint64_t n) { page_->live_pushed.fetch_add(n, std::memory_order_relaxed); }
  void AddPulled(uint64_t n) { page_->live_pulled.fetch_add(n, std::memory_order_relaxed); }
  // The agent, once the program has ended (nothing writes `live` then): ended += live, live = 0.
  void FoldEnded();
  // What the rank's earlier (ended) programs moved, and how many of them there were.
  uint64_t ended_pushed() const { return page_->ended_pushed.load(); }
  uint64_t ended_pulled() const { return page_->ended_pulled.load(); }
  uint64_t ended_programs() const { return page_->ended_programs.load(); }
  uint64_t live_pushed() const { return page_->live_pushed.load(); }
  uint64_t live_pulled() const { return page_->live_pulled.load(); }

 private:
  // 64-bit lock-free atomics are address-free, so both processes may use them in shared memory.
  struct Page {
    uint64_t magic;
    std::atomic<uint64_t> live_pushed, live_pulled;          // the running program adds
    std::atomic<uint64_t> ended_pushed, ended_pulled;        // the agent folds into
    std::atomic<uint64_t> ended_programs;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  ByteLedger(int fd, Page* page) : fd_(fd), page_(page) {}
  static StatusOr<Page*> Map(int fd, bool fresh);

  const int fd_;      // owned
  Page* const page_;  // mapped, shared
};

}  // namespace trellis
