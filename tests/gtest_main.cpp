// main() of every zoe test binary (cmake/ZoeModule.cmake links it instead of gtest_main). It
// runs GoogleTest as gtest_main does and then tells ctest what happened in an exit status:
//  - every selected test skipped (GTEST_SKIP: no GPU, no local data): 77, which zoe_add_test
//    registers as SKIP_RETURN_CODE, so ctest lists the entry as skipped instead of passed;
//  - no test selected (a --gtest_filter of a ctest entry that matches nothing, a renamed
//    suite): 1, so a stale filter fails instead of passing with nothing run.
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0 || GTEST_FLAG_GET(list_tests)) return rc;
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  if (u.test_to_run_count() == 0) {
    std::fprintf(stderr, "zoe tests: no test matches --gtest_filter=%s\n", GTEST_FLAG_GET(filter).c_str());
    return 1;
  }
  if (u.successful_test_count() == 0 && u.skipped_test_count() > 0) {
    std::fprintf(stderr, "zoe tests: all %d selected tests skipped (exit 77: skipped for ctest)\n",
                 u.skipped_test_count());
    return 77;
  }
  return 0;
}
