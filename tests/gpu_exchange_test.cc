#include "client/agent/gpu_exchange.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace rdzv {
namespace {

class GpuExchangeTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "gpu-exchange-XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    dir_ = base_ + "/rdzv-gpus-42.0-n1";
  }
  void TearDown() override { std::filesystem::remove_all(base_); }

  std::unique_ptr<GpuExchange> Publish(int local_id, const std::string& device) {
    absl::StatusOr<std::unique_ptr<GpuExchange>> e = GpuExchange::Publish(dir_, local_id, device);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  std::string base_;
  std::string dir_;
};

TEST_F(GpuExchangeTest, EveryTaskOfTheNodeLearnsTheOthersGpusInLocalIdOrder) {
  // Tasks start in any order; each writes its own GPU.
  std::vector<std::unique_ptr<GpuExchange>> tasks(4);
  for (int id : {2, 0, 3, 1}) tasks[id] = Publish(id, absl::StrCat(4 + id));
  for (const auto& task : tasks) {
    ASSERT_NE(task, nullptr);
    EXPECT_EQ(task->Collect(4), (std::vector<std::string>{"4", "5", "6", "7"}));
  }
  // The directory is this user's alone.
  struct stat st;
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // A task that wrote nothing: no list rather than a partial one.
  EXPECT_TRUE(tasks[0]->Collect(5).empty());
  EXPECT_TRUE(tasks[0]->Collect(0).empty());
  // The last task to go removes the directory.
  tasks[1].reset();
  tasks[3].reset();
  EXPECT_TRUE(tasks[0]->Collect(4).empty());
  tasks[0].reset();
  tasks[2].reset();
  EXPECT_FALSE(std::filesystem::exists(dir_));
}

TEST_F(GpuExchangeTest, GpuUuidsAreShared) {
  std::unique_ptr<GpuExchange> a = Publish(0, "GPU-5d6f2c1e-0a9b-4c3d-8e7f-112233445566");
  std::unique_ptr<GpuExchange> b = Publish(1, "GPU-77aa2c1e-0a9b-4c3d-8e7f-112233445566");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->Collect(2), (std::vector<std::string>{"GPU-5d6f2c1e-0a9b-4c3d-8e7f-112233445566",
                                                     "GPU-77aa2c1e-0a9b-4c3d-8e7f-112233445566"}));
}

TEST_F(GpuExchangeTest, ADirectoryOthersCouldWriteIsNotUsed) {
  ASSERT_EQ(mkdir(dir_.c_str(), 0777), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
  absl::StatusOr<std::unique_ptr<GpuExchange>> e = GpuExchange::Publish(dir_, 0, "0");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("mode 0700"), std::string::npos) << e.status();
  // Nor a link to a directory of ours.
  const std::string real = base_ + "/real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  const std::string link = base_ + "/link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  EXPECT_FALSE(GpuExchange::Publish(link, 0, "0").ok());
}

TEST_F(GpuExchangeTest, WhatIsNotAGpuIsNeitherWrittenNorRead) {
  EXPECT_FALSE(GpuExchange::Publish(dir_, 0, "").ok());
  EXPECT_FALSE(GpuExchange::Publish(dir_, 0, "0,1").ok());
  EXPECT_FALSE(GpuExchange::Publish(dir_, 0, "../x").ok());
  EXPECT_FALSE(GpuExchange::Publish(dir_, -1, "0").ok());
  std::unique_ptr<GpuExchange> a = Publish(0, "0");
  ASSERT_NE(a, nullptr);
  std::ofstream(dir_ + "/1") << "1; rm -rf /\n";
  EXPECT_TRUE(a->Collect(2).empty());
}

}  // namespace
}  // namespace rdzv
