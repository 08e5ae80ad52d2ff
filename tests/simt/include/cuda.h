/* cuda.h under the CUDA emulator: the driver API's tensor-map types and
 * cuTensorMapEncodeTiled, the only driver entry point the kernels use (gemm_wgmma.cu gets it
 * through cudaGetDriverEntryPointByVersion). The emulator's version is in
 * tests/simt/wgmma.cpp; the values below are the emulator's own, not the driver's. */
#ifndef WICK_SIMT_CUDA_H
#define WICK_SIMT_CUDA_H

#include "simt.h"

typedef uint64_t cuuint64_t;
typedef uint32_t cuuint32_t;
typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };

typedef enum { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7 }
	CUtensorMapDataType;
typedef enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 } CUtensorMapInterleave;
typedef enum { CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_128B = 3 } CUtensorMapSwizzle;
typedef enum { CU_TENSOR_MAP_L2_PROMOTION_NONE = 0, CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 }
	CUtensorMapL2promotion;
typedef enum { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 } CUtensorMapFloatOOBfill;

typedef struct CUtensorMap_st {
	alignas(64) cuuint64_t opaque[16];
} CUtensorMap;

/* As the driver's, for what the emulator supports: UINT8 or FLOAT32, rank 2, no interleave, no or
 * 128-byte swizzle (then boxDim[0] <= 128), unit element strides, zero fill. */
CUresult cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
				cuuint32_t tensorRank, void *globalAddress,
				const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
				const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
				CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
				CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill);

#endif
