#include "examples/mlp/options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

namespace trellis::mlp {
namespace {

StatusOr<int64_t> ParseInt(const std::string& name, const std::string& text, int64_t min) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < min) {
    return InvalidArgumentError("--" + name + ": expected an integer >= " + std::to_string(min) +
                                ", got '" + text + "'");
  }
  return static_cast<int64_t>(v);
}

StatusOr<double> ParseDouble(const std::string& name, const std::string& text, double min,
                             double max) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !(v >= min && v <= max)) {
    std::ostringstream msg;
    msg << "--" << name << ": expected a number in [" << min << ", " << max << "], got '" << text
        << "'";
    return InvalidArgumentError(msg.str());
  }
  return v;
}

StatusOr<std::vector<int64_t>> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    TRELLIS_ASSIGN_OR_RETURN(int64_t v, ParseInt("layers", item, 1));
    sizes.push_back(v);
  }
  if (sizes.size() < 2) {
    return InvalidArgumentError("--layers: expected at least 'input,classes' (e.g. 64,1024,10), got '" +
                                text + "'");
  }
  return sizes;
}

using Setter = std::function<Status(TrainOptions&, const std::string&)>;

const std::map<std::string, Setter>& Setters() {
  static const auto* setters = new std::map<std::string, Setter>{
      {"epochs", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(int64_t x, ParseInt("epochs", v, 1));
         o.epochs = static_cast<int32_t>(x);
         return Status::Ok();
       }},
      {"batch", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.batch, ParseInt("batch", v, 1));
         return Status::Ok();
       }},
      {"lr", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.lr, ParseDouble("lr", v, 1e-9, 100.0));
         return Status::Ok();
       }},
      {"momentum", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.momentum, ParseDouble("momentum", v, 0.0, 0.999));
         return Status::Ok();
       }},
      {"seed", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(int64_t x, ParseInt("seed", v, 0));
         o.seed = static_cast<uint64_t>(x);
         return Status::Ok();
       }},
      {"data-seed", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(int64_t x, ParseInt("data-seed", v, 0));
         o.task.seed = static_cast<uint64_t>(x);
         return Status::Ok();
       }},
      {"target-accuracy", [](TrainOptions& o, const std::string& v) -> Status {
         // Accepts a fraction (0.9) or a percentage (90).
         TRELLIS_ASSIGN_OR_RETURN(double x, ParseDouble("target-accuracy", v, 0.0, 100.0));
         o.target_accuracy = x > 1.0 ? x / 100.0 : x;
         return Status::Ok();
       }},
      {"train-samples", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.train_samples, ParseInt("train-samples", v, 1));
         return Status::Ok();
       }},
      {"test-samples", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.test_samples, ParseInt("test-samples", v, 1));
         return Status::Ok();
       }},
      {"label-noise", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.task.label_noise, ParseDouble("label-noise", v, 0.0, 1.0));
         return Status::Ok();
       }},
      {"teacher-hidden", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.task.teacher_hidden, ParseInt("teacher-hidden", v, 0));
         return Status::Ok();
       }},
      {"latent-dim", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.task.latent_dim, ParseInt("latent-dim", v, 0));
         if (o.task.latent_dim > 256) return InvalidArgumentError("--latent-dim: at most 256, got '" + v + "'");
         return Status::Ok();
       }},
      {"min-margin", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.task.min_margin, ParseDouble("min-margin", v, 0.0, 10.0));
         return Status::Ok();
       }},
      {"stop-at-step", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.stop_at_step, ParseInt("stop-at-step", v, 0));
         return Status::Ok();
       }},
      {"slow-rank", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(int64_t r, ParseInt("slow-rank", v, 0));
         if (r > 100000) return InvalidArgumentError("--slow-rank: at most 100000, got '" + v + "'");
         o.slow_rank = static_cast<int32_t>(r);
         return Status::Ok();
       }},
      {"step-sleep-ms", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.step_sleep_ms, ParseInt("step-sleep-ms", v, 0));
         if (o.step_sleep_ms > 60000) return InvalidArgumentError("--step-sleep-ms: at most 60000, got '" + v + "'");
         return Status::Ok();
       }},
      {"layers", [](TrainOptions& o, const std::string& v) -> Status {
         TRELLIS_ASSIGN_OR_RETURN(o.sizes, ParseSizes(v));
         return Status::Ok();
       }},
  };
  return *setters;
}

