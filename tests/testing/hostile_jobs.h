// Job files an attacker (or a careless generator) writes, shared by the launcher's and the
// scheduler's process tests: each must be refused at once with a clear message (exit 2), never
// crash, spin or swell the process.
#pragma once

#include <string>
#include <vector>

namespace trellis::testing {

struct HostileJob {
  std::string what;
  std::string yaml;
  std::string message;  // a part of the expected error
};

inline std::string HostileHeader(const std::string& name) {
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " + name + "\nspec:\n";
}

// Nine levels of nine aliases in a pod template: ~600 bytes that expand to 9^9 scalars.
inline std::string AliasBombJob() {
  std::string y = HostileHeader("bomb") +
                  "  workers:\n    command: [trellis-mlp]\n    template:\n      metadata:\n        annotations:\n"
                  "          a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  char prev = 'a';
  for (char n = 'b'; n <= 'i'; ++n) {
    y += std::string("          ") + n + ": &" + n + " [";
    for (int k = 0; k < 9; ++k) y += std::string(k ? ", *" : "*") + prev;
    y += "]\n";
    prev = n;
  }
  return y;
}

inline std::vector<HostileJob> HostileJobs() {
  return {
      {"alias bomb in a pod template", AliasBombJob(), "with its aliases expanded it holds more than"},
      {"40 KB metadata.name", HostileHeader(std::string(40000, 'a')) + "  workers:\n    command: [w]\n",
       "metadata.name: must be at most 50 characters"},
      {"200 KB number", HostileHeader("j") + "  workers:\n    command: [w]\n    replicas: " + std::string(200000, '7') + "\n",
       "spec.workers.replicas: must be an integer"},
      {"200 KB float", HostileHeader("j") + "  workers:\n    command: [w]\n  compression: {type: 2bit, threshold: " +
                           std::string(200000, '7') + ".5}\n",
       "spec.compression.threshold"},
      {"200 KB quantity", HostileHeader("j") + "  workers:\n    command: [w]\n    resources: {limits: {memory: '" +
                              std::string(200000, '1') + "x'}}\n",
       "must be a Kubernetes quantity"},
  };
}

}  // namespace trellis::testing
