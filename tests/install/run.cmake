# ctest -R install: installs this build to a fresh prefix, then configures, builds and runs
# against it the C++ consumer project, the C example (found with find_package, then with
# pkg-config) and, when FORTRAN names a compiler, the Fortran example; when NN is ON (kfa::nn
# built), also the consumer's kfa::nn program. Arguments: BUILD_DIR, WORK_DIR, SOURCE_DIR,
# GENERATOR, CXX, C, FORTRAN (empty: no Fortran), NN, LIBDIR, LINK_FLAGS
# (the sanitizer flags of a sanitized build: its shared libraries need the sanitizer runtime
# linked into the consumer executables, first in the library list).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(exe_flags "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}")
set(steps
    "${CMAKE_COMMAND}|--install|${BUILD_DIR}|--prefix|${prefix}"
    "${CMAKE_COMMAND}|-S|${SOURCE_DIR}/tests/install/consumer|-B|${WORK_DIR}/build|-G|${GENERATOR}|-DCMAKE_CXX_COMPILER=${CXX}|-DCMAKE_PREFIX_PATH=${prefix}|${exe_flags}"
    "${CMAKE_COMMAND}|--build|${WORK_DIR}/build"
    "${WORK_DIR}/build/consumer"
    "${CMAKE_COMMAND}|-S|${SOURCE_DIR}/examples/c|-B|${WORK_DIR}/c|-G|${GENERATOR}|-DCMAKE_C_COMPILER=${C}|-DCMAKE_PREFIX_PATH=${prefix}|${exe_flags}"
    "${CMAKE_COMMAND}|--build|${WORK_DIR}/c"
    "${WORK_DIR}/c/attention_c"
    "${CMAKE_COMMAND}|-E|env|PKG_CONFIG_PATH=${prefix}/${LIBDIR}/pkgconfig|${CMAKE_COMMAND}|-S|${SOURCE_DIR}/examples/c|-B|${WORK_DIR}/c-pkgconfig|-G|${GENERATOR}|-DCMAKE_C_COMPILER=${C}|-DKFA_EXAMPLE_PKGCONFIG=ON|${exe_flags}"
    "${CMAKE_COMMAND}|--build|${WORK_DIR}/c-pkgconfig"
    "${WORK_DIR}/c-pkgconfig/attention_c")
if(NN)
  list(APPEND steps "${WORK_DIR}/build/consumer_nn")
endif()
if(FORTRAN)
  list(APPEND steps
       "${CMAKE_COMMAND}|-S|${SOURCE_DIR}/examples/fortran|-B|${WORK_DIR}/fortran|-G|${GENERATOR}|-DCMAKE_Fortran_COMPILER=${FORTRAN}|-DCMAKE_PREFIX_PATH=${prefix}|${exe_flags}"
       "${CMAKE_COMMAND}|--build|${WORK_DIR}/fortran"
       "${WORK_DIR}/fortran/attention_fortran")
endif()
foreach(step IN LISTS steps)  # each step's arguments are separated by |
  string(REPLACE "|" ";" step "${step}")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test step failed (${rc}): ${step}")
  endif()
endforeach()
