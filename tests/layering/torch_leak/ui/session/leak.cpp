#include "core/engine_part.h"
