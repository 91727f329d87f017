/* A stand-in for libcuda.so, loaded through KILN_LIBCUDA. KT_FAKE_CUDA
 * picks the device it shows:
 *   no-device  the driver sees none (kiln_target_live: KILN_ERR_NO_DEVICE);
 *   device     an sm_90 device whose memory is host memory: allocations
 *              are malloc'ed, copies are memcpy, kernels and graphs do
 *              nothing but count (kt_fake_cuda_launches), so a session
 *              can be created and its device bytes read back
 *              (kt_fake_cuda_* below);
 *   (unset)    one device that cuDeviceGet fails with CUDA_ERROR_UNKNOWN
 *              (KILN_ERR_CUDA), which tests/scripts/suite_exit.sh uses.
 * With the device, KT_FAKE_CUDA_FAIL injects a failure:
 *   host-alloc  every cuMemHostAlloc fails (CUDA_ERROR_OUT_OF_MEMORY);
 *   copy:N      the Nth cuMemcpyHtoDAsync (from 1) and every one after it
 *               fail (CUDA_ERROR_ILLEGAL_ADDRESS, as a lost context does);
 *   alloc-over:N  every cuMemAlloc of more than N bytes fails
 *               (CUDA_ERROR_OUT_OF_MEMORY; kt_fake_cuda_refused counts them).
 * runtime/driver.c resolves every entry point through cuGetProcAddress_v2;
 * those not in entries[] share a body that fails. */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))

static int mode_is(const char *name)
{
    const char *mode = getenv("KT_FAKE_CUDA");
    return mode && strcmp(mode, name) == 0;
}

static long fail_copy_at(void)
{
    const char *f = getenv("KT_FAKE_CUDA_FAIL");
    return f && !strncmp(f, "copy:", 5) ? atol(f + 5) : 0;
}

/* ------------------------------------------------------------ bookkeeping */

typedef struct fake_block {
    void *p;
    size_t bytes;
} fake_block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static fake_block *device_blocks;
static int n_device, cap_device;
static int host_live;
static long copies, refused;

static int block_add(void *p, size_t bytes)
{
    pthread_mutex_lock(&mu);
    if (n_device == cap_device) {
        int cap = cap_device ? 2 * cap_device : 64;
        fake_block *v = realloc(device_blocks, (size_t)cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&mu);
            return 0;
        }
        device_blocks = v;
        cap_device = cap;
    }
    device_blocks[n_device++] = (fake_block){ p, bytes };
    pthread_mutex_unlock(&mu);
    return 1;
}

static int block_remove(void *p)
{
    pthread_mutex_lock(&mu);
    int found = 0;
    for (int i = 0; i < n_device && !found; i++)
        if (device_blocks[i].p == p) {
            device_blocks[i] = device_blocks[--n_device];
            found = 1;
        }
    pthread_mutex_unlock(&mu);
    return found;
}

/* For the tests, which dlopen this very library: the device allocations
 * alive now, and the pinned host ones. */
FAKE_API int kt_fake_cuda_n_blocks(void)
{
    pthread_mutex_lock(&mu);
    int n = n_device;
    pthread_mutex_unlock(&mu);
    return n;
}

FAKE_API const void *kt_fake_cuda_block(int i, size_t *bytes)
{
    pthread_mutex_lock(&mu);
    const void *p = i >= 0 && i < n_device ? device_blocks[i].p : NULL;
    *bytes = p ? device_blocks[i].bytes : 0;
    pthread_mutex_unlock(&mu);
    return p;
}

/* The cuMemAlloc calls alloc-over:N refused so far. */
FAKE_API long kt_fake_cuda_refused(void)
{
    pthread_mutex_lock(&mu);
    long n = refused;
    pthread_mutex_unlock(&mu);
    return n;
}

