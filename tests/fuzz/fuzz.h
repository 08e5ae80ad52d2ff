/*
 * fuzz.h - the fuzz targets' one entry point. Each tests/fuzz/NAME.c defines it; it is linked
 * either with libFuzzer (`make fuzz`, clang) or with replay.c, which runs a committed corpus
 * through it in `make test`. A target must never crash, leak or read out of bounds, whatever
 * the bytes; it returns 0.
 */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
