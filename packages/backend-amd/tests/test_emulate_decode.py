"""The RDNA3 decoder against LLVM's: every instruction of a corpus of clang-19 gfx1100 kernels (hand-written HIP
covering each instruction class, and kernels of the op suite rendered by the HIP renderer) is decoded by
`xgrad_amd.emulate` and by llvm-objdump-19, and mnemonic and operands must agree. The opcode table itself is checked
against llvm-mc-19 by regenerating it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from xgrad_amd.elf import load_code_object
from xgrad_amd.emulate import EmulatorError, decode_at, disassemble

CLANG, OBJDUMP, MC = shutil.which("clang-19"), shutil.which("llvm-objdump-19"), shutil.which("llvm-mc-19")
pytestmark = pytest.mark.skipif(not (CLANG and OBJDUMP), reason="clang-19 / llvm-objdump-19 not installed")

# one kernel per instruction class the emulator runs: scalar control flow, VALU of every width, LDS, WMMA, packed
CORPUS = r"""
typedef _Float16 half;
typedef half half2 __attribute__((ext_vector_type(2)));
typedef half half16 __attribute__((ext_vector_type(16)));
typedef float float8 __attribute__((ext_vector_type(8)));
#define K extern "C" __attribute__((global))
#define TID __builtin_amdgcn_workitem_id_x()
K void elementwise(float* o, const float* a, const float* b, int n) {
  int i = __builtin_amdgcn_workgroup_id_x() * 64 + TID;
  if (i < n) o[i] = __builtin_amdgcn_exp2f(a[i]) * b[i] + __builtin_sqrtf(b[i]) - __builtin_amdgcn_logf(a[i]) / b[i];
}
K void doubles(double* o, const double* a, long long* l, int n) {
  int i = TID;
  if (i < n) { o[i] = a[i] * 3.0 / (a[i] + 1.0) + __builtin_floor(a[i]); l[i] = (l[i] >> 3) * (long long)a[i]; }
}
K void ints(int* o, const int* a, unsigned* u, int n) {
  int i = TID;
  o[i] = a[i] / (n + 1) + a[i] % 7 + __builtin_popcount(u[i]) + __builtin_clz(u[i] | 1) + (u[i] >> (a[i] & 31));
  u[i] = (unsigned)a[i] * 2654435761u + (u[i] < 5 ? 3 : 9);
}
K void halves(half* o, const half* a, const half2* p, half2* q) {
  int i = TID;
  o[i] = a[i] * (half)2.5 + (half)__builtin_amdgcn_rcph(a[i]);
  q[i] = p[i] * p[i] + (half2){1.0, -2.0};
}
K void reduce(float* o, const float* a) {
  __attribute__((shared)) float sh[256];
  int i = TID;
  sh[i] = a[i];
  __builtin_amdgcn_s_barrier();
  for (int s = 128; s > 0; s >>= 1) {
    if (i < s) sh[i] += sh[i + s];
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
  }
  if (i == 0) o[__builtin_amdgcn_workgroup_id_x()] = sh[0];
}
K void branchy(float* o, const float* a, int n) {
  int i = TID;
  float x = a[i], acc = 0.0f;
  if (x > 0.5f) { for (int k = 0; k < n; k++) acc += __builtin_sinf(x * k); } else { acc = __builtin_cosf(x); }
  o[i] = acc;
}
K void wmma(float* o, const half* a, const half* b) {
  int l = TID;
  half16 av, bv;
  for (int k = 0; k < 16; k++) { av[k] = a[(l % 16) * 16 + k]; bv[k] = b[k * 16 + (l % 16)]; }
  float8 c = {};
  c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(av, bv, c);
  for (int r = 0; r < 8; r++) o[(2 * r + l / 16) * 16 + (l % 16)] = c[r];
}
"""


def hipcc(source: str, tmp: Path) -> Path:
    src, out = tmp / "corpus.hip", tmp / "corpus.co"
    src.write_text(source)
    cmd = [CLANG, "-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "--no-gpu-bundle-output",
           "--offload-arch=gfx1100", "-O3", str(src), "-o", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    tmp = tmp_path_factory.mktemp("corpus")
    paths = [hipcc(CORPUS, tmp)]
    # kernels of the op suite, as the HIP renderer writes them
    from xgrad import Tensor, dtypes
    from xgrad.device import Device
    from xgrad_amd.compiler import HIPCompiler

    dev = "NULL:HIP:gfx1100"
    null = Device[dev]
    cases = [
        lambda: (Tensor.empty(300, device=dev).exp() + Tensor.empty(300, device=dev).log().sqrt()).sin(),
        lambda: Tensor.empty(8, 512, device=dev).softmax(axis=-1),
        lambda: Tensor.empty(64, 64, dtype=dtypes.float16, device=dev).matmul(
            Tensor.empty(64, 64, dtype=dtypes.float16, device=dev), dtype=dtypes.float32
        ),
        lambda: Tensor.empty(16, 100, device=dev).argmax(axis=1),
        lambda: Tensor.empty(257, dtype=dtypes.int32, device=dev) // Tensor.empty(257, dtype=dtypes.int32, device=dev),
    ]
    compiler = HIPCompiler("gfx1100")
    for i, case in enumerate(cases):
        null._programs.clear()
        case().realize()
        for j, p in enumerate(null._programs.values()):
            path = tmp / f"op{i}_{j}.co"
            path.write_bytes(compiler.compile(p.info.src))
            paths.append(path)
    return paths


def _norm(text: str) -> list[str]:
    out = []
    for tok in re.split(r"\s*,\s*|\s+", re.sub(r"_e(32|64)\b", "", text.strip())):
        if not tok:
            continue
        try:
            tok = str(int(tok, 0))
        except ValueError:
            pass
        out.append(tok)
    return out


# printed by LLVM with symbolic fields this comparison does not rebuild; their mnemonic is compared
SYMBOLIC = {"s_waitcnt", "s_delay_alu", "s_sendmsg", "s_waitcnt_depctr", "s_clause", "s_set_inst_prefetch_distance"}


def test_decoder_matches_llvm_objdump(corpus: list[Path]) -> None:
    assert OBJDUMP is not None
    seen: set[str] = set()
    checked = 0
    for path in corpus:
        co = load_code_object(path.read_bytes())
        text = subprocess.run([OBJDUMP, "-d", str(path)], check=True, capture_output=True, text=True).stdout
        llvm = {int(m.group(2), 16): m.group(1) for m in re.finditer(r"^\s+(.*?)\s*// ([0-9A-F]{12}):", text, re.M)}
        for k in co.kernels.values():
            for inst in disassemble(k.code, k.code_offset):
                want = llvm.get(inst.addr)
                assert want is not None, f"{path.name}: llvm-objdump has no instruction at {inst.addr:#x}"
                if inst.name in SYMBOLIC:
                    assert want.split()[0] == inst.name
                else:
                    assert _norm(inst.text()) == _norm(want), f"{path.name} {inst.addr:#x}"
                seen.add(inst.name)
                checked += 1
    # every instruction class appears in the corpus
    for needed in ("s_load_b128", "s_and_saveexec_b32", "s_cbranch_execz", "v_add_co_ci_u32", "v_fma_f64",
                   "global_load_b32", "ds_store_b32", "ds_load_b32", "s_barrier", "v_wmma_f32_16x16x16_f16",
                   "v_pk_fma_f16", "v_dual_mov_b32", "v_cmp_gt_f32", "v_div_scale_f32", "v_exp_f32"):  # fmt: skip
        assert needed in seen, f"the corpus lost {needed}; decoded: {sorted(seen)}"
    assert checked > 1000


def test_unknown_opcode_raises_naming_it() -> None:
    with pytest.raises(EmulatorError, match=r"unknown gfx11 opcode 127 of encoding VOP3P .* at 0x8"):
        decode_at(bytes(8) + (0xCC7F0000).to_bytes(4, "little") + bytes(4), 8)
    with pytest.raises(EmulatorError, match="outside the kernel"):
        decode_at(bytes(4), 4)


@pytest.mark.skipif(MC is None, reason="llvm-mc-19 not installed")
def test_opcode_table_is_what_llvm_mc_decodes() -> None:
    from xgrad_amd.emulate import gen_opcodes, opcodes

    assert gen_opcodes.generate() == opcodes.OPCODES
