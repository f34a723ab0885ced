"""A function whose setup always raises: every start fails, and the console says so."""


class SetupFails:
    def setup(self, ctx):
        raise RuntimeError("setup failed on purpose: the weights are not there")

    def __call__(self, input):
        return input
