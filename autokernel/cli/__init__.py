"""The `autokernel` command: `main` (parse, dispatch, one-line errors) and `generate` here; every other sub-command in
a module of this package that registers it. The work lives in the stage packages, which import no typer."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, cast

import typer

from autokernel.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile an LLM engine, rewrite its Triton kernels with an agent, prove and measure each.")


@app.callback()
def _root() -> None:
    """autokernel: every sub-command exits 0 on success, 1 on a clean negative, 2 on bad input."""


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Prompt text; wrapped in the model's chat template unless --raw."),
    kernels: str = typer.Option("triton", help="Op implementations: reference (torch) or triton."),
    model: Optional[Path] = typer.Option(None, help="A llama-architecture GGUF; default: embedded SmolLM2-135M."),
    weights: str = typer.Option("quant", help="quant: keep Q4_1/Q8_0 blocks; dequant: expand at load."),
    max_new_tokens: int = typer.Option(64, min=1, help="Upper bound on generated tokens."),
    temperature: float = typer.Option(0.0, min=0.0, help="0 is greedy."),
    top_k: int = typer.Option(0, min=0, help="Sample among the k most likely tokens (0: off)."),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="Nucleus sampling mass."),
    seed: Optional[int] = typer.Option(None, help="Seed for sampling."),
    chat: bool = typer.Option(True, "--chat/--raw", help="Apply the chat template."),
):
    """Generate text with the live engine, streaming tokens as they come."""
    from autokernel.engine import open_engine
    from autokernel.engine.generate import Sampling
    from autokernel.engine.generate import generate as run_generation
    eng = open_engine(model, kernels=kernels, weights=weights)
    ids = eng.encode_prompt(prompt, chat)
    shown = ""
    new: list[int] = []

    def stream(_row: int, token: int) -> None:
        nonlocal shown
        new.append(token)
        text = eng.tokenizer.decode(new)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    g = run_generation(eng.model, eng.tokenizer, [ids], max_new_tokens,
                       Sampling(temperature, top_k, top_p, seed), on_token=stream)
    sys.stdout.write("\n")
    n = len(g.new_ids[0])
    tps = g.decode_steps / g.decode_s if g.decode_s > 0 else float("nan")
    typer.echo(f"[{kernels} kernels, {weights} weights, {len(ids)} prompt + {n} new tokens; prefill "
               f"{g.prefill_s:.2f} s, decode {tps:.2f} tok/s]", err=True)


def _die_with_jobs() -> None:
    """SIGTERM (a CI runner's cancel, `kill`): every sandbox job still running (or stopped by the bench's lockstep)
    is killed first, then the command exits 143; Ctrl-C's KeyboardInterrupt kills a job where it waits
    (autokernel.sandbox.runner._execute). No job process outlives autokernel, with or without bubblewrap."""
    import signal

    def on_term(signum, frame):
        from autokernel import sandbox
        sandbox.kill_all()
        typer.echo("autokernel: terminated; sandbox jobs killed", err=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def main() -> None:
    # The other sub-commands' modules register them; imported only when a command runs, so that `import
    # autokernel.cli` stays light.
    from autokernel.cli import agent as agent_command
    from autokernel.cli import bench as bench_command
    from autokernel.cli import init as init_command
    from autokernel.cli import ledger
    from autokernel.cli import policy as policy_command
    from autokernel.cli import profile as profile_command
    from autokernel.cli import run as run_command
    from autokernel.cli import verify as gate_command
    for stage in (bench_command, agent_command, gate_command, profile_command, policy_command, run_command, ledger,
                  init_command):
        stage.register(app)
    _die_with_jobs()
    try:
        rc = app(standalone_mode=False)  # typer.Exit(code) comes back as the return value here
        sys.exit(rc if isinstance(rc, int) else 0)
    except UserError as e:  # one line, and the message may quote a file name or a server's reply: no escapes
        from autokernel.untrusted import line
        typer.echo(f"autokernel: error: {line(e)}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("autokernel: interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # click's (or typer's vendored click's) usage errors arrive here in non-standalone mode
        names = {c.__name__ for c in type(e).__mro__}
        if "ClickException" in names:
            cast(Any, e).show()  # a ClickException, known by name: click's or typer's vendored copy's class
            sys.exit(2)
        if "Abort" in names:
            sys.exit(130)
        raise
