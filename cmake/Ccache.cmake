# Use ccache for this project's targets when it is installed (and the user has not chosen a launcher).
find_program(TRAINKIT_CCACHE ccache)
if(TRAINKIT_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${TRAINKIT_CCACHE}")
endif()
