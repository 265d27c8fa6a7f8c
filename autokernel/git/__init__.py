"""Deliver accepted kernels as one commit on autokernel's own branch of the target repo, never touching the checkout.

The commit is built with git's plumbing, not in a checkout: the files are written as blobs (`hash-object -w`), laid
over HEAD's tree in a private index file (`read-tree`, `update-index --cacheinfo`, `write-tree`), wrapped in a
commit (`commit-tree`), and the branch is created last and atomically (`update-ref` with "must not exist"). So:
  - the user's work tree, index, HEAD and branches are never touched, and no worktree is left behind;
  - `.gitignore` plays no part: evidence under an ignored `traces/` is committed like any other path;
  - nothing half-made is ever visible: if any step fails or is interrupted, no branch points at anything.
Before a delivery, `delivered` finds the same change already made: a branch under the prefix (local, or a remote's:
a CI checkout has last night's only as origin/autokernel/...) whose tip is one commit over the same base carrying the
same file; with --open-pr, `find_pull_request` finds the open PR of the same op, which `update_pull_request` (after a
lease-guarded push of the new commit to its branch) brings up to date instead of opening another.
Every git process is started by GitPython's command wrapper (`Git`, what `Repo.git` is), ours (`_Git`): hooks disabled
(`core.hooksPath` pointing at no directory, `--no-verify` on push), the system and global config ignored (but by
push and author, which want the user's own), filters and fsmonitor off, and an environment built from an allowlist:
the API keys in ours (model providers, GitHub) never reach git or anything git would start. GitPython's own
`execute` lays the environment it is given over a copy of ours, so `_Git` starts the process itself; the plumbing
stays git's (read-tree, update-ref's "must not exist"), not GitPython's pure-Python index and object writers, which
know neither sha256 repositories nor reftable.

The checkout's git config is the checkout's author's (docs/design.md, trust rule 6): a handed-over directory or
tarball brings its own `.git/config` and `.git` file. So:
  - no command that can start a program or reach the network reads it. The commands run in the checkout are local
    plumbing with every transport forbidden (GIT_ALLOW_PROTOCOL names none: a partial clone's lazy fetch would run
    its `remote.<name>.uploadpack`); `push` runs from a throwaway git dir of ours (empty config, the checkout's
    objects as an alternate), where only the user's own global and system config apply (their credential helper,
    their ssh), and the remote URL is read from the checkout's config as data and must be https://, ssh://, scp-like
    or a local path (`_push_url`); a local remote's receive-pack runs with hooks, auto-gc, alternate-refs commands
    and updateInstead off (`RECEIVE_PACK`), since it reads that repository's config;
  - the author is the user's own identity from their global config, never the checkout's `user.name` (`author`);
  - a `.git` file or link may lead only to a git dir that names this checkout back: a linked worktree's `gitdir`
    file or a submodule's `core.worktree` (`_own_git_dir`); anything else would put the commit in another repository.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import git as gitpython

from autokernel.errors import UserError
from autokernel.untrusted import line, plain

# The committer always, and the author where the repository's git config names nobody (a CI checkout): an address
# GitHub accepts and never mails, not one of this machine's.
BOT_NAME, BOT_EMAIL = "autokernel", "autokernel@users.noreply.github.com"
ZERO = "0" * 40
# Passed to git from our environment when set; nothing else (no *_KEY, *_TOKEN, proxies' credentials).
GIT_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
PUSH_ENV = ("HOME", "SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS", "XDG_CONFIG_HOME")
# GIT_ALLOW_PROTOCOL overrides every protocol.* setting, the checkout's included. No transport is named "none", so a
# command in the checkout reaches nothing; a push may use https and ssh (what _push_url lets through, after the
# user's own url.<base>.insteadOf), plus file for a local remote.
NO_TRANSPORT, PUSH_PROTOCOLS = "none", "https:ssh"
# A local remote's receive-pack reads that repository's config: hooks, auto-gc, core.alternateRefsCommand and a
# push into its checked-out branch with receive.denyCurrentBranch=updateInstead (which checks files out through its
# filters) all start programs. git does not pass our -c options across a local transport (local_repo_env).
RECEIVE_PACK = ("git", "-c", f"core.hooksPath={os.devnull}", "-c", "core.fsmonitor=false", "-c", "receive.autogc=false",
                "-c", "core.alternateRefsCommand=true", "-c", "receive.denyCurrentBranch=refuse", "receive-pack")


class DeliveryError(UserError):
    """Git refused the delivery (one line); the run's state stays resumable and `--resume` retries it."""


