"""Findings that say what is wrong and hints that say what to do (CONF-1, CONF-3).

Each test gives the suite a kernel written for another convention (FlashAttention's layout
and keyword names, a tuple return, PyTorch's float ``attn_mask``, a mask whose True means
"masked out", an ``nn.Module`` class) or with a plumbing mistake (None, a list, another
library's array), and asserts the finding names it and the hint gives the exact flag;
where a flag fixes it, the same kernel checked with that flag passes.  Kernels are tiny
files calling the reference; each check runs a few cheap properties in float64.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import SMALL_SIZE_FLAGS, SMALL_SIZES, TESTS, kernel_file

from attnspec.conformance import SetupError, check, cli
from attnspec.conformance.judge.failures import distinct

KERNELS = '''
import numpy as np
from attnspec.reference import scaled_dot_product_attention as sdpa


def _swap(a):
    return np.swapaxes(a, -2, -3)


def flash_attn(q, k, v, *, causal=False, softmax_scale=None):
    """FlashAttention's (B, L, H, D) layout and keyword names."""
    return _swap(sdpa(_swap(q), _swap(k), _swap(v), is_causal=causal, scale=softmax_scale))


def with_weights(q, k, v, *, mask=None, is_causal=False, scale=None):
    out = sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
    eye = np.broadcast_to(np.eye(k.shape[-2]), (*k.shape[:-1], k.shape[-2]))
    weights = sdpa(q, k, eye.astype(q.dtype), mask=mask, is_causal=is_causal, scale=scale)
    return out, weights


def float_attn_mask(q, k, v, *, attn_mask=None, is_causal=False, scale=None):
    """PyTorch-style: attn_mask is added to the scores (a boolean one as 0/1)."""
    bias = None if attn_mask is None else np.asarray(attn_mask).astype(q.dtype)
    return sdpa(q, k, v, bias=bias, is_causal=is_causal, scale=scale)


def inverted_mask(q, k, v, *, mask=None, is_causal=False, scale=None):
    """True means "masked out", like key_padding_mask."""
    return sdpa(q, k, v, mask=None if mask is None else ~mask, is_causal=is_causal,
                scale=scale)


def takes_anything(q, k, v, **options):
    """Its signature hides that it takes no keyword at all."""
    if options:
        raise TypeError(f"takes_anything() got an unexpected keyword argument "
                        f"'{next(iter(options))}'")
    return sdpa(q, k, v)


def returns_none(q, k, v, *, mask=None, is_causal=False, scale=None):
    sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def returns_list(q, k, v, *, mask=None, is_causal=False, scale=None):
    return [sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)]


def float32_only(q, k, v, *, mask=None, is_causal=False, scale=None):
    if q.dtype != np.float32:
        raise TypeError(f"only float32 is supported, got {q.dtype}")
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def four_dimensional_only(q, k, v, *, mask=None, is_causal=False, scale=None):
    """Written for (B, H, L, E) arrays only."""
    batch, heads, length, head_dim = q.shape
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def scale_rounded_to_float32(q, k, v, *, mask=None, is_causal=False, scale=None):
    """The default scale 1/sqrt(E) held in float32 while computing in float64."""
    if scale is None:
        scale = float(np.float32(1 / np.sqrt(q.shape[-1])))
    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
