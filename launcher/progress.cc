#include "launcher/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/base/eta.h"

namespace trellis {
namespace {

std::string NodeState(const v1::NodeInfo& n) {
  if (n.pod_name().empty()) return "waiting";
  std::string s;
  if (n.exited()) {
    s = "exited " + std::to_string(n.last_exit_code());
  } else if (n.preempted()) {
    s = "awaiting its replacement pod";
  } else if (n.stalled()) {
    s = "stalled, being restarted";
  } else if (n.dead()) {
    s = "dead";
  } else if (n.role() == v1::ROLE_SERVER) {
    s = n.ready() ? "ready" : "starting";
  } else {
    s = "running";
  }
  if (n.restarts() > 0) s += " (" + std::to_string(n.restarts()) + (n.restarts() == 1 ? " restart)" : " restarts)");
  return s;
}

}  // namespace

std::string FormatProgress(const v1::ClusterView* view) {
  if (view == nullptr) return "waiting for the scheduler";
  int registered = 0, ready = 0;
  for (const auto& s : view->servers()) {
    if (!s.pod_name().empty()) ++registered;
    if (s.ready()) ++ready;
  }
  // An elastic job's worker slots outside its world that never ran are not shown (a grow beyond
  // the first size brings them in).
  const auto& members = view->world().members();
  const auto in_world = [&](int r) {
    return members.empty() || std::find(members.begin(), members.end(), r) != members.end();
  };
  int shown = 0;
  std::string workers;
  for (int r = 0; r < view->workers_size(); ++r) {
    const auto& w = view->workers(r);
    if (w.pod_name().empty() && !in_world(r)) continue;
    if (!w.pod_name().empty()) ++registered;
    workers += (shown++ ? ", " : "") + std::to_string(r) + " " + NodeState(w);
  }
  std::string out = "registered " + std::to_string(registered) + "/" +
                    std::to_string(view->num_servers() + shown);
  if (view->num_servers() > 0) {
    out += " | servers " + std::to_string(ready) + "/" + std::to_string(view->num_servers()) + " ready";
  }
  out += " | workers: " + workers;
  // A stalled program is named with why (docs/scheduler.md#stalls): its agent restarts it.
  for (const auto* nodes : {&view->servers(), &view->workers()}) {
    for (const auto& n : *nodes) {
      if (!n.stalled()) continue;
      out += std::string(" | ") + (n.role() == v1::ROLE_SERVER ? "server " : "worker ") +
             std::to_string(n.rank()) + " (pod " + n.pod_name() + ") STALLED: " + n.stall_reason();
    }
  }
  if (view->failed()) out += " | FAILED: " + view->failure_message();
  return out;
}

namespace {

// 3 significant figures with k/M: "987", "2.46k", "1.20M".
std::string Short(double v) {
  char buf[32];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  } else if (v >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

}  // namespace

std::string FormatTraining(const v1::JobProgress& p) {
  if (!p.reported()) return "";
  std::string out = "step " + std::to_string(p.step());
  if (p.total_steps() > 0) out += "/" + std::to_string(p.total_steps());
  out += " | " + Short(p.samples_per_second()) + " samples/s";
  if (p.has_loss()) out += " | loss " + Short(p.loss());
  if (p.eta_seconds() >= 0) out += " | ETA " + FormatEta(p.eta_seconds());
  if (p.straggler_rank() >= 0) {
    char skew[32];
    std::snprintf(skew, sizeof skew, "%.1fx", p.skew());
    out += " | straggler: worker " + std::to_string(p.straggler_rank()) + " (" + p.straggler_pod() +
           ") " + skew;
  }
  return out;
}

void Console::Write(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd_, s.data() + off, s.size() - off);
    if (n <= 0) return;  // a closed terminal must not stop the job
    off += static_cast<size_t>(n);
  }
}

void Console::Line(std::string_view text) {
  std::string out;
  if (tty_ && !status_.empty()) out += "\r\033[K";
  out.append(text);
  out += "\n";
  if (tty_ && !status_.empty()) out += status_;
  Write(out);
}

void Console::Progress(const std::string& job, const std::string& summary, std::chrono::milliseconds elapsed,
                       const std::string& training) {
  if (quiet_) return;
  if (tty_) {
    // About 5 redraws a second; a changed summary shows at once.
    if (summary == last_summary_ && !status_.empty() && elapsed - last_draw_ < std::chrono::milliseconds(200)) return;
    last_summary_ = summary;
    last_draw_ = elapsed;
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%.1fs", static_cast<double>(elapsed.count()) / 1000.0);
    // Training first: the line is cut at the terminal's width.
    std::string line = "[" + job + " " + secs + "] " + (training.empty() ? "" : training + " | ") + summary;
    const size_t width = static_cast<size_t>(std::max(width_, 20));
    if (line.size() >= width) line = line.substr(0, width - 4) + "...";
    status_ = line;
    Write("\r\033[K" + status_);
    return;
  }
  if (summary != last_summary_) {
    last_summary_ = summary;
    Write("[launch] " + summary + "\n");
  }
  if (training.empty()) return;
  // Who the straggler is, not its skew (which moves every poll).
  const size_t cut = training.find(" | straggler: ");
  const size_t close = training.find(')', cut == std::string::npos ? 0 : cut);
  const std::string straggler = cut == std::string::npos ? "" : training.substr(cut, close - cut);
  if (straggler != last_straggler_ || elapsed - last_training_ >= std::chrono::seconds(10)) {
    last_straggler_ = straggler;
    last_training_ = elapsed;
    Write("[launch] " + training + "\n");
  }
}

void Console::ClearStatus() {
  if (tty_ && !status_.empty()) {
    Write("\r\033[K");
    status_.clear();
  }
}

}  // namespace trellis
