"""One win's way into the target repository: staged, committed, offered as a pull request.

`stage` writes what the commit will carry into a directory no candidate ever had (<op_dir>/delivery/), so a
delivery that git refuses is retried by `--resume` from there without a new session; `commit` makes the commit
from that directory (autokernel.git.commit_files: a new branch, the checkout untouched); `pull_request` brings the
open PR of the same op up to date, else pushes the branch and opens one. The run's bookkeeping (state.json, the
outcome's status) stays with the pipeline (autokernel/run.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from autokernel import git as delivery
from autokernel.errors import UserError
from autokernel.git import report

MAX_PROFILE_BYTES = 512_000  # a profile summary committed with the evidence (SmolLM2-135M's: ~100 kB); a bigger one
#                             is named, not committed


def profile_paths(op: str, trace: str | None, run_name: str, root: Path, policy) -> tuple[float | None, str, str]:
    """(the op's share of profiled end-to-end time from the ranking, None if unknown; the repository path the profile
    summary is committed to, "" if it is not; the trace's repository-relative directory when it is too big)."""
    from autokernel.profile import rank as rank_mod
    from autokernel.profile import trace as trace_mod
    if not trace:
        return None, "", ""
    try:
        t = trace_mod.load_trace(trace, check_device=False)
    except UserError:
        return None, "", ""
    share = next((r.e2e_share for r in rank_mod.rank(t, policy) if r.op == op), None)
    if Path(t["_path"]).stat().st_size <= MAX_PROFILE_BYTES:
        return share, f"traces/autokernel/{run_name}/profile/summary.json", ""
    d = Path(t["_path"]).parent
    return share, "", str(d.relative_to(root)) if d.is_relative_to(root) else f"traces/{d.name}"


def stage(d: Path, win: report.Win, source: str, root: Path, trace: str | None = None) -> Path:
    """Write what the commit will carry into `d`: the kernel, the evidence, the message, the PR body, the profile
    summary when it is committed, and delivery.json naming where each goes. The base is the target's HEAD now."""
    d.mkdir(parents=True, exist_ok=True)
    base = delivery.head(root)
    (d / "kernel.py").write_text(source)
    (d / "evidence.json").write_text(report.evidence(win, base))
    (d / "message.txt").write_text(report.message(win, base))
    (d / "pr.md").write_text(f"# {report.title(win)}\n\n{report.body(win, base)}\n")
    if win.profile_path:
        from autokernel.profile import trace as trace_mod
        assert trace is not None, "a committed profile comes from the run's trace (profile_paths)"
        (d / "profile.json").write_bytes(Path(trace_mod.load_trace(trace, check_device=False)["_path"]).read_bytes())
    (d / "delivery.json").write_text(json.dumps({"op": win.op, "base": base, "evidence_path": win.evidence_path,
                                                 "profile_path": win.profile_path}))
    return d


def commit(root: Path, d: Path, op: str, branch: str) -> delivery.Delivered:
    """Commit <d>/kernel.py as kernels/<op>.py plus the evidence (and profile) file on a new branch named like
    `branch`; DeliveryError (one line) when git refuses."""
    meta = json.loads((d / "delivery.json").read_text())
    files: dict[str, str | bytes] = {f"kernels/{op}.py": (d / "kernel.py").read_bytes(),
                                     meta["evidence_path"]: (d / "evidence.json").read_bytes()}
    if meta.get("profile_path"):
        files[meta["profile_path"]] = (d / "profile.json").read_bytes()
    return delivery.commit_files(root, branch, files, (d / "message.txt").read_text())


@dataclass(frozen=True)
class PullRequest:
    url: str
    updated: str | None = None  # the branch of the open PR that was brought up to date; None: a new PR was opened


def pull_request(root: Path, prefix: str, op: str, branch: str, body: str, token: str,
                 api: str = "https://api.github.com") -> PullRequest:
    """The PR of a committed win (`branch`, body: its pr.md): the open PR of the same op into the same base, brought
    up to date (the new commit pushed to its branch, lease-guarded; title and body replaced), else the branch pushed
    and a new PR opened."""
    title = body.splitlines()[0].lstrip("# ")
    base = delivery.git(root, "rev-parse", "--abbrev-ref", "HEAD")
    slug = delivery.github_slug(root)
    same_op = re.compile(re.escape(prefix) + r"\d{4}-\d{2}-\d{2}-" + re.escape(op) + r"(-\d+)?")
    pr = delivery.find_pull_request(slug, same_op, base, token, api)
    if pr is None:
        delivery.push(root, branch)
        return PullRequest(delivery.open_pull_request(slug, branch, base, title, body, token, api))
    delivery.push(root, branch, to=pr["head"], lease=pr["sha"])
    return PullRequest(delivery.update_pull_request(slug, pr["number"], title, body, token, api), pr["head"])
