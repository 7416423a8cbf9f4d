# ctest -R readme_snippet: the README's "Using the library" section as a newcomer copies it.
# Installs this build to a fresh prefix (as run.cmake), writes the section's first ```cpp block
# as main.cpp and its first ```cmake block as CMakeLists.txt of a new project, configures it
# with CMAKE_PREFIX_PATH, builds and runs it. Arguments: BUILD_DIR, WORK_DIR, SOURCE_DIR,
# GENERATOR, CXX.
file(REMOVE_RECURSE "${WORK_DIR}")
file(READ "${SOURCE_DIR}/README.md" readme)
string(FIND "${readme}" "## Using the library" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md has no \"## Using the library\" section")
endif()
string(SUBSTRING "${readme}" ${at} -1 section)
# The first fenced block of `lang` in the section.
function(fenced lang out)
  string(FIND "${section}" "```${lang}\n" begin)
  if(begin EQUAL -1)
    message(FATAL_ERROR "no ```${lang} block in README.md's \"Using the library\"")
  endif()
  string(LENGTH "```${lang}\n" skip)
  math(EXPR begin "${begin} + ${skip}")
  string(SUBSTRING "${section}" ${begin} -1 rest)
  string(FIND "${rest}" "```" end)
  string(SUBSTRING "${rest}" 0 ${end} text)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
fenced(cpp program)
fenced(cmake project)
file(WRITE "${WORK_DIR}/app/main.cpp" "${program}")
file(WRITE "${WORK_DIR}/app/CMakeLists.txt" "${project}")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD_DIR};--prefix;${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};-S;${WORK_DIR}/app;-B;${WORK_DIR}/build;-G;${GENERATOR};-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build"
    "${WORK_DIR}/build/app")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "README snippet step failed (${rc}): ${step}")
  endif()
endforeach()
