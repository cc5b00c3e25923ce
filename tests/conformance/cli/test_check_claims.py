"""``attnspec check``'s declaration flags: each becomes a claim of the claims table, and a
waived clause is named in every report (CONF-3, CONF-7).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from support import KERNELS, SMALL_SIZE_FLAGS, kernel_file, run_main

from attnspec import SPEC_VERSION
from attnspec.conformance import cli
from attnspec.conformance.claims.declaration import SparseClaim
from attnspec.conformance.claims.family_claims import MlaClaim
from attnspec.conformance.judge.verdict import WAIVED
from attnspec.conformance.run.property_runner import PROFILES, Profile

NO_SCALE_KERNELS = """
from attnspec.reference import scaled_dot_product_attention


def attention(q, k, v, *, mask=None, is_causal=False):
    # JAX-like: no scale parameter, and it needs Ev == E
    assert q.shape[-1] == v.shape[-1], "needs Ev == E"
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal)


def scales_by_one_over_e(q, k, v, *, mask=None, is_causal=False):
    assert q.shape[-1] == v.shape[-1], "needs Ev == E"
    return scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                        scale=1 / q.shape[-1])
"""


def test_equal_head_dims_without_a_scale_parameter(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SDPA-1.1, SDPA-2.1 (once a false failure): --equal-head-dims on a correct kernel
    with no scale parameter passes (it is never given scale=), a 1/E default scale is
    still caught, and the inputs line says how the kernel's arguments were padded."""
    kernel = kernel_file(tmp_path, "noscale.py", NO_SCALE_KERNELS)
    # what is checked is the padding's plumbing: every stratum and anchor, at small sizes
    sizes = ("--dtype", "float64", *SMALL_SIZE_FLAGS)
    only = ("--only", "matches-reference,default-scale", *sizes)
    status, out, err = run_main(capsys, "check", f"{kernel}:attention", "--equal-head-dims", *only)
    assert status == 0, out + err
    # the 1/E scale on default-scale alone: its matches-reference failure, shrunk, is not
    # what is read here (~0.8 CPU-s); judged in this process (--no-isolate): the padding is
    # the setup's, made alike in either process, and the first check's went through a worker
    status, out, _ = run_main(
        capsys,
        *("check", f"{kernel}:scales_by_one_over_e", "--equal-head-dims"),
        *("--only", "default-scale", *sizes, "--no-isolate"),
    )
    assert status == 1 and "FAILED default-scale [SDPA-2.1" in out
    lines = out.splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("FAILED default-scale"))
    inputs = next(line for line in lines[failed:] if line.startswith("  inputs:"))
    assert "scale=None (equal_head_dims: the kernel got q, k, v zero-padded to" in inputs
    assert "and q times" in inputs and "TypeError" not in out


def _claims(*flags: str) -> dict[str, Any]:
    """The claims ``attnspec check m:f FLAGS`` declares."""
    return cli.claims_from(cli.build_parser().parse_args(["check", "m:f", *flags]))


def test_declaration_flags_become_claims() -> None:
    """CONF-3: each declaration flag sets exactly its KernelDeclaration field."""
    claims = _claims(
        "--bias",
        "--bias-keyword",
        "attn_mask",
        "--gqa-keyword",
        "enable_gqa",
        "--causal-alignment",
        "bottom-right",
        "--no-empty-rows-zero",
        "--returns-weights",
        "--no-mask-and-causal",
        "--no-scale",
        "--kwarg",
        "dropout_p=0.0",
        "--sparse",
        "sliding_window",
        "--sparse-param",
        "left=2",
        "--sparse-param",
        "right=0",
        "--sparse-causal",
    )
    assert claims == {
        "bias": True,
        "bias_keyword": "attn_mask",
        "gqa_keyword": "enable_gqa",
        "gqa": True,
        "causal_alignment": "bottom_right",
        "empty_rows_zero": False,
        "returns_weights": True,
        "mask_and_causal": False,
        "scale": False,
        "extra_kwargs": {"dropout_p": 0.0},
        "sparse": SparseClaim("sliding_window", {"left": 2, "right": 0}, causal=True),
    }
    assert _claims() == {}


