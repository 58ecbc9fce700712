# Third-party dependencies. LibTorch comes from CMAKE_PREFIX_PATH (scripts/build.sh points it at the
# project's virtual environment); any official LibTorch >= 2.1, CPU or CUDA, works.
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS 2.1)
  message(FATAL_ERROR "trainkit needs LibTorch >= 2.1, found ${Torch_VERSION}")
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
