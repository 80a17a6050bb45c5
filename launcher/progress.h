// The launcher's console: worker output passed through line by line, and a progress display --
// a live status line on a terminal, plain lines on changes otherwise.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "trellis/v1/scheduler.pb.h"

namespace trellis {

// "registered 5/5 | servers 2/2 ready | workers: 0 running, 1 running (1 restart), 2 exited 0"
// (workers by rank). Without a view yet: "waiting for the scheduler".
std::string FormatProgress(const v1::ClusterView* view);

// Training progress from the scheduler (docs/user-guide.md#progress), "" before any report:
// "step 120/1000 | 2.46k samples/s | loss 0.251 | ETA 1m28s | straggler: worker 1 (mlp-worker-1) 7.5x"
std::string FormatTraining(const v1::JobProgress& progress);

// Writes whole lines to a file descriptor (one write(2) each, so lines never interleave).
class Console {
 public:
  // `tty`: a terminal (live status line); `quiet`: no progress at all.
  Console(int fd, bool tty, bool quiet) : fd_(fd), tty_(tty), quiet_(quiet) {}

  // A line of output (worker output, messages); on a terminal the status line is redrawn below.
  void Line(std::string_view text);
  // Progress: `summary` without time, `elapsed` shown on the live line. Not on a terminal, a
  // line is printed only when `summary` changed.
  // `training` (FormatTraining) leads the live line; not on a terminal it is printed at most
  // every 10 s, and at once when its straggler part changes.
  void Progress(const std::string& job, const std::string& summary, std::chrono::milliseconds elapsed,
                const std::string& training = "");
  // Removes the live status line (before the final messages).
  void ClearStatus();
  // Terminal columns: the live line is cut to fit, or it would wrap and break the redraw.
  void set_width(int columns) { width_ = columns; }

 private:
  void Write(const std::string& s);
  const int fd_;
  const bool tty_;
  const bool quiet_;
  int width_ = 200;
  std::string status_;        // the live line now shown (terminal)
  std::string last_summary_;  // the last shown summary
  std::chrono::milliseconds last_draw_{0};  // when the live line was last drawn (terminal)
  std::chrono::milliseconds last_training_{-100000};  // when training was last printed (no terminal)
  std::string last_straggler_;  // the straggler part last printed (no terminal)
};

}  // namespace trellis
