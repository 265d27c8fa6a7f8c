"""A virtual environment inside the checkout (`python -m venv .venv` in the repository, the usual way) holds triton
and torch: their frames are not the checkout's launchers, and their files are not the checkout's kernels. Without
this, every launch's site was triton's own `jit.py` (the nearest frame "in the checkout"), so `init` declared no
launcher (`launchers = ["TODO"]`) and the gate refused every op as launched from outside its file."""
import importlib.util

import pytest

from autokernel.errors import UserError
from autokernel.target import declaration as decl
from autokernel.target import discover, launches

SITE = ".venv/lib/python3.11/site-packages"


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_launch_site_skips_an_installed_package_inside_the_checkout(tmp_path, monkeypatch):
    lib = tmp_path / SITE / "fakelib" / "jit.py"
    lib.parent.mkdir(parents=True)
    lib.write_text("import sys\n\ndef launch():\n    return sys._getframe()\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ops.py").write_text("def my_launcher(x):\n    return LIB.launch()\n")
    fakelib = _module(lib, "ak_test_fakelib_jit")
    ops = _module(tmp_path / "pkg" / "ops.py", "ak_test_pkg_ops")
    ops.LIB = fakelib
    frame = ops.my_launcher(1)  # the innermost frame is the installed package's, as triton's run() is
    site = launches.LaunchHook(str(tmp_path)).site(frame)
    assert site is not None and site["file"] == "pkg/ops.py" and site["function"] == "my_launcher", site
    assert launches.LaunchHook(str(tmp_path)).rel(str(lib)) is None


def test_a_kernel_file_in_an_installed_package_is_not_the_checkouts(tmp_path):
    kernel = tmp_path / SITE / "liger_kernel" / "ops" / "rms_norm.py"
    kernel.parent.mkdir(parents=True)
    kernel.write_text("def rms_norm_forward(x):\n    return x\n")
    (tmp_path / "mine.py").write_text("def f(x):\n    return x\n")
    assert not discover._inside(tmp_path, f"{SITE}/liger_kernel/ops/rms_norm.py")
    assert discover._inside(tmp_path, "mine.py")
    (tmp_path / decl.NAME).write_text(f'[ops.rms_norm]\nfile = "{SITE}/liger_kernel/ops/rms_norm.py"\n'
                                      'launchers = ["rms_norm_forward"]\n')
    with pytest.raises(UserError, match="installed package's file"):
        decl.load(tmp_path)


@pytest.mark.parametrize("path,expected", [(f"{SITE}/triton/runtime/jit.py", True),
                                           ("venv/lib/python3.11/dist-packages/torch/x.py", True),
                                           ("src/site_packages_helper.py", False), ("kernels/rmsnorm.py", False)])
def test_installed(path, expected):
    assert launches.installed(path) is expected
