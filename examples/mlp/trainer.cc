#include "examples/mlp/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>

#include "examples/mlp/dataset.h"
#include "examples/mlp/rng.h"

namespace trellis::mlp {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", fraction * 100.0);
  return buf;
}

std::string Bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  }
  return buf;
}

std::string Bar(int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : kWidth;
  return "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "]";
}

// SGD with momentum for one layer; `sum` is the gradient summed over `world` workers.
void ApplyUpdate(float* params, float* velocity, const float* sum, int64_t n, float lr,
                 float momentum, float inv_world) {
  for (int64_t i = 0; i < n; ++i) {
    velocity[i] = momentum * velocity[i] + sum[i] * inv_world;
    params[i] -= lr * velocity[i];
  }
}

// Where a restored step lies in the epochs of this run (`steps_per_epoch`: its own, for the
// world it runs in now), from the position kept with it (exchange.h). The step after it is placed
// at the same fraction of its epoch as the run that kept it counted, as a resize does
// (docs/elastic.md): every worker of the job computes the same, so their epochs end together.
struct Resumed {
  int epoch = 0;            // 0: no position kept (a fresh start)
  int64_t epoch_first = 0;  // the global steps done before that epoch (a resize's count: may be < 0)
  int64_t first_step = 0;   // the index in that epoch of the step after the restored one (may be -1)
};

StatusOr<Resumed> Resume(int64_t resume_after, const std::vector<float>& position, int64_t steps_per_epoch,
                         int epochs) {
  Resumed r;
  if (resume_after <= 0 || position.size() < kPositionSlots || position[0] == 0.0f) return r;
  const double e = position[0], first = position[1], per = position[2];
  // Kept by this program, or read from a checkpoint file: checked like any input.
  if (!(e >= 1 && e <= 1e6 && e == static_cast<int>(e)) || !(first > -1e9 && first <= resume_after) ||
      !(per >= 1 && per <= 1e9) || first != static_cast<int64_t>(first) || per != static_cast<int64_t>(per)) {
    return DataLossError("the restored position (epoch " + std::to_string(e) + ", first step " +
                         std::to_string(first) + ", " + std::to_string(per) + " steps per epoch) does not fit step " +
                         std::to_string(resume_after) + " of a " + std::to_string(epochs) + "-epoch job");
  }
  r.epoch = static_cast<int>(e);
  int64_t epoch_first = static_cast<int64_t>(first), then = static_cast<int64_t>(per);
  const int64_t next_global = resume_after + 1;
  if (next_global - epoch_first > then) {  // kept at the end of its epoch: the next one begins
    ++r.epoch;
    epoch_first += then;
  }
  const double done = static_cast<double>(next_global - epoch_first) / static_cast<double>(then);
  const int64_t next = std::min<int64_t>(
      steps_per_epoch, static_cast<int64_t>(done * static_cast<double>(steps_per_epoch) + 0.5));
  r.epoch_first = next_global - next;
  r.first_step = next - 1;
  return r;
}

}  // namespace

