# trainkit_sources_setup(target [REUSE_FROM other]): what every target built from trainkit's own sources
# needs: the fmt/spdlog header shim (see Dependencies.cmake), warnings and precompiled LibTorch headers —
# built once per flag set and reused (REUSE_FROM) instead of once per target (~20 s each on 2 cores).
function(trainkit_sources_setup target)
  cmake_parse_arguments(ARG "" "REUSE_FROM" "" ${ARGN})
  target_include_directories(${target} BEFORE PRIVATE "${TRAINKIT_FMT_SHIM_DIR}")
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:trainkit_warnings>)
  if(TRAINKIT_USE_PCH)
    if(ARG_REUSE_FROM)
      target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
    else()
      target_precompile_headers(${target} PRIVATE <torch/torch.h> <fmt/format.h> <spdlog/spdlog.h>)
    endif()
  endif()
endfunction()

# The one precompiled header of all apps and benchmarks (`pch` trainkit_exe_pch), or of all test programs
# (trainkit_test_pch, compiled with TRAINKIT_TEST_CXX_FLAGS): an object library that only builds it.
function(_trainkit_executable_pch pch)
  if(TARGET ${pch})
    return()
  endif()
  add_library(${pch} OBJECT "${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp")
  target_link_libraries(${pch} PRIVATE trainkit::app ${TRAINKIT_FMT} ${TRAINKIT_SPDLOG})
  if(pch STREQUAL "trainkit_test_pch")
    target_compile_options(${pch} PRIVATE ${TRAINKIT_TEST_CXX_FLAGS})
  endif()
  trainkit_sources_setup(${pch})
endfunction()

# trainkit_executable(name [TEST] SOURCES...): an app, bench or (TEST) test program linked to trainkit and its
# application layer. A test program compiles with TRAINKIT_TEST_CXX_FLAGS (the tests' precompiled header too).
function(trainkit_executable name)
  cmake_parse_arguments(ARG "TEST" "" "" ${ARGN})
  set(pch trainkit_exe_pch)
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  if(ARG_TEST)
    set(pch trainkit_test_pch)
    target_compile_options(${name} PRIVATE ${TRAINKIT_TEST_CXX_FLAGS})
  endif()
  target_link_libraries(${name} PRIVATE trainkit::app ${TRAINKIT_FMT} ${TRAINKIT_SPDLOG})
  set_target_properties(${name} PROPERTIES BUILD_RPATH "${TRAINKIT_TORCH_LIB_DIR}")
  if(TRAINKIT_USE_PCH)
    _trainkit_executable_pch(${pch})
    trainkit_sources_setup(${name} REUSE_FROM ${pch})
  else()
    trainkit_sources_setup(${name})
  endif()
endfunction()

# trainkit_unity_by_folder(target): with TRAINKIT_UNITY_BUILD, the sources of `target` that use the
# precompiled header compile as one translation unit per folder (CMake's UNITY_BUILD, GROUP mode). Most of
# a source's compile time is LibTorch's: loading the header, instantiating its templates and optimizing the
# inline functions they bring, about the same for a 60-line file as for a 400-line one; a folder compiled
# as one unit pays it once. Sources that skip the precompiled header (no LibTorch, or flags of their own)
# stay on their own. Call it in the directory that added the sources, after their properties are set.
# MERGE "a|b|c" ...: the folders of one entry share a unit (named after the first): each unit saves the
# ~4 s of CPU that loading the header and generating LibTorch's inline functions costs a unit.
function(trainkit_unity_by_folder target)
  if(NOT TRAINKIT_UNITY_BUILD)
    return()
  endif()
  cmake_parse_arguments(ARG "" "" "MERGE" ${ARGN})
  get_target_property(sources ${target} SOURCES)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.cpp$" OR src MATCHES "^\\$<")
      continue()
    endif()
    get_source_file_property(skip_pch "${src}" SKIP_PRECOMPILE_HEADERS)
    if(skip_pch)
      continue()
    endif()
    get_filename_component(folder "${src}" DIRECTORY)
    if(folder STREQUAL "")
      set(folder ".")
    endif()
    foreach(merged IN LISTS ARG_MERGE)
      string(REPLACE "|" ";" merged_folders "${merged}")
      if(folder IN_LIST merged_folders)
        list(GET merged_folders 0 folder)
        break()
      endif()
    endforeach()
    set_source_files_properties("${src}" PROPERTIES UNITY_GROUP "${folder}")
  endforeach()
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE GROUP)
endfunction()
