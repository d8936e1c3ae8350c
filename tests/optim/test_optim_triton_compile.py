"""Compile the fused kernels for real GPUs (sm_80, sm_90) without one: Triton's ahead-of-time
path down to a cubin with its bundled ptxas. Catches GPU-only compile errors (types, casts,
control flow) that the CPU interpreter used by the other tests cannot see, and checks that
the launches for 16-byte-aligned tensors move whole blocks with 16-byte accesses
(``ld.global.v4.b32`` / ``st.global.v4.b32`` in the PTX) while the others make no such claim.

Runs in a subprocess because the other test modules switch on ``TRITON_INTERPRET``.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

# GPU code, checked on every machine: part of the GPU selection (see tests/conftest.py).
pytestmark = pytest.mark.cuda_also

SCRIPT = textwrap.dedent('''
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gpuml.optim import _triton as K

    PTR = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}
    FP32_PTRS = ("partials", "f_w", "norm", "gscale", "found_inf", "lr_ptr", "full_sq")
    STORES = {"_sumsq_kernel": False, "_lamb_pass1": True, "_lamb_pass2": True,
              "_lars_pass1": None, "_lars_pass2": True}  # None: stores when NORMALIZED

    def build(kern, pdt, constexprs, target):
        sig = {}
        for n in kern.arg_names:
            if n in constexprs:
                sig[n] = "constexpr"
            elif n == "tab":
                sig[n] = "*i64"
            elif n == "chunks":
                sig[n] = "*i32"
            elif n in FP32_PTRS:
                sig[n] = "*fp32"
            elif n in ("p_w", "g_w"):
                sig[n] = PTR[pdt]
            else:
                sig[n] = "fp32"
        ptx = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=constexprs),
                             target=target).asm["ptx"]
        name = kern.fn.__name__
        if name not in STORES:  # touches no tensor data (per-tensor sums of the partials)
            return
        # A launch for aligned tensors must move whole blocks 16 bytes at a time; the
        # other launch makes no alignment claim and must not.
        stores = STORES[name] if STORES[name] is not None else constexprs["NORMALIZED"]
        wide = ("ld.global.v4.b32" in ptx, "st.global.v4.b32" in ptx)
        want = (True, stores) if constexprs["ALIGNED"] else (False, False)
        if wide != want:
            sys.exit(f"{name} {pdt} {constexprs}: 16-byte (loads, stores) {wide}, want {want}")

    n = 0
    for cc, pdt in [(90, "fp32"), (90, "bf16"), (80, "fp16")]:
        t = GPUTarget("cuda", cc, 32)
        low = pdt != "fp32"
        for aligned in (True, False):
            base = dict(NCOL=10, CHUNK=65536, BLOCK=1024, HAS_SCALE=True, HAS_INF=True,
                        HAS_MASTER=low, ALIGNED=aligned)
            build(K._sumsq_kernel, pdt, dict(NCOL=10, CHUNK=65536, BLOCK=1024,
                                             ALIGNED=aligned), t)
            for variant in (0, 2):
                lamb = dict(base, HAS_CLIP=True, BIAS_CORRECTION=True, VARIANT=variant,
                            EPS_INSIDE=variant == 0, MAXIMIZE=variant == 2)
                build(K._lamb_pass1, pdt, lamb, t)
                # REDUCED: the norms of sharded tensors, summed over the ranks
                build(K._lamb_pass2, pdt, dict(lamb, LR_IS_PTR=variant == 2, PBLOCK=128,
                                               PARAM_BF16=pdt == "bf16",
                                               REDUCED=variant == 2), t)
            for normalized in (False, True):
                lars = dict(base, NORMALIZED=normalized, MAXIMIZE=normalized)
                build(K._lars_pass1, pdt, lars, t)
                build(K._lars_pass2, pdt, dict(lars, LR_IS_PTR=True, HAS_MOMENTUM=True,
                                               NESTEROV=not normalized, CLIP=True,
                                               PBLOCK=128, PARAM_BF16=pdt == "bf16",
                                               REDUCED=normalized), t)
            n += 9
        build(K._tensor_sumsq_kernel, pdt, dict(NCOL=10, PBLOCK=128), t)
        n += 1
    print("compiled", n)
''')


def test_fused_kernels_compile_for_sm80_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0 and ("ptxas" in proc.stderr and "not found" in proc.stderr
                                 or "GPUTarget" in proc.stderr and "ImportError" in proc.stderr):
        pytest.skip("this Triton cannot compile ahead of time here: " + proc.stderr[-300:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled 57" in proc.stdout
