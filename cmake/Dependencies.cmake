# Third-party dependencies. LibTorch comes from CMAKE_PREFIX_PATH (scripts/build.sh points it at the
# project's virtual environment); LibTorch >= 2.4, CPU or CUDA (tested: 2.4.1 and 2.15.0, scripts/compat.sh).
include(TrainkitWheelNvtx)
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 2.4)
  message(FATAL_ERROR "trainkit needs LibTorch >= 2.4, found ${Torch_VERSION} in ${Torch_DIR}; point "
                      "CMAKE_PREFIX_PATH at a newer one (a torch wheel's torch.utils.cmake_prefix_path, for "
                      "instance)")
endif()
find_package(Threads REQUIRED)
# OpenMP for the one source that enters ATen's intra-op thread pool (src/detail/parallel_range.cpp says why).
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)
find_package(PNG REQUIRED)
# libcurl for the MLflow client (Debian: libcurl4-openssl-dev).
find_package(CURL REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
# LibTorch built with the pre-C++11 libstdc++ ABI (the PyPI torch wheels before 2.7 or so: TORCH_CXX_FLAGS
# holds -D_GLIBCXX_USE_CXX11_ABI=0, which the torch target passes to every source that links it) cannot be
# linked with Debian's compiled libfmt and libspdlog, which use the C++11 ABI: every function of theirs that
# takes or returns a std::string is a different symbol. TRAINKIT_FMT_HEADER_ONLY (AUTO: on exactly for such
# a LibTorch) compiles fmt and spdlog into trainkit from their headers instead (their header-only targets);
# TRAINKIT_FMT and TRAINKIT_SPDLOG name the targets to link. The other compiled dependencies are C (zlib,
# libpng, libcurl, OpenMP's runtime) or header-only (CLI11, toml++, nlohmann-json, Catch2).
set(TRAINKIT_FMT_HEADER_ONLY AUTO CACHE STRING
    "Use fmt and spdlog header-only: AUTO (when LibTorch uses the pre-C++11 ABI), ON or OFF")
set_property(CACHE TRAINKIT_FMT_HEADER_ONLY PROPERTY STRINGS AUTO ON OFF)
set(TRAINKIT_TORCH_CXX11_ABI ON)
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  set(TRAINKIT_TORCH_CXX11_ABI OFF)
endif()
if(TRAINKIT_FMT_HEADER_ONLY STREQUAL "AUTO")
  if(TRAINKIT_TORCH_CXX11_ABI)
    set(_tk_fmt_header_only OFF)
  else()
    set(_tk_fmt_header_only ON)
  endif()
else()
  set(_tk_fmt_header_only ${TRAINKIT_FMT_HEADER_ONLY})
endif()
if(_tk_fmt_header_only)
  set(TRAINKIT_FMT fmt::fmt-header-only)
  set(TRAINKIT_SPDLOG spdlog::spdlog_header_only)
  # Debian's header-only spdlog target still links the compiled fmt (fmt::fmt): give it the header-only one.
  set_property(TARGET spdlog::spdlog_header_only PROPERTY INTERFACE_LINK_LIBRARIES Threads::Threads fmt::fmt-header-only)
  message(STATUS "trainkit: fmt and spdlog header-only (LibTorch's C++11 ABI: ${TRAINKIT_TORCH_CXX11_ABI})")
else()
  set(TRAINKIT_FMT fmt::fmt)
  set(TRAINKIT_SPDLOG spdlog::spdlog)
  if(NOT TRAINKIT_TORCH_CXX11_ABI)
    message(WARNING "LibTorch uses the pre-C++11 ABI but TRAINKIT_FMT_HEADER_ONLY is OFF: linking the compiled fmt and spdlog will fail unless they were built with that ABI too")
  endif()
endif()
# nlohmann-json: every JSON file trainkit writes or reads (Debian: nlohmann-json3-dev). Header-only and
# private to the sources, so the installed package does not ask for it.
find_package(nlohmann_json 3 REQUIRED)
# toml++ is used header-only inside one source file, so it adds no link dependency.
find_path(TRAINKIT_TOMLPP_INCLUDE_DIR toml++/toml.h)
if(NOT TRAINKIT_TOMLPP_INCLUDE_DIR)
  message(FATAL_ERROR "toml++ headers not found (Debian: libtomlplusplus-dev)")
endif()
# CLI11: the command-line parser behind the application layer's app/cli.h (header only, used by one source).
find_package(CLI11 CONFIG REQUIRED)

# LibTorch's imported targets put their headers on the include path as normal directories; mark them
# SYSTEM so that LibTorch's own warnings do not drown ours.
foreach(_tk_target torch torch_cpu c10)
  if(TARGET ${_tk_target})
    get_target_property(_tk_inc ${_tk_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_tk_inc)
      set_target_properties(${_tk_target} PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_tk_inc}")
    endif()
  endif()
endforeach()
# The wheel's libraries live beside libtorch.so; executables find them through the build RPATH.
get_filename_component(TRAINKIT_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)

# LibTorch's include directory carries its own, newer fmt headers, and it comes before /usr/include on the
# command line; Debian's compiled spdlog and fmt need the fmt headers they were built with. trainkit's
# own sources therefore get a private include directory, searched first, that links to exactly those
# headers. Public trainkit headers include neither fmt nor spdlog, so consumers are unaffected.
set(TRAINKIT_FMT_SHIM_DIR "${CMAKE_BINARY_DIR}/trainkit_fmt_shim")
foreach(_tk_pkg fmt spdlog)
  get_target_property(_tk_inc ${_tk_pkg}::${_tk_pkg} INTERFACE_INCLUDE_DIRECTORIES)
  set(_tk_found "")
  foreach(_tk_dir ${_tk_inc})
    if(EXISTS "${_tk_dir}/${_tk_pkg}" AND NOT _tk_found)
      set(_tk_found "${_tk_dir}/${_tk_pkg}")
    endif()
  endforeach()
  if(NOT _tk_found AND EXISTS "/usr/include/${_tk_pkg}")
    set(_tk_found "/usr/include/${_tk_pkg}")
  endif()
  if(NOT _tk_found)
    message(FATAL_ERROR "cannot locate the ${_tk_pkg} headers of ${_tk_pkg}::${_tk_pkg}")
  endif()
  file(MAKE_DIRECTORY "${TRAINKIT_FMT_SHIM_DIR}")
  file(CREATE_LINK "${_tk_found}" "${TRAINKIT_FMT_SHIM_DIR}/${_tk_pkg}" SYMBOLIC)
endforeach()
