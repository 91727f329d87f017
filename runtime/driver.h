/* The CUDA driver, loaded at run time: a binary that never meets a GPU needs
 * no libcuda, and one built here runs on any driver new enough for the
 * symbols below (their CUDA 12.0 ABI, asked for through cuGetProcAddress). */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include "core/build.h"

#include <cuda.h>

typedef struct kiln_cu {
    int version; /* cuDriverGetVersion: 13000 for CUDA 13.0 */
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
    CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                     const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
} kiln_cu;

/* The driver, loaded and initialized once per process. KILN_ERR_NO_DEVICE
 * with the reason (no libcuda, cuInit failed, no device) otherwise; the same
 * answer every call. $KILN_LIBCUDA names another library to load. */
kiln_status kiln_cu_get(const kiln_cu **out);

/* KILN_OK for CUDA_SUCCESS; otherwise KILN_ERR_CUDA with "what: NAME (text)". */
kiln_status kiln_cu_check(const kiln_cu *cu, CUresult r, const char *what);

/* The live target of device ordinal: capabilities from its compute
 * capability (sm_90 devices get sm_90a: the code runs on that very chip),
 * multiprocessor count and shared-memory limit read from the device. */
kiln_status kiln_cu_target(const kiln_cu *cu, int ordinal, kiln_target *out, char *name,
                           size_t name_size);

/* What device dev gives a session's launches (kiln_launch_finalise): its
 * SM count, an SM's shared memory, the part each block reserves, and the
 * warps an SM holds. */
kiln_status kiln_cu_caps(const kiln_cu *cu, CUdevice dev, kiln_device_caps *out);

#endif
