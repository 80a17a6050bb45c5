// A whole local job (trellis-launch, trellis-mlp 2 workers x 2 servers) with mutual TLS between
// all parts ends exactly as the same job without it: the same accuracy and the same final
// weights, bit for bit, on both data transports. The job's processes really ran TLS: every one
// has TRELLIS_TLS_* and the servers' logs say so.
#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

constexpr int kSteps = 2 * 128;  // mlp-tiny: 128 steps per epoch

std::string JobYaml(const std::string& name, const std::string& ckpt_dir, const std::string& transport,
                    const std::string& tls) {
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " + name +
         "\nspec:\n  servers:\n    replicas: 2\n  workers:\n    replicas: 2\n"
         "    command: [trellis-mlp]\n"
         "    args: [--layers, \"16,128,64,10\", --latent-dim, \"8\", --teacher-hidden, \"16\",\n"
         "           --epochs, \"2\", --batch, \"32\", --lr, \"0.02\", --train-samples, \"8192\",\n"
         "           --test-samples, \"1000\", --target-accuracy, \"0.5\"]\n"
         "  sliceBytes: 16384\n  transport: " + transport +
         "\n  checkpoint:\n    path: " + ckpt_dir + "\n    intervalSteps: 128\n    keep: 1\n" + tls +
         "  runPolicy:\n    activeDeadlineSeconds: 250\n";
}

class TlsJobTest : public LaunchedJobsTest {
 protected:
  // Runs a job to its end; returns the exit code, the launcher's output in *out.
  int Run(const std::string& job, const std::string& transport, const std::string& tls,
          std::string* out) {
    jobs_.push_back(job);
    auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job,
                         JobYaml(job, dir_ + "/ckpt-" + job, transport, tls));
    if (!p.ok()) {
      *out = p.status().ToString();
      return -1;
    }
    auto st = (*p)->WaitFor(300s);
    *out = ReadFile(dir_ + "/" + job + ".out");
    return st ? st->exit_code : -1;
  }
  std::string Log(const std::string& job, const std::string& process) {
    return ReadFile(dir_ + "/logs-" + job + "/" + process + ".log");
  }
};

TEST_F(TlsJobTest, BothTransportsWithTlsEndAsThePlainRun) {
  const std::string base = "tls-" + std::to_string(::getpid());
  std::string plain_out;
  ASSERT_EQ(Run(base + "-plain", "tcp", "", &plain_out), 0) << plain_out;
  const double plain = MlpAccuracy(plain_out);
  ASSERT_GT(plain, 0) << plain_out;
  EXPECT_EQ(Log(base + "-plain", "server-0").find("TLS on"), std::string::npos);

  // A cluster job's spec.tls (a Secret) runs here with a CA made for the run.
  const std::string secret = "  tls:\n    secretName: job-certs\n";
  for (const std::string transport : {"tcp", "grpc"}) {
    const std::string job = base + "-" + transport;
    std::string out;
    ASSERT_EQ(Run(job, transport, secret, &out), 0) << out;
    EXPECT_DOUBLE_EQ(MlpAccuracy(out), plain) << out;
    ExpectSameFinalModel(dir_ + "/ckpt-" + base + "-plain", dir_ + "/ckpt-" + job, kSteps,
                         "TLS on the " + transport + " transport");
    const std::string server = Log(job, "server-0");
    EXPECT_NE(server.find("TLS on"), std::string::npos) << server;
  }
}

TEST_F(TlsJobTest, AMissingCertificateFileStopsTheJobBeforeItStarts) {
  const std::string job = "tlsbad-" + std::to_string(::getpid());
  std::string out;
  const int rc = Run(job, "tcp",
                     "  tls:\n    caFile: nowhere/ca.crt\n    certFile: nowhere/tls.crt\n"
                     "    keyFile: nowhere/tls.key\n",
                     &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("spec.tls"), std::string::npos) << out;
  EXPECT_NE(out.find("nowhere/ca.crt"), std::string::npos) << out;
}

}  // namespace
}  // namespace trellis