std::string EnvName(const std::string& flag) {
  // The example's own options (not a variable the parts of Trellis exchange: those are in
  // common/config/env_names.h).
  std::string name = "TRELLIS_MLP_";
  for (char c : flag) name += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return name;
}

}  // namespace

StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args) {
  TrainOptions options;
  // Environment first, so flags parsed afterwards override it.
  for (const auto& [flag, set] : Setters()) {
    const std::string env = EnvName(flag);
    if (const char* v = std::getenv(env.c_str()); v != nullptr && *v != '\0') {
      if (Status s = set(options, v); !s.ok()) return s.Annotate(env);
    }
  }
  if (const char* v = std::getenv(EnvName("local").c_str()); v != nullptr && std::string(v) == "1") {
    options.local = true;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      options.help = true;
      continue;
    }
    if (arg == "--local") {
      options.local = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) return InvalidArgumentError("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2), value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) return InvalidArgumentError("--" + name + ": missing value");
      value = args[++i];
    }
    const auto it = Setters().find(name);
    if (it == Setters().end()) {
      return InvalidArgumentError("unknown flag --" + name + " (see --help)");
    }
    TRELLIS_RETURN_IF_ERROR(it->second(options, value));
  }
  if (options.sizes[0] != options.task.input_dim) {
    // The task's input width follows the model's.
    options.task.input_dim = options.sizes[0];
  }
  options.task.classes = options.sizes.back();
  if (options.task.classes < 2) {
    return InvalidArgumentError("--layers: the last size is the number of classes, must be >= 2");
  }
  return options;
}

std::string TrainUsage() {
  return R"(trellis-mlp: data-parallel MLP on a synthetic teacher task (see docs/user-guide.md)

  --epochs N            passes over the training set (default 3)
  --batch N             samples per worker per step (default 64)
  --lr X                SGD learning rate (default 0.03)
  --momentum X          SGD momentum in [0, 0.999] (default 0.9)
  --seed N              initial weights and shuffling (default 1)
  --data-seed N         teacher network and data (default 7)
  --target-accuracy X   test accuracy to reach, fraction or percent (default 0.90);
                        the exit code is 1 when rank 0 misses it
  --train-samples N     training set size, split across workers (default 32768)
  --test-samples N      held-out test set size (default 2048)
  --label-noise X       fraction of training labels replaced at random (default 0)
  --teacher-hidden N    hidden width of the teacher; 0 = linear teacher (default 64)
  --latent-dim N        inputs lie near a random N-dim subspace; 0 = full (default 16)
  --min-margin X        redraw samples whose teacher top-2 logit gap is below X (default 0.3)
  --layers A,B,...      layer sizes, input first, classes last (default 64,1024,768,256,10)
  --stop-at-step N      end (exit 0) after global step N, e.g. right after a checkpoint
  --slow-rank R         worker rank R sleeps --step-sleep-ms per step: a straggler on purpose
  --step-sleep-ms MS    (for seeing the Straggler condition; default none)
  --local               train in this process without Trellis (same data and math)

Checkpoints: with the job's spec.checkpoint.path set, rank 0 saves the weights and momentum every
spec.checkpoint.intervalSteps steps, and a (re)started job resumes from the newest good one.

Every flag can also come from the environment as TRELLIS_MLP_<FLAG> (e.g. TRELLIS_MLP_EPOCHS=3,
TRELLIS_MLP_LOCAL=1); a flag wins.
)";
}

}  // namespace trellis::mlp
