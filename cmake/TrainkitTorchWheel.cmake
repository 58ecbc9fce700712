# When LibTorch comes from PyPI's torch wheel, its CUDA libraries (NCCL, cuDNN, cuBLAS ...) live in the
# sibling nvidia/*/lib folders of the same environment and are found at run time through libtorch's own
# RUNPATH. At link time GNU ld would otherwise resolve them from the CUDA toolkit's folders, whose NCCL
# can be older than the one the wheel was built against, so the wheel's folders go first (-rpath-link).
# Included by trainkit's build and by the installed trainkitConfig.cmake; sets TRAINKIT_TORCH_LINK_OPTIONS.
set(TRAINKIT_TORCH_LINK_OPTIONS "")
if(TORCH_LIBRARY)
  get_filename_component(_tk_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  get_filename_component(_tk_site "${_tk_torch_lib_dir}/../.." ABSOLUTE)
  file(GLOB _tk_nvidia_lib_dirs LIST_DIRECTORIES true "${_tk_site}/nvidia/*/lib" "${_tk_site}/nvidia/cu*/lib")
  foreach(_tk_dir ${_tk_nvidia_lib_dirs})
    if(IS_DIRECTORY "${_tk_dir}")
      list(APPEND TRAINKIT_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_tk_dir}")
    endif()
  endforeach()
endif()
