"""Packaging facts: the stdlib `platform` is never shadowed, a missing or stale extension gets
an error that says how to rebuild, and an installed marlkit is the one imported, also beside a
clone named ``marlkit``."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import types

import pytest

import marlkit
from marlkit.native import ExtensionError, _loader

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_platform_folder_has_no_init() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_import_platform_from_repo_root_is_stdlib() -> None:
    code = "import platform, uuid; print(platform.__file__); print(platform.python_version())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    path = pathlib.Path(out.stdout.splitlines()[0]).resolve()
    assert ROOT not in path.parents, f"`import platform` resolved to {path}"


def test_package_data_shipped() -> None:
    pkg = pathlib.Path(marlkit.__file__).parent
    assert (pkg / "py.typed").is_file()
    assert (pkg / "_C.pyi").is_file()


def test_extension_loads_and_matches_sources() -> None:
    module = _loader.load_extension()
    assert module.ABI_VERSION == _loader.ABI_VERSION
    csrc = _loader._checkout_csrc()
    assert csrc is not None and _loader.source_hash(csrc) == module.SOURCE_HASH


def test_the_stub_names_every_binding_of_the_extension() -> None:
    stub = ast.parse((pathlib.Path(marlkit.__file__).parent / "_C.pyi").read_text())
    declared = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)  # ABI_VERSION, SOURCE_HASH
    bound = {name for name in dir(_loader.load_extension()) if not name.startswith("_")}
    assert declared == bound, (sorted(bound - declared), sorted(declared - bound))


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_loader, "_cache", {})


def test_missing_extension_says_how_to_rebuild(tmp_path: pathlib.Path) -> None:
    # A real copy of the package without the compiled .so, imported in a fresh interpreter.
    shutil.copytree(
        ROOT / "platform" / "marlkit",
        tmp_path / "marlkit",
        ignore=shutil.ignore_patterns("_C*.so", "__pycache__"),
    )
    code = (
        # The editable install's finder would find the checkout's .so: take it out.
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        "import marlkit.native as n\n"
        "try:\n    n.load_extension()\nexcept ImportError as e:\n"
        "    print(type(e).__name__); print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.startswith("ExtensionError"), out.stdout + out.stderr
    assert "not built" in out.stdout and "pip install -e ." in out.stdout


def test_stale_extension_is_refused(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "bindings.cpp").write_text("// edited since the last build\n")
    monkeypatch.setattr(_loader, "_checkout_csrc", lambda: csrc)
    with pytest.raises(ExtensionError, match=r"stale.*pip install -e \."):
        _loader.load_extension()


def test_abi_mismatch_is_refused(fresh_loader: None, monkeypatch: pytest.MonkeyPatch) -> None:
    old = types.SimpleNamespace(ABI_VERSION=_loader.ABI_VERSION - 1, SOURCE_HASH="x")
    monkeypatch.setattr(_loader, "_import_module", lambda: old)
    with pytest.raises(ExtensionError, match="ABI version"):
        _loader.load_extension()
    assert not _loader.extension_available()


def test_native_backend_without_extension_raises(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> types.ModuleType:
        raise ImportError("simulated: no marlkit._C")

    monkeypatch.setattr(_loader, "_import_module", broken)
    with pytest.raises(ExtensionError, match="pip install -e"):
        marlkit.make("navigation", num_envs=2, backend="native")
    # "auto" falls back to the torch twin instead.
    assert marlkit.make("navigation", num_envs=2, backend="auto").backend == "torch"


def test_auto_fallbacks_say_why_once(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from marlkit.native import render
    from marlkit.native.segment_tree import SumSegmentTree

    def broken() -> types.ModuleType:
        raise ImportError("simulated: no marlkit._C")

    monkeypatch.setattr(_loader, "_import_module", broken)
    monkeypatch.setattr(_loader, "_warned", set())
    monkeypatch.setattr(render, "_auto_native", None)
    with caplog.at_level("WARNING", logger="marlkit"):
        for _ in range(2):  # a second env, tree or frame adds no warning
            assert marlkit.make("predator_prey", num_envs=2).backend == "torch"
            assert marlkit.make("navigation", num_envs=2).backend == "torch"
            assert SumSegmentTree(8).backend == "torch"
            circle = render.Circles([[0.0, 0.0]], radius=0.5, color=(0, 0, 0))
            assert render.render_frame([circle], half_extent=1.0, size=8).shape == (8, 8, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3, warnings
    for component, message in zip(
        ("the native scenarios", "SumSegmentTree", "the renderer"), warnings, strict=True
    ):
        assert message.startswith(f"{component} falls back to its slower torch/NumPy twin")
        assert "simulated: no marlkit._C" in message and "pip install -e ." in message


def test_set_num_threads_validates() -> None:
    from marlkit.native import get_num_threads, set_num_threads

    with pytest.raises(TypeError, match="int"):
        set_num_threads(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_threads must be in \[0, 1024\].*got -1"):
        set_num_threads(-1)
    # a pool of that many threads would fail to start at the first kernel call
    with pytest.raises(ValueError, match=r"num_threads must be in \[0, 1024\].*got 100000"):
        set_num_threads(100_000)
    set_num_threads(1024)
    assert get_num_threads() == 1024
    set_num_threads(1)
    assert get_num_threads() == 1
    set_num_threads(0)
    assert get_num_threads() >= 1


POOL_THAT_CANNOT_START = """
import resource
from marlkit.envs.registry import make
from marlkit.native import set_num_threads

