# Private, non-exported warning flags for trainkit's own targets.
add_library(trainkit_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(trainkit_warnings INTERFACE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  # LibTorch 2.4's _TORCH_OPTIM_DESERIALIZE_TORCH_ARG (used by the optimizers' load) expands to
  # TORCH_INTERNAL_ASSERT(cond) with no variadic argument, which clang's -Wpedantic flags at our call site.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang" AND Torch_VERSION VERSION_LESS 2.5)
    target_compile_options(trainkit_warnings INTERFACE -Wno-gnu-zero-variadic-macro-arguments)
  endif()
elseif(MSVC)
  target_compile_options(trainkit_warnings INTERFACE /W4)
endif()
