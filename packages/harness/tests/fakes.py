"""A tiny CPU problem and contenders, honest and planted, for testing the harness itself."""

import contextlib

from kernellab.harness.case import Impl, Problem, Suite, Tolerance


@contextlib.contextmanager
def harness_constant(module, name: str, value):
    """Set one of the harness's constants for a test, sealed as set (``integrity`` refuses a constant changed
    under it), and restore both after."""
    from kernellab.harness import integrity

    key = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    old, sealed = getattr(module, name), integrity._SEALED[key]
    setattr(module, name, value)
    integrity._SEALED[key] = (value, value)
    try:
        yield
    finally:
        setattr(module, name, old)
        integrity._SEALED[key] = sealed


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


def restorable(problem, restore):
    """An honest call carrying ``restore``, which undoes what its cheat changed at bind (``_run_and_restore``)."""
    call = honest(problem)

    def run(i, o):
        return call(i, o)
    run.restore = restore
    return run


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


def skips_the_calls_it_counts_unchecked(iterations: int):
    """Knows the run's batch length (``iterations``) and counts its calls from the poisoned outputs a batch starts
    with (a validation's look the same, so the first call works too), then does the work of the last call it
    expects only, writing zeros in between: with batches of a fixed length, the last call, the one checked, was
    always right."""
    def bind(problem):
        count = [0]

        def call(i, o):
            count[0] = 0 if bool(o["y"].isnan().any()) else count[0] + 1
            if count[0] in (0, iterations - 1):
                o["y"].copy_(i["x"]).mul_(2).add_(1)
            else:
                o["y"].zero_()
            return o
        return call
    return bind


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


class WorkWhenRead(dict):
    """A result that does the call's work only when the harness reads it, after the clock stopped."""

    def __init__(self, i, o, done: list):
        super().__init__(o)
        self._i, self._o, self._done = i, o, done

    def _work(self):
        self._done.append(1)
        self._o["y"].copy_(self._i["x"]).mul_(2).add_(1)

    def items(self):
        self._work()
        return super().items()

    def values(self):
        self._work()
        return super().values()

    def __getitem__(self, key):
        self._work()
        return super().__getitem__(key)


def works_when_read(done: list):
    """Returns at once a dict subclass whose reads do the work (``WorkWhenRead``)."""
    def bind(problem):
        return lambda i, o: WorkWhenRead(i, o, done)
    return bind


def returns_its_input(problem):
    """For a problem whose answer is its input (``Copy``): the input itself, no byte moved."""
    return lambda i, o: {"y": i["x"]}


def patches_its_bench(problem):
    """Finds the bench that binds it and replaces its ``_measure`` on the instance (the class's method, which
    the harness seals, stays as it was): its own samples come back 50 times smaller."""
    import gc

    from kernellab.harness import threads
    from kernellab.harness.runner import Bench

    for obj in gc.get_objects():
        if type(obj) is Bench:
            real = obj._measure

            def _measure(mode, calls, check, real=real):
                kept, disturbance = real(mode, calls, check)
                mine = threads._active is not None and threads._active[0] == "cheat"
                return ([s / 50 for s in kept] if mine else kept), disturbance
            obj._measure = _measure
    return honest(problem)


def patches_the_encoder(problem):
    """Wraps ``json.dumps``, which encodes every worker reply, to shrink its own samples 50 times."""
    import json

    real = json.dumps

    def dumps(obj, *a, **k):
        data = obj.get("data") if isinstance(obj, dict) else None
        if isinstance(data, dict) and "samples_us" in data:
            data["samples_us"] = {m: [s / 50 for s in v] for m, v in data["samples_us"].items()}
        return real(obj, *a, **k)
    json.dumps = dumps
    return honest(problem)


def answers_for_its_artifacts(problem):
    """Replaces the harness's hashing of built files so that a rebuilt one reads as the report recorded it
    (zeros here); honest calls."""
    from kernellab.harness import provenance

    real = provenance.artifact_hashes
    provenance.artifact_hashes = lambda paths: {p: "0" * 64 for p in real(paths)}
    return honest(problem)


def slows_the_control(problem):
    """Honest calls; at bind it wraps ``torch.add``, which the affine control calls, to run it three times: the
    control it is compared with gets slower, not itself. ``call.restore`` undoes the patch."""
    import torch

    real = torch.add

    def add(*args, **kwargs):
        for _ in range(2):
            real(*args, **kwargs)
        return real(*args, **kwargs)
    torch.add = add
    return restorable(problem, lambda: setattr(torch, "add", real))