FAKE_API int kt_fake_cuda_host_live(void)
{
    pthread_mutex_lock(&mu);
    int n = host_live;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ------------------------------------------------------------ entry points */

static CUresult fake_init(unsigned int flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

static CUresult fake_driver_get_version(int *version)
{
    *version = 12000;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_count(int *count)
{
    *count = mode_is("no-device") ? 0 : 1;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *device, int ordinal)
{
    if (!mode_is("device") || ordinal != 0)
        return CUDA_ERROR_UNKNOWN;
    *device = 0;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_name(char *name, int len, CUdevice dev)
{
    (void)dev;
    if (len > 0) {
        strncpy(name, "fake sm_90 device", (size_t)len - 1);
        name[len - 1] = '\0';
    }
    return CUDA_SUCCESS;
}

static CUresult fake_device_get_attribute(int *v, CUdevice_attribute a, CUdevice dev)
{
    (void)dev;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    default: *v = 0; break;
    }
    return CUDA_SUCCESS;
}

static CUresult fake_mem_sizes(size_t *free_bytes, size_t *total)
{
    *free_bytes = *total = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

static CUresult fake_total_mem(size_t *total, CUdevice dev)
{
    (void)dev;
    *total = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

static CUresult fake_ctx_retain(CUcontext *ctx, CUdevice dev)
{
    (void)dev;
    *ctx = (CUcontext)(uintptr_t)0x1000;
    return CUDA_SUCCESS;
}

/* Handles nothing dereferences: a module, function, stream, graph or
 * event of this driver is a small block, so that a leak shows. */
static CUresult fake_handle(void **out)
{
    return (*out = malloc(1)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult fake_handle_free(void *h)
{
    free(h);
    return CUDA_SUCCESS;
}

static CUresult fake_module_load_data(CUmodule *m, const void *image)
{
    (void)image;
    return fake_handle((void **)m);
}

static CUresult fake_module_get_function(CUfunction *f, CUmodule m, const char *name)
{
    (void)name;
    *f = (CUfunction)m;
    return CUDA_SUCCESS;
}

static CUresult fake_stream_create(CUstream *s, unsigned flags)
{
    (void)flags;
    return fake_handle((void **)s);
}

static CUresult fake_event_create(CUevent *e, unsigned flags)
{
    (void)flags;
    return fake_handle((void **)e);
}

static CUresult fake_end_capture(CUstream s, CUgraph *g)
{
    (void)s;
    return fake_handle((void **)g);
}

static CUresult fake_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    (void)g;
    (void)flags;
    return fake_handle((void **)e);
}

/* The driver's documented rules for a tiled tensor map (CUDA driver API,
 * cuTensorMapEncodeTiled), so that a map kiln would have the real driver
 * refuse fails here too: the map 64-byte aligned, rank 1 to 5, a 16-byte
 * aligned address, element
 * sizes of the type, dims up to 2^32, strides of the outer dimensions
 * multiples of 16 below 2^40, boxes of 1 to 256 whose inner bytes are a
 * multiple of 16 (and at most the swizzle's span), element strides 1 to 8. */
static CUresult fake_tensor_map_encode(CUtensorMap *map, CUtensorMapDataType type,
                                       cuuint32_t rank, void *addr, const cuuint64_t *dims,
                                       const cuuint64_t *strides, const cuuint32_t *box,
                                       const cuuint32_t *elem_strides,
                                       CUtensorMapInterleave interleave,
                                       CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                       CUtensorMapFloatOOBfill fill)
{
    (void)l2;
    (void)fill;
    static const unsigned size[] = {
        [CU_TENSOR_MAP_DATA_TYPE_UINT8] = 1,   [CU_TENSOR_MAP_DATA_TYPE_UINT16] = 2,
        [CU_TENSOR_MAP_DATA_TYPE_UINT32] = 4,  [CU_TENSOR_MAP_DATA_TYPE_INT32] = 4,
        [CU_TENSOR_MAP_DATA_TYPE_UINT64] = 8,  [CU_TENSOR_MAP_DATA_TYPE_INT64] = 8,
        [CU_TENSOR_MAP_DATA_TYPE_FLOAT16] = 2, [CU_TENSOR_MAP_DATA_TYPE_FLOAT32] = 4,
        [CU_TENSOR_MAP_DATA_TYPE_FLOAT64] = 8, [CU_TENSOR_MAP_DATA_TYPE_BFLOAT16] = 2,
    };
    if (!map || (uintptr_t)map % 64 || !addr || (uintptr_t)addr % 16 || rank < 1 || rank > 5 ||
        (unsigned)type >= sizeof size / sizeof size[0] || !size[type] ||
        interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned e = size[type];
    for (cuuint32_t i = 0; i < rank; i++) {
        if (dims[i] < 1 || dims[i] > (1ull << 32) || box[i] < 1 || box[i] > 256 ||
            elem_strides[i] < 1 || elem_strides[i] > 8)
            return CUDA_ERROR_INVALID_VALUE;
        if (i + 1 < rank && (strides[i] % 16 || strides[i] >= (1ull << 40)))
            return CUDA_ERROR_INVALID_VALUE;
    }
    const unsigned inner = box[0] * e;
    const unsigned span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                          : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                          : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32
                                                                 : 0;
    if (inner % 16 || (span && inner > span))
        return CUDA_ERROR_INVALID_VALUE;
    memset(map, 0, sizeof *map);
    return CUDA_SUCCESS;
}

static CUresult fake_mem_alloc(CUdeviceptr *p, size_t bytes)
{
    const char *f = getenv("KT_FAKE_CUDA_FAIL");
    if (f && !strncmp(f, "alloc-over:", 11) && bytes > (size_t)atol(f + 11)) {
        pthread_mutex_lock(&mu);
        refused++;
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *b = malloc(bytes ? bytes : 1);
    if (!b || !block_add(b, bytes)) {
        free(b);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)(uintptr_t)b;
    return CUDA_SUCCESS;
}

static CUresult fake_mem_free(CUdeviceptr p)
{
    if (!p)
        return CUDA_SUCCESS;
    if (!block_remove((void *)(uintptr_t)p))
        return CUDA_ERROR_INVALID_VALUE;
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}

static CUresult fake_host_alloc(void **p, size_t bytes, unsigned flags)
{
    (void)flags;
    const char *f = getenv("KT_FAKE_CUDA_FAIL");
    if (f && !strcmp(f, "host-alloc"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!(*p = malloc(bytes ? bytes : 1)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    host_live++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult fake_free_host(void *p)
{
    free(p);
    pthread_mutex_lock(&mu);
    host_live--;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static CUresult fake_htod(CUdeviceptr dst, const void *src, size_t bytes)
{
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}

static CUresult fake_htod_async(CUdeviceptr dst, const void *src, size_t bytes, CUstream s)
{
    (void)s;
    long at = fail_copy_at();
    pthread_mutex_lock(&mu);
    long n = ++copies;
    pthread_mutex_unlock(&mu);
    if (at > 0 && n >= at)
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    return fake_htod(dst, src, bytes);
}

static CUresult fake_dtoh(void *dst, CUdeviceptr src, size_t bytes)
{
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

static CUresult fake_dtoh_async(void *dst, CUdeviceptr src, size_t bytes, CUstream s)
{
    (void)s;
    return fake_dtoh(dst, src, bytes);
}

static CUresult fake_dtod(CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

static CUresult fake_memset(CUdeviceptr dst, unsigned char v, size_t bytes)
{
    memset((void *)(uintptr_t)dst, v, bytes);
    return CUDA_SUCCESS;
}

/* Device memory is host memory here: every 2-D copy is rows of memcpy. */
static CUresult fake_copy_2d(const CUDA_MEMCPY2D *c, CUstream s)
{
    (void)s;
    const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST
                          ? (const char *)c->srcHost
                          : (const char *)(uintptr_t)c->srcDevice;
    char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? (char *)c->dstHost
                                                       : (char *)(uintptr_t)c->dstDevice;
    src += c->srcY * c->srcPitch + c->srcXInBytes;
    dst += c->dstY * c->dstPitch + c->dstXInBytes;
    for (size_t row = 0; row < c->Height; row++)
        memcpy(dst + row * c->dstPitch, src + row * c->srcPitch, c->WidthInBytes);
    return CUDA_SUCCESS;
}

static CUresult fake_memset_async(CUdeviceptr dst, unsigned char v, size_t bytes, CUstream s)
{
    (void)s;
    return fake_memset(dst, v, bytes);
}

static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *status)
{
    (void)s;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

static CUresult fake_elapsed(float *ms, CUevent a, CUevent b)
{
    (void)a;
    (void)b;
    *ms = 0.001f;
    return CUDA_SUCCESS;
}

static CUresult fake_get_error_name(CUresult error, const char **name)
{
    *name = error == CUDA_ERROR_UNKNOWN               ? "CUDA_ERROR_UNKNOWN"
            : error == CUDA_ERROR_OUT_OF_MEMORY       ? "CUDA_ERROR_OUT_OF_MEMORY"
            : error == CUDA_ERROR_ILLEGAL_ADDRESS     ? "CUDA_ERROR_ILLEGAL_ADDRESS"
                                                      : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

static CUresult fake_get_error_string(CUresult error, const char **text)
{
    (void)error;
    *text = "the fake driver of the test harness";
    return CUDA_SUCCESS;
}

/* Calls that succeed and do nothing here: contexts, synchronization,
 * attributes, launches, tensor maps. */
static CUresult fake_success(void)
{
    return CUDA_SUCCESS;
}

/* A launch does nothing but count. */
static long launches;

static CUresult fake_launch(void)
{
    pthread_mutex_lock(&mu);
    launches++;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

FAKE_API long kt_fake_cuda_launches(void)
{
    pthread_mutex_lock(&mu);
    long n = launches;
    pthread_mutex_unlock(&mu);
    return n;
}

static CUresult fake_unreachable(void)
{
    return CUDA_ERROR_UNKNOWN;
}

static const struct {
    const char *name;
    void *fn;
    int device; /* only with KT_FAKE_CUDA=device */
} entries[] = {
    { "cuInit", (void *)fake_init, 0 },
    { "cuDriverGetVersion", (void *)fake_driver_get_version, 0 },
    { "cuDeviceGetCount", (void *)fake_device_get_count, 0 },
    { "cuDeviceGet", (void *)fake_device_get, 0 },
    { "cuGetErrorName", (void *)fake_get_error_name, 0 },
    { "cuGetErrorString", (void *)fake_get_error_string, 0 },
    { "cuDeviceGetName", (void *)fake_device_get_name, 1 },
    { "cuDeviceGetAttribute", (void *)fake_device_get_attribute, 1 },
    { "cuDeviceTotalMem", (void *)fake_total_mem, 1 },
    { "cuDevicePrimaryCtxRetain", (void *)fake_ctx_retain, 1 },
    { "cuDevicePrimaryCtxRelease", (void *)fake_success, 1 },
    { "cuCtxSetCurrent", (void *)fake_success, 1 },
    { "cuCtxSynchronize", (void *)fake_success, 1 },
    { "cuModuleLoadData", (void *)fake_module_load_data, 1 },
    { "cuModuleUnload", (void *)fake_handle_free, 1 },
    { "cuModuleGetFunction", (void *)fake_module_get_function, 1 },
    { "cuFuncSetAttribute", (void *)fake_success, 1 },
    { "cuFuncGetAttribute", (void *)fake_success, 1 },
    { "cuMemAlloc", (void *)fake_mem_alloc, 1 },
    { "cuMemFree", (void *)fake_mem_free, 1 },
    { "cuMemGetInfo", (void *)fake_mem_sizes, 1 },
    { "cuMemcpyHtoD", (void *)fake_htod, 1 },
    { "cuMemcpyDtoH", (void *)fake_dtoh, 1 },
    { "cuMemcpyDtoD", (void *)fake_dtod, 1 },
    { "cuMemcpyHtoDAsync", (void *)fake_htod_async, 1 },
    { "cuMemcpyDtoHAsync", (void *)fake_dtoh_async, 1 },
    { "cuMemsetD8", (void *)fake_memset, 1 },
    { "cuMemHostAlloc", (void *)fake_host_alloc, 1 },
    { "cuMemFreeHost", (void *)fake_free_host, 1 },
    { "cuStreamCreate", (void *)fake_stream_create, 1 },
    { "cuStreamDestroy", (void *)fake_handle_free, 1 },
    { "cuStreamSynchronize", (void *)fake_success, 1 },
    { "cuLaunchKernelEx", (void *)fake_launch, 1 },
    { "cuStreamBeginCapture", (void *)fake_success, 1 },
    { "cuStreamEndCapture", (void *)fake_end_capture, 1 },
    { "cuGraphInstantiateWithFlags", (void *)fake_instantiate, 1 },
    { "cuGraphLaunch", (void *)fake_success, 1 },
    { "cuGraphExecDestroy", (void *)fake_handle_free, 1 },
    { "cuGraphDestroy", (void *)fake_handle_free, 1 },
    { "cuEventCreate", (void *)fake_event_create, 1 },
    { "cuEventRecord", (void *)fake_success, 1 },
    { "cuEventSynchronize", (void *)fake_success, 1 },
    { "cuEventElapsedTime", (void *)fake_elapsed, 1 },
    { "cuEventDestroy", (void *)fake_handle_free, 1 },
    { "cuTensorMapEncodeTiled", (void *)fake_tensor_map_encode, 1 },
    { "cuMemcpy2DAsync", (void *)fake_copy_2d, 1 },
    { "cuMemsetD8Async", (void *)fake_memset_async, 1 },
    { "cuStreamIsCapturing", (void *)fake_is_capturing, 1 },
};

FAKE_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                              cuuint64_t flags,
                                              CUdriverProcAddressQueryResult *status)
{
    (void)cudaVersion;
    (void)flags;
    *pfn = (void *)fake_unreachable;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (strcmp(symbol, entries[i].name) == 0 && (!entries[i].device || mode_is("device")))
            *pfn = entries[i].fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
