/* cuda_runtime.h under the CUDA emulator: everything is in tests/simt/simt.h */
#include "simt.h"
