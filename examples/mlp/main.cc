// trellis-mlp: the demo training program (see docs/user-guide.md). Parses flags, picks the
// exchange (Trellis, or --local for a single process) and runs the trainer.
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "examples/mlp/exchange.h"
#include "examples/mlp/options.h"
#include "examples/mlp/trainer.h"
#ifdef TRELLIS_MLP_HAVE_TRELLIS
#include "examples/mlp/trellis_exchange.h"
#endif

int main(int argc, char** argv) {
  using namespace trellis::mlp;
  trellis::SetLogTag("mlp");
  auto options = ParseTrainOptions(std::vector<std::string>(argv + 1, argv + argc));
  if (!options.ok()) {
    std::cerr << "trellis-mlp: " << options.status().message() << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << TrainUsage();
    return 0;
  }

  std::unique_ptr<Exchange> exchange;
  if (options->local) {
    exchange = std::make_unique<LocalExchange>();
  } else {
#ifdef TRELLIS_MLP_HAVE_TRELLIS
    auto trellis_exchange = TrellisExchange::Create();
    if (!trellis_exchange.ok()) {
      std::cerr << "trellis-mlp: cannot join the job: " << trellis_exchange.status().ToString()
                << "\n(run it under trellis-launch, or pass --local to train in this process)\n";
      return 3;
    }
    exchange = std::move(trellis_exchange).value();
#else
    std::cerr << "trellis-mlp: built without libtrellis; only --local is available\n";
    return 3;
#endif
  }

  Mlp model(options->sizes);
  TrainOutput output{&std::cout, isatty(STDOUT_FILENO) == 1};
  auto report = Train(*options, *exchange, model, output);
  if (!report.ok()) {
    std::cerr << "trellis-mlp (rank " << exchange->rank() << "): " << report.status().ToString()
              << "\n";
    return 4;
  }
  if (report->left) return 0;  // an elastic job resized without this worker (docs/elastic.md)
  if (exchange->rank() == 0 && !report->stopped && !report->reached_target) return 1;
  return 0;
}
