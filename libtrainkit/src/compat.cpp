// Compiles the out-of-line compatibility functions declared in trainkit/compat.h.
#define TRAINKIT_COMPAT_IMPLEMENTATION
#include "trainkit/compat.h"