@dataclass(frozen=True)
class Delivered:
    branch: str
    sha: str
    base: str  # the commit the branch starts from (the target's HEAD when the commit was made)
    files: tuple[str, ...]


def _env(for_push: bool = False) -> dict[str, str]:
    keep = GIT_ENV + (PUSH_ENV if for_push else ())
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_AUTHOR_NAME=BOT_NAME, GIT_AUTHOR_EMAIL=BOT_EMAIL,
               GIT_COMMITTER_NAME=BOT_NAME, GIT_COMMITTER_EMAIL=BOT_EMAIL,
               GIT_ALLOW_PROTOCOL=NO_TRANSPORT, GIT_NO_LAZY_FETCH="1")  # push() names its transports
    if not for_push:  # push may need the user's credential helper; a commit needs nobody's config
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, HOME=tempfile.gettempdir())
    return env


# Every command: hooks off (no directory holds them), fsmonitor off (the checkout's config could name a program),
# never signing (it would start gpg), content committed byte for byte.
NO_HOOKS = (f"core.hooksPath={os.devnull}", "core.fsmonitor=false", "commit.gpgSign=false", "core.autocrlf=false")
TIMEOUT_S = 120  # one git command; a push to a slow remote is the longest


class _Git(gitpython.Git):
    """GitPython's command wrapper with our guards: the NO_HOOKS options on every command, and a process started
    with the scrubbed environment (_env) plus the variables a call adds; never ours (module docstring)."""

    def __init__(self, working_dir: str | os.PathLike[str] | None = None, for_push: bool = False):
        super().__init__(working_dir)
        self.cwd, self.for_push = working_dir, for_push  # the path as given (GitPython's own expands $VARS in it)
        self.set_persistent_git_options(c=list(NO_HOOKS))

    def execute(self, command: Any, istream: Any = None, with_extended_output: bool = False,
                with_exceptions: bool = True, as_process: bool = False, output_stream: Any = None,
                stdout_as_string: bool = True, kill_after_timeout: float | None = None, *_: Any, env: Any = None,
                **__: Any) -> Any:
        """GitPython's execute, as much of it as delivery and Repo's readers use: stdin bytes (or a file, or the pipe
        of GitPython's long-lived cat-file), a timeout, stdout or (status, stdout, stderr), a process for
        as_process; GitCommandError on failure unless with_exceptions is False."""
        if output_stream is not None:
            raise NotImplementedError("autokernel.git._Git: output_stream")
        env = {**_env(self.for_push), **(env or {})}
        stdin = {"input": istream} if isinstance(istream, bytes) else {"stdin": istream or subprocess.DEVNULL}
        if as_process:
            proc = subprocess.Popen(command, cwd=self.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdin=subprocess.DEVNULL if istream is None else istream)
            return self.AutoInterrupt(proc, command)
        p = subprocess.run(command, cwd=self.cwd, capture_output=True, timeout=kill_after_timeout, env=env, **stdin)
        if with_exceptions and p.returncode != 0:
            raise gitpython.GitCommandError(command, p.returncode, p.stderr, p.stdout)
        out = p.stdout.removesuffix(b"\n")
        text = out.decode(errors="replace") if stdout_as_string else out
        return (p.returncode, text, p.stderr.decode(errors="replace")) if with_extended_output else text


class _Repo(gitpython.Repo):
    GitCommandWrapperType = _Git  # repo.git: the guarded wrapper


