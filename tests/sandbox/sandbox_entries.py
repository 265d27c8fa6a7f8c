"""Trusted entries for the sandbox tests: each loads the candidate file the test wrote and calls its main(job_dir)."""
import importlib.util
from pathlib import Path


def call_candidate(payload: dict, job_dir: Path) -> dict:
    spec = importlib.util.spec_from_file_location("candidate", payload["candidate"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"result": mod.main(job_dir)}