StatusOr<TrainReport> Train(const TrainOptions& options, Exchange& exchange, Mlp& model,
                            const TrainOutput& output) {
  const Clock::time_point wall_start = Clock::now();
  // An elastic job's resize changes rank and world at a commit point (docs/elastic.md): the
  // trainer re-shards its data then, and only rank 0 of the moment talks.
  int rank = exchange.rank();
  int world = exchange.world();
  bool talk = rank == 0 && output.out != nullptr;
  std::ostream discard(nullptr);  // no buffer: swallows output on silent ranks
  std::ostream* out_stream = talk ? output.out : &discard;
  auto out = [&]() -> std::ostream& { return *out_stream; };
  if (model.sizes() != options.sizes) {
    return InvalidArgumentError("model shape does not match --layers");
  }
  if (rank < 0 || rank >= world) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(world) + ")");
  }

  const Dataset full_train = MakeTrainSet(options.task, options.train_samples);
  Dataset train = Shard(full_train, rank, world);
  // Every worker may become rank 0 after a resize, and rank 0 evaluates.
  const Dataset test = MakeTestSet(options.task, options.test_samples);
  const int64_t batch = options.batch;
  int64_t steps_per_epoch = train.size / batch;
  if (steps_per_epoch < 1) {
    return InvalidArgumentError("--train-samples " + std::to_string(options.train_samples) +
                                " gives " + std::to_string(train.size) + " samples per worker (" +
                                std::to_string(world) + " workers), fewer than --batch " +
                                std::to_string(batch));
  }

  int64_t total_steps =
      options.stop_at_step > 0 ? std::min(options.stop_at_step, steps_per_epoch * options.epochs)
                               : steps_per_epoch * options.epochs;
  const int layers = model.num_layers();
  std::vector<std::vector<float>> velocity(layers);
  for (int l = 0; l < layers; ++l) velocity[l].assign(model.layer_size(l), 0.0f);
  // Each worker starts from its own seed; Setup makes everyone equal to rank 0 (or to rank 0's
  // checkpoint, and then training resumes after the step it was saved at).
  model.Init(MixSeed(options.seed, 10 + static_cast<uint64_t>(rank)));
  std::vector<float> position(kPositionSlots, 0.0f);
  auto setup = exchange.Setup(model, velocity, position);
  if (!setup.ok()) return setup.status().Annotate("setting up keys and initial weights");
  const int64_t resume_after = *setup;
  TRELLIS_ASSIGN_OR_RETURN(const Resumed resumed,
                           Resume(resume_after, position, steps_per_epoch, options.epochs));
  if (resumed.epoch > 0) {
    const int64_t planned = resumed.epoch_first + steps_per_epoch * (options.epochs - resumed.epoch + 1);
    total_steps = options.stop_at_step > 0 ? std::min(options.stop_at_step, planned) : planned;
  }
  // What a commit or a checkpoint keeps of where training stands (exchange.h).
  auto keep_position = [&](int epoch, int64_t epoch_first) {
    position = {static_cast<float>(epoch), static_cast<float>(epoch_first), static_cast<float>(steps_per_epoch)};
  };
  std::vector<bool> pending(layers, false);
  const float lr = static_cast<float>(options.lr);
  const float momentum = static_cast<float>(options.momentum);
  float inv_world = 1.0f / static_cast<float>(world);

  Status comm_error;  // first communication failure, checked after each forward/backward
  auto finish_layer = [&](int l) {
    if (!pending[l]) return;
    pending[l] = false;
    Status s = exchange.Wait(l);
    if (!s.ok()) {
      if (comm_error.ok()) comm_error = s.Annotate("layer " + std::to_string(l));
      return;
    }
    if (exchange.ReturnsWeights()) {
      // Update mode: the servers applied the job's optimizer; the answer is the new weights.
      std::copy(model.grads(l), model.grads(l) + model.layer_size(l), model.params(l));
    } else {
      ApplyUpdate(model.params(l), velocity[l].data(), model.grads(l), model.layer_size(l), lr,
                  momentum, inv_world);
    }
  };
  auto start_layer = [&](int l) {
    exchange.Start(l, model.grads(l), /*priority=*/-l);
    pending[l] = true;
  };

  std::vector<int64_t> order(train.size);
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> xb(batch * train.dim);
  std::vector<int32_t> yb(batch);

  TrainReport report;
  report.resumed_after = resume_after;
  report.num_params = model.num_params();
  report.world = world;
  double train_seconds = 0;
  if (talk) {
    out() << "trellis-mlp: " << report.num_params << " parameters, " << world << " worker(s), "
        << train.size << " training samples per worker, batch " << batch << ", "
        << steps_per_epoch << " steps per epoch\n"
        << std::flush;
    if (exchange.ReturnsWeights()) {
      out() << "trellis-mlp: serverMode update: the servers run the job's optimizer (--lr and "
             "--momentum unused)\n";
    }
    if (resume_after > 0) out() << "trellis-mlp: resuming after step " << resume_after << "\n";
  }
  // A finished job started again (its newest checkpoint is its last step): nothing to train. The
  // restored model is the job's result; rank 0 evaluates it instead of reporting nothing.
  report.already_finished = resume_after > 0 && resume_after >= total_steps;
  if (report.already_finished) {
    if (talk) {
      out() << "trellis-mlp: the checkpoint is of step " << resume_after << ", the job's last ("
          << total_steps << "): nothing left to train; evaluating the restored model\n";
    }
    if (rank == 0) {
      const EvalResult eval = model.Evaluate(test.x.data(), test.y.data(), test.size);
      report.test_accuracy = eval.accuracy;
      report.test_loss = eval.loss;
    }
  }
  // Applies every pending update: parameters and velocity are then those after the last step.
  auto finish_all = [&]() -> Status {
    for (int l = 0; l < layers; ++l) finish_layer(l);
    return comm_error;
  };

  // Global steps done before the next epoch starts.
  int64_t next_epoch_first = 0;
  // An elastic job's resize (docs/elastic.md) took effect at the last commit: after this step
  // the trainer re-shards the training set for its new rank and world and carries on at the same
  // fraction of the epoch. (The step in flight keeps the batch it was given.)
  bool resized = false;
  for (int epoch = 1; epoch <= options.epochs && !report.stopped && !report.already_finished &&
                      !report.left;
       ++epoch) {
    const Clock::time_point epoch_start = Clock::now();
    // Each epoch shuffles the previous epoch's order, so a resumed run replays the shuffles of
    // the epochs it skips.
    Rng shuffle(MixSeed(options.seed, 100000 + 1000 * static_cast<uint64_t>(epoch) + rank));
    for (int64_t i = train.size - 1; i > 0; --i) {
      std::swap(order[i], order[shuffle.Below(static_cast<uint64_t>(i) + 1)]);
    }
    int64_t epoch_first = next_epoch_first;
    next_epoch_first += steps_per_epoch;
    int64_t first_step = 0;
    if (resumed.epoch > 0) {  // where the kept position says
      if (epoch < resumed.epoch) continue;
      if (epoch == resumed.epoch) {
        epoch_first = resumed.epoch_first;
        next_epoch_first = epoch_first + steps_per_epoch;
        first_step = resumed.first_step;
      }
    } else {
      if (next_epoch_first <= resume_after) continue;  // trained before the restore
      first_step = std::max<int64_t>(0, resume_after - epoch_first);
    }
    double loss_sum = 0;
    int64_t epoch_steps = 0;
    int64_t bar_every = std::max<int64_t>(1, steps_per_epoch / 50);
    for (int64_t step = first_step; step < steps_per_epoch; ++step) {
      // A worker that joined a grow may start one step before its epoch's first (Resume).
      const int64_t data_step = std::max<int64_t>(step, 0);
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t idx = order[data_step * batch + r];
        std::copy(train.row(idx), train.row(idx) + train.dim, xb.data() + r * train.dim);
        yb[r] = train.y[idx];
      }
      model.Forward(xb.data(), batch, finish_layer);
      if (!comm_error.ok()) return comm_error;
      // The forward pass applied the previous step's last updates, and this step's gradients
      // are not pushed yet: the commit point of the previous step (a restarted worker resumes
      // from it; it replays the shuffles above like a restore).
      keep_position(epoch, epoch_first);
      TRELLIS_RETURN_IF_ERROR(exchange.Commit(epoch_first + step));
      if (exchange.left()) {
        // Resized away: every update up to the commit is applied and nothing is in flight.
        report.left = true;
        report.left_after = epoch_first + step;
        break;
      }
      if (exchange.world() != world || exchange.rank() != rank) {
        // The step in flight is summed over the new world: scale its sum accordingly.
        rank = exchange.rank();
        world = exchange.world();
        inv_world = 1.0f / static_cast<float>(world);
        talk = rank == 0 && output.out != nullptr;
        out_stream = talk ? output.out : &discard;
        resized = true;
        report.resizes += 1;
      }
      const double loss = model.LossAndGradient(yb.data(), batch);
      loss_sum += loss;
      ++epoch_steps;
      if (rank == options.slow_rank && options.step_sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(options.step_sleep_ms));
      }
      model.Backward(xb.data(), batch, start_layer);
      if (!comm_error.ok()) return comm_error;
      ++report.steps;
      const int64_t global_step = epoch_first + step + 1;
      exchange.ReportProgress(global_step, batch, loss, total_steps);
      if (exchange.CheckpointDue(global_step)) {
        TRELLIS_RETURN_IF_ERROR(finish_all());
        keep_position(epoch, epoch_first);
        TRELLIS_RETURN_IF_ERROR(exchange.SaveCheckpoint(global_step));
      }
      if (options.stop_at_step > 0 && global_step >= options.stop_at_step) {
        TRELLIS_RETURN_IF_ERROR(finish_all());
        report.stopped = true;
        break;
      }
      if (talk && output.tty && (step % bar_every == 0 || step + 1 == steps_per_epoch)) {
        const double secs = SecondsSince(epoch_start);
        const double rate = secs > 0 ? world * batch * (step + 1) / secs : 0;
        char line[160];
        std::snprintf(line, sizeof(line), "\repoch %d/%d %s %3d%% loss %.4f %.0f samples/s ",
                      epoch, options.epochs, Bar(step + 1, steps_per_epoch).c_str(),
                      static_cast<int>(100 * (step + 1) / steps_per_epoch),
                      loss_sum / static_cast<double>(step + 1), rate);
        out() << line << std::flush;
      }
      if (resized) {
        resized = false;
        const double done = static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch);
        train = Shard(full_train, rank, world);
        steps_per_epoch = train.size / batch;
        if (steps_per_epoch < 1) {
          return InvalidArgumentError("after a resize to " + std::to_string(world) +
                                      " workers, " + std::to_string(train.size) +
                                      " samples per worker are fewer than --batch " +
                                      std::to_string(batch));
        }
        order.resize(train.size);
        std::iota(order.begin(), order.end(), 0);
        Rng reshuffle(MixSeed(options.seed, 100000 + 1000 * static_cast<uint64_t>(epoch) + rank));
        for (int64_t i = train.size - 1; i > 0; --i) {
          std::swap(order[i], order[reshuffle.Below(static_cast<uint64_t>(i) + 1)]);
        }
        const int64_t next = std::min<int64_t>(
            steps_per_epoch, static_cast<int64_t>(done * static_cast<double>(steps_per_epoch) + 0.5));
        const int64_t global_done = epoch_first + step + 1;
        epoch_first = global_done - next;
        next_epoch_first = epoch_first + steps_per_epoch;
        const int64_t planned = next_epoch_first + (options.epochs - epoch) * steps_per_epoch;
        total_steps = options.stop_at_step > 0 ? std::min(options.stop_at_step, planned) : planned;
        bar_every = std::max<int64_t>(1, steps_per_epoch / 50);
        xb.assign(batch * train.dim, 0.0f);
        if (talk) {
          out() << (output.tty ? "\n" : "") << "trellis-mlp: resized to " << world
              << " worker(s) from step " << global_done << ": " << train.size
              << " training samples per worker, " << steps_per_epoch << " steps per epoch\n"
              << std::flush;
        }
        step = next - 1;
      }
    }
    if (report.left) {
      TRELLIS_RETURN_IF_ERROR(finish_all());
      train_seconds += SecondsSince(epoch_start);
      break;
    }
    if (report.stopped) {
      // The partial epoch's time counts too: without it, throughput divided by ~0 s.
      train_seconds += SecondsSince(epoch_start);
      if (talk) out() << "\ntrellis-mlp: stopped after step " << options.stop_at_step << " as asked\n";
      break;
    }
    // Apply the last step's updates so every worker holds the same weights at the epoch end.
    TRELLIS_RETURN_IF_ERROR(finish_all());

    EpochStats stats;
    stats.epoch = epoch;
    stats.train_seconds = SecondsSince(epoch_start);
    train_seconds += stats.train_seconds;
    stats.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(1, epoch_steps));
    stats.samples_per_second =
        static_cast<double>(world * batch * epoch_steps) / std::max(stats.train_seconds, 1e-9);
    if (rank == 0) {
      const EvalResult eval = model.Evaluate(test.x.data(), test.y.data(), test.size);
      stats.test_loss = eval.loss;
      stats.test_accuracy = eval.accuracy;
    }
    report.epochs.push_back(stats);
    if (talk) {
      char line[256];
      std::snprintf(line, sizeof(line),
                    "%sepoch %d/%d %s train loss %.4f | test loss %.4f, accuracy %s | %.0f "
                    "samples/s | %.1f s\n",
                    output.tty ? "\r" : "", epoch, options.epochs,
                    Bar(steps_per_epoch, steps_per_epoch).c_str(), stats.train_loss,
                    stats.test_loss, Percent(stats.test_accuracy).c_str(),
                    stats.samples_per_second, stats.train_seconds);
      out() << line << std::flush;
    }
  }

  if (report.left) {
    // Not in the job any more: the statistics are the remaining workers' business.
    report.train_seconds = train_seconds;
    report.wall_seconds = SecondsSince(wall_start);
    if (output.out != nullptr) {
      *output.out << "trellis-mlp: worker left the job after step " << report.left_after
                  << " (resized away; docs/elastic.md)\n"
                  << std::flush;
    }
    return report;
  }
  report.world = world;
  // Exact totals over all workers (each worker only knows its own counters).
  TRELLIS_ASSIGN_OR_RETURN(
      std::vector<double> totals,
      exchange.SumStats({static_cast<double>(report.steps * batch),
                         static_cast<double>(exchange.bytes_pushed()),
                         static_cast<double>(exchange.bytes_pulled()),
                         static_cast<double>(exchange.compressed_bytes_in()),
                         static_cast<double>(exchange.compressed_bytes_out()),
                         exchange.restarted() ? 1.0 : 0.0,
                         exchange.bytes_short() ? 1.0 : 0.0}));
  report.train_seconds = train_seconds;
  report.samples_per_second = totals[0] / std::max(train_seconds, 1e-9);
  report.bytes_pushed = totals[1];
  report.bytes_pulled = totals[2];
  report.compressed_in = totals[3];
  report.compressed_out = totals[4];
  report.restarted_workers = static_cast<int>(totals[5] + 0.5);
  report.short_workers = static_cast<int>(totals[6] + 0.5);
  if (!report.epochs.empty()) {
    report.test_accuracy = report.epochs.back().test_accuracy;
    report.test_loss = report.epochs.back().test_loss;
  }
  // Stopped before an epoch ended: nothing was evaluated, so there is no accuracy to judge.
  const bool evaluated = !report.epochs.empty() || report.already_finished;
  report.reached_target = evaluated && report.test_accuracy >= options.target_accuracy;
  report.wall_seconds = SecondsSince(wall_start);
  if (talk) out() << FormatResult(options, report) << std::flush;
  return report;
}

