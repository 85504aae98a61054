/* The old name of tests/check.h, for the test programs not switched yet: include check.h. */
#include "check.h"
