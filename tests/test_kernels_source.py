"""The conventions of the shared kernel source (lockstep/backends/kernels/README.md), checked statically.

These are what lets one source compile as OpenCL C, CUDA C++ and Metal: the Metal buffer slot of
every argument is its position, dialect differences live only in the preludes, every kernel the
ops launch exists (and none is dead), and the host packs parameter structs in the source's order.
"""

import re

import numpy as np
import pytest

from lockstep.backends import kernels
from lockstep.backends.kernels.runtime import ParamBlock

ARG_RE = re.compile(r"LS_(BUF|CBUF|SCALAR)\(\s*([\w ]+?)\s*,\s*(\w+)\s*,\s*(\d+)\s*\)")


def kernel_signatures():
    """name -> (file, [(kind, type, arg name, index), ...], text after the arguments)."""
    out = {}
    for f in kernels.KERNEL_FILES:
        text = (kernels.KERNEL_DIR / f).read_text()
        for m in re.finditer(r"^LS_KERNEL\((\w+)\)\((.*?)\)\s*\{", text, re.MULTILINE | re.DOTALL):
            out[m.group(1)] = (f, ARG_RE.findall(m.group(2)), m.group(2))
    return out


def test_every_argument_index_is_its_position():
    sigs = kernel_signatures()
    assert len(sigs) == len(kernels.kernel_names()) >= 40
    for name, (f, args, text) in sigs.items():
        assert [int(a[3]) for a in args] == list(range(len(args))), f"{f}: {name} argument indices"
        assert len({a[2] for a in args}) == len(args), f"{f}: {name} repeats an argument name"
        assert text.rstrip().endswith("LS_IDS"), f"{f}: {name} must close its parameters with LS_IDS"
        assert len(args) <= 31, f"{f}: {name} has more arguments than Metal has buffer slots"
        # everything between the macros is commas and whitespace: no bare C parameter slipped in
        assert re.fullmatch(r"[\s,]*", ARG_RE.sub("", text).replace("LS_IDS", "")), f"{f}: {name} has a bare parameter"


def test_no_dialect_conditionals_outside_the_preludes():
    for f in (kernels.HEADER, *kernels.KERNEL_FILES):
        text = (kernels.KERNEL_DIR / f).read_text()
        assert not re.search(r"^\s*#\s*(if|ifdef|ifndef|elif)\b", text, re.MULTILINE), f"{f} has a preprocessor conditional"
        assert "LS_DIALECT_" not in text, f"{f} tests the dialect"


def test_kernel_files_name_their_spec_module_and_use_no_float_atomics():
    for f in kernels.KERNEL_FILES:
        text = (kernels.KERNEL_DIR / f).read_text()
        assert text.startswith(f"/* {f} -- "), f"{f} must open with its name and what it implements"
        assert "lockstep/spec/" in text.split("*/")[0], f"{f} must name the spec module it implements"
    for f in (kernels.HEADER, *kernels.KERNEL_FILES):
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", (kernels.KERNEL_DIR / f).read_text(), flags=re.DOTALL)
        assert not re.search(r"\batomic", code), f"{f} uses an atomic"
        # Types of some dialect, never needed here (ls_i8 ... come from the preludes): as a variable
        # name each breaks OpenCL C or Metal, and double does not exist on Apple GPUs.
        for word in ("half", "char", "short", "long", "double"):
            assert not re.search(rf"\b{word}\b", code), f"{f} uses the word {word!r} (a type in some dialect)"


def test_every_launched_kernel_exists_and_none_is_dead():
    host_code = "".join(p.read_text() for p in sorted(kernels.KERNEL_DIR.glob("*.py")))
    launched = set(re.findall(r'"(ls_\w+_kernel)"', host_code))
    defined = set(kernels.kernel_names())
    assert launched - defined == set()
    assert defined - launched == set()


@pytest.mark.parametrize("dialect", kernels.DIALECTS)
def test_each_dialect_assembles_one_translation_unit(dialect):
    src = kernels.source(dialect, kernels=dialect != "host")
    assert src.startswith(f'#line 1 "prelude_{dialect}.h"')
    assert '#line 1 "ls_fp.h"' in src
    assert len(kernels.source_digest(dialect)) == 64


def test_preludes_define_the_same_names():
    required = ["ls_u32", "ls_i32", "ls_u64", "ls_i64", "ls_i8", "LS_FN", "LS_GLOBAL", "LS_LOCAL", "LS_PRIVATE",
                "LS_BARRIER", "LS_UNROLL", "ls_bits", "ls_float", "ls_mulhi",
                "ls_add_raw", "ls_sub_raw", "ls_mul_raw", "ls_div_raw", "ls_sqrt_raw", "ls_mul_hw", "ls_div_hw"]
    kernel_macros = ["LS_KERNEL", "LS_BUF", "LS_CBUF", "LS_SCALAR", "LS_IDS", "LS_LOCAL_ARRAY", "LS_LOCAL_ID",
                     "LS_GROUP_ID", "LS_LOCAL_SIZE", "LS_NUM_GROUPS", "LS_GLOBAL_ID", "LS_GLOBAL_SIZE"]
    for dialect in kernels.DIALECTS:
        text = (kernels.KERNEL_DIR / kernels.prelude_name(dialect)).read_text()
        for name in required + (kernel_macros if dialect != "host" else []):
            assert re.search(rf"\b{name}\b", text), f"prelude_{dialect}.h lacks {name}"
    assert "#pragma OPENCL FP_CONTRACT OFF" in (kernels.KERNEL_DIR / "prelude_opencl.h").read_text()
    assert "#pragma STDC FP_CONTRACT OFF" in (kernels.KERNEL_DIR / "prelude_metal.h").read_text()
    cuda = (kernels.KERNEL_DIR / "prelude_cuda.h").read_text()
    for op in ("add", "sub", "mul", "div"):
        assert f'"{op}.rn.f32' in cuda
    asm = " ".join(re.findall(r'asm\("([^"]*)"', cuda))
    assert asm.count(".rn.f32") == 5 and ".ftz" not in asm and "fma" not in asm


def test_param_blocks_follow_the_source_struct():
    layout = kernels.param_structs()["ls_quantize_params"]
    assert [f for f, _, _ in layout] == ["rows", "cols", "x_off", "x_rs", "x_cs", "s_row", "s_col"]
    block = ParamBlock("ls_quantize_params", s_col=7, rows=1, cols=2, x_off=3, x_rs=4, x_cs=5, s_row=6)
    assert block.words.tolist() == [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(TypeError, match="missing fields"):
        ParamBlock("ls_quantize_params", rows=1)
    with pytest.raises(TypeError, match="float32 field"):
        ParamBlock("ls_adamw_params", **{f: 1 for f, _, _ in kernels.param_structs()["ls_adamw_params"]})
    with pytest.raises(ValueError, match="32-bit"):
        ParamBlock("ls_quantize_params", rows=2**31, cols=2, x_off=3, x_rs=4, x_cs=5, s_row=6, s_col=7)
    copy = kernels.param_structs()["ls_copy_params"]
    assert sum(count for _, _, count in copy) * 4 == 88
    assert np.float32(0.5).view(np.uint32) in ParamBlock(
        "ls_contract_params", **{f: (np.float32(0.5) if k == "f" else 0) for f, k, _ in kernels.param_structs()["ls_contract_params"]}).words
