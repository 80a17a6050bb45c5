#include "common/checkpoint/checkpoint_dir.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace trellis {
namespace {

namespace fs = std::filesystem;

Checkpoint At(int64_t step) {
  Checkpoint c;
  c.step = step;
  c.origin = "test";
  c.entries.push_back({0, 0, EntryKind::kValues, step, "w",
                       {static_cast<float>(step), 2.0f, 3.0f, 4.0f}});
  return c;
}

std::string Read(const std::string& f) {
  std::ifstream in(f, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Write(const std::string& f, const std::string& bytes) {
  std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trellis-ckptdir-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointDirTest, SaveKeepsTheNewestKAndNoTemporaryFiles) {
  CheckpointDir d(dir_.string(), "model", 2);
  for (int64_t s : {10, 20, 30, 40}) {
    uint64_t bytes = 0;
    auto f = d.Save(At(s), &bytes);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(*f, (dir_ / ("model-0000000000" + std::to_string(s) + ".ckpt")).string());
    EXPECT_EQ(bytes, fs::file_size(*f));
  }
  auto steps = d.Steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{40, 30}));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".ckpt") << e.path();
  }
  EXPECT_EQ(files, 2);
  auto got = d.LoadNewest();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->checkpoint, At(40));
  EXPECT_TRUE(got->skipped.empty());
}

TEST_F(CheckpointDirTest, OtherWritersAndStrayFilesAreIgnored) {
  CheckpointDir model(dir_.string(), "model", 3);
  CheckpointDir server(dir_.string(), "server-1", 3);
  ASSERT_TRUE(model.Save(At(5)).ok());
  ASSERT_TRUE(server.Save(At(9)).ok());
  Write((dir_ / ".model-11.123.tmp").string(), "half a file");
  Write((dir_ / "model-x00000000011.ckpt").string(), "x");
  auto got = model.LoadNewest();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->checkpoint.step, 5);
  EXPECT_EQ(server.LoadNewest()->checkpoint.step, 9);
}

TEST_F(CheckpointDirTest, NothingThereIsNotFound) {
  CheckpointDir d(dir_.string(), "model", 3);
  auto got = d.LoadNewest();
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
}

// The newest file broken in each way: rejected with a message naming it, the previous kept.
TEST_F(CheckpointDirTest, CorruptTruncatedAndWrongVersionFallBackToThePreviousGoodOne) {
  struct Case {
    const char* name;
    std::string (*damage)(std::string);
    const char* expect;
  };
  const Case cases[] = {
      {"corrupt", [](std::string b) { b[b.size() - 6] ^= 0x40; return b; },
       "data checksum mismatch in entry 0 (key 0 w slice 0)"},
      {"truncated", [](std::string b) { return b.substr(0, b.size() - 9); }, "truncated"},
      {"wrong version", [](std::string b) { b[8] = 9; return b; },
       "checkpoint format version 9, this build reads version 1"},
      {"empty", [](std::string) { return std::string(); }, "truncated: 0 bytes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    fs::remove_all(dir_);
    CheckpointDir d(dir_.string(), "model", 3);
    ASSERT_TRUE(d.Save(At(100)).ok());
    auto newest = d.Save(At(200));
    ASSERT_TRUE(newest.ok());
    Write(*newest, c.damage(Read(*newest)));
    auto got = d.LoadNewest();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->checkpoint, At(100));
    EXPECT_EQ(got->file, d.FileFor(100));
    ASSERT_EQ(got->skipped.size(), 1u);
    const std::string& msg = got->skipped[0].message();
    EXPECT_EQ(msg.rfind(*newest + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    // The bad file is left for a human to look at; it is not deleted or overwritten.
    EXPECT_TRUE(fs::exists(*newest));
  }
}

TEST_F(CheckpointDirTest, AllBadListsEveryRejectedFile) {
  CheckpointDir d(dir_.string(), "model", 3);
  auto a = d.Save(At(1));
  auto b = d.Save(At(2));
  ASSERT_TRUE(a.ok() && b.ok());
  Write(*a, "garbage!");
  Write(*b, "");
  auto got = d.LoadNewest();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_NE(got.status().message().find(*a + ": not a Trellis checkpoint"), std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find(*b + ": truncated"), std::string::npos);
}

TEST_F(CheckpointDirTest, AFileWhoseStepDisagreesWithItsNameIsRejected) {
  CheckpointDir d(dir_.string(), "model", 3);
  ASSERT_TRUE(d.Save(At(1)).ok());
  auto b = d.Save(At(2));
  ASSERT_TRUE(b.ok());
  fs::rename(*b, d.FileFor(3));
  auto got = d.LoadNewest();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->checkpoint.step, 1);
  ASSERT_EQ(got->skipped.size(), 1u);
  EXPECT_NE(got->skipped[0].message().find("holds step 2, its name says step 3"),
            std::string::npos);
}

TEST_F(CheckpointDirTest, UnwritableDirectoryIsAnErrorNamingIt) {
  const std::string file = (dir_ / "not-a-dir").string();
  fs::create_directories(dir_);
  Write(file, "x");
  CheckpointDir d(file + "/sub", "model", 3);
  auto r = d.Save(At(1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(file + "/sub"), std::string::npos) << r.status().message();
}

// A stray file that does not load, named as a newer checkpoint than any real one, used to count
// towards `keep`: with keep 1 every new save was pruned right after it was written, and a
// restart found no usable checkpoint. Now it is moved aside and only valid files count.
TEST_F(CheckpointDirTest, AStrayBadFileIsMovedAsideAndNeverCounted) {
  CheckpointDir d(dir_.string(), "model", 1);
  ASSERT_TRUE(d.Save(At(10)).ok());
  const std::string stray = d.FileFor(999999);
  Write(stray, "not a checkpoint at all");
  ASSERT_TRUE(d.Save(At(20)).ok());
  ASSERT_TRUE(d.Save(At(30)).ok());
  EXPECT_TRUE(fs::exists(d.FileFor(30))) << "the newest valid checkpoint was pruned";
  EXPECT_FALSE(fs::exists(d.FileFor(20)));
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_EQ(Read(stray + ".corrupt"), "not a checkpoint at all") << "the bad file is kept aside";

  // A restart (a new process) resumes from the newest valid checkpoint.
  CheckpointDir again(dir_.string(), "model", 1);
  auto newest = again.LoadNewest();
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->checkpoint.step, 30);
}

// A bad file among older ones (keep 2): the two newest valid ones stay, whatever the stray's step.
TEST_F(CheckpointDirTest, ABadFileInTheMiddleIsNotCountedAndNotOverwritten) {
  CheckpointDir d(dir_.string(), "model", 2);
  ASSERT_TRUE(d.Save(At(10)).ok());
  Write(d.FileFor(20), "garbage");
  ASSERT_TRUE(d.Save(At(30)).ok());
  EXPECT_TRUE(fs::exists(d.FileFor(10)));
  EXPECT_TRUE(fs::exists(d.FileFor(30)));
  EXPECT_EQ(Read(d.FileFor(20) + ".corrupt"), "garbage");
  // The same step saved again over a bad file: the bad one goes aside first (a second name).
  Write(d.FileFor(40), "more garbage");
  ASSERT_TRUE(d.Save(At(40)).ok());
  EXPECT_EQ(Read(d.FileFor(40) + ".corrupt"), "more garbage");
  auto steps = d.Steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{40, 30}));
}

}  // namespace
}  // namespace trellis
