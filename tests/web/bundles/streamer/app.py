"""A streaming function for the browser tests: yields the prompt's words one by one."""

import time


class Streamer:
    def setup(self, ctx):
        self.tensors = len(ctx.weights)
        self.adapters = sorted(ctx.adapters)

    def __call__(self, input, call):
        if input.get("fail"):
            raise ValueError(f"asked to fail: {input['fail']}")
        words = str(input.get("prompt", "")).split()
        for i, word in enumerate(words):
            if i:
                time.sleep(float(input.get("delay_s", 0)))
            yield {"token": word, "adapter": call.adapter, "tensors": self.tensors}
