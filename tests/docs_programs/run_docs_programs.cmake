# Extracts the complete C++ programs of README.md and docs/*.md, installs the trainkit just built into a scratch
# prefix, builds the programs against it (tests/docs_programs/CMakeLists.txt) and runs each in a directory of
# its own (they write files such as runs/demo/ and lr_find.svg). Fails on a C++ block of the docs that is
# neither a program nor marked ```cpp fragment, a program that does not compile, or one that exits non-zero.
# Invoked by ctest with cmake -P: ROOT (the source tree), DOCS_CXX_COMPILER (the library's compiler) and
# tests/consumer/user_project.cmake's variables.
include("${CMAKE_CURRENT_LIST_DIR}/../consumer/user_project.cmake")
set(CXX_COMPILER "${DOCS_CXX_COMPILER}")  # the library's compiler (tests/CMakeLists.txt)
set(programs "${WORK_DIR}/programs")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
trainkit_run(bash "${ROOT}/scripts/extract_doc_programs.sh" "${ROOT}" "${programs}")
trainkit_build_user_project("${ROOT}/tests/docs_programs" "${build}" "-DPROGRAMS_DIR=${programs}")
file(STRINGS "${programs}/programs.txt" names)
foreach(name IN LISTS names)
  file(MAKE_DIRECTORY "${WORK_DIR}/run/${name}")
  string(TIMESTAMP start "%s")
  execute_process(COMMAND "${build}/docs_programs" "${name}" WORKING_DIRECTORY "${WORK_DIR}/run/${name}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 300)
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} (${programs}/${name}.cpp) failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${name}: exit 0 in ${seconds} s ${out}")
endforeach()
list(LENGTH names count)
message(STATUS "docs_programs: ${count} programs of the docs compiled and ran")
