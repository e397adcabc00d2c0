// The status reply stays within its size whatever the server holds, and says what it left out.
#include "server/status_reply.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace rdzv {
namespace {

v1::JobStatus Job(const std::string& id, int agents) {
  v1::JobStatus job;
  job.set_job_id(id);
  job.set_state("running");
  job.set_joined(agents);
  for (int i = 0; i < agents; ++i) {
    v1::AgentStatus* agent = job.add_agents();
    agent->set_agent_id(absl::StrCat(id, "-agent-", i));
    agent->set_host(absl::StrCat("node", i));
    agent->set_node_index(i);
    agent->set_nproc(8);
  }
  return job;
}

TEST(FitStatusReplyTest, ASmallReplyIsWhole) {
  v1::StatusResponse reply;
  FitStatusReply({Job("a", 3), Job("b", 2)}, kMaxStatusReplyBytes, &reply);
  ASSERT_EQ(reply.jobs_size(), 2);
  EXPECT_EQ(reply.jobs(0).agents_size(), 3);
  EXPECT_EQ(reply.jobs(1).agents_size(), 2);
  EXPECT_EQ(reply.jobs(0).omitted_agents(), 0);
  EXPECT_EQ(reply.omitted_jobs(), 0);
}

// One user's huge job does not push another's small one out: every job is listed, and each
// gets a share of the room for agents.
TEST(FitStatusReplyTest, AHugeJobIsCutAndTheOthersStay) {
  v1::StatusResponse reply;
  FitStatusReply({Job("huge", 100'000), Job("small", 4)}, kMaxStatusReplyBytes, &reply);
  EXPECT_LE(reply.ByteSizeLong(), kMaxStatusReplyBytes);
  ASSERT_EQ(reply.jobs_size(), 2);
  EXPECT_GT(reply.jobs(0).agents_size(), 1000);
  EXPECT_EQ(reply.jobs(0).agents_size() + reply.jobs(0).omitted_agents(), 100'000);
  EXPECT_EQ(reply.jobs(1).agents_size(), 4);
  EXPECT_EQ(reply.jobs(1).omitted_agents(), 0);
}

TEST(FitStatusReplyTest, TooManyJobsAreCountedNotSent) {
  std::vector<v1::JobStatus> jobs;
  for (int i = 0; i < 2000; ++i) {
    v1::JobStatus job = Job(absl::StrCat("job", i), 1);
    job.mutable_abort()->set_reason(std::string(16 * 1024, 'r'));
    jobs.push_back(std::move(job));
  }
  v1::StatusResponse reply;
  FitStatusReply(std::move(jobs), kMaxStatusReplyBytes, &reply);
  EXPECT_LE(reply.ByteSizeLong(), kMaxStatusReplyBytes);
  EXPECT_GT(reply.jobs_size(), 100);
  EXPECT_EQ(reply.jobs_size() + reply.omitted_jobs(), 2000);
}

}  // namespace
}  // namespace rdzv
