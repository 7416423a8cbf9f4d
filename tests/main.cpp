// GoogleTest main that brackets the suites with Kokkos initialisation and names the execution
// space the suite runs on (category.hpp), since one source runs as several executables.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <iostream>

#include "category.hpp"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  Kokkos::initialize(argc, argv);
  int result = 0;
  {
    if (::testing::GTEST_FLAG(list_tests) == false) {
      Kokkos::print_configuration(std::cout);
      std::cout << "kfa tests on " << kfa_test::Exec::name() << " (concurrency "
                << kfa_test::Exec().concurrency() << ")\n";
    }
    result = RUN_ALL_TESTS();
  }
  Kokkos::finalize();
  return result;
}
