"""Attack: read API keys from the environment (the parent's env holds canary keys)."""
import os


def main(ctx):
    return {"found": {k: v for k, v in os.environ.items() if "canary" in v or k.endswith(("_KEY", "_TOKEN"))},
            "keys": sorted(os.environ)}