def starves_the_control_of_threads(problem):
    """Honest calls; at bind it sets torch's thread pool to one thread, which the control's ops run on.
    ``call.restore`` undoes it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    return restorable(problem, lambda: torch.set_num_threads(threads))


def _reply_stream():
    """The worker's reply stream, found where a contender would look: the frame of ``worker.serve``."""
    import sys

    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "serve":
        frame = frame.f_back
    return frame.f_locals["out"]


def takes_over_the_reply_channel(problem):
    """Honest calls; at bind it points the worker's reply descriptor at a pipe of its own and forwards every reply
    through a low-level thread (one ``threading`` does not list), its samples divided by 3."""
    import _thread
    import json
    import os

    fd = _reply_stream().fileno()
    real = os.dup(fd)
    r, w = os.pipe()
    os.dup2(w, fd)
    os.close(w)

    def pump():
        buffered = b""
        while chunk := os.read(r, 1 << 20):
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                msg = json.loads(line)
                if isinstance(msg.get("data"), dict) and "samples_us" in msg["data"]:
                    msg["data"]["samples_us"] = {m: [x / 3 for x in v] for m, v in msg["data"]["samples_us"].items()}
                os.write(real, (json.dumps(msg) + "\n").encode())
    _thread.start_new_thread(pump, ())
    return honest(problem)


def keeps_a_copy_of_the_reply_channel(problem):
    """Honest calls; at bind it keeps a descriptor of the worker's reply pipe of its own, through which it could
    write replies the driver would read as the worker's."""
    import os

    keeps_a_copy_of_the_reply_channel.kept = os.dup(_reply_stream().fileno())
    return honest(problem)


def pushes_a_torch_function_mode(problem):
    """Honest calls; at bind it pushes a torch function mode that spins on every torch call (the control's: its own
    call does not go through torch's functions). ``call.restore`` pops it."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Slow(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            sum(range(3000))
            return func(*args, **(kwargs or {}))
    torch._C._push_on_torch_function_stack(Slow())
    return restorable(problem, torch._C._pop_torch_function_stack)


def hands_the_interpreter_over_often(problem):
    """Honest calls; at bind it sets the interpreter's thread switch interval to a microsecond (a thread of its
    own would then take the control's time slices). ``call.restore`` puts it back."""
    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    return restorable(problem, lambda: sys.setswitchinterval(interval))


def pins_the_process_to_one_cpu(problem):
    """Honest calls; at bind it pins every thread of the process to one CPU (to two where it had one), where
    torch's pool keeps its thread count. ``call.restore`` puts every thread back."""
    import os

    every = os.sched_getaffinity(0)
    one = {min(every)} if len(every) > 1 else every

    def pin(cpus):
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:
                pass
    pin(one)
    return restorable(problem, lambda: pin(every))


def starts_a_thread_through_its_thread(problem):
    """Honest calls; at bind it starts a thread (the impl's) that, once bind has returned, starts another that
    spins until ``stop`` is set: a thread no impl owns, which could slow the control's cases unwaited."""
    import threading
    import time

    stop = threading.Event()

    def second():
        while not stop.is_set():
            time.sleep(0.001)

    def first():
        time.sleep(0.05)  # bind (and the harness's record of the impl's threads) is over by now
        threading.Thread(target=second, name="started-by-an-owned-thread", daemon=True).start()
    threading.Thread(target=first, daemon=True).start()
    return restorable(problem, stop.set)


def starts_a_thread_outside_threading(problem):
    """Honest calls; at bind it starts a thread through ``_thread``, which ``threading`` never lists, running until
    ``stop`` is set."""
    import _thread
    import threading
    import time

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            time.sleep(0.001)
    _thread.start_new_thread(spin, ())
    return restorable(problem, stop.set)


def patches_a_tensor_method(problem):
    """Does no work in its call; at its first call (after the case's first integrity check) it replaces
    ``torch.Tensor.detach``, through which the harness reads results, with one that does the work then."""
    import torch

    real = torch.Tensor.detach
    pending = {}

    def detach(self):
        x = pending.pop(id(self), None)
        if x is not None:  # the harness is reading this result: compute it now, after the clock stopped
            torch.add(real(x) * 2, 1, out=self)
        return real(self)

    def call(i, o):
        torch.Tensor.detach = detach
        pending[id(o["y"])] = i["x"]
        return o
    call.restore = lambda: setattr(torch.Tensor, "detach", real)
    return call


