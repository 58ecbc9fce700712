# What tests/consumer/run_consumer_test.cmake and tests/docs_programs/run_docs_programs.cmake share (included by
# both, which ctest runs with cmake -P): install the trainkit just built into a scratch prefix and build a project
# against it as a user's project would (find_package(trainkit), CMake's default compiler).
# Their variables: BUILD_DIR (trainkit's build), WORK_DIR (scratch, emptied first), PREFIX_PATH (LibTorch's CMake
# prefix), CUDA_ROOT, CUDA_COMPILER, GENERATOR, CXX_COMPILER (empty: CMake's default; a sanitizer build passes
# its own, whose runtime its objects call).

# Runs a command; fails the test with the command line when it exits non-zero.
function(trainkit_run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

# Installs trainkit into ${WORK_DIR}/install, then configures and builds the project in `source` into `build`;
# further arguments go to its configure step.
function(trainkit_build_user_project source build)
  set(prefix "${WORK_DIR}/install")
  trainkit_run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
  # Release at -O0: the programs spend their time inside LibTorch and trainkit, which keep their own
  # optimization, and GCC compiles these LibTorch-heavy units in 84% of -O1's time (43 s -> 36 s for the docs'
  # programs; -O1 took two thirds of -O3's).
  set(args -S "${source}" -B "${build}" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG"
      "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${PREFIX_PATH}/Torch" ${ARGN})
  if(CXX_COMPILER)
    list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  endif()
  if(CUDA_ROOT)
    list(APPEND args "-DCUDAToolkit_ROOT=${CUDA_ROOT}")
  endif()
  if(CUDA_COMPILER)
    list(APPEND args "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}")
  endif()
  trainkit_run("${CMAKE_COMMAND}" ${args})
  trainkit_run("${CMAKE_COMMAND}" --build "${build}")
endfunction()
