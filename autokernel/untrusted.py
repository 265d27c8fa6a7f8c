"""Text that came from a candidate or a model, made safe for where it is shown: the terminal, rich markup, Markdown.

A rejection detail, a model's rationale, a file name the model chose: any of them may carry rich markup (`[/]`
crashes rich's parser, `[bold green]ACCEPTED` fakes a verdict), ANSI/OSC escapes (clear the screen, retitle the
terminal, hide text), a carriage return that overwrites the line, or bidirectional overrides that reorder what a
reviewer reads. One rule for every sink: keep printable characters, newlines and tabs; drop everything else.
"""
from __future__ import annotations

import re
import unicodedata

# ESC-introduced sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC (ESC P|X|^|_ ... ST),
# and two-character escapes. Removed whole, so their parameters do not leak into the text as visible garbage.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"
                      r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"
                      r"|\x9b[0-?]*[ -/]*[@-~]|\x9d.*?(?:\x07|\x9c|$)"
                      r"|\x1b[ -/]*[0-~]?", re.S)
_KEEP = {"\n", "\t"}


def plain(text: object, limit: int | None = None) -> str:
    """`text` as printable characters, newlines and tabs only; cut to `limit` characters (with an ellipsis)."""
    s = _ESCAPES.sub("", str(text))
    s = "".join(c for c in s if c in _KEEP or unicodedata.category(c) not in ("Cc", "Cf", "Cs", "Co", "Cn"))
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 1)] + "…"
    return s


def line(text: object, limit: int | None = None) -> str:
    """plain(), on one line: newlines and tabs become spaces (table cells, one-line summaries, commit subjects)."""
    return " ".join(plain(text).split()) if limit is None else plain(" ".join(plain(text).split()), limit)


def markup(text: object, limit: int | None = None) -> str:
    """plain(), then escaped for rich markup: safe inside console.print(f"[red]{markup(detail)}[/]")."""
    from rich.markup import escape
    return escape(plain(text, limit))


def fenced(text: object, info: str = "text") -> str:
    """A Markdown code block that `text` cannot close: the fence is longer than any backtick run inside it, so
    model-written Markdown (links, images, @mentions, HTML) is shown as text in a PR, never rendered."""
    s = plain(text)
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{s}\n{fence}"


def data(value: object) -> object:
    """A JSON-able value with every string in it (keys too) through plain(), and anything else but numbers, bools
    and None as its str(), stripped: --json output and verdict.json, whose details a consumer (jq -r, a CI log)
    would otherwise print with the candidate's escapes intact."""
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {plain(k) if isinstance(k, str) else k: data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [data(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return plain(str(value))  # what json.dumps(default=str) would have written, stripped


# What GitHub acts on in a commit message or a PR body (and a fence means nothing in a commit message): references
# #12, GH-12, owner/repo#12 and issue/PR URLs (with a closing keyword before them -- Closes, Fixes, Resolves -- they
# close the issue when the commit lands on the default branch), @user and @org/team mentions, and trailers such as
# Co-authored-by: that credit someone. inert() breaks each with one visible space after the sign (#12 -> "# 12",
# GH-12 -> "GH- 12", @team -> "@ team", Co-authored-by: -> "Co-authored-by :") and defangs URLs (https:// ->
# hxxps://): no invisible characters (plain() removes those anyway), nothing GitHub links, and a reader still sees
# what the model wrote. A closing keyword is inert once no reference follows it.
_GITHUB = re.compile(r"#(?=\d)|\bGH-(?=\d)|@(?=[\w-])|\b(?=[\w-]+-by:)(?P<trailer>[\w-]+-by):|\bhttp(?P<s>s?)://",
                     re.I)


def _defuse(m: re.Match) -> str:
    if m.group("trailer"):
        return f"{m.group('trailer')} :"
    if m.group(0).lower().startswith("http"):
        return f"hxxp{m.group('s')}://"
    return m.group(0) + " "


def inert(text: object) -> str:
    """plain(), with nothing GitHub would link, close, mention or credit (see _GITHUB): for model and candidate
    words in a commit message or a PR body."""
    return _GITHUB.sub(_defuse, plain(text))