std::string FormatResult(const TrainOptions& options, const TrainReport& report) {
  std::ostringstream s;
  char line[256];
  if (report.stopped && report.epochs.empty() && !report.already_finished) {
    std::snprintf(line, sizeof(line),
                  "RESULT: stopped early after step %lld as asked (--stop-at-step), before any "
                  "epoch ended: no test accuracy measured (target %s not judged)\n",
                  static_cast<long long>(options.stop_at_step), Percent(options.target_accuracy).c_str());
    s << line;
  } else {
    std::snprintf(line, sizeof(line), "RESULT: test accuracy %s (target %s) -- %s%s\n",
                  Percent(report.test_accuracy).c_str(), Percent(options.target_accuracy).c_str(),
                  report.reached_target ? "reached" : "MISSED",
                  report.already_finished
                      ? " (the job had already finished: the model of its last checkpoint)"
                  : report.stopped ? " (after the last full epoch; stopped early as asked by --stop-at-step)"
                                   : "");
    s << line;
    std::snprintf(line, sizeof(line),
                  "RESULT: test loss %.4f; task ceiling 100%% (test labels are the teacher's "
                  "argmax, noise-free)\n",
                  report.test_loss);
    s << line;
  }
  std::snprintf(line, sizeof(line),
                "RESULT: %lld parameters, %d worker(s), %d epochs, %lld steps of %lld per worker\n",
                static_cast<long long>(report.num_params), report.world, options.epochs,
                static_cast<long long>(report.steps), static_cast<long long>(options.batch));
  s << line;
  std::snprintf(line, sizeof(line), "RESULT: throughput %.0f samples/s (all workers)\n",
                report.samples_per_second);
  s << line;
  s << "RESULT: bytes pushed " << Bytes(report.bytes_pushed) << ", pulled "
    << Bytes(report.bytes_pulled) << " (all workers";
  if (report.restarted_workers > report.short_workers) {
    s << "; " << report.restarted_workers - report.short_workers
      << " restarted, their killed processes' bytes included";
  }
  if (report.short_workers > 0) {
    // Bytes of a process that ran under another agent (a replaced pod) are gone: say so.
    s << "; UNDERCOUNTED: " << report.short_workers
      << " worker(s) replaced, the bytes their earlier pods' processes moved are not counted";
  }
  s << ")\n";
  // Plain byte counts (to float precision) for tools that compare runs, e.g. the 2-bit test.
  std::snprintf(line, sizeof(line), "RESULT: pushed %.0f B, pulled %.0f B", report.bytes_pushed,
                report.bytes_pulled);
  s << line;
  if (report.compressed_out > 0) {
    std::snprintf(line, sizeof(line), "; compression: %.0f B of gradients sent as %.0f B (%.2fx)",
                  report.compressed_in, report.compressed_out,
                  report.compressed_in / report.compressed_out);
    s << line;
  }
  s << "\n";
  std::snprintf(line, sizeof(line), "RESULT: wall time %.1f s (training %.1f s)\n",
                report.wall_seconds, report.train_seconds);
  s << line;
  return s.str();
}

}  // namespace trellis::mlp