env = make("navigation", num_envs=4096)  # enough work for every kernel thread
td = env.reset()
set_num_threads(1024)
# 3 GiB more address space than now: 1,023 threads of 8 MiB stacks cannot all start
room = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + (3 << 30)
resource.setrlimit(resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))
try:
    env.step(env.rand_action(td))
except RuntimeError as err:
    print("raised:", err)
set_num_threads(2)
env.step(env.rand_action(td))
print("stepped on")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS bounds thread stacks on Linux")
def test_a_kernel_pool_that_cannot_start_its_threads_raises_and_the_process_goes_on() -> None:
    # The pool's constructor threw with some threads running: std::terminate aborted Python.
    out = subprocess.run(
        [sys.executable, "-c", POOL_THAT_CANNOT_START], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "raised:" in out.stdout and out.stdout.rstrip().endswith("stepped on")


def test_set_min_work_per_thread_validates() -> None:
    from marlkit.native import get_min_work_per_thread, set_min_work_per_thread

    default = get_min_work_per_thread()
    assert default == 262144
    with pytest.raises(TypeError, match="int"):
        set_min_work_per_thread(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 1 work unit, got 0"):
        set_min_work_per_thread(0)
    assert get_min_work_per_thread() == default  # unchanged by the refused calls
    set_min_work_per_thread(1000)
    assert get_min_work_per_thread() == 1000
    set_min_work_per_thread(default)


def _installed_layout(dest: pathlib.Path) -> pathlib.Path:
    """A copy of the installed package layout (adapters/ and scenarios/ mapped into marlkit),
    as the strict editable install of ``make lint`` links it."""
    shutil.copytree(ROOT / "platform" / "marlkit", dest / "marlkit")
    shutil.copytree(ROOT / "adapters", dest / "marlkit" / "adapters")
    shutil.copytree(ROOT / "scenarios", dest / "marlkit" / "scenarios")
    return dest


@pytest.mark.slow
def test_import_contracts_catch_an_upward_import(tmp_path: pathlib.Path) -> None:
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    layout = _installed_layout(tmp_path)

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(lint_imports), "--no-cache", str(ROOT / "pyproject.toml")],
            cwd=layout,
            capture_output=True,
            text=True,
            timeout=300,
        )

    clean = lint()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    # The data layer importing the environments (a layer above it) breaks both the layers...
    upward = layout / "marlkit" / "data" / "_upward.py"
    upward.write_text("import marlkit.envs\n")
    broken = lint()
    assert broken.returncode != 0
    assert "core layers: nothing below imports what is above it BROKEN" in broken.stdout
    assert "marlkit.data._upward -> marlkit.envs" in broken.stdout
    # ...objectives importing the envs breaks them too (DESIGN.md: objectives never imports
    # envs), as does envs importing modules or modules importing objectives (a layer above)...
    upward.unlink()
    objectives_envs = layout / "marlkit" / "objectives" / "_upward.py"
    objectives_envs.write_text("import marlkit.envs\n")
    assert "marlkit.objectives._upward -> marlkit.envs" in lint().stdout
    objectives_envs.unlink()
    (layout / "marlkit" / "envs" / "_mlp.py").write_text("import marlkit.modules\n")
    independent = lint()
    assert "envs, replay and modules are independent BROKEN" in independent.stdout
    assert "marlkit.envs._mlp -> marlkit.modules" in independent.stdout
    (layout / "marlkit" / "envs" / "_mlp.py").unlink()
    modules_up = layout / "marlkit" / "modules" / "_upward.py"
    modules_up.write_text("import marlkit.objectives\n")
    assert "marlkit.modules._upward -> marlkit.objectives" in lint().stdout
    modules_up.unlink()
    assert lint().returncode == 0
    # ...and a scenario importing the command line breaks the forbidden contract.
    (layout / "marlkit" / "scenarios" / "_cli_user.py").write_text("import marlkit.cli\n")
    forbidden = lint()
    assert forbidden.returncode != 0
    assert "the core never imports the command line or the benchmark harness BROKEN" in (
        forbidden.stdout
    )


