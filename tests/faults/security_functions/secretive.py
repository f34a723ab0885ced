"""Functions that leak their secret and return too much: run in real replica processes."""

from __future__ import annotations

import os
import sys
from typing import Any


class Leaky:
    """Prints, returns and raises with the secret it was given; returns ``size`` bytes."""

    def setup(self, ctx: Any) -> None:
        print("setup sees HF_TOKEN =", os.environ.get("HF_TOKEN"), flush=True)

    def __call__(self, input: Any) -> Any:
        token = os.environ["HF_TOKEN"]
        print("calling with", token, flush=True)
        mode = input.get("mode")
        if mode == "raise":
            raise RuntimeError(f"upstream refused token {token}")
        if mode == "big":
            return "x" * int(input["size"])
        return {"token": token, "nested": [f"Bearer {token}"], token: "as a key"}


class Chunky:
    """Streams outputs of the sizes asked for."""

    def __call__(self, input: Any) -> Any:
        for size in input["sizes"]:
            yield "y" * int(size)


class Chatty:
    """Prints its secret (whole, and split across writes) and then ``lines`` lines."""

    def __call__(self, input: Any) -> Any:
        token = os.environ["HF_TOKEN"]
        print("token:", token, flush=True)
        sys.stdout.write(f"split {token[:4]}")
        sys.stdout.write(f"{token[4:]} end\n")
        print(f"to stderr {token}", file=sys.stderr, flush=True)
        for i in range(int(input["lines"])):
            print(f"{input['tag']} line {i:04d} " + "." * 80)
        sys.stdout.flush()
        return "done"
