"""Asynchronous rollout: generation runs ahead of training in a background thread (``rollout.async_rollout``).

The producer thread rolls out and scores the batch of step ``s`` as soon as the trainer has finished
step ``s - max_policy_lag`` (so a batch is at most ``max_policy_lag`` policy versions old when it is
trained on), with the newest weights the trainer has pushed. The trainer trains on step ``s - 1``
meanwhile. With ``max_policy_lag = 0`` the producer waits for every update: the steps run in the
synchronous order, with the same seeds and weights, so the run equals a synchronous one.

A thread (not a process) because the hf generation backend already owns its own copy of the weights
and torch releases the GIL inside its kernels; a push clones the policy's weights once (the trainer
goes on training) and the producer loads the newest clone before each rollout. On a CUDA device the
producer queues its kernels on a stream of its own, so generation and training kernels can run on
the GPU at the same time rather than one after the other on the default stream. Each batch carries
its ``policy_version``; the trainer drops one older than the lag bound (never trained on, counted).
The off-policy gap is corrected with the rollout log-probs (``algorithm.off_policy_correction``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nemo_azr.contracts import Batch
from nemo_azr.utils.seeding import seed_everything, step_seed

#: Seconds between checks of the stop flag while the producer waits.
_POLL_S = 0.5


@dataclass
class Rollout:
    """The rolled-out, scored batch of one step (or why the step has nothing to train on)."""

    step: int
    batch: Batch | None
    metrics: dict[str, float]
    skip: tuple[str, str] | None = None  # (why, hint) when the step has no batch
    rollout_s: float = 0.0
    reward_s: float = 0.0
    loader_after: dict = field(default_factory=dict)  # the data position after this batch's draws
    policy_version: int = 0  # the generation weights' version
    lag_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Failure:
    error: BaseException


class AsyncRollout:
    """Runs ``produce(step)`` for ``start_step .. end_step - 1`` in a daemon thread, at most
    ``max_policy_lag`` steps ahead of :meth:`step_done`; :meth:`take` hands them to the trainer."""

    def __init__(
        self,
        produce: Callable[[int], Rollout],
        backend,
        *,
        start_step: int,
        end_step: int,
        max_policy_lag: int,
        seed: int,
        num_threads: int = 0,
        in_flight: list[Rollout] | None = None,
        dropped_stale: int = 0,
    ) -> None:
        """``in_flight``: rollouts a checkpoint kept (:meth:`snapshot`), handed out first; the
        producer goes on after the last of them."""
        in_flight = list(in_flight or [])
        if in_flight and [r.step for r in in_flight] != list(range(start_step, start_step + len(in_flight))):
            raise ValueError(
                f"in-flight rollouts of steps {[r.step for r in in_flight]} do not follow step {start_step}"
            )
        self.produce = produce
        self.num_threads = num_threads
        self.backend = backend
        self.max_policy_lag = max_policy_lag
        self.seed = seed
        self.end_step = end_step
        self._done_through = start_step  # steps < this one are trained (their weights pushed)
        self._next = start_step + len(in_flight)
        self._produced = self._next  # steps < this one are rolled out (queued or taken)
        # (version, weights, CUDA event recorded after the clone on the trainer's stream, or None)
        self._pending: tuple[int, dict[str, torch.Tensor], torch.cuda.Event | None] | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._queue: queue.Queue = queue.Queue(maxsize=max(max_policy_lag + 1, len(in_flight)))
        for rollout in in_flight:
            self._queue.put_nowait(rollout)
        self.dropped_stale = dropped_stale
        self._thread = threading.Thread(target=self._run, name="nemo-azr-rollout", daemon=True)
        self._thread.start()

    # --- producer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        if self.num_threads > 0:  # torch's intra-op thread count is per calling thread
            torch.set_num_threads(self.num_threads)
        try:
            with _own_stream(device_of(self.backend)):
                self._produce_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer thread, raised there
            self._queue.put(_Failure(exc))

    def _produce_all(self) -> None:
        for step in range(self._next, self.end_step):
            with self._cond:
                while not self._stop and self._done_through < step - self.max_policy_lag:
                    self._cond.wait(_POLL_S)
                if self._stop:
                    return
                pending, self._pending = self._pending, None
            if pending is not None:
                self._load(*pending)
            seed_everything(step_seed(self.seed, step))  # the synchronous step's seed
            rollout = self.produce(step)
            while not self._stop:
                try:
                    self._queue.put(rollout, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            with self._cond:
                self._produced = step + 1
                self._cond.notify_all()

    @torch.no_grad()
    def _load(self, version: int, state: dict[str, torch.Tensor], cloned: torch.cuda.Event | None) -> None:
        if cloned is not None:  # the clone was queued on the trainer's stream: wait for it on ours
            torch.cuda.current_stream().wait_event(cloned)
        self.backend.model.load_state_dict(state)
        if cloned is not None:  # the clone's memory belongs to the trainer's stream: copy before it is freed
            torch.cuda.current_stream().synchronize()
        self.backend.version = version

    # --- trainer side ------------------------------------------------------------------------------
    def push_weights(self, policy, version: int) -> None:
        """The trainer's weights after an update (cloned now: training goes on); the producer loads
        the newest push before its next rollout."""
        weights = (
            policy.state_dict() if isinstance(policy, torch.nn.Module) else policy.export_hf_state_dict()
        )
        state = {k: v.detach().clone() for k, v in weights.items()}
        cloned = None
        if any(v.is_cuda for v in state.values()):
            cloned = torch.cuda.Event()
            cloned.record()
        with self._cond:
            self._pending = (version, state, cloned)

    def step_done(self, step: int) -> None:
        """Step ``step`` is trained (and its weights pushed): the producer may go one step further."""
        with self._cond:
            self._done_through = max(self._done_through, step + 1)
            self._cond.notify_all()

    def take(self, step: int, policy_version: int) -> Rollout:
        """The batch of ``step`` (waits for it). A batch more than ``max_policy_lag`` versions behind
        ``policy_version`` is replaced by a skip: it is never trained on."""
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the rollout producer thread stopped without a batch") from None
        if isinstance(item, _Failure):
            raise item.error
        if item.step != step:
            raise RuntimeError(f"rollout producer out of order: got step {item.step}, expected {step}")
        return check_lag(item, policy_version, self.max_policy_lag, self)

    def snapshot(self) -> list[Rollout]:
        """The rollouts produced ahead of the trainer, for a checkpoint (they stay queued).

        Waits until the producer has rolled out every step that may have started before the last
        update (up to the last trained step + ``max_policy_lag``): those may be sampled by weights
        the checkpoint does not hold, so a resumed run trains on these very batches. Every later
        step starts after the last update and samples the checkpoint's weights, in both runs. A
        run resumed with them equals the uninterrupted one."""
        with self._cond:
            target = min(self.end_step, self._done_through + self.max_policy_lag)
            while self._produced < target and self._thread.is_alive() and not self._stop:
                self._cond.wait(_POLL_S)
        with self._queue.mutex:
            items = list(self._queue.queue)
        if any(isinstance(i, _Failure) for i in items):
            return []  # the producer failed: the trainer raises its error at the next take()
        return [i for i in items if i.step >= self._done_through]

    def close(self, timeout_s: float = 120.0) -> None:
        """Stop the producer (after its current rollout) and drop what it queued. A rollout that
        hangs past ``timeout_s`` is left behind: the thread is a daemon and cannot block the exit."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        while not self._queue.empty():
            self._queue.get_nowait()


