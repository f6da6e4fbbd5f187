/* fuzz_image.c: libFuzzer harness for the image decoders (kimg_decode and kimg_probe:
 * PNG through libpng, JPEG through libjpeg-turbo, format sniffing). Any
 * crash, leak or sanitizer report is a bug: bad bytes must come back as
 * errors. Build and run: make fuzz-image. */
#include <stdint.h>
#include <stdlib.h>

#include "vision/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t w, h; /* the header probe (kimg_probe) agrees with the decoder */
    kiln_status_free(kimg_probe(data, size, "fuzz", &w, &h));
    kimg_image im;
    kiln_status st = kimg_decode(data, size, "fuzz", &im);
    if (!st && (im.h <= 0 || im.w <= 0 || !im.rgb)) abort();
    if (!st && (im.w != w || im.h != h)) abort();
    kiln_status_free(st);
    kimg_free(&im);
    return 0;
}
