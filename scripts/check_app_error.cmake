cmake_minimum_required(VERSION 3.16)
# Runs an app on bad input and checks that it fails clearly: a non-zero exit status, and output (stdout
# and stderr together) that contains EXPECT (e.g. the file and line it blames).
#   APP: the program; ARGS: its arguments (a ;-list); EXPECT: text the output must contain.
# Usage: cmake -DAPP=... "-DARGS=..." "-DEXPECT=..." -P scripts/check_app_error.cmake     Run by ctest.
execute_process(COMMAND "${APP}" ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${APP} succeeded on bad input (expected a non-zero exit):\n${out}\n${err}")
endif()
string(FIND "${out}${err}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${APP} failed (${rc}) but its output lacks \"${EXPECT}\":\n${out}\n${err}")
endif()
message(STATUS "failed as expected (${rc}):\n${out}${err}")
