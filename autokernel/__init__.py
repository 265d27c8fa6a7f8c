"""autokernel: profile an LLM engine, rewrite its Triton kernels with an agent, prove and measure every rewrite."""
from importlib.metadata import PackageNotFoundError, version

try:  # the version is declared once, in pyproject.toml; the installed package's metadata carries it
    __version__ = version("autokernel")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
