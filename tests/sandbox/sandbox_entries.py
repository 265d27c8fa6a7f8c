"""Trusted entries for the sandbox tests: each loads the candidate file the test passed as an input and calls its
main(scratch), the way the gate's harness imports a candidate (from the read-only input directory)."""
import importlib.util
import os
from pathlib import Path

import torch  # as in the real entries: imported before any candidate code runs


def call_candidate(payload: dict, inputs: Path) -> dict:
    spec = importlib.util.spec_from_file_location("candidate", Path(inputs) / payload["candidate"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"result": mod.main(Path(os.getcwd()))}


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def attack(payload: dict, inputs: Path) -> dict:
    """Import each hostile file (from the read-only input directory, as the gate imports a candidate) and run its
    main(ctx). payload: attacks [file names], ctx {what the attacker is assumed to know}, group (catch each attack's
    exception so that the next one still runs; a lone attack's exception is the job's failure)."""
    out = {}
    for name in payload["attacks"]:
        try:
            out[name] = {"result": _load(Path(inputs) / name, name.removesuffix(".py")).main(payload.get("ctx", {}))}
        except Exception as e:
            if not payload.get("group"):
                raise
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def import_module(payload: dict, inputs: Path) -> dict:
    """Import payload["name"] from the pythonpath (for the bytecode test)."""
    importlib.import_module(payload["name"])
    return {"imported": payload["name"]}


def inputs_probe(payload: dict, inputs: Path) -> dict:
    """What the job sees of its input directory, and whether it can change it."""
    out = {"names": sorted(os.listdir(inputs)), "a": torch.load(Path(inputs) / "a.pt", weights_only=True),
           "raw": (Path(inputs) / "raw.bin").read_bytes()}
    for what, act in (("write", lambda: open(Path(inputs) / "raw.bin", "wb").write(b"x")),
                      ("unlink", lambda: os.unlink(Path(inputs) / "a.pt"))):
        try:
            act()
            out[what] = "done"
        except OSError:
            out[what] = "OSError"
    return out
