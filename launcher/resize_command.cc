#include "launcher/resize_command.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include "common/base/file_util.h"
#include "common/process/exit_codes.h"
#include "common/tls/auth.h"
#include "scheduler/scheduler_client.h"

namespace trellis {
namespace {

using std::chrono::milliseconds;

constexpr char kClientFile[] = "scheduler.client";
constexpr size_t kMaxClientFileBytes = 16 << 10;  // five short lines; anything bigger is not ours

StatusOr<std::map<std::string, std::string>> ReadClientFile(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kClientFile;
  auto text = ReadFileLimited(path, kMaxClientFileBytes);
  if (text.status().code() == StatusCode::kNotFound) {
    return NotFoundError(path + " not found: RUN_DIR is the directory a running trellis-launch " +
                         "printed (its --log-dir), and the job must be running");
  }
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> fields;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  if (fields["address"].empty()) return InvalidArgumentError(path + ": no address line");
  return fields;
}

// A call's error, with a hint when the scheduler did not answer: the run directory outlives the
// job (the launcher keeps its logs), so a job that ended looks like this.
std::string Unanswered(const Status& st) {
  const bool gone = st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded;
  return st.message() + (gone ? " (the job's scheduler does not answer: has the job ended? its trellis-launch says)" : "");
}

}  // namespace

Status WriteSchedulerClientFile(const std::string& run_dir, const std::string& address,
                                const TlsFiles& tls) {
  std::string text = "address=" + address + "\n";
  if (tls.enabled()) {
    text += "ca=" + tls.ca_file + "\ncert=" + tls.cert_file + "\nkey=" + tls.key_file +
            "\nserver_name=" + tls.server_name + "\n";
  }
  return WriteFileAtomic(run_dir + "/" + kClientFile, text);
}

int RunResizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                     milliseconds wait) {
  // RUN_DIR WORKERS, or RUN_DIR --servers SERVERS.
  const bool servers = args.size() == 3 && args[1] == "--servers";
  // A flag where WORKERS goes ("--servers" without its count, any other) is no count either.
  const bool flag = args.size() == 2 && args[1].rfind("--", 0) == 0;
  if ((args.size() != 2 && !servers) || flag) {
    err << "usage: trellis-launch resize RUN_DIR WORKERS\n"
           "       trellis-launch resize RUN_DIR --servers SERVERS\n"
           "  Resizes a running elastic job (spec.elastic) to WORKERS workers, or its parameter\n"
           "  servers to SERVERS (within minServers, maxServers); RUN_DIR is the directory its\n"
           "  trellis-launch keeps the logs in (--log-dir). docs/elastic.md\n";
    return kExitUsage;
  }
  const std::string& run_dir = args[0];
  const std::string& count_arg = args.back();
  const char* what = servers ? "servers" : "workers";
  int count = 0;
  {
    size_t used = 0;
    try {
      count = std::stoi(count_arg, &used);
    } catch (...) {
      used = 0;
    }
    if (used != count_arg.size() || count < 1) {
      err << "trellis-launch resize: " << (servers ? "SERVERS" : "WORKERS") << " must be a number >= 1, got '"
          << count_arg << "'\n";
      return kExitUsage;
    }
  }
  auto fields = ReadClientFile(run_dir);
  if (!fields.ok()) {
    err << "trellis-launch resize: " << fields.status().message() << "\n";
    return kExitUsage;
  }
  SchedulerClientOptions o;
  o.address = (*fields)["address"];
  o.rpc_timeout = milliseconds(5000);
  if (auto token = ReadTokenFile(run_dir + "/token"); token.ok()) o.token = *token;
  if (!(*fields)["ca"].empty()) {
    TlsFiles files;
    files.ca_file = (*fields)["ca"];
    files.cert_file = (*fields)["cert"];
    files.key_file = (*fields)["key"];
    if (!(*fields)["server_name"].empty()) files.server_name = (*fields)["server_name"];
    auto tls = LoadTls(files);
    if (!tls.ok()) {
      err << "trellis-launch resize: " << tls.status().message() << "\n";
      return kExitFailure;
    }
    o.tls = *tls;
  }
  auto client = SchedulerClient::Connect(o);
  if (!client.ok()) {
    err << "trellis-launch resize: " << Unanswered(client.status()) << "\n";
    return kExitFailure;
  }
  const auto asked = std::chrono::steady_clock::now();
  auto resized = servers ? (*client)->Resize(0, "trellis-launch resize", count)
                         : (*client)->Resize(count, "trellis-launch resize");
  if (!resized.ok()) {
    err << "trellis-launch resize: " << Unanswered(resized.status()) << "\n";
    return kExitFailure;
  }
  if (resized->epoch() == resized->current().epoch()) {
    out << "trellis-launch resize: the job already has " << count << " " << what << "\n";
    return kExitOk;
  }
  const int from = servers ? resized->current().servers() : resized->current().members_size();
  out << "trellis-launch resize: " << (from > 0 ? std::to_string(from) + " -> " : std::string("")) << count << " "
      << what << " asked for; waiting for "
      << (servers && (from == 0 || count > from) ? "the servers added, then the workers' next step boundary"
                                                  : "the workers' next step boundary")
      << "\n"
      << std::flush;
  const auto deadline = asked + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    auto progress = (*client)->GetProgress();
    if (progress.ok() && progress->world().epoch() >= resized->epoch()) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
      char line[200];
      std::snprintf(line, sizeof line,
                    "trellis-launch resize: %d %s from step %lld (decided %.2f s after it "
                    "was asked for)\n",
                    servers ? progress->world().servers() : progress->world().members_size(), what,
                    static_cast<long long>(progress->world().from_step()), secs);
      out << line;
      return kExitOk;
    }
    if (progress.ok() && progress->resize_pending_epoch() == 0) {
      err << "trellis-launch resize: the job's scheduler gave the resize up (a worker or server joining "
             "did not start in time, or no worker reached a step boundary in time: "
          << run_dir << "/scheduler.log says why); the job runs on as it was\n";
      return kExitFailure;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  err << "trellis-launch resize: not decided within " << wait.count() / 1000
      << " s: the workers reach a step boundary only in Checkpointer::EndStep or Commit "
         "(docs/elastic.md)\n";
  return kExitFailure;
}

}  // namespace trellis
