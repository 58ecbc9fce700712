# trainkit_sources_setup(target): what every target built from trainkit's own sources needs:
# the fmt/spdlog header shim (see Dependencies.cmake), warnings and precompiled LibTorch headers.
function(trainkit_sources_setup target)
  target_include_directories(${target} BEFORE PRIVATE "${TRAINKIT_FMT_SHIM_DIR}")
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:trainkit_warnings>)
  if(TRAINKIT_USE_PCH)
    target_precompile_headers(${target} PRIVATE <torch/torch.h> <fmt/format.h> <spdlog/spdlog.h>)
  endif()
endfunction()

# trainkit_executable(name SOURCES...): an app, bench or test program linked to trainkit.
function(trainkit_executable name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE trainkit::trainkit)
  set_target_properties(${name} PROPERTIES BUILD_RPATH "${TRAINKIT_TORCH_LIB_DIR}")
  trainkit_sources_setup(${name})
endfunction()
