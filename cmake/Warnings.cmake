# Private, non-exported warning flags for trainkit's own targets.
add_library(trainkit_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(trainkit_warnings INTERFACE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
elseif(MSVC)
  target_compile_options(trainkit_warnings INTERFACE /W4)
endif()
