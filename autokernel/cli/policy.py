"""`autokernel policy check [FILE]`: validate policies.yaml and show the effective values."""
from __future__ import annotations

from pathlib import Path

import typer

from autokernel import policy
from autokernel.untrusted import line

policy_app = typer.Typer(help="Inspect and validate policies.yaml.", no_args_is_help=True)


@policy_app.command("check")
def check(path: Path = typer.Argument(Path("policies.yaml"), help="The policy file to validate.")):
    """Validate a policy file: exit 0 if valid, 2 naming the field, the line and what is allowed if not; and list the
    fields a checkout's policies.yaml may not set (docs/design.md, trust rule 6)."""
    p = policy.load(path)
    typer.echo(f"{path}: valid")
    for section, values in p.model_dump().items():
        typer.echo(f"  {section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    refused = policy.checkout_refusals(path)
    if refused:  # valid as your own file (--policy, the user config), but not as a checkout's (trust rule 6)
        typer.echo(f"as a checkout's policies.yaml, {len(refused)} field(s) would be refused (exit 2):")
        for r in refused:
            typer.echo(f"  {line(r)}")


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
