"""`autokernel ledger [--op OP] [--json] [--repo PATH] [--all-devices]`: print the checkout's ledger of tried candidates
(autokernel/agent/ledger.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from autokernel import paths
from autokernel.agent.ledger import Ledger
from autokernel.untrusted import data, line


def ledger_cmd(op: Optional[str] = typer.Option(None, help="Only this op."),
               as_json: bool = typer.Option(False, "--json", help="JSON lines for machines."),
               repo: Optional[Path] = typer.Option(None, help="The checkout (default: the one here)."),
               all_devices: bool = typer.Option(False, "--all-devices", help="Include other devices' lines.")):
    """Every candidate tried on this checkout: sha256, op, device, verdict, reason, speedup, time."""
    led = Ledger.of(paths.target(repo))
    es = led.entries(op, this_device=not all_devices)
    if as_json:
        for e in es:
            typer.echo(json.dumps(data(e)))
        return
    if not es:
        typer.echo(f"ledger {led.path}: no candidates" + (f" for {op}" if op else "") + " on this device")
        return
    for e in es:
        sp = f"{e['speedup']:.3f}x" if isinstance(e.get("speedup"), (int, float)) else "-"
        typer.echo(f"{line(e['time'], 20)}  {line(e['op'], 20):<12} {line(e['sha256'], 64)[:12]}  "
                   f"{line(e['verdict'], 10):<8} {sp:>8}  {line(e.get('reason') or '', 40):<28} "
                   f"{line(e.get('detail') or '', 100)}")


def register(app: typer.Typer) -> None:
    app.command("ledger")(ledger_cmd)
