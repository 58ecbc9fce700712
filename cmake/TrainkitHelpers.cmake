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

# The one precompiled header of all apps, benchmarks and tests: an object library that only builds it.
function(_trainkit_executable_pch)
  if(TARGET trainkit_exe_pch)
    return()
  endif()
  add_library(trainkit_exe_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp")
  target_link_libraries(trainkit_exe_pch PRIVATE trainkit::app fmt::fmt spdlog::spdlog)
  trainkit_sources_setup(trainkit_exe_pch)
endfunction()

# trainkit_executable(name SOURCES...): an app, bench or test program linked to trainkit and its
# application layer.
function(trainkit_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE trainkit::app fmt::fmt spdlog::spdlog)
  set_target_properties(${name} PROPERTIES BUILD_RPATH "${TRAINKIT_TORCH_LIB_DIR}")
  if(TRAINKIT_USE_PCH)
    _trainkit_executable_pch()
    trainkit_sources_setup(${name} REUSE_FROM trainkit_exe_pch)
  else()
    trainkit_sources_setup(${name})
  endif()
endfunction()