def test_claims_table_is_the_one_source_of_declaration_fields_and_flags() -> None:
    """CONF-3: KernelDeclaration's fields (type and default) are exactly the claims table's
    rows, in order, and every claim flag of the CLI comes from the table (so a new claim is
    one field and one row, and neither can be forgotten)."""
    from dataclasses import fields

    from attnspec.conformance import KernelDeclaration
    from attnspec.conformance.claims import table as claims

    assert [f.name for f in fields(KernelDeclaration)] == [c.field for c in claims.CLAIMS]
    for claim in claims.CLAIMS:
        assert claim.field == "dtypes" or claim.flags, f"{claim.field} has no flag"
    options = {
        action.option_strings[0] for action in _check_parser()._actions if action.option_strings
    }
    table = {flag.option for flag in (*claims.SETUP_FLAGS, *claims.CLAIM_FLAGS)}
    assert table <= options
    assert cli.DECLARATION_FLAGS == (*claims.SETUP_FLAGS, *claims.CLAIM_FLAGS)


def _check_parser() -> Any:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices["check"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--mask-keyword", "attn_mask"], {"mask_keyword": "attn_mask", "mask": True}),
        (["--bias-keyword", "attn_bias"], {"bias_keyword": "attn_bias", "bias": True}),
        (["--gqa-keyword", "enable_gqa"], {"gqa_keyword": "enable_gqa", "gqa": True}),
        (["--no-bias", "--bias-keyword", "b"], {"bias_keyword": "b", "bias": False}),
        (["--no-mask", "--mask-keyword", "m"], {"mask_keyword": "m", "mask": False}),
    ],
)
def test_keyword_flags_turn_their_claim_on(flags: list[str], expected: dict[str, Any]) -> None:
    """CONF-3: --mask-keyword, --bias-keyword and --gqa-keyword claim what they
    name, unless the claim's own flag says otherwise."""
    assert _claims(*flags) == expected


