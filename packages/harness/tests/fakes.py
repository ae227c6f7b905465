"""A tiny CPU problem and contenders, honest and planted, for testing the harness itself."""

from kernellab.harness.case import Impl, Problem, Suite, Tolerance


class Affine(Problem):
    """y = 2 x + 1 over an (M, N) tensor."""

    op = "affine"

    def make_inputs(self, seed):
        return {"x": self.randn(self.shape, self.generator(seed))}

    def make_outputs(self, inputs):
        import torch

        return {"y": torch.empty_like(inputs["x"])}

    def reference(self, inputs):
        return {"y": inputs["x"].double() * 2 + 1}

    def control(self, inputs, outputs):
        import torch

        torch.add(inputs["x"] * 2, 1, out=outputs["y"])
        return outputs

    def bytes_moved(self):
        return 2 * self.shape[0] * self.shape[1] * 4

    def tolerance(self):
        return Tolerance(1e-6, 1e-6)


def honest(problem):
    def call(i, o):
        o["y"].copy_(i["x"]).mul_(2).add_(1)
        return o
    return call


def leaves_tail_unwritten(problem):
    def call(i, o):
        o["y"][:, :-1].copy_(i["x"][:, :-1] * 2 + 1)
        return o
    return call


def writes_input(problem):
    def call(i, o):
        i["x"].mul_(2).add_(1)
        o["y"].copy_(i["x"])
        return o
    return call


def caches_by_pointer(problem):
    cache = {}

    def call(i, o):
        key = i["x"].data_ptr()
        if key not in cache:
            cache[key] = i["x"] * 2 + 1
        o["y"].copy_(cache[key])
        return o
    return call


def affine_suite(*impls: Impl, shapes=((8, 16), (3, 5))) -> Suite:
    return Suite(name="affine", device="cpu", description="test suite",
                 make_problems=lambda: [Affine(s, "fp32", "cpu") for s in shapes],
                 impls=[Impl("torch", bind=lambda p: p.control), *impls])


# ---- contenders that cheat the timing, each caught by the harness (test_cheats.py) ----------------
def works_when_poisoned(problem):
    """Does the work only when its output holds NaN, as a validation leaves it."""
    def call(i, o):
        if bool(o["y"].isnan().any()):
            o["y"].copy_(i["x"]).mul_(2).add_(1)
        return o
    return call


def memoizes_on_fingerprint(stale: list):
    """Keeps results keyed on the input's address and three sampled elements; ``stale`` collects the
    calls it served from a memo made before the input was last written (torch's version counter)."""
    def bind(problem):
        cache = {}

        def call(i, o):
            x = i["x"]
            key = (x.data_ptr(), float(x[0, 0]), float(x[-1, -1]), float(x[x.shape[0] // 2, x.shape[1] // 2]))
            if key in cache and cache[key][0] != x._version:
                stale.append(key)
            if key not in cache:
                cache[key] = (x._version, x * 2 + 1)
            o["y"].copy_(cache[key][1])
            return o
        return call
    return bind


def finishes_in_a_thread(problem):
    """Returns at once and finishes the work in a thread of its own."""
    import threading
    import time

    def call(i, o):
        def work():
            time.sleep(0.002)
            o["y"].copy_(i["x"]).mul_(2).add_(1)
        threading.Thread(target=work, name="planted-worker").start()
        return o
    return call


class Gate:
    """Holds back a planted thread's work until the harness starts checking outputs (``Checked``'s
    reference), then waits for it to be done: work that ends after the clock stopped, before the check."""

    def __init__(self):
        import threading

        self.open, self.lock, self.outstanding = threading.Event(), threading.Lock(), 0

    def hold(self, work) -> None:
        import _thread

        with self.lock:
            self.outstanding += 1

        def run():
            self.open.wait(30)
            work()
            with self.lock:
                self.outstanding -= 1
        _thread.start_new_thread(run, ())  # a thread the threading module never sees, as a native one

    def release(self) -> None:
        import time

        self.open.set()
        deadline = time.monotonic() + 30
        while self.outstanding and time.monotonic() < deadline:
            time.sleep(0.001)
        self.open.clear()


class Checked(Affine):
    """Affine whose reference, which the harness computes when it checks a result, opens ``gate``."""

    def __init__(self, shape, dtype, device, gate: Gate):
        super().__init__(shape, dtype, device)
        self.gate = gate

    def reference(self, inputs):
        self.gate.release()
        return super().reference(inputs)


def finishes_in_a_hidden_thread(gate: Gate):
    """Returns at once; a low-level thread (invisible to ``threading``, like a native one, so no join
    reaches it) does the work once the harness starts checking."""
    def bind(problem):
        def call(i, o):
            gate.hold(lambda: o["y"].copy_(i["x"]).mul_(2).add_(1))
            return o
        return call
    return bind


def patches_the_comparison(problem):
    """Replaces the harness's comparison with one that always passes, then does no work."""
    from kernellab.harness import validate

    validate.compare = lambda *a, **k: {"passed": True, "outputs": {}}

    def call(i, o):
        return o
    return call


def patches_the_clock(problem):
    """Makes the harness's clock run 50 times slower, so that every call looks 50 times faster."""
    import time

    real = time.perf_counter_ns
    time.perf_counter_ns = lambda: real() // 50
    return honest(problem)
