// GoogleTest main that brackets the suites with Kokkos initialisation.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  Kokkos::initialize(argc, argv);
  int result = 0;
  {
    if (::testing::GTEST_FLAG(list_tests) == false) Kokkos::print_configuration(std::cout);
    result = RUN_ALL_TESTS();
  }
  Kokkos::finalize();
  return result;
}
