// Catch2's main for trainkit_tests, with two warnings always on: a filter that matches no test case fails
// (NoTests: a renamed tag must not turn a ctest entry into a pass that runs nothing), and so does a test case or
// section that makes no assertion (NoAssertions). Catch2 2.13 takes one --warn per command line, so they are set
// here rather than on every ctest entry; scripts/check_test_quality.py checks that both are in force.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  auto& data = session.configData();
  data.warnings =
      static_cast<Catch::WarnAbout::What>(data.warnings | Catch::WarnAbout::NoTests | Catch::WarnAbout::NoAssertions);
  return session.run();
}

// Run only by scripts/check_test_quality.py, which expects this run to fail: a case without assertions.
TEST_CASE("a case that checks nothing fails", "[.quality-no-assertions]") {}