def git(cwd: str | Path, *args: str, input: bytes | None = None, env: dict | None = None,
        for_push: bool = False, where: str | Path | None = None) -> str:
    """One git command through _Git; its stdout, or DeliveryError with git's last line (naming `where`, default
    `cwd`)."""
    where = where or cwd
    command = getattr(_Git(cwd, for_push), args[0].replace("-", "_"))  # GitPython's git.<cmd>: update_ref, ...
    try:
        status, out, err = command(*args[1:], istream=input, env=env, kill_after_timeout=TIMEOUT_S,
                                   with_extended_output=True, with_exceptions=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeliveryError(f"git {args[0]} failed in {where}: {e}") from None
    if status != 0:
        last = (err.strip().splitlines() or [f"exit {status}"])[-1]
        raise DeliveryError(f"git {args[0]} failed in {where}: {line(last, 300)}")
    return out.strip()


def open_repo(path: str | Path) -> gitpython.Repo:
    """The GitPython Repo at or above `path` (reads only: remotes, the active branch); its .git is _Git."""
    toplevel(path)  # a repository of its own (_own_git_dir)
    try:
        return _Repo(path, search_parent_directories=True)
    except (gitpython.InvalidGitRepositoryError, gitpython.NoSuchPathError):
        raise UserError(f"{path}: not inside a git repository (pass --repo PATH to a clone)") from None


def toplevel(path: str | Path) -> Path:
    if not Path(path).is_dir():
        raise UserError(f"{path}: no such directory")
    try:
        root = Path(git(path, "rev-parse", "--show-toplevel"))
        mine = Path(git(path, "rev-parse", "--absolute-git-dir")).resolve()
    except DeliveryError:
        raise UserError(f"{path}: not inside a git repository (pass --repo PATH to a clone)") from None
    try:  # core.worktree in the checkout's config names any directory as its work tree: that directory's own
        theirs = Path(git(root, "rev-parse", "--absolute-git-dir")).resolve()  # repository would take our branch
    except DeliveryError:
        theirs = None
    if theirs != mine or not Path(path).resolve().is_relative_to(root.resolve()):
        raise UserError(f"{path}: its git config names {line(str(root), 200)} as its work tree (core.worktree), "
                        "whose repository is not the checkout's; autokernel commits only into the checkout's own "
                        "repository (unset core.worktree)")
    _own_git_dir(root)
    common = Path(git(root, "rev-parse", "--path-format=absolute", "--git-common-dir")).resolve()
    _no_links(mine, common)
    _no_alternates(common)
    return root


def _no_alternates(common: Path) -> None:
    """UserError if the repository borrows objects from another (objects/info/alternates, a clone made with --shared
    or --reference; http-alternates): a push sends whatever the pushed commits reach, so a checkout whose history
    names a commit of another local repository of the user's had `--push` copy it, secrets and all, to the remote
    the checkout chose."""
    for name in ("alternates", "http-alternates"):
        f = common / "objects" / "info" / name
        if os.path.lexists(f):
            raise UserError(f"{common}: objects/info/{name} borrows objects from another repository, which a push "
                            "would send with the branch; clone the checkout without --shared/--reference (git clone "
                            "--no-local PATH) and point autokernel at the clone")


MAX_GIT_ENTRIES = 1_000_000  # a .git walked for links: past this many entries it is refused, not walked forever


def _no_links(*git_dirs: Path) -> None:
    """UserError if a repository directory holds a symbolic link (hooks aside: autokernel runs none): git follows
    them when it writes a ref, a reflog line or a loose object, so a handed-over .git with `refs/heads/autokernel`
    or a reflog linked to ~/.bashrc made our delivery create or append to files outside the checkout. Loose object
    files are never rewritten (git skips an object it has), so only their directories are looked at."""
    seen = 0
    for top in dict.fromkeys(git_dirs):
        for here, dirs, files in os.walk(top):
            rel = Path(here).relative_to(top)
            if rel.parts[:1] == ("hooks",):
                dirs[:] = []
                continue
            names = dirs + ([] if rel.parts[:1] == ("objects",) and len(rel.parts) == 2 else files)
            seen += len(names)
            if seen > MAX_GIT_ENTRIES:
                raise UserError(f"{top}: more than {MAX_GIT_ENTRIES} entries to check for links; pack the "
                                "repository (git gc) or clone it")
            link = next((n for n in names if os.path.islink(os.path.join(here, n))), None)
            if link is not None:
                raise UserError(f"{top}: {line(str(rel / link), 200)} is a symbolic link, which would lead "
                                "autokernel's writes (a branch, a reflog line) outside the repository; clone the "
                                "checkout (git clone PATH) and point autokernel at the clone")


def _own_git_dir(root: Path) -> None:
    """UserError unless the repository that holds `root`'s branches and objects (git's common dir) is inside `root`,
    or names `root` back as git's own links do: a linked worktree's git dir is <common>/worktrees/<id>, whose
    `gitdir` file holds the path of the worktree's .git file (absolute, or relative to that git dir); a submodule's
    git dir is its common dir, whose config has core.worktree (relative to the git dir). These files are the other
    repository's, so a checkout cannot forge them; a `.git` file, link or `commondir` that leads anywhere else would
    put our branch into another repository of the user's."""
    gitdir = Path(git(root, "rev-parse", "--absolute-git-dir")).resolve()
    common = Path(git(root, "rev-parse", "--path-format=absolute", "--git-common-dir")).resolve()
    top = root.resolve()
    if common.is_relative_to(top):
        return
    if gitdir.parent == common / "worktrees" and (gitdir / "gitdir").is_file():  # is_file: never a FIFO's read
        try:
            back = (gitdir / "gitdir").read_text(errors="replace")[:4096].strip()
        except OSError:
            back = ""
        if back and (gitdir / back).resolve() == (top / ".git").resolve():
            return
    if gitdir == common and (common / "config").is_file():
        try:
            worktree = git(top, "config", "--file", str(common / "config"), "--no-includes", "--get", "core.worktree")
        except DeliveryError:  # unset
            worktree = ""
        if worktree and (gitdir / worktree).resolve() == top:
            return
    raise UserError(f"{root}: its .git leads to {line(str(common), 200)}, a repository outside it that does not name "
                    f"it as its worktree or submodule; autokernel commits only into the checkout's own repository")


def head(path: str | Path) -> str:
    try:
        return git(path, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except DeliveryError:
        raise DeliveryError(f"{path}: the repository has no commits yet") from None


def free_branch(path: str | Path, name: str) -> str:
    git(path, "check-ref-format", "--branch", name)
    existing = set(git(path, "for-each-ref", "--format=%(refname:short)", "refs/heads/").splitlines())
    if name not in existing:
        return name
    n = 2
    while f"{name}-{n}" in existing:
        n += 1
    return f"{name}-{n}"


def _rel(path: str) -> str:
    p = PurePosixPath(path)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..", ".git") for part in p.parts):
        raise DeliveryError(f"{path!r}: not a plain path inside the repository")
    return str(p)


def author(repo_path: str | Path) -> tuple[str, str]:
    """(name, email) of the commit's author: the user's own user.name and user.email from their global config
    (~/.gitconfig, $XDG_CONFIG_HOME/git/config, and what they include for this checkout), when both are set; else
    the bot's. Never the checkout's own config: a handed-over checkout would make the commit anyone's."""
    def get(key: str) -> str:
        try:
            return line(git(repo_path, "config", "--global", "--get", key, for_push=True), 200)
        except DeliveryError:  # unset: git config exits 1
            return ""
    name, email = get("user.name"), get("user.email")
    return (name, email) if name and email else (BOT_NAME, BOT_EMAIL)


def same_as_head(root: Path, rel: str, data: bytes) -> None:
    """UserError unless `data` (the op's file in the work tree) is HEAD's blob of `rel`: the prompt, the gate and the
    benchmark read the work tree and the commit is laid over HEAD, so a file changed (or hidden by `git update-index
    --assume-unchanged`, git status then clean) had a speedup measured against one file committed over another (red
    team: "1.77x faster" over a base whose own file it was 0.61x of). The blob id is computed here from the bytes,
    no git filter of the checkout's config runs."""
    import hashlib
    algo = git(root, "rev-parse", "--show-object-format").strip() or "sha1"
    mine = hashlib.new(algo, b"blob %d\0" % len(data) + data).hexdigest()
    try:
        theirs = git(root, "rev-parse", "--verify", "--quiet", f"HEAD:{rel}").strip()
    except DeliveryError:
        theirs = ""
    if mine != theirs:
        raise UserError(f"{root}: {rel} differs from HEAD's copy ({'not in HEAD' if not theirs else 'changed'}, "
                        "perhaps hidden from git status by --assume-unchanged): a win would be measured against "
                        "this file and committed over HEAD's; commit or stash the change first")


def _file_mode(root: Path, base: str, rel: str) -> str:
    """The mode `rel` has at `base` when it is a regular file there (100755 kept: a commit changes content only),
    else 100644 (a new file)."""
    listed = git(root, "ls-tree", base, "--", rel).split(None, 1)
    return listed[0] if listed and listed[0] in ("100644", "100755") else "100644"


def commit_files(repo_path: str | Path, branch: str, files: dict[str, str | bytes], message: str) -> Delivered:
    """One commit holding `files` (repo-relative path -> content) over HEAD, on a new `branch` (a free name near
    it), made without a checkout (see the module docstring)."""
    root = toplevel(repo_path)
    base = head(root)
    rels = {_rel(k): v.encode() if isinstance(v, str) else v for k, v in files.items()}
    with tempfile.TemporaryDirectory(prefix="autokernel-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(root, "read-tree", base, env=index)
        for rel, content in rels.items():
            blob = git(root, "hash-object", "-w", "--stdin", input=content)
            git(root, "update-index", "--add", "--cacheinfo", f"{_file_mode(root, base, rel)},{blob},{rel}",
                env=index)
        tree = git(root, "write-tree", env=index)
    name, email = author(root)
    sha = git(root, "commit-tree", tree, "-p", base, "-F", "-", input=plain(message).encode(),
              env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email})
    for _ in range(20):  # another process may take the name between free_branch and update-ref: take the next
        name = free_branch(root, branch)
        try:
            git(root, "update-ref", "-m", "autokernel: deliver", f"refs/heads/{name}", sha, ZERO)
            return Delivered(name, sha, base, tuple(rels))
        except DeliveryError:
            if free_branch(root, name) == name:  # not a lost race: git refused for another reason
                raise
    raise DeliveryError(f"{root}: could not create a branch named like {branch!r}")


def delivered(repo_path: str | Path, path: str, content: bytes | None, prefix: str = "autokernel/",
              base: str | None = None) -> Delivered | None:
    """A branch named <prefix>... (local or a remote's) whose tip is one commit over `base` (default: HEAD) holding
    exactly `content` at `path`: the delivery a new one would repeat; None if there is none. content None: any
    content at `path` other than base's (a delivery for that file, whatever it holds)."""
    root = toplevel(repo_path)
    base = base or head(root)
    if content is None:
        try:
            blob = "!" + git(root, "rev-parse", "--verify", "--quiet", f"{base}:{_rel(path)}")
        except DeliveryError:
            blob = "!"
    else:
        blob = git(root, "hash-object", "--stdin", input=content)  # no -w: nothing is written
    rows = git(root, "for-each-ref", "--format=%(refname)%09%(objectname)%09%(parent)", "refs/heads/",
               "refs/remotes/")
    for row in rows.splitlines():
        ref, sha, parents = (row.split("\t") + ["", ""])[:3]
        name = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else "/".join(ref.split("/")[3:])
        if not name.startswith(prefix) or parents.split() != [base]:
            continue
        try:
            there = git(root, "rev-parse", "--verify", "--quiet", f"{sha}:{_rel(path)}")
            if there == blob or (blob.startswith("!") and there != blob[1:]):
                return Delivered(ref.removeprefix("refs/heads/").removeprefix("refs/remotes/"), sha, base, (path,))
        except DeliveryError:  # the file is not in that commit
            continue
    return None


def push(repo_path: str | Path, branch: str, remote: str = "origin", to: str | None = None,
         lease: str | None = None) -> list[str]:
    """Push local `branch` to `to` (default: the same name) on `remote`; with `lease` (the sha the remote branch must
    still have), a forced update that fails if anyone else moved it since. git runs in a throwaway git dir (module
    docstring): the user's config and environment, never the checkout's config or hooks. Returns the URLs pushed to."""
    root = toplevel(repo_path)
    to = to or branch
    force = [f"--force-with-lease=refs/heads/{to}:{lease}"] if lease else []
    common = Path(git(root, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    urls = push_urls(root, remote)
    if not urls:
        raise DeliveryError(f"{root}: no git remote {remote!r} to push to")
    targets = [_push_url(u, root) for u in urls]  # every URL checked before anything is pushed
    sha = git(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}")
    objects = str(common / "objects")
    if "\n" in objects or objects.startswith('"'):
        raise DeliveryError(f"{root}: its object directory's path cannot be named in an alternates file")
    with tempfile.TemporaryDirectory(prefix="autokernel-push-") as tmp:
        gd = Path(tmp) / "push.git"
        fmt = git(root, "rev-parse", "--show-object-format")
        git(tmp, "init", "--quiet", "--bare", "--template=", f"--object-format={fmt}", str(gd))
        (gd / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (gd / "objects" / "info" / "alternates").write_text(objects + "\n")
        own = {"GIT_DIR": str(gd)}
        git(gd, "update-ref", f"refs/heads/{branch}", sha, env=own)
        for url, protocols, receive_pack in targets:
            git(gd, "push", "--no-verify", *force, *receive_pack, "--", url, f"refs/heads/{branch}:refs/heads/{to}",
                env={**own, "GIT_ALLOW_PROTOCOL": protocols}, for_push=True, where=root)
    return urls  # where it went, as the config names it (for the user to see)


def push_urls(root: Path, remote: str = "origin") -> list[str]:
    """The URLs a push to `remote` goes to, as the checkout's own config names them (pushurl, else url), read as
    data: no includes, no insteadOf rewriting (which the checkout's config could aim anywhere). The pull request's
    repository is read from the same URLs (github_slug), so the branch and the PR cannot go to different places."""
    common = Path(git(root, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    return _config(root, common / "config", f"remote.{remote}.pushurl") or _config(root, common / "config",
                                                                                    f"remote.{remote}.url")


def _config(root: Path, file: Path, key: str) -> list[str]:
    """Every value of `key` in one config file, read as data (no includes, nothing run); [] if unset."""
    try:
        return git(root, "config", "--file", str(file), "--no-includes", "--get-all", key).splitlines()
    except DeliveryError:  # unset: exit 1
        return []


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)(://|::)")  # git's URL scheme, or a remote helper's prefix
_HOST = re.compile(r"(?:[A-Za-z0-9._~+][A-Za-z0-9._~+-]*@)?[A-Za-z0-9_][A-Za-z0-9._-]*")  # [user@]host, no leading -


def _push_url(url: str, root: Path) -> tuple[str, str, list[str]]:
    """(the URL handed to git push, the transports it may use, extra options) for a remote URL the checkout names:
    https://, ssh:// and scp-like user@host:path as they are; a local path (or file://) made absolute against the
    checkout, pushed with RECEIVE_PACK. Anything else (ext::, fd::, any remote helper, git://, http://, an option)
    is refused, naming the URL in one line."""
    def refuse(why: str) -> DeliveryError:
        return DeliveryError(f"{root}: will not push to remote URL {line(url, 200)!r}: {why} (https://, ssh://, "
                             f"user@host:path or a local path)")
    m = _SCHEME.match(url)
    if m and m.group(2) == "::":
        raise refuse(f"the {m.group(1)}:: transport runs a program")
    if not url or url.startswith("-") or not url.isprintable() or (" " in url and (m or ":" in url)):
        raise refuse("not a plain URL")  # a space only in a local path
    if m:
        scheme, parts = m.group(1).lower(), urllib.parse.urlsplit(url)
        if scheme in ("https", "ssh"):
            if not parts.hostname or not _HOST.fullmatch(parts.hostname):
                raise refuse("no plain host name")
            return url, PUSH_PROTOCOLS, []
        if scheme != "file" or parts.netloc not in ("", "localhost"):
            raise refuse(f"{scheme}:// is not a transport autokernel pushes over")
        url = urllib.parse.unquote(parts.path)
    elif ":" in url and ("/" not in url or url.index("/") > url.index(":")):  # git's scp-like syntax
        if not _HOST.fullmatch(url.split(":", 1)[0]):
            raise refuse("no plain host name")
        return url, PUSH_PROTOCOLS, []
    path = str((root / url).resolve())  # git resolves a relative path from the work tree's top
    return path, "file", [f"--receive-pack={shlex.join(RECEIVE_PACK)}"]


def github_slug(repo_path: str | Path, remote: str = "origin") -> str:
    """owner/name of the repository the branch is pushed to (push_urls: https or ssh form), the one the pull request
    is opened on; UserError when the push URLs name no such repository or more than one."""
    urls = push_urls(toplevel(repo_path), remote)
    if not urls:
        raise UserError(f"no git remote {remote!r} to open a pull request against")
    slugs = set()
    for url in urls:
        m = re.search(r"[:/]([^/:]+)/([^/]+?)(?:\.git)?/?$", url)
        if not m:
            raise UserError(f"cannot read owner/name from remote URL {line(url, 200)!r}")
        slugs.add(f"{m.group(1)}/{m.group(2)}")
    if len(slugs) > 1:
        raise UserError(f"remote {remote!r} pushes to {len(slugs)} repositories ({', '.join(sorted(slugs))}); a "
                        "pull request is opened on the one the branch goes to: leave one push URL")
    return slugs.pop()


def _github(method: str, url: str, token: str, payload: dict | None = None):
    """One GitHub REST call: its JSON, or UserError (one line) naming what GitHub said."""
    req = urllib.request.Request(url, method=method, data=None if payload is None else json.dumps(payload).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
                                          "X-GitHub-Api-Version": "2022-11-28", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise UserError(f"GitHub refused the pull request ({e.code}): "
                        f"{line(e.read()[:200].decode(errors='replace'))}") from None
    except urllib.error.URLError as e:
        raise UserError(f"cannot reach {url.split('/repos/')[0]}: {e.reason}") from None


def open_pull_request(slug: str, branch: str, base: str, title: str, body: str, token: str,
                      api_url: str = "https://api.github.com") -> str:
    """POST /repos/{slug}/pulls; returns the PR's html_url."""
    return _github("POST", f"{api_url.rstrip('/')}/repos/{slug}/pulls", token,
                   {"title": line(title, 250), "head": branch, "base": base, "body": plain(body)})["html_url"]


def find_pull_request(slug: str, head: re.Pattern, base: str, token: str,
                      api_url: str = "https://api.github.com") -> dict | None:
    """The first open PR into `base` from a branch of this repository (not a fork) whose name `head` matches in
    full: {number, html_url, head (the branch), sha (its tip)}, or None."""
    pulls = _github("GET", f"{api_url.rstrip('/')}/repos/{slug}/pulls?state=open&per_page=100&base="
                           f"{urllib.parse.quote(base, safe='')}", token)
    for pr in pulls if isinstance(pulls, list) else []:
        h = pr.get("head") or {}
        if ((h.get("repo") or {}).get("full_name") == slug and (pr.get("base") or {}).get("ref") == base
                and head.fullmatch(str(h.get("ref", "")))):
            return {"number": pr["number"], "html_url": pr["html_url"], "head": h["ref"], "sha": h.get("sha")}
    return None


def update_pull_request(slug: str, number: int, title: str, body: str, token: str,
                        api_url: str = "https://api.github.com") -> str:
    """PATCH /repos/{slug}/pulls/{number}: a new title and body; returns the PR's html_url."""
    return _github("PATCH", f"{api_url.rstrip('/')}/repos/{slug}/pulls/{int(number)}", token,
                   {"title": line(title, 250), "body": plain(body)})["html_url"]
