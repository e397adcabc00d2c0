// What rdzv's programs print of gRPC's own log (common/logging.h): its routine errors stay out
// of sight at the default level, its failed self-checks (its last line before abort) do not.
#include "common/logging.h"

#include <grpc/support/log.h>

#include <string>

#include "gtest/gtest.h"

namespace rdzv {
namespace {

class GrpcLogTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(SetUpLogging("logtest", "info").ok()); }

  // What gRPC logging `message` at `severity` puts on stderr.
  static std::string Printed(gpr_log_severity severity, const char* message) {
    ::testing::internal::CaptureStderr();
    gpr_log("src/core/some_file.cc", 831, severity, "%s", message);
    return ::testing::internal::GetCapturedStderr();
  }
};

TEST_F(GrpcLogTest, AFailedAssertionIsPrintedWithWhereItFailed) {
  const std::string out = Printed(GPR_LOG_SEVERITY_ERROR, "assertion failed: t->write_state");
  EXPECT_NE(out.find("logtest C "), std::string::npos) << out;
  EXPECT_NE(out.find("gRPC failed its own check at src/core/some_file.cc:831: "
                     "assertion failed: t->write_state"),
            std::string::npos)
      << out;
}

TEST_F(GrpcLogTest, UnreachableCodeIsPrinted) {
  const std::string out = Printed(GPR_LOG_SEVERITY_ERROR, "Should never reach here.");
  EXPECT_NE(out.find("Should never reach here."), std::string::npos) << out;
}

TEST_F(GrpcLogTest, RoutineErrorsStayAtDebug) {
  EXPECT_EQ(Printed(GPR_LOG_SEVERITY_ERROR, "Handshake failed with fatal error"), "");
  EXPECT_EQ(Printed(GPR_LOG_SEVERITY_INFO, "assertion failed: not an error at all"), "");
}

}  // namespace
}  // namespace rdzv
