/* A stand-in for libamdhip64 with the same C signatures, for testing xgrad_amd.driver's ctypes binding without a GPU:
   "device memory" is host malloc, launches are recorded (not run) so a test can read back what the binding passed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int current = -1;
static int device_count = 2;
static unsigned last_grid[3], last_block[3], last_shared, launches;
static unsigned char last_kernarg[4096];
static size_t last_kernarg_size;
static const void* last_image;
static char last_function[256];
static int last_copy_kind;

int fake_launches(void) { return (int)launches; }
size_t fake_kernarg(unsigned char* out) { memcpy(out, last_kernarg, last_kernarg_size); return last_kernarg_size; }
void fake_launch_dims(unsigned* out) { for (int i = 0; i < 3; i++) { out[i] = last_grid[i]; out[3 + i] = last_block[i]; } out[6] = last_shared; }
int fake_current(void) { return current; }
int fake_copy_kind(void) { return last_copy_kind; }
const char* fake_function(void) { return last_function; }
void fake_set_device_count(int n) { device_count = n; }

const char* hipGetErrorString(int e) { return e == 101 ? "invalid device ordinal" : e == 2 ? "out of memory" : "fake error"; }
int hipGetDeviceCount(int* n) { *n = device_count; return device_count ? 0 : 100; }
int hipSetDevice(int d) { if (d < 0 || d >= device_count) return 101; current = d; return 0; }
int hipDeviceGetName(char* name, int len, int d) { strncpy(name, d ? "Fake Radeon 1" : "Fake Radeon 0", len); return 0; }
int hipGetDevicePropertiesR0600(void* props, int d) {
  memset(props, 0, 1472);
  strcpy((char*)props, "Fake Radeon RX 7900 gfx9999");        /* the marketing name may itself mention a gfx */
  strcpy((char*)props + 1160, d ? "gfx942:sramecc+:xnack-" : "gfx1100");  /* gcnArchName, somewhere after */
  return 0;
}
int hipMalloc(void** p, size_t n) { if (n > ((size_t)1 << 40)) return 2; *p = malloc(n); return 0; }
int hipFree(void* p) { free(p); return 0; }
int hipMemcpy(void* dst, const void* src, size_t n, int kind) { memcpy(dst, src, n); last_copy_kind = kind; return 0; }
int hipModuleLoadData(void** module, const void* image) {
  if (memcmp(image, "\x7f" "ELF", 4) != 0) return 200;
  last_image = image; *module = (void*)0x1234; return 0;
}
int hipModuleGetFunction(void** f, void* module, const char* name) {
  if (module != (void*)0x1234) return 400;
  strncpy(last_function, name, 255); *f = (void*)0x5678; return 0;
}
int hipModuleUnload(void* m) { return 0; }
int hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared, void* stream, void** params, void** extra) {
  if (f != (void*)0x5678 || params != 0 || extra == 0) return 98;
  if (extra[0] != (void*)1 || extra[2] != (void*)2 || extra[4] != (void*)3) return 1;
  last_kernarg_size = *(size_t*)extra[3];
  memcpy(last_kernarg, extra[1], last_kernarg_size);
  last_grid[0] = gx; last_grid[1] = gy; last_grid[2] = gz; last_block[0] = bx; last_block[1] = by; last_block[2] = bz;
  last_shared = shared; launches++;
  return 0;
}
int hipEventCreate(void** e) { *e = malloc(8); return 0; }
int hipEventRecord(void* e, void* s) { return 0; }
int hipEventSynchronize(void* e) { return 0; }
int hipEventElapsedTime(float* ms, void* a, void* b) { *ms = 0.25f; return 0; }
int hipEventDestroy(void* e) { free(e); return 0; }
int hipDeviceSynchronize(void) { return 0; }
