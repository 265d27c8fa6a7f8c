"""Run untrusted candidate code in an isolated process and bring back what the trusted harness computed.

CONTRACT (other packages code against this; the implementation may grow, the signature stays):

    run(entry, payload, job_dir, limits) -> SandboxResult

- `entry` is "module:function" of TRUSTED code (e.g. "autokernel.gate.child:numeric"). In the child process the
  function is called as fn(payload: dict, job_dir: Path) -> dict (JSON-able). It may import candidate files named
  in the payload and write tensors with torch.save into job_dir; the parent reads them back with
  torch.load(weights_only=True).
- `job_dir` (sandbox/<run>/<candidate>/...) is the only writable place besides a private /tmp.
- Isolation: bubblewrap when present (no network namespace, read-only system + project, env scrubbed to an
  allowlist, rlimits, wall-clock timeout killing the process group); otherwise a plain subprocess with the same
  limits and a loud warning; limits.isolation == "required" refuses without bubblewrap.
- Failures are values, never exceptions: SandboxResult.ok False with reason one of
  sandbox.timeout | sandbox.oom | sandbox.crash | sandbox.error (entry raised: detail = last traceback line) |
  sandbox.no_isolation.
"""
