// The one translation unit that compiles stb_image and stb_image_resize (Debian's libstb-dev
// ships them as single headers). Their own warnings are not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#pragma GCC diagnostic ignored "-Wpedantic"
#define STB_IMAGE_IMPLEMENTATION
#define STBI_FAILURE_USERMSG
// Only the formats stb_image decodes for BatchPilot (core/data/image_folder_dataset.cpp): PNG, JPEG and
// PNM go to libpng, libjpeg-turbo and BatchPilot's own reader, after fuzzing found memory-safety
// bugs in this version's JPEG and 16-bit PNM paths; PSD, PIC and HDR are not offered at all.
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_TGA
#include <stb/stb_image.h>
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
#pragma GCC diagnostic pop
