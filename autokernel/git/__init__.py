"""Deliver accepted kernels as commits on autokernel's own branch, made in a separate worktree (GitPython).

The user's checkout, index, current branch and uncommitted changes are never touched: a temporary worktree is
created from HEAD, the files are written and committed there, and the worktree is removed. If anything fails or is
interrupted before the commit exists, the new branch is deleted again, so no half-made commit is left behind.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from autokernel.errors import UserError

BOT_NAME, BOT_EMAIL = "autokernel", "autokernel@localhost"


@dataclass(frozen=True)
class Delivered:
    branch: str
    sha: str
    files: tuple[str, ...]


def open_repo(path: str | Path):
    import git
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UserError(f"{path}: not inside a git repository (pass --repo PATH to a clone)") from None


def free_branch(repo, name: str) -> str:
    existing = {h.name for h in repo.heads}
    if name not in existing:
        return name
    n = 2
    while f"{name}-{n}" in existing:
        n += 1
    return f"{name}-{n}"


def commit_files(repo_path: str | Path, branch: str, files: dict[str, str | bytes], message: str) -> Delivered:
    """One commit holding `files` (repo-relative path -> content) on a new `branch` from HEAD, made off-checkout."""
    import git
    repo = open_repo(repo_path)
    if repo.head.is_valid() is False:
        raise UserError(f"{repo.working_tree_dir}: the repository has no commits yet")
    branch = free_branch(repo, branch)
    tmp = Path(tempfile.mkdtemp(prefix="autokernel-wt-"))
    wt_dir = tmp / "wt"
    committed = False
    try:
        repo.git.worktree("add", "-b", branch, str(wt_dir), "HEAD")
        wt = git.Repo(wt_dir)
        for rel, content in files.items():
            dst = wt_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(content.encode() if isinstance(content, str) else content)
        wt.git.add("--", *files.keys())
        actor = git.Actor(BOT_NAME, BOT_EMAIL)
        commit = wt.index.commit(message, author=actor, committer=actor)
        committed = True
        return Delivered(branch, commit.hexsha, tuple(files))
    finally:
        try:
            repo.git.worktree("remove", "--force", str(wt_dir))
        except git.GitCommandError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
        repo.git.worktree("prune")
        if not committed and branch in {h.name for h in repo.heads}:
            repo.git.branch("-D", branch)


def push(repo_path: str | Path, branch: str, remote: str = "origin") -> None:
    import git
    repo = open_repo(repo_path)
    try:
        repo.git.push(remote, f"{branch}:{branch}")
    except git.GitCommandError as e:
        raise UserError(f"git push {remote} {branch} failed: {e.stderr.strip().splitlines()[-1] if e.stderr else e}")


def github_slug(repo_path: str | Path, remote: str = "origin") -> str:
    """owner/name from the remote URL (https or ssh form)."""
    repo = open_repo(repo_path)
    try:
        url = repo.remote(remote).url
    except ValueError:
        raise UserError(f"no git remote {remote!r} to open a pull request against") from None
    m = re.search(r"[:/]([^/:]+)/([^/]+?)(?:\.git)?/?$", url)
    if not m:
        raise UserError(f"cannot read owner/name from remote URL {url!r}")
    return f"{m.group(1)}/{m.group(2)}"


def open_pull_request(slug: str, branch: str, base: str, title: str, body: str, token: str,
                      api_url: str = "https://api.github.com") -> str:
    """POST /repos/{slug}/pulls; returns the PR's html_url."""
    req = urllib.request.Request(
        f"{api_url.rstrip('/')}/repos/{slug}/pulls", method="POST",
        data=json.dumps({"title": title, "head": branch, "base": base, "body": body}).encode(),
        headers={"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                 "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)["html_url"]
    except urllib.error.HTTPError as e:
        raise UserError(f"GitHub refused the pull request ({e.code}): {e.read()[:200].decode(errors='replace')}")
    except urllib.error.URLError as e:
        raise UserError(f"cannot reach {api_url}: {e.reason}") from None