def test_platform_holds_nothing_importable_but_the_package() -> None:
    # The editable install puts platform/ on sys.path (setup.py): anything else here would
    # become a top-level module. setuptools' metadata folder (a dotted name) is not importable.
    names = {p.name for p in (ROOT / "platform").iterdir() if not p.name.endswith(".egg-info")}
    assert names == {"marlkit"}, f"platform/ must hold only marlkit/, holds {sorted(names)}"


def _checkout_copy(dest: pathlib.Path) -> pathlib.Path:
    """What ``pip install`` reads of this working tree (uncommitted changes included), without
    build outputs."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in ("platform", "adapters", "scenarios", "csrc"):
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


def _pip_install(python: str | pathlib.Path, args: list[str], cwd: pathlib.Path) -> None:
    """``python -m pip install`` a checkout copy: without the extension (the layout is under
    test, not the kernels), its dependencies or an index."""
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    out = subprocess.run(
        [*pip, "--no-index", *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "MARLKIT_NO_EXTENSION": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def _venv_seeing_these_packages(dest: pathlib.Path) -> pathlib.Path:
    """A fresh venv that sees this interpreter's packages (torch, tensordict, setuptools, pip)
    as a plain path entry: their .pth files, this checkout's editable install among them, are
    not run there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (pathlib.Path(purelib) / "_marlkit_test_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return python


@pytest.mark.slow
@pytest.mark.parametrize("editable", [True, False], ids=["pip-install-e", "pip-install"])
def test_python_run_beside_a_clone_named_marlkit_imports_the_installed_package(
    tmp_path: pathlib.Path, editable: bool
) -> None:
    # A user clones into ./marlkit, installs it, and runs Python from the folder holding the
    # clone: sys.path[0] then holds a folder `marlkit` without __init__.py, a namespace package
    # that setuptools' editable import hook (appended to sys.meta_path) never got to overrule:
    # `AttributeError: module 'marlkit' has no attribute 'make'`.
    clone = _checkout_copy(tmp_path / "marlkit")
    python = _venv_seeing_these_packages(tmp_path / "venv")
    # --ignore-installed: pip sees the test interpreter's marlkit through the path entry: leave
    # that install alone.
    mode = ["-e", str(clone)] if editable else [str(clone)]
    _pip_install(python, ["--ignore-installed", *mode], cwd=tmp_path)
    code = (
        "import marlkit, marlkit.adapters, marlkit.scenarios\n"
        "print(marlkit.__file__)\n"
        "print(type(marlkit.make('navigation', num_envs=1)).__name__)\n"
    )
    out = subprocess.run(
        [str(python), "-c", code],
        cwd=tmp_path,  # the folder holding the clone
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    where, made = out.stdout.split()
    expected = clone / "platform" if editable else tmp_path / "venv"
    assert expected in pathlib.Path(where).parents, where
    assert made == "NavigationEnv"


@pytest.mark.slow
def test_the_strict_editable_install_of_make_lint_is_setuptools_own(tmp_path: pathlib.Path) -> None:
    # make lint's static tools read the link tree of a strict editable install: the platform/
    # path entry of the default install is not added there (the tree holds the whole layout).
    clone = _checkout_copy(tmp_path / "marlkit")
    strict = ["--config-settings", "editable_mode=strict", "--target", "build/lint-site"]
    _pip_install(sys.executable, [*strict, "-e", "."], cwd=clone)
    assert [p.name for p in (clone / "build" / "lint-site").glob("*.pth")] == [
        "__editable__.marlkit-0.1.0.pth"
    ]
    (tree,) = (clone / "build").glob("__editable__.marlkit-*")
    for module in ("__init__.py", "adapters/__init__.py", "scenarios/__init__.py"):
        assert (tree / "marlkit" / module).is_file(), module
