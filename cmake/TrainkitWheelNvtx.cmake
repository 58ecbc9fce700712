# Runs before find_package(Torch), in trainkit's build and in the installed trainkitConfig.cmake.
# A torch wheel built for CUDA 12 (the PyPI wheels of torch 2.1 to 2.6 or so) has a TorchConfig that requires
# the CUDA toolkit's libnvToolsExt (CUDA::nvToolsExt: "Failed to find nvToolsExt" otherwise); CUDA 13
# toolkits no longer ship it. The wheel's own nvidia-nvtx package has it (the copy its libtorch_cuda.so
# loads), so when the LibTorch on CMAKE_PREFIX_PATH (or Torch_DIR) is such a wheel and nothing else was
# chosen, that copy is named for TorchConfig. The toolkit still serves nvcc, the headers and the other
# link-time libraries; at run time LibTorch loads the wheel's CUDA libraries through its own RUNPATH.
set(_tk_torch_share_dirs "")
if(Torch_DIR)
  list(APPEND _tk_torch_share_dirs "${Torch_DIR}/..")
endif()
list(APPEND _tk_torch_share_dirs ${CMAKE_PREFIX_PATH})
foreach(_tk_share ${_tk_torch_share_dirs})
  # torch.utils.cmake_prefix_path is <site-packages>/torch/share/cmake.
  get_filename_component(_tk_site "${_tk_share}/../../.." ABSOLUTE)
  set(_tk_nvtx "${_tk_site}/nvidia/nvtx/lib/libnvToolsExt.so.1")
  if(EXISTS "${_tk_share}/Torch/TorchConfig.cmake" AND EXISTS "${_tk_nvtx}")
    # FindCUDAToolkit's names (it looks for the library only where it finds the header).
    if(NOT CUDA_nvToolsExt_LIBRARY)
      set(CUDA_nvToolsExt_LIBRARY "${_tk_nvtx}" CACHE FILEPATH "libnvToolsExt (the torch wheel's own)")
    endif()
    if(NOT CUDAToolkit_nvToolsExt_INCLUDE_DIR)
      set(CUDAToolkit_nvToolsExt_INCLUDE_DIR "${_tk_site}/nvidia/nvtx/include" CACHE PATH
          "nvToolsExt.h (the torch wheel's own)")
    endif()
    # TorchConfig's own lookup of the same library (it adds it to TORCH_LIBRARIES).
    if(NOT LIBNVTOOLSEXT)
      set(LIBNVTOOLSEXT "${_tk_nvtx}" CACHE FILEPATH "libnvToolsExt (the torch wheel's own)")
    endif()
    break()
  endif()
endforeach()
