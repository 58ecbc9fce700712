# Installs the trainkit just built into a scratch prefix, then configures, builds and runs the
# consumer project against it with find_package(trainkit). Invoked by ctest with cmake -P.
include("${CMAKE_CURRENT_LIST_DIR}/user_project.cmake")
file(REMOVE_RECURSE "${WORK_DIR}")
set(build "${WORK_DIR}/build")
trainkit_build_user_project("${SOURCE_DIR}" "${build}")
trainkit_run("${build}/consumer" "${WORK_DIR}/weights.pt")
trainkit_run("${build}/load_weights" "${WORK_DIR}/weights.pt")
