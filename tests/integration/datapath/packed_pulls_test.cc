// Packed pull answers across real processes (datapath_fixture.h): the same 2-bit pushes through
// trellis-pserver processes, once with spec.compression.packedPulls false (float32 answers) and
// once true (packed answers). Every worker must receive exactly the same values both ways, the
// workers of a job must agree bit for bit, and the bytes pulled must drop.
#include "tests/integration/datapath/datapath_fixture.h"

#include <random>

namespace trellis {
namespace {

using datapath_testing::DatapathTest;

class PackedPullsTest : public DatapathTest {};
INSTANTIATE_TEST_SUITE_P(Transports, PackedPullsTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

struct WorkerRun {
  std::vector<float> answers;  // every answer of every step, in order
  uint64_t bytes_pulled = 0;
  CompressionStats stats;
};

TEST_P(PackedPullsTest, WorkersReceiveTheFloat32AnswersValuesInFewerBytes) {
  constexpr int kServers = 2, kWorkers = 3, kSteps = 5;
  const std::vector<int64_t> sizes = {5000, 301};  // several slices on both servers; odd length
  std::vector<WorkerRun> runs[2];                  // [packedPulls]
  for (bool packed : {false, true}) {
    StartJob(kServers, kWorkers, 4096,
             std::string("  compression:\n    type: 2bit\n    threshold: 0.5\n") +
                 "    packedPulls: " + (packed ? "true" : "false") + "\n");
    runs[packed].resize(kWorkers);
    auto results = RunWorkers([&](Worker& worker) -> Status {
      const int rank = worker.rank();
      for (size_t k = 0; k < sizes.size(); ++k) {
        TRELLIS_RETURN_IF_ERROR(worker.DeclareKey(
            {.id = k, .name = "k" + std::to_string(k), .num_elements = sizes[k]}));
      }
      TRELLIS_RETURN_IF_ERROR(worker.FinishDeclarations());
      std::mt19937 rng(100 + rank);  // the same gradients in both jobs
      std::normal_distribution<float> nd(0.0f, 0.6f);
      WorkerRun& run = runs[packed][rank];
      for (int step = 1; step <= kSteps; ++step) {
        for (size_t k = 0; k < sizes.size(); ++k) {
          std::vector<float> g(sizes[k]), out(sizes[k], -7.0f);
          for (auto& v : g) v = nd(rng);
          TRELLIS_RETURN_IF_ERROR(
              worker.PushPull(k, g.data(), out.data(), -static_cast<int>(k)).Wait());
          run.answers.insert(run.answers.end(), out.begin(), out.end());
        }
      }
      run.bytes_pulled = worker.bytes_pulled();
      run.stats = worker.compression_stats();
      return worker.Barrier("end");
    });
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(results[r].ok()) << "packedPulls " << packed << " worker " << r << ": "
                                   << results[r].ToString();
    }
    StopJob();
  }
  const uint64_t floats = 4u * (5000 + 301) * kSteps;
  for (int r = 0; r < kWorkers; ++r) {
    const WorkerRun& plain = runs[0][r];
    const WorkerRun& packed = runs[1][r];
    ASSERT_EQ(packed.answers.size(), plain.answers.size());
    EXPECT_EQ(std::memcmp(packed.answers.data(), plain.answers.data(),
                          plain.answers.size() * sizeof(float)), 0)
        << "worker " << r << ": packed answers differ from the float32 answers";
    EXPECT_EQ(std::memcmp(packed.answers.data(), runs[1][0].answers.data(),
                          plain.answers.size() * sizeof(float)), 0)
        << "worker " << r << " disagrees with worker 0";
    EXPECT_EQ(plain.bytes_pulled, floats);
    EXPECT_EQ(plain.stats.pulled_packed_bytes, 0u);
    // 3 workers: 4 bits per element, a 16-byte header per 1024-element slice.
    EXPECT_EQ(packed.stats.pulled_unpacked_bytes, floats);
    EXPECT_EQ(packed.bytes_pulled, packed.stats.pulled_packed_bytes);
    EXPECT_LT(packed.bytes_pulled * 7, plain.bytes_pulled) << packed.bytes_pulled;
  }
}

}  // namespace
}  // namespace trellis
