# ctest -R install: installs this build to a fresh prefix, then configures, builds and runs the
# consumer project against it. Arguments: BUILD_DIR, WORK_DIR, SOURCE_DIR, GENERATOR, CXX.
file(REMOVE_RECURSE "${WORK_DIR}")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD_DIR};--prefix;${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};-S;${SOURCE_DIR}/tests/install/consumer;-B;${WORK_DIR}/build;-G;${GENERATOR};-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "${WORK_DIR}/build/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test step failed (${rc}): ${step}")
  endif()
endforeach()
