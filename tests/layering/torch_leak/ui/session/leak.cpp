#include "core/device/engine_part.h"
