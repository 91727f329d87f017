#include "runtime/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every symbol is asked for at the CUDA 12.0 ABI: the struct's prototypes
 * are those of that version (cuMemAlloc_v2, cuStreamBeginCapture_v2, ...). */
#define KILN_CU_ABI 12000

static const struct {
    const char *name;
    size_t offset;
} symbols[] = {
#define SYM(f) { "cu" #f, offsetof(kiln_cu, f) }
    SYM(Init), SYM(DriverGetVersion), SYM(GetErrorName), SYM(GetErrorString),
    SYM(DeviceGetCount), SYM(DeviceGet), SYM(DeviceGetName), SYM(DeviceGetAttribute),
    SYM(DeviceTotalMem), SYM(DevicePrimaryCtxRetain), SYM(DevicePrimaryCtxRelease),
    SYM(CtxSetCurrent), SYM(CtxSynchronize), SYM(ModuleLoadData), SYM(ModuleUnload),
    SYM(ModuleGetFunction), SYM(FuncSetAttribute), SYM(FuncGetAttribute), SYM(MemAlloc),
    SYM(MemFree), SYM(MemGetInfo), SYM(MemcpyHtoD), SYM(MemcpyDtoH), SYM(MemcpyDtoD),
    SYM(MemcpyHtoDAsync), SYM(MemcpyDtoHAsync), SYM(MemsetD8), SYM(MemHostAlloc),
    SYM(MemFreeHost), SYM(StreamCreate), SYM(StreamDestroy), SYM(StreamSynchronize),
    SYM(LaunchKernelEx), SYM(StreamBeginCapture), SYM(StreamEndCapture),
    SYM(GraphInstantiateWithFlags), SYM(GraphLaunch), SYM(GraphExecDestroy), SYM(GraphDestroy),
    SYM(EventCreate), SYM(EventRecord), SYM(EventSynchronize), SYM(EventElapsedTime),
    SYM(EventDestroy), SYM(TensorMapEncodeTiled), SYM(Memcpy2DAsync), SYM(MemsetD8Async),
    SYM(StreamIsCapturing),
#undef SYM
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static kiln_cu driver;
static kiln_status load_status;
static char load_error[512];

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static kiln_status load(void)
{
    kiln_env env;
    kiln_env_read(&env);
    const char *names[] = { env.libcuda, "libcuda.so.1", "libcuda.so" };
    void *lib = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(names) && !lib; i++)
        if (names[i] && names[i][0])
            lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return kiln_fail(KILN_ERR_NO_DEVICE, "no CUDA driver: %s", dlerror());
    get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc)
        return kiln_fail(KILN_ERR_NO_DEVICE,
                         "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
    for (size_t i = 0; i < KILN_ARRAY_LEN(symbols); i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult found;
        CUresult r = get_proc(symbols[i].name, &fn, KILN_CU_ABI, CU_GET_PROC_ADDRESS_DEFAULT,
                              &found);
        if (r != CUDA_SUCCESS || !fn)
            return kiln_fail(KILN_ERR_NO_DEVICE, "the CUDA driver lacks %s (error %d)",
                             symbols[i].name, (int)r);
        memcpy((char *)&driver + symbols[i].offset, &fn, sizeof fn);
    }
    CUresult r = driver.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        driver.GetErrorName(r, &name);
        return kiln_fail(KILN_ERR_NO_DEVICE, "cuInit failed: %s", name);
    }
    int count = 0;
    if (driver.DeviceGetCount(&count) != CUDA_SUCCESS || count == 0)
        return kiln_fail(KILN_ERR_NO_DEVICE, "the CUDA driver sees no device");
    driver.DriverGetVersion(&driver.version);
    return KILN_OK;
}

static void load_once(void)
{
    load_status = load();
    if (load_status != KILN_OK)
        snprintf(load_error, sizeof load_error, "%s", kiln_last_error());
}

kiln_status kiln_cu_get(const kiln_cu **out)
{
    pthread_once(&once, load_once);
    if (load_status != KILN_OK)
        return kiln_fail(load_status, "%s", load_error);
    *out = &driver;
    return KILN_OK;
}

kiln_status kiln_cu_check(const kiln_cu *cu, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return KILN_OK;
    const char *name = "?", *text = "?";
    cu->GetErrorName(r, &name);
    cu->GetErrorString(r, &text);
    return kiln_fail(KILN_ERR_CUDA, "%s: %s (%s)", what, name, text);
}

kiln_status kiln_cu_target(const kiln_cu *cu, int ordinal, kiln_target *out, char *name,
                           size_t name_size)
{
    CUdevice dev;
    int major = 0, minor = 0, sms = 0, smem = 0;
    kiln_status st = kiln_cu_check(cu, cu->DeviceGet(&dev, ordinal), "cuDeviceGet");
    if (st == KILN_OK)
        st = kiln_cu_check(cu, cu->DeviceGetAttribute(&major,
                               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attribute");
    if (st == KILN_OK)
        st = kiln_cu_check(cu, cu->DeviceGetAttribute(&minor,
                               CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attribute");
    if (st == KILN_OK)
        st = kiln_cu_check(cu, cu->DeviceGetAttribute(&sms,
                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "attribute");
    if (st == KILN_OK)
        st = kiln_cu_check(cu, cu->DeviceGetAttribute(&smem,
                               CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
                           "attribute");
    if (st == KILN_OK && name)
        st = kiln_cu_check(cu, cu->DeviceGetName(name, (int)name_size, dev), "cuDeviceGetName");
    if (st != KILN_OK)
        return kiln_fail_prefix(st, "device %d", ordinal);
    return kiln_target_from_cc(major, minor, sms, smem, out);
}

kiln_status kiln_cu_caps(const kiln_cu *cu, CUdevice dev, kiln_device_caps *out)
{
    static const struct {
        CUdevice_attribute id;
        size_t at;
    } attrs[] = {
        { CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, offsetof(kiln_device_caps, sm_count) },
        { CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
          offsetof(kiln_device_caps, smem_per_sm) },
        { CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
          offsetof(kiln_device_caps, smem_per_block_reserved) },
        { CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
          offsetof(kiln_device_caps, warps_per_sm) },
    };
    kiln_device_caps c;
    for (size_t i = 0; i < KILN_ARRAY_LEN(attrs); i++) {
        int *v = (int *)((char *)&c + attrs[i].at);
        kiln_status st = kiln_cu_check(cu, cu->DeviceGetAttribute(v, attrs[i].id, dev),
                                       "cuDeviceGetAttribute");
        if (st != KILN_OK)
            return st;
    }
    c.warps_per_sm /= 32;
    *out = c;
    return KILN_OK;
}

kiln_status kiln_target_live(int device, kiln_target *out)
{
    const kiln_cu *cu;
    kiln_status st = kiln_cu_get(&cu);
    return st ? st : kiln_cu_target(cu, device, out, NULL, 0);
}