def raises_the_ship_limit(problem):
    """Sets the size past which results are checked in the worker only to zero, so that nothing it returns is
    checked outside its process; computes honestly."""
    from kernellab.harness import validate

    validate.SHIP_LIMIT_BYTES = 0
    return problem.control


def replaces_its_problems_truth(problem):
    """Replaces the truth on the problem it is handed with its own (unwritten, NaN) outputs, then does no work."""
    import torch

    problem.reference = lambda inputs: {"y": torch.full(inputs["x"].shape, float("nan"), dtype=torch.float64)}
    return lambda i, o: o


def stops_the_thread_join(problem):
    """Clears the harness's record of the case being measured, so that its synchronizations join no thread of
    the contender's; computes honestly."""
    from kernellab.harness import threads

    def call(i, o):
        threads._active = None
        problem.control(i, o)
        return o
    return call


def predicts_batch_inputs(hits: list):
    """Computes, outside the clock, the inputs that seeds derived from the run's configuration would give each
    timed batch (as a harness seeding its batches from the config would write them), and counts in ``hits``
    every timed call whose input is one of them: each such call could be served from a memo."""
    from kernellab.harness.case import seed_for
    from kernellab.harness.runner import Config

    def bind(problem):
        config = Config()
        predicted = set()
        for mode in ("e2e_throughput", "e2e_latency"):
            batch = seed_for(config.seed, problem.name, "cheat", "batch", mode, 0)
            for k in range(64):
                predicted.add(float(problem.make_inputs(seed_for(batch, k))["x"].sum()))

        def call(i, o):
            if float(i["x"].sum()) in predicted:
                hits.append(1)
            problem.control(i, o)
            return o
        return call
    return bind


def patches_isnan_for_one_read(problem):
    """Does no work in its call; inside each call it replaces ``torch.isnan`` with one that, at the comparison's
    second call (the truth's), copies the truth into the output being compared and then puts the original back:
    no check around the case would see it."""
    import torch

    real = torch.isnan
    seen = []

    def isnan(t):
        seen.append(t)
        if len(seen) == 2:  # (the output's float64 copy, the truth): make them agree, then leave no trace
            torch.isnan = real
            seen[0].copy_(t)
            seen.clear()
        return real(t)

    def call(i, o):
        seen.clear()
        torch.isnan = isnan
        return o
    call.restore = lambda: setattr(torch, "isnan", real)
    return call


def patches_the_clock_once(problem):
    """Honest work, but inside each call it replaces ``time.perf_counter_ns`` with a clock that, at its first use,
    puts the original back and returns a time 10 ms early: the next stamp the harness takes (its batch's end)
    would be early, and no check around the case would see a patch."""
    import time

    real = time.perf_counter_ns
    inner = honest(problem)

    def once() -> int:
        time.perf_counter_ns = real
        return real() - 10_000_000

    def call(i, o):
        time.perf_counter_ns = once
        return inner(i, o)
    call.restore = lambda: setattr(time, "perf_counter_ns", real)
    return call


def patches_the_comparison_once(problem):
    """Works only where its outputs are poisoned (a validation, a batch's first call); in every other call it does
    nothing and replaces ``validate.compare`` with one that, at its first use, puts the original back and compares
    the truth with itself: the check after the batch would pass, and no check around the case would see a patch."""
    from kernellab.harness import validate

    real = validate.compare
    inner = honest(problem)

    def once(result, truth, rtol, atol, slack=None):
        validate.compare = real
        return real(truth, truth, rtol, atol, slack)

    def call(i, o):
        if bool(o["y"].isnan().any()):
            return inner(i, o)
        validate.compare = once
        return o
    call.restore = lambda: setattr(validate, "compare", real)
    return call


class _Zero(int):
    """An int that is always zero: every count of wrong elements made through it is none."""

    def __new__(cls, *args, **kwargs):
        return int.__new__(cls, 0)


def shadows_a_builtin_in_the_harness(problem):
    """Adds a global ``int`` to the harness's validation module, which its comparison then counts wrong elements
    with instead of the builtin (none, whatever the output), then does no work."""
    from kernellab.harness import validate

    validate.int = _Zero
    return lambda i, o: o