def test_bias_keyword_alone_runs_the_bias_properties(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SDPA-3.2: --bias-keyword NAME alone makes bias-semantics run (not "not applicable"),
    and it catches a kernel that ignores that argument."""
    kernel = tmp_path / "biased.py"
    kernel.write_text(
        "from attnspec.reference import scaled_dot_product_attention as sdpa\n"
        "def good(q, k, v, *, mask=None, attn_bias=None, is_causal=False, scale=None):\n"
        "    return sdpa(q, k, v, mask=mask, bias=attn_bias, is_causal=is_causal, scale=scale)\n"
        "def ignores(q, k, v, *, mask=None, attn_bias=None, is_causal=False, scale=None):\n"
        "    return sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)\n"
    )
    # the kernel that ignores the bias is judged in this process (--no-isolate): the keyword
    # is the setup's, given alike in either process, and the good kernel's went through a worker
    for name, status, isolate in (("good", 0, ()), ("ignores", 1, ("--no-isolate",))):
        code, out, err = run_main(
            capsys,
            "check",
            f"{kernel}:{name}",
            "--bias-keyword",
            "attn_bias",
            "--dtype",
            "float64",
            # what is checked is the keyword's plumbing: small problems show it
            *SMALL_SIZE_FLAGS,
            "--only",
            "bias-semantics",
            *isolate,
        )
        assert code == status, err
        row = next(line for line in out.splitlines() if line.startswith("bias-semantics"))
        assert ("passed" if status == 0 else "FAILED") in row


# the full run feeds the kernel NaN (SDPA-8.x), which NumPy reports while computing on it
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_waived_must_clause_is_named_in_every_report(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    report_files: tuple[dict[str, Path], tuple[str, ...]],
) -> None:
    """CONF-7, CONF-10: --no-empty-rows-zero waives SDPA-5.1: its property is "waived", the
    claim of a full passing run says "except SDPA-5.1", exit 0, and JSON, JUnit and Markdown
    say the same; every report names the spec version the check was made against.

    A claim needs every property to run, but what is checked here is how the reports name
    the waiver: 2 small examples a property, in this process, are enough for that (the
    quick profile was 30-60 s of this suite; the reference's zero-false-failure run is
    tests/catalogue/test_correct_pass.py, the waiver's way out of a worker
    tests/conformance/test_supervisor.py's test_hints_and_waivers_travel_from_the_worker)."""
    monkeypatch.setitem(PROFILES, "quick", Profile(2))
    kernel = kernel_file(tmp_path, "plain.py", KERNELS)
    paths, flags = report_files
    status, out, err = run_main(
        capsys,
        "check",
        f"{kernel}:correct",
        "--no-empty-rows-zero",
        "--dtype",
        "float64",
        "--profile",
        "quick",
        "--no-isolate",
        *flags,
    )
    assert status == 0, err
    claim = (
        f"conforms to attnspec {SPEC_VERSION} except SDPA-5.1 (dense, mask, top-left "
        "causal, explicit scale; float64)"
    )
    assert out.rstrip().splitlines()[-1] == claim
    row = next(line for line in out.splitlines() if line.startswith("empty-rows-zero"))
    assert " waived " in row and "empty_rows_zero=False" in row
    assert "result: conforms except SDPA-5.1 (waived, CONF-7)" in out
    data = json.loads(paths["json"].read_text())
    assert (data["conforms"], data["waived"], data["claim"]) == (True, ["SDPA-5.1"], claim)
    assert data["counts"][WAIVED] == 1
    suite = ET.parse(paths["junit"]).getroot().find("testsuite")
    assert suite is not None
    junit = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (junit["conforms"], junit["waived"], junit["claim"]) == ("True", "SDPA-5.1", claim)
    case = next(c for c in suite.iter("testcase") if c.get("name").startswith("empty-rows-"))
    assert case.find("skipped") is not None
    assert claim in paths["markdown"].read_text()
    heading = re.compile(
        rf"^(## )?attnspec {re.escape(SPEC_VERSION)}( \(draft .*\))? conformance of ", re.M
    )
    assert heading.search(out) and heading.search(paths["markdown"].read_text())
    assert data["spec_version"] == junit["spec_version"] == SPEC_VERSION


def test_linear_flags_become_a_linear_claim() -> None:
    claim = _claims("--linear", "favor+", "--linear-num-features", "256", "--linear-iid")["linear"]
    assert (claim.feature_map, claim.num_features, claim.orthogonal) == ("favor+", 256, False)


def test_mla_flags_become_a_paged_mla_claim() -> None:
    """MLA-4, MLA-5: --mla-paged, --mla-page-size and --mla-default-scale refine --mla; a
    page size without --mla-paged, or a refinement without --mla, is a usage error."""
    claim = _claims("--mla", "512", "--mla-paged", "--mla-page-size", "64", "--mla-default-scale")
    assert claim["mla"] == MlaClaim(512, 64, paged=True, page_size=64, default_scale=True)
    assert _claims("--mla", "256", "--mla-rope-dim", "32")["mla"] == MlaClaim(256, 32)
    for flags, needs in (
        (("--mla", "512", "--mla-page-size", "64"), "needs --mla-paged"),
        (("--mla-paged",), "needs --mla R"),
    ):
        with pytest.raises(cli.UsageError, match=needs):
            _claims(*flags)


def test_linear_feature_map_may_be_a_callable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """LIN-5.1: --linear MODULE:FUNC declares a custom feature map; the formula property
    then runs with it (and a wrong map is caught)."""
    kernel = tmp_path / "linear_kernel.py"
    kernel.write_text(
        "from attnspec.reference import linear_attention\n"
        "def phi(x):\n    return x * x + 1.0\n"
        "def other(x):\n    return x * x + 2.0\n"
        "def attention(q, k, v, *, is_causal=False):\n"
        "    return linear_attention(q, k, v, feature_map=phi, is_causal=is_causal)\n"
    )
    # what is checked is that the map given by name is the one used; small problems in
    # one dtype show it (the realistic sizes are tests/reference/test_linear*.py's and the
    # property tests')
    only = (
        "--only",
        "linear-matches-formula,linear-causal-prefix",
        *("--dtype", "float64", *SMALL_SIZE_FLAGS),
    )
    status, out, _ = run_main(
        capsys, "check", f"{kernel}:attention", "--linear", f"{kernel}:phi", *only
    )
    assert status == 0 and "linear-matches-formula" in out
    # the wrong map caught by the formula property alone: the causal prefix's failure,
    # shrunk too, would say the same (~0.9 CPU-s); in this process (--no-isolate): the map
    # is loaded by name alike in either, and the right map's check went through a worker
    status, out, _ = run_main(
        capsys,
        *("check", f"{kernel}:attention", "--linear", f"{kernel}:other"),
        *("--only", "linear-matches-formula", *only[2:], "--no-isolate"),
    )
    assert status == 1 and "FAILED linear-matches-formula" in out
    status, _, err = run_main(capsys, "check", f"{kernel}:attention", "--linear", "softmax")
    assert status == 2 and "MODULE:FUNC" in err
