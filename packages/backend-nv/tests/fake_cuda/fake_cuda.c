/* A stand-in for libcuda.so.1, written against the toolkit's cuda.h, for testing xgrad_nv.driver's ctypes binding
 * without a GPU: the functions the backend calls, with the exact C signatures cuda.h declares. Device memory is host
 * memory (a CUdeviceptr is a malloc'd address), a launch runs nothing but records its dimensions and decodes its
 * kernelParams by the kinds set with fake_expect ('p': 8-byte pointer, 'i': 4-byte int). fake_* are test hooks. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUcontext current;
static unsigned int dims[7];
static long long params[32];
static char kinds[33];
static char function_name[128];
static unsigned char image_head[16];
static int func_attr[2];
static long long live_bytes;

void fake_expect(const char *k) { strncpy(kinds, k, 32); }
long long fake_param(int i) { return params[i]; }
unsigned int fake_dim(int i) { return dims[i]; }
const char *fake_function_name(void) { return function_name; }
const unsigned char *fake_image_head(void) { return image_head; }
int fake_func_attr(int i) { return func_attr[i]; }
long long fake_live_bytes(void) { return live_bytes; }

CUresult cuInit(unsigned int flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 2; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  if (ordinal < 0 || ordinal >= 2) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  snprintf(name, (size_t)len, "Fake H200 %d", (int)dev);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = 232448; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { *bytes = (size_t)141 << 30; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  *pctx = (CUcontext)(uintptr_t)(0x1000 + dev);
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) { current = ctx; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) { return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  if (n > ((size_t)1 << 30)) return CUDA_ERROR_OUT_OF_MEMORY;
  void *m = malloc(n);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  live_bytes += (long long)n;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return CUDA_SUCCESS; }
CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
  *total = (size_t)141 << 30;
  *free_ = *total - (size_t)live_bytes;
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) { return cuMemcpyHtoD_v2(dst, src, n); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { return cuMemcpyDtoH_v2(dst, src, n); }
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  memcpy(image_head, image, sizeof(image_head));
  if (strncmp((const char *)image, ".version 99", 11) == 0) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  *module = (CUmodule)(uintptr_t)0x2000;
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule m) { return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  if (strcmp(name, "missing") == 0) return CUDA_ERROR_NOT_FOUND;
  strncpy(function_name, name, sizeof(function_name) - 1);
  *f = (CUfunction)(uintptr_t)0x3000;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value) {
  func_attr[0] = (int)attrib;
  func_attr[1] = value;
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **kernelParams,
                        void **extra) {
  if (gx == 0 || gy == 0 || gz == 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned int d[7] = {gx, gy, gz, bx, by, bz, shared};
  memcpy(dims, d, sizeof(d));
  for (int i = 0; kinds[i] && i < 32; i++)
    params[i] = kinds[i] == 'p' ? (long long)*(uint64_t *)kernelParams[i] : (long long)*(int32_t *)kernelParams[i];
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent *e, unsigned int flags) { *e = (CUevent)malloc(1); return CUDA_SUCCESS; }
CUresult cuEventRecord(CUevent e, CUstream s) { return CUDA_SUCCESS; }
CUresult cuEventSynchronize(CUevent e) { return CUDA_SUCCESS; }
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { *ms = 1.5f; return CUDA_SUCCESS; }
CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult e, const char **s) {
  switch (e) {
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : e == CUDA_ERROR_NOT_FOUND ? "named symbol not found" : "fake error";
  return CUDA_SUCCESS;
}
