# Installs the trainkit just built into a scratch prefix, then configures, builds and runs the
# consumer project against it with find_package(trainkit). Invoked by ctest with cmake -P.
set(prefix "${WORK_DIR}/install")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
set(args -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${PREFIX_PATH}/Torch")
# Empty: CMake's default compiler; a sanitizer build passes its own (its objects call that compiler's runtime).
if(CXX_COMPILER)
  list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(CUDA_ROOT)
  list(APPEND args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
endif()
if(CUDA_COMPILER)
  list(APPEND args "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}")
endif()
run("${CMAKE_COMMAND}" ${args})
run("${CMAKE_COMMAND}" --build "${build}")
run("${build}/consumer" "${WORK_DIR}/weights.pt")
run("${build}/load_weights" "${WORK_DIR}/weights.pt")
