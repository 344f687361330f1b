// api_error is header-only; this unit keeps the library non-empty until the server lands.
#include "api/api_error.h"
