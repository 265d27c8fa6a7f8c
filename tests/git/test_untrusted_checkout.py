"""A handed-over checkout's .git is the attacker's: its config must start no program and reach no network through
a push (or a lazy fetch), and its .git file must not lead our commit into another repository. Every attack here
writes a marker file when it works; the push must still arrive."""
import subprocess
from pathlib import Path

import git
import pytest

from autokernel import git as delivery
from autokernel.errors import UserError

ACTOR = git.Actor("u", "u@x")


def make_repo(path: Path) -> git.Repo:
    r = git.Repo.init(path, initial_branch="main")
    (path / "kernels").mkdir()
    (path / "kernels" / "rmsnorm.py").write_text("old\n")
    r.index.add(["kernels/rmsnorm.py"])
    r.index.commit("init", author=ACTOR, committer=ACTOR)
    return r


def wd(r: git.Repo) -> Path:
    return Path(str(r.working_tree_dir))


def script(path: Path, marker: Path, tail: str = "exit 1") -> Path:
    path.write_text(f"#!/bin/sh\ntouch {marker}\n{tail}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A user with an empty global config; the marker directory every attack writes into."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    for var in ("GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS"):
        monkeypatch.delenv(var, raising=False)
    marks = tmp_path / "marks"
    marks.mkdir()
    return marks


def hostile(repo: git.Repo, marks: Path, remote_url: str) -> None:
    """Every setting of the checkout's own config that makes git start a program or reach the network."""
    gd = Path(str(repo.git_dir))
    bad = gd.parent.parent / "bad"
    bad.mkdir()
    for hook in ("pre-push", "reference-transaction", "post-update"):
        script(gd / "hooks" / hook, marks / f"hook-{hook}", "exit 0")
        script(bad / hook, marks / f"hookspath-{hook}", "exit 0")
    prog = {k: script(bad / k, marks / k) for k in ("askpass", "gitproxy", "gpg", "ssh")}
    ext = f"ext::sh -c touch% {marks}/ext"
    with repo.config_writer() as cw:
        cw.set_value("remote \"origin\"", "url", remote_url)
        cw.set_value("remote \"origin\"", "receivepack", f"touch {marks}/receivepack; git-receive-pack")
        cw.set_value("remote \"origin\"", "uploadpack", f"touch {marks}/uploadpack; git-upload-pack")
        cw.set_value("core", "hooksPath", str(bad))
        cw.set_value("core", "sshCommand", str(prog["ssh"]))
        cw.set_value("core", "askPass", str(prog["askpass"]))
        cw.set_value("core", "gitProxy", str(prog["gitproxy"]))
        cw.set_value("credential", "helper", f"!touch {marks}/credential; false")
        cw.set_value("protocol \"ext\"", "allow", "always")
        cw.set_value("protocol", "allow", "always")
        cw.set_value(f"url \"{ext}\"", "pushInsteadOf", remote_url)
        cw.set_value("push", "gpgSign", "true")
        cw.set_value("gpg", "program", str(prog["gpg"]))
        cw.set_value("http", "sslVerify", "false")
        cw.set_value("http", "proxy", "http://127.0.0.1:9")


def test_push_reads_none_of_the_checkouts_config(tmp_path, env):
    """The red-team's B1: remote.origin.receivepack ran as the user (HOME, ssh-agent); here with every other
    program-starting key of the checkout's config beside it. The push still arrives, lease-guarded updates too."""
    repo = make_repo(tmp_path / "user")
    bare = git.Repo.init(tmp_path / "remote.git", bare=True)
    hostile(repo, env, str(bare.git_dir))
    root = wd(repo)
    d = delivery.commit_files(root, "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    delivery.push(root, d.branch)
    assert bare.commit("autokernel/x").hexsha == d.sha
    e = delivery.commit_files(root, "autokernel/y", {"kernels/rmsnorm.py": "newer\n"}, "m")
    with pytest.raises(delivery.DeliveryError, match="failed in .*user"):  # the remote moved: the lease holds
        delivery.push(root, e.branch, to="autokernel/x", lease=e.sha)
    delivery.push(root, e.branch, to="autokernel/x", lease=d.sha)
    assert bare.commit("autokernel/x").hexsha == e.sha
    assert sorted(p.name for p in env.iterdir()) == []


def test_a_relative_local_remote_is_the_checkouts(tmp_path, env):
    repo = make_repo(tmp_path / "user")
    bare = git.Repo.init(tmp_path / "remote.git", bare=True)
    repo.create_remote("origin", "../remote.git")
    d = delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    delivery.push(wd(repo), d.branch)
    assert bare.commit("autokernel/x").hexsha == d.sha


@pytest.mark.parametrize("url", ["ext::sh -c touch% {marks}/ext", "ext::sh", "fd::3", "testgit::/tmp/x",
                                 "git://example.invalid/acme/engine.git", "http://example.invalid/acme/engine.git",
                                 "file://example.invalid/srv/engine.git", "--upload-pack=touch {marks}/opt",
                                 "-oProxyCommand=x:path", "ssh://-oProxyCommand=x/path"])
def test_remote_urls_that_run_programs_are_refused(tmp_path, env, url):
    repo = make_repo(tmp_path / "user")
    with repo.config_writer() as cw:
        cw.set_value("protocol", "allow", "always")
        cw.set_value("remote \"origin\"", "url", url.format(marks=env))
    d = delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    with pytest.raises(delivery.DeliveryError, match="will not push to remote URL") as e:
        delivery.push(wd(repo), d.branch)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in env.iterdir()) == []


def test_pushurl_is_what_is_pushed_to_and_checked(tmp_path, env):
    repo = make_repo(tmp_path / "user")
    bare = git.Repo.init(tmp_path / "remote.git", bare=True)
    with repo.config_writer() as cw:
        cw.set_value("remote \"origin\"", "url", "https://example.invalid/acme/engine.git")
        cw.set_value("remote \"origin\"", "pushurl", f"ext::sh -c touch% {env}/ext")
    d = delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    with pytest.raises(delivery.DeliveryError, match="ext:: transport"):
        delivery.push(wd(repo), d.branch)
    with repo.config_writer() as cw:
        cw.set_value("remote \"origin\"", "pushurl", str(bare.git_dir))
    delivery.push(wd(repo), d.branch)
    assert bare.commit("autokernel/x").hexsha == d.sha


@pytest.mark.parametrize("url", ["ssh://git@example.invalid/acme/engine.git", "git@example.invalid:acme/engine.git"])
def test_ssh_is_the_users_not_the_checkouts(tmp_path, env, url):
    """core.sshCommand in the checkout ran with the user's ssh-agent; the user's own (global config) runs instead."""
    repo = make_repo(tmp_path / "user")
    hostile(repo, env, url)
    users = script(tmp_path / "users-ssh", tmp_path / "users-ssh-ran")
    (Path.home() / ".gitconfig").write_text(f"[core]\n\tsshCommand = {users}\n")
    d = delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    with pytest.raises(delivery.DeliveryError, match="git push failed in"):
        delivery.push(wd(repo), d.branch)
    assert (tmp_path / "users-ssh-ran").exists()
    assert sorted(p.name for p in env.iterdir()) == []


def test_a_local_remote_runs_no_program_of_its_own(tmp_path, env):
    """A local remote is a repository too (a directory of the tarball, say): receive-pack reads its config. Its hooks,
    its alternate-refs command and a checkout of the pushed branch through its filters (updateInstead) stay off."""
    repo = make_repo(tmp_path / "user")
    elsewhere = make_repo(tmp_path / "elsewhere")
    bare = git.Repo.init(tmp_path / "remote.git", bare=True)
    (Path(str(bare.git_dir)) / "objects" / "info" / "alternates").write_text(f"{str(elsewhere.git_dir)}/objects\n")
    for hook in ("pre-receive", "update", "post-receive", "post-update", "reference-transaction", "push-to-checkout"):
        script(Path(str(bare.git_dir)) / "hooks" / hook, env / f"remote-{hook}", "exit 0")
    with bare.config_writer() as cw:
        cw.set_value("core", "alternateRefsCommand", f"touch {env}/alternate-refs; true")
    repo.create_remote("origin", str(bare.git_dir))
    d = delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    delivery.push(wd(repo), d.branch)
    assert bare.commit("autokernel/x").hexsha == d.sha
    assert sorted(p.name for p in env.iterdir()) == []
    # a non-bare remote whose checked-out branch is the one we push, updated in place through a smudge filter
    live = make_repo(tmp_path / "live")
    (tmp_path / "live" / ".gitattributes").write_text("* filter=evil\n")
    live.index.add([".gitattributes"])
    live.index.commit("attrs", author=ACTOR, committer=ACTOR)
    live.git.checkout("-b", "autokernel/x")
    mine = git.Repo.clone_from(wd(live), tmp_path / "mine")  # the test's git, before the filter is set
    with live.config_writer() as cw:
        cw.set_value("receive", "denyCurrentBranch", "updateInstead")
        cw.set_value("filter \"evil\"", "smudge", f"touch {env}/smudge; cat")
        cw.set_value("filter \"evil\"", "clean", "cat")
    e = delivery.commit_files(wd(mine), "autokernel/x", {"kernels/rmsnorm.py": "x\n"}, "m")
    with pytest.raises(delivery.DeliveryError, match="failed in"):  # refused, never checked out
        delivery.push(wd(mine), e.branch, to="autokernel/x")
    assert sorted(p.name for p in env.iterdir()) == []


def test_no_lazy_fetch_runs_the_checkouts_upload_pack(tmp_path, env):
    """A partial clone fetches a missing object from its promisor remote on first read, running that remote's
    uploadpack from the checkout's config."""
    src = make_repo(tmp_path / "src")
    pc = tmp_path / "pc"
    serve = "git -c uploadpack.allowFilter=1 upload-pack"
    subprocess.run(["git", "-c", "uploadpack.allowFilter=1", "clone", "-q", "--no-local", "--filter=tree:0",
                    "--no-checkout", "-u", serve, f"file://{wd(src)}", str(pc)], check=True)
    clone = git.Repo(pc)
    clone.git.update_ref("refs/heads/main", clone.commit("origin/main").hexsha)
    with clone.config_writer() as cw:
        cw.set_value("remote \"origin\"", "uploadpack", f"touch {env}/uploadpack; {serve}")
    with pytest.raises(delivery.DeliveryError):  # HEAD's tree is not here, and may not be fetched
        delivery.commit_files(pc, "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert sorted(p.name for p in env.iterdir()) == []


def foreign_gitfile(tmp_path, other: git.Repo, kind: str) -> Path:
    evil = tmp_path / f"evil-{kind}"
    evil.mkdir()
    (evil / "kernels").mkdir()
    if kind == "gitfile":
        (evil / ".git").write_text(f"gitdir: {str(other.git_dir)}\n")
    elif kind == "symlink":
        (evil / ".git").symlink_to(str(other.git_dir))
    elif kind == "commondir":  # a git dir inside the checkout whose refs and objects live in the other repository
        shaped = evil / ".git"
        subprocess.run(["git", "init", "-q", str(evil)], check=True)
        (shaped / "commondir").write_text(f"{str(other.git_dir)}\n")
    else:  # a real linked worktree of the other repository, claimed by a checkout it does not name
        other.git.worktree("add", str(tmp_path / "theirs"), "-b", "theirs")
        (evil / ".git").write_text(f"gitdir: {str(other.git_dir)}/worktrees/theirs\n")
    return evil


@pytest.mark.parametrize("kind", ["gitfile", "symlink", "commondir", "worktree"])
def test_a_git_file_into_another_repository_is_refused(tmp_path, env, kind):
    """The red-team's B7: `.git` holding `gitdir: /elsewhere/.git` made autokernel commit into that repository."""
    other = make_repo(tmp_path / "other")
    evil = foreign_gitfile(tmp_path, other, kind)
    heads = sorted(h.name for h in other.heads)
    with pytest.raises(UserError, match="outside it") as e:
        delivery.commit_files(evil, "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="outside it"):
        delivery.push(evil, "main")
    with pytest.raises(UserError, match="outside it"):
        delivery.open_repo(evil)
    assert sorted(h.name for h in other.heads) == heads


def test_a_linked_worktree_and_a_submodule_are_their_own(tmp_path, env):
    repo = make_repo(tmp_path / "user")
    repo.git.worktree("add", str(tmp_path / "wt"), "-b", "wt")
    d = delivery.commit_files(tmp_path / "wt", "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert repo.commit("autokernel/x").hexsha == d.sha  # the branch is the repository's, as git's own would be
    bare = git.Repo.init(tmp_path / "remote.git", bare=True)
    repo.create_remote("origin", str(bare.git_dir))
    delivery.push(tmp_path / "wt", d.branch)  # objects found through the common dir
    assert bare.commit("autokernel/x").hexsha == d.sha
    sup = make_repo(tmp_path / "super")
    sup.git.execute(["git", "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(wd(repo)),
                     "sub"])
    sub = tmp_path / "super" / "sub"
    assert (sub / ".git").is_file()  # git links it: super/.git/modules/sub, core.worktree pointing back
    s = delivery.commit_files(sub, "autokernel/s", {"kernels/rmsnorm.py": "sub\n"}, "m")
    assert git.Repo(sub).commit("autokernel/s").hexsha == s.sha


@pytest.mark.parametrize("where", ["other", "parent"])
def test_a_work_tree_named_by_the_checkouts_config_is_refused(tmp_path, env, where):
    """Red-team: `core.worktree = /elsewhere` in the checkout's .git/config made `rev-parse --show-toplevel` answer
    /elsewhere, whose own .git took the branch (and a push and the PR's slug). A work tree above the checkout (the
    user's home, a dotfiles repository) is refused the same way: its repository is not the checkout's."""
    other = make_repo(tmp_path / "other")
    evil = make_repo(tmp_path / "other" / "evil" if where == "parent" else tmp_path / "evil")
    with evil.config_writer() as cw:
        cw.set_value("core", "worktree", str(wd(other)))
    heads = sorted(h.name for h in other.heads)
    with pytest.raises(UserError, match="core.worktree") as e:
        delivery.commit_files(Path(str(evil.git_dir)).parent, "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert "\n" not in str(e.value)
    assert sorted(h.name for h in other.heads) == heads and sorted(h.name for h in evil.heads) == ["main"]


@pytest.mark.parametrize("link", ["refs/heads/autokernel", "logs/refs/heads/autokernel", "objects/00"])
def test_links_inside_the_git_dir_are_refused(tmp_path, env, link):
    """Red-team: `.git/refs/heads/autokernel` linked to a directory outside made update-ref create the branch's
    file there, a reflog linked to a user's file had a line appended to it; a loose-object directory linked outside
    would take the new objects. Nothing is written; the message says to clone."""
    repo = make_repo(tmp_path / "user")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = Path(str(repo.git_dir)) / link
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UserError, match="symbolic link.*clone") as e:
        delivery.commit_files(wd(repo), "autokernel/x", {"kernels/rmsnorm.py": "new\n"}, "m")
    assert "\n" not in str(e.value)
    assert list(outside.iterdir()) == [] and sorted(h.name for h in repo.heads) == ["main"]


def test_a_checkout_borrowing_another_repositorys_objects_is_refused(tmp_path, env):
    """objects/info/alternates pointing at another local repository of the user's, and a merge whose second parent is
    that repository's commit (its id is all the attacker needs): `--push` copied the victim's secret to the
    checkout's remote. Refused before any delivery (exit 2 naming the file); a checkout without it is taken."""
    victim = make_repo(tmp_path / "victim")
    (wd(victim) / "secret.txt").write_text("TOKEN\n")
    victim.index.add(["secret.txt"])
    secret = victim.index.commit("private", author=ACTOR, committer=ACTOR)
    co = make_repo(tmp_path / "co")
    info = Path(str(co.git_dir)) / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text(str(Path(str(victim.git_dir)) / "objects") + "\n")
    co = git.Repo(wd(co))  # a fresh object database that reads the alternates
    merge = co.index.commit("merge", parent_commits=[co.head.commit, co.commit(secret.hexsha)], author=ACTOR,
                            committer=ACTOR)
    assert co.head.commit == merge
    with pytest.raises(UserError, match="alternates borrows objects from another repository"):
        delivery.toplevel(wd(co))
    (info / "alternates").unlink()
    assert delivery.toplevel(wd(make_repo(tmp_path / "clean"))) == (tmp_path / "clean").resolve()


def test_the_pull_request_goes_where_the_branch_is_pushed(tmp_path, env):
    """url = the victim's GitHub repository (rewritten by the checkout's own insteadOf to a private one), pushurl =
    the attacker's: the branch went to the attacker and the PR, with the user's token, to the private repository.
    The slug is now read from the push URLs themselves, as data (no insteadOf): the attacker's; and a remote pushing
    to two repositories opens no PR."""
    co = make_repo(tmp_path / "co")
    with co.config_writer() as cw:
        cw.set_value('remote "origin"', "url", "https://github.com/victim/engine.git")
        cw.set_value('remote "origin"', "pushurl", "https://github.com/attacker/drop.git")
        cw.set_value('url "https://github.com/victim-org/private-infra.git"', "insteadOf",
                     "https://github.com/victim/engine.git")
    assert delivery.github_slug(wd(co)) == "attacker/drop"
    assert delivery.push_urls(wd(co)) == ["https://github.com/attacker/drop.git"]
    with co.config_writer() as cw:
        cw.add_value('remote "origin"', "pushurl", "git@github.com:victim/engine.git")
    with pytest.raises(UserError, match="pushes to 2 repositories"):
        delivery.github_slug(wd(co))
