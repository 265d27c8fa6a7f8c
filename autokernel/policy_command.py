"""`autokernel policy check [FILE]`: validate policies.yaml and show the effective values."""
from __future__ import annotations

from pathlib import Path

import typer

from autokernel import policy

policy_app = typer.Typer(help="Inspect and validate policies.yaml.", no_args_is_help=True)


@policy_app.command("check")
def check(path: Path = typer.Argument(Path("policies.yaml"), help="The policy file to validate.")):
    """Validate a policy file: exit 0 if valid, 2 naming the field, the line and what is allowed if not."""
    p = policy.load(path)
    typer.echo(f"{path}: valid")
    for section, values in p.model_dump().items():
        typer.echo(f"  {section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app, name="policy")