'''


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    return kernel_file(tmp_path, "convention_kernels.py", KERNELS)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``attnspec ARGV`` in this process, in float64, the kernel in this process too and
    sizes capped: what these tests read is the findings and hints (that the hint probes
    run in the worker of an isolated check, and what they find comes back from it, is
    test_supervisor.py's)."""
    status = cli.main([*argv, "--dtype", "float64", "--quiet", "--no-isolate", *SMALL_SIZE_FLAGS])
    return status, capsys.readouterr().out


def hints_of(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("hint:")]


def test_flash_layout_and_keywords_get_the_exact_flags(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """SDPA-1.1, SDPA-4.1, SDPA-2.2: a (B, L, H, D) kernel taking causal=/softmax_scale=
    gets one hint with --rename for both keywords and one with --layout blhd (found by
    probing it); with those flags it passes."""
    target = f"{kernels}:flash_attn"
    only = ("--only", "matches-reference,default-scale,causal-zeros")
    status, out = run(capsys, "check", target, *only)
    assert status == 1
    hints = hints_of(out)
    assert any("--rename is_causal=causal --rename scale=softmax_scale" in h for h in hints)
    assert any("pass --layout blhd" in h and "(B, L, H, D)" in h for h in hints)
    status, out = run(
        capsys,
        "check",
        target,
        *only,
        "--layout",
        "blhd",
        "--rename",
        "is_causal=causal",
        "--rename",
        "scale=softmax_scale",
    )
    assert status == 0, out
    assert hints_of(out) == []
    row = next(line for line in out.splitlines() if line.startswith("causal-zeros"))
    assert " passed " in row  # the renamed is_causal is now claimed and checked


def test_tuple_return_says_returns_weights(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """SDPA-1.3: a kernel returning (out, weights) undeclared is told so, with
    --returns-weights; declared, it passes."""
    target = f"{kernels}:with_weights"
    status, out = run(capsys, "check", target, "--only", "matches-reference,default-scale")
    assert status == 1
    assert (
        "the kernel returned a tuple of 2 (numpy.ndarray, numpy.ndarray), but should "
        "return the output array [SDPA-1.3]" in out
    )
    assert "--returns-weights" in out and "AttributeError" not in out
    status, out = run(
        capsys, "check", target, "--only", "matches-reference,default-scale", "--returns-weights"
    )
    assert status == 0, out


def test_float_attn_mask_says_bias_keyword(
    capsys: pytest.CaptureFixture[str], kernels: Path
) -> None:
    """SDPA-3.1, SDPA-3.2: a kernel adding attn_mask to the scores (PyTorch's float mask)
    fails mask-polarity with a finding that says so and the flags that declare it as a
    bias; with them, bias-semantics runs and passes."""
    target = f"{kernels}:float_attn_mask"
    status, out = run(capsys, "check", target, "--only", "mask-polarity")
    assert status == 1
    assert "the kernel takes a PyTorch-style additive float mask" in out
    assert "hint:    declare it as an additive bias: --bias-keyword attn_mask --no-mask" in out
    status, out = run(
        capsys,
        "check",
        target,
        "--only",
        "mask-polarity,bias-semantics",
        "--bias-keyword",
        "attn_mask",
        "--no-mask",
    )
    assert status == 0, out
    row = next(line for line in out.splitlines() if line.startswith("bias-semantics"))
    assert " passed " in row


def test_inverted_mask_is_called_inverted(kernels: Path) -> None:
    """SDPA-3.1: a kernel reading True as "masked out" fails mask-polarity with a finding
    that says the output follows the inverted mask, and how to invert it."""
    verdict = check(
        f"{kernels}:inverted_mask", only=["mask-polarity"], dtypes=["float64"]
    ).verdicts[0]
    assert verdict.status == "failed"
    assert verdict.detail.startswith("the output follows the mask inverted")
    assert "~mask" in verdict.hint


def test_one_root_cause_is_one_finding(
    capsys: pytest.CaptureFixture[str], kernels: Path, tmp_path: Path
) -> None:
    """SDPA-1.1: a kernel that rejects is_causal (its **kwargs hide it from the pre-flight)
    fails many properties for that one reason: told once, naming every property, with the
    flag that stops the suite passing is_causal; the JSON groups them the same way."""
    path = tmp_path / "r.json"
    status, out = run(
        capsys,
        "check",
        f"{kernels}:takes_anything",
        "--no-mask",
        "--no-scale",
        "--only",
        "matches-reference,deterministic,causal-zeros,causal-alignment",
        "--json",
        str(path),
    )
    assert status == 1
    assert "FAILED 4 properties, one cause [MUST]:" in out
    assert out.count("\n  finding: kernel raised TypeError") == 1
    assert out.count("reproduction (runs on its own)") == 1
    assert "hint:    the kernel does not take is_causal=" in out and "--no-causal" in out
    findings = json.loads(path.read_text())["findings"]
    assert [f["properties"] for f in findings] == [
        ["matches-reference", "deterministic", "causal-zeros", "causal-alignment"]
    ]


@pytest.mark.parametrize(
    ("name", "finding"),
    [
        ("returns_none", "the kernel returned None as out, but should return a numpy array"),
        (
            "returns_list",
            "the kernel returned a list of 1 (numpy.ndarray), but should return the output array",
        ),
    ],
)
def test_results_that_are_not_arrays_are_named(kernels: Path, name: str, finding: str) -> None:
    """SDPA-1.3: None or a list is named as such (never an AttributeError from reading it)."""
    verdict = check(f"{kernels}:{name}", only=["default-scale"]).verdicts[0]
    assert verdict.status == "failed"
    assert verdict.detail.startswith(finding), verdict.detail
    assert "AttributeError" not in verdict.detail


def test_numpy_array_under_torch_is_named(tmp_path: Path) -> None:
    """SDPA-1.3: a NumPy array returned to a torch check is "a numpy.ndarray, but the
    kernel runs on torch" (not "out.dtype=float16, but should be float16")."""
    pytest.importorskip("torch", reason="the torch backend is what this is about")
    kernel = tmp_path / "to_numpy.py"
    kernel.write_text(
        "from attnspec.reference import scaled_dot_product_attention as sdpa\n"
        "def attention(q, k, v, *, mask=None, is_causal=False, scale=None):\n"
        "    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale).numpy()\n"
    )
    report = check(
        f"{kernel}:attention", backend="torch", dtypes=["float16"], only=["output-shape-dtype"]
    )
    detail = report.verdicts[0].detail
    assert detail.startswith("out is a numpy.ndarray, but the kernel runs on torch"), detail
    assert "--backend numpy" in report.verdicts[0].hint


TORCH_KERNEL = """
import numpy as np
import torch


def attention(q, k, v, *, is_causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=is_causal, scale=scale
    )


def transposes_its_own_way(q, k, v, *, is_causal=False, scale=None):
    raise ValueError("axes don't match array")
"""


def test_kernel_of_one_batch_rank_says_batch_ndim(kernels: Path) -> None:
    """SDPA-1.2, CONF-3: a kernel that takes (B, H, L, E) arrays only raises on the others
    the suite draws; probed with 0, 1 and 2 leading batch dims, it is right with 1 only, so
    the hint says --batch-ndim 1, with which it passes.  A kernel that raises for another
    reason (a dtype) and is right at every rank gets no such hint."""
    target = f"{kernels}:four_dimensional_only"
    report = check(target, only=["matches-reference"], **SMALL_SIZES)
    assert report.verdicts[0].status == "failed"
    assert any(
        "right on a probe with 1 leading batch dim and not with 0 or 2" in hint
        and "pass --batch-ndim 1" in hint
        for hint in report.hints
    ), report.hints
    declared = check(target, only=["matches-reference"], batch_ndim=1, **SMALL_SIZES)
    assert declared.verdicts[0].status == "passed", declared.verdicts[0].detail
    other = check(f"{kernels}:float32_only", dtypes=["float16", "float32"], only=["default-scale"])
    assert other.verdicts[0].detail.startswith("kernel raised TypeError: only float32")
    assert not any("--batch-ndim" in hint for hint in other.hints), other.hints


def test_kernel_rejecting_a_dtype_says_declare_the_dtypes(kernels: Path) -> None:
    """SDPA-1.4, CONF-3: a kernel that raises "only float32 is supported" on float16 gets
    the hint to declare its dtypes (--dtype); declared, it passes."""
    target = f"{kernels}:float32_only"
    verdict = check(target, dtypes=["float16", "float32"], only=["output-shape-dtype"])
    assert verdict.verdicts[0].status == "failed"
    assert "only float32 is supported" in verdict.verdicts[0].detail
    assert "declare the dtypes it does" in verdict.verdicts[0].hint
    assert "--dtype float32" in verdict.verdicts[0].hint
    declared = check(target, dtypes=["float32"], only=["output-shape-dtype"]).verdicts[0]
    assert declared.status == "passed", declared.detail


def test_torch_kernel_on_the_default_backend_says_backend_torch(tmp_path: Path) -> None:
    """SDPA-1.3: a torch kernel checked on the default backend (NumPy) raises on NumPy
    arrays ("must be Tensor, not numpy.ndarray"); the hint names --backend torch, with which
    the same kernel passes.  An exception that does not name NumPy's arrays, from a module
    that uses NumPy too, gets no such hint: it may be the kernel's own."""
    pytest.importorskip("torch", reason="the torch backend is what this is about")
    kernel = kernel_file(tmp_path, "torch_kernel.py", TORCH_KERNEL)
    only = ["default-scale"]
    verdict = check(f"{kernel}:attention", dtypes=["float64"], only=only).verdicts[0]
    assert verdict.status == "failed" and "numpy.ndarray" in verdict.detail, verdict.detail
    assert "check it on them with --backend torch" in verdict.hint, verdict.hint
    torch_run = check(f"{kernel}:attention", backend="torch", dtypes=["float64"], only=only)
    assert torch_run.verdicts[0].status == "passed", torch_run.verdicts[0].detail
    own = check(f"{kernel}:transposes_its_own_way", dtypes=["float64"], only=only).verdicts[0]
    assert own.status == "failed" and "--backend" not in own.hint, own.hint


def test_module_class_target_says_pass_an_instance(tmp_path: Path) -> None:
    """SDPA-1.1: an nn.Module class given as the kernel is a setup error (exit 2) that
    says to pass an instance and how, not a failure of every property."""
    pytest.importorskip("torch", reason="nn.Module is torch's")
    kernel = tmp_path / "module_kernel.py"
    kernel.write_text(
        "import torch\n"
        "class Attention(torch.nn.Module):\n"
        "    def forward(self, q, k, v, *, mask=None, is_causal=False, scale=None):\n"
        "        return torch.nn.functional.scaled_dot_product_attention(q, k, v)\n"
    )
    with pytest.raises(SetupError, match=r"is an nn\.Module class, not a kernel") as error:
        check(f"{kernel}:Attention", backend="torch", only=["default-scale"])
    assert "Pass an instance" in str(error.value)
    assert "attention = Attention(...)" in str(error.value)


def test_scale_finding_shows_the_digits_that_differ(kernels: Path) -> None:
    """SDPA-2.1: a default scale held in float32 differs from 1/sqrt(E) in the 8th digit;
    the finding shows both to that digit and the difference, never two equal numbers."""
    verdict = check(
        f"{kernels}:scale_rounded_to_float32", only=["default-scale"], dtypes=["float64"]
    ).verdicts[0]
    assert verdict.status == "failed"
    implied = verdict.detail.split("imply scale=")[1].split(" ")[0]
    expected = verdict.detail.split("but should be ")[1].split(" ")[0]
    assert implied != expected and "they differ by" in verdict.detail


def test_distinct_shows_enough_digits() -> None:
    assert distinct(0.5773502691896258, 0.5773502691896257) == (
        "0.5773502691896258",
        "0.5773502691896257",
    )
    assert distinct(1.00004, 0.7071067811865476) == ("1.00004", "0.707107")


LARGE_LOGITS_KERNELS = """
import sys
sys.path.insert(0, {tests!r})
from catalogue.bugs_softmax import no_max_subtraction
from catalogue.bugs_plumbing import torch_scores_in_input_dtype
"""


def test_large_logits_names_which_overflow(tmp_path: Path) -> None:
    """SDPA-7.4, SDPA-7.2: a softmax without max subtraction is told so on scores whose
    q k^T is finite; a kernel forming q k^T in float16 is told its scores overflow, not
    that it lacks max subtraction."""
    kernel = tmp_path / "overflows.py"
    kernel.write_text(LARGE_LOGITS_KERNELS.format(tests=str(TESTS)))
    verdict = check(f"{kernel}:no_max_subtraction", only=["large-logits"]).verdicts[0]
    assert re.search(
        "where exp (over|under)flows but q k\\^T does not: the softmax needs max subtraction",
        verdict.detail,
    ), verdict.detail
    pytest.importorskip("torch", reason="the float16 scores kernel is a torch one")
    verdict = check(
        f"{kernel}:torch_scores_in_input_dtype",
        backend="torch",
        dtypes=["float16"],
        only=["large-logits"],
    ).verdicts[0]
    assert "so max subtraction works: q k^T reaches" in verdict.detail
    assert "float16's largest finite value" in verdict.detail
    assert "max subtraction or an equivalent" not in verdict.detail


def test_reproduction_of_empty_inputs_raises_what_the_check_saw(
    kernels: Path, tmp_path: Path, python_c: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """SDPA-1.5: the reproduction rebuilds empty inputs with their exact shape (q(1, 0, 1)
    is not np.array([[]])) and calls fn(q, k, v, ...) directly, so it raises the very
    exception the finding reports."""
    kernel = tmp_path / "empty_fails.py"
    kernel.write_text(
        "from attnspec.reference import scaled_dot_product_attention as sdpa\n"
        "def attention(q, k, v, *, mask=None, is_causal=False, scale=None):\n"
        "    if 0 in q.shape:\n"
        "        raise RuntimeError(f'empty q of shape {tuple(q.shape)}')\n"
        "    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)\n"
    )
    verdict = check(f"{kernel}:attention", only=["empty-sizes"]).verdicts[0]
    assert verdict.status == "failed" and "empty q of shape" in verdict.detail
    assert "out = fn(q, k, v" in verdict.reproduction
    ran = python_c(verdict.reproduction, cwd=tmp_path)
    shown = verdict.detail.split("RuntimeError: ")[1]
    assert ran.returncode != 0 and f"RuntimeError: {shown}" in ran.stderr
