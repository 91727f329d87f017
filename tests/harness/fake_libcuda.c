/* A stand-in for libcuda.so, loaded through KILN_LIBCUDA by
 * tests/scripts/suite_exit.sh to hand a GPU suite a device it cannot read.
 * With KT_FAKE_CUDA=no-device the driver sees no device (kiln_target_live:
 * KILN_ERR_NO_DEVICE); otherwise it sees one and cuDeviceGet fails with
 * CUDA_ERROR_UNKNOWN (KILN_ERR_CUDA). runtime/driver.c resolves every entry
 * point through cuGetProcAddress_v2; the ones not in entries[] share a body
 * that fails, and kiln calls none of them before cuDeviceGet. */
#include <cuda.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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
    const char *mode = getenv("KT_FAKE_CUDA");
    *count = mode && strcmp(mode, "no-device") == 0 ? 0 : 1;
    return CUDA_SUCCESS;
}

static CUresult fake_device_get(CUdevice *device, int ordinal)
{
    (void)device;
    (void)ordinal;
    return CUDA_ERROR_UNKNOWN;
}

static CUresult fake_get_error_name(CUresult error, const char **name)
{
    *name = error == CUDA_ERROR_UNKNOWN ? "CUDA_ERROR_UNKNOWN" : "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}

static CUresult fake_get_error_string(CUresult error, const char **text)
{
    (void)error;
    *text = "the fake driver of the test harness";
    return CUDA_SUCCESS;
}

static CUresult fake_unreachable(void)
{
    return CUDA_ERROR_UNKNOWN;
}

static const struct {
    const char *name;
    void *fn;
} entries[] = {
    { "cuInit", (void *)fake_init },
    { "cuDriverGetVersion", (void *)fake_driver_get_version },
    { "cuDeviceGetCount", (void *)fake_device_get_count },
    { "cuDeviceGet", (void *)fake_device_get },
    { "cuGetErrorName", (void *)fake_get_error_name },
    { "cuGetErrorString", (void *)fake_get_error_string },
};

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    (void)cudaVersion;
    (void)flags;
    *pfn = (void *)fake_unreachable;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (strcmp(symbol, entries[i].name) == 0)
            *pfn = entries[i].fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}
