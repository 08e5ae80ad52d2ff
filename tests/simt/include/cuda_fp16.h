/* cuda_fp16.h under the CUDA emulator: everything is in tests/simt/simt.h */
#include "simt.h"
