// trellis-launch JOB.yaml: runs a TrainingJob on this machine. See launcher/plan.h for usage.
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "common/process/exit_codes.h"
#include "common/base/logging.h"
#include "launcher/launcher.h"
#include "launcher/resize_command.h"

int main(int argc, char** argv) {
  using namespace trellis;
  SetLogTag("launch");
  // SIGINT/SIGTERM are read from a signalfd by the event loop; block them before any thread
  // exists so none of them takes the signal. Children get a clean mask (common/process/subprocess.cc).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher before it cleans up

  // trellis-launch resize RUN_DIR WORKERS (or --servers SERVERS): a running elastic job
  // (docs/elastic.md).
  if (argc >= 2 && std::string(argv[1]) == "resize") {
    return RunResizeCommand(std::vector<std::string>(argv + 2, argv + argc), std::cout, std::cerr);
  }
  auto options = ParseLaunchArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::fprintf(stderr, "trellis-launch: %s\n%s", options.status().message().c_str(), LaunchHelp().c_str());
    return kExitUsage;
  }
  if (options->help) {
    std::fputs(LaunchHelp().c_str(), stdout);
    return kExitOk;
  }
  StatusOr<JobSpec> job = options->command.empty() ? LoadJobSpecFile(options->job_file)
                                                   : JobFromCommand(options->job_flags, options->command);
  if (job.ok() && !options->command.empty()) {
    // The job it runs, as a file one can keep and run again (trellis-launch FILE) or kubectl apply.
    std::printf("# trellis-launch: the job built from the command line\n%s---\n",
                JobSpecToYaml(*job).c_str());
    std::fflush(stdout);
  } else if (job.ok() && options->job_flags.any()) {
    job = ApplyJobFlags(std::move(job).value(), options->job_flags);
  }
  if (!job.ok()) {
    std::fprintf(stderr, "trellis-launch: %s\n", job.status().message().c_str());
    return kExitUsage;
  }
  int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) {
    std::perror("trellis-launch: signalfd");
    return kExitFailure;
  }
  Console console(STDOUT_FILENO, isatty(STDOUT_FILENO) == 1, options->quiet);
  if (winsize ws{}; ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) console.set_width(ws.ws_col);
  int code;
  {
    Launcher launcher(*options, *job, sfd, console);
    code = launcher.Run();
  }
  close(sfd);
  return code;
}