def uncorrected_lag_warning(cfg) -> str | None:
    """A warning when batches up to ``max_policy_lag >= 1`` updates old are trained without any
    correction of the gap (no importance weights, and pi_old is not the rollout's); else None."""
    alg, ro = cfg.algorithm, cfg.rollout
    if not ro.async_rollout or ro.max_policy_lag < 1:
        return None
    if alg.off_policy_correction != "none" or alg.use_rollout_logprobs:
        return None
    return (
        f"nemo-azr: warning: rollout.max_policy_lag={ro.max_policy_lag} trains on batches sampled by "
        "weights up to that many updates old, and algorithm.off_policy_correction=none leaves the gap "
        "uncorrected; set algorithm.off_policy_correction=tis (docs/throughput.md)"
    )


def async_generation_mode(setting: str, device: torch.device) -> str:
    """Where the decode loop runs: ``thread`` or ``process``. ``auto`` picks the process on a GPU,
    where it overlaps with training and the thread does not (the GIL serialises the two threads'
    kernel launches), and the thread on the CPU, where the two share the cores either way and the
    thread skips the second interpreter (docs/throughput.md, decision 128)."""
    if setting != "auto":
        return setting
    return "process" if device.type == "cuda" else "thread"


def device_of(backend) -> torch.device:
    """The device of the backend's generation model (the CPU when it has none)."""
    model = getattr(backend, "model", None)
    if isinstance(model, torch.nn.Module):
        param = next(model.parameters(), None)
        if param is not None:
            return param.device
    return torch.device("cpu")


def _own_stream(device: torch.device) -> contextlib.AbstractContextManager:
    """A CUDA stream of the producer's own on a CUDA device (nothing elsewhere)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device))


def check_lag(rollout: Rollout, policy_version: int, max_policy_lag: int, counter=None) -> Rollout:
    """``rollout`` with its lag metrics; a skip instead when it is older than ``max_policy_lag``."""
    lag = policy_version - rollout.policy_version
    stale = lag > max_policy_lag
    if stale and counter is not None:
        counter.dropped_stale += 1
    dropped = float(getattr(counter, "dropped_stale", int(stale)))
    rollout.lag_metrics = {"async/policy_lag": float(lag), "async/dropped_stale": dropped}
    if stale:
        why = f"the batch was generated {lag} policy versions ago (rollout.max_policy_lag={max_policy_lag})"
        return dataclasses.replace(rollout, batch=None, skip=(why, "raise rollout.max_policy_lag"))
    return rollout
