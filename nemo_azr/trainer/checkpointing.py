"""The trainer's checkpoints: what a ``step_<N>`` folder holds besides the weights (trainer state,
data position, RNG streams, config, a part-way warm-up), writing it (collective under torchrun,
optionally in the background), choosing and loading the folder a run resumes from, and the frozen
warmed-up policy the KL term may be anchored to. The folder life cycle (temporary folder, COMPLETE
marker, manifest, rotation) is :mod:`nemo_azr.trainer.checkpoint`'s."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nemo_azr.config.loader import to_yaml
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.capabilities import StatefulWorkflow
from nemo_azr.contracts.policy import Critic, Policy
from nemo_azr.errors import (
    CheckpointDamagedError,
    CheckpointError,
    StorageFullError,
    storage_full_reason,
)
from nemo_azr.models.training.critic_common import CRITIC_DIR
from nemo_azr.trainer.checkpoint import CHECKPOINT_DIR, Checkpointer, ResumePlan, checkpoint_step, plan_resume
from nemo_azr.utils.seeding import rng_state, set_rng_state

if TYPE_CHECKING:
    from nemo_azr.trainer.sft import SFTWarmup

#: A checkpoint taken part-way through the supervised warm-up (a preemption) holds its state here.
SFT_WARMUP_FILE = "sft_warmup.pt"
KL_REFERENCE_DIR = "kl_reference"  # algorithm.kl.reference=warmup: the warmed-up policy's weights
#: rollout.async_rollout: the batches produced ahead of the trainer (sampled by older weights than the
#: checkpoint's), so a resumed run trains on exactly what the uninterrupted one would have.
ASYNC_IN_FLIGHT_FILE = "async_in_flight.pt"
_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


@dataclass
class TrainerState:
    step: int = 0  # steps completed
    policy_version: int = 0
    samples_seen: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    loader: dict = field(default_factory=dict)
    # A checkpoint taken part-way through the supervised warm-up: the warm-up steps done (its
    # optimizer state is in sft_warmup.pt). None: the warm-up is finished, or there is none.
    warmup_step: int | None = None
    workflow: dict = field(default_factory=dict)  # a StatefulWorkflow's state_dict()
    resume_fallbacks: int = 0  # damaged checkpoints trainer.resume=auto skipped on the way to this state


def is_main_process() -> bool:
    """Rank 0, or a run without torch.distributed: the one process that logs and publishes checkpoints."""
    return not dist.is_initialized() or dist.get_rank() == 0


def launch_rank() -> int:
    """This process's global rank, also before the process group exists (torchrun's ``RANK``)."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


class CheckpointingMixin:
    """The checkpoint half of :class:`~nemo_azr.trainer.trainer.Trainer` (mixed in): it reads the
    attributes below, which the trainer builds."""

    cfg: NemoAzrConfig
    output_dir: Path
    checkpointer: Checkpointer
    state: TrainerState
    policy: Policy
    critic: Critic | None
    ref: Policy | None
    tokenizer: Any
    loader: Any
    workflow: Any
    async_rollout: Any = None
    _loader_trained: dict | None = None  # with async rollout: the data position after the last trained batch
    _warmup: SFTWarmup | None = None  # a warm-up stopped part-way, while its checkpoint is written
    _resumed_in_flight: dict | None = None  # the resume checkpoint's async in-flight rollouts

    _save_seconds: float = 0.0  # the saves' wall time since the last take_save_seconds()

    def take_save_seconds(self) -> float:
        """Seconds this rank spent in :meth:`save_checkpoint` since the last call (``timing/save_s``)."""
        seconds, self._save_seconds = self._save_seconds, 0.0
        return seconds

    def save_checkpoint(self) -> Path:
        """Write ``step_<step>`` (collective under torchrun). With ``trainer.async_save`` the policy's
        shards are written in the background and the folder is published (COMPLETE marker, rename)
        by :meth:`finalize_checkpoints`; the returned path exists once that has run."""
        start = time.perf_counter()
        try:
            return self._save_checkpoint()
        finally:
            self._save_seconds += time.perf_counter() - start

    def _save_checkpoint(self) -> Path:
        self.finalize_checkpoints(blocking=True)  # at most one save in flight
        multi = dist.is_initialized() and dist.get_world_size() > 1
        asynchronous = self.cfg.trainer.async_save
        final = self.checkpointer.root / f"step_{self.state.step}"
        if multi and not is_main_process():
            # Saving is collective (weights are gathered): write this rank's part into rank 0's folder.
            box: list = [None]
            dist.broadcast_object_list(box, src=0)
            if self.critic is not None:  # collective too, in rank 0's order: critic, then policy
                self.critic.save(Path(box[0]) / CRITIC_DIR)
            if asynchronous:
                self.policy.save(Path(box[0]), tokenizer=None, on_written=lambda: None)
            else:
                self.policy.save(Path(box[0]), tokenizer=None)
                dist.barrier()  # rank 0 publishes the folder (rename to step_N) before this returns
            return final

        step = self.state.step
        tmp = self.checkpointer.begin(step)
        try:
            if multi:
                dist.broadcast_object_list([str(tmp)], src=0)
            torch.save(rng_state(), tmp / "rng.pt")
            # The data position of the next batch to train on (an asynchronous producer has drawn more).
            async_position = self._loader_trained if self.async_rollout is not None else None
            self.state.loader = async_position or self.loader.state_dict()
            if isinstance(self.workflow, StatefulWorkflow):
                self.state.workflow = self.workflow.state_dict()
            if self.async_rollout is not None:
                in_flight = {
                    "rollouts": self.async_rollout.snapshot(),
                    "dropped_stale": self.async_rollout.dropped_stale,
                }
                torch.save(in_flight, tmp / ASYNC_IN_FLIGHT_FILE)
            (tmp / "trainer_state.json").write_text(json.dumps(asdict(self.state), indent=1))
            (tmp / "config.yaml").write_text(to_yaml(self.cfg))
            if self._warmup is not None:  # stopped part-way by a signal: resumable
                torch.save(self._warmup.state_dict(), tmp / SFT_WARMUP_FILE)
            if self.critic is not None:
                self.critic.save(tmp / CRITIC_DIR)
            if asynchronous:  # the policy's finalize step publishes the folder
                self.policy.save(
                    tmp, tokenizer=self.tokenizer, on_written=lambda: self.checkpointer.publish(tmp, step)
                )
                return final
            self.policy.save(tmp, tokenizer=self.tokenizer)
            folder = self.checkpointer.publish(tmp, step)  # removes tmp itself when it fails
        except BaseException as exc:
            full = storage_full(exc, self.checkpointer.root, step)  # before the cleanup frees space
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise full from None
            raise
        if multi:
            dist.barrier()
        return folder

    def finalize_checkpoints(self, *, blocking: bool) -> None:
        """Publish background (``trainer.async_save``) checkpoints whose writes are done. Collective."""
        if self.cfg.trainer.async_save:
            self.policy.finalize_saves(blocking=blocking)

    def load_checkpoint(self, folder: Path) -> None:
        """Load a checkpoint (``fit`` verifies it against its manifest first). A file that cannot
        be read raises :class:`CheckpointDamagedError` naming it, not torch's or json's error."""
        self._check_model_shape(folder)
        self.policy.load(folder)
        if self.critic is not None:
            self.critic.load(folder / CRITIC_DIR)
        self.state = read_checkpoint_file(
            folder, "trainer_state.json", lambda p: TrainerState(**json.loads(p.read_text()))
        )
        if self.state.step != checkpoint_step(folder):
            raise CheckpointError(f"{folder}: trainer_state.json says step {self.state.step}")
        self.loader.load_state_dict(self.state.loader)
        if isinstance(self.workflow, StatefulWorkflow):
            self.workflow.load_state_dict(self.state.workflow)
        read_checkpoint_file(folder, "rng.pt", lambda p: set_rng_state(torch.load(p, weights_only=False)))
        self._resumed_in_flight = None
        if (folder / ASYNC_IN_FLIGHT_FILE).is_file() and self.cfg.rollout.async_rollout:
            self._resumed_in_flight = read_checkpoint_file(
                folder, ASYNC_IN_FLIGHT_FILE, lambda p: torch.load(p, weights_only=False)
            )

    def _plan_resume(self) -> ResumePlan:
        """:func:`plan_resume` on rank 0, shared with every rank (all must load the same folder)."""
        root = self.output_dir / CHECKPOINT_DIR
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return plan_resume(self.cfg.trainer.resume, root)
        box: list = [None]
        if is_main_process():
            try:
                box[0] = plan_resume(self.cfg.trainer.resume, root)
            except CheckpointError as exc:
                box[0] = exc
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], CheckpointError):
            raise box[0]
        return box[0]

    def _check_model_shape(self, folder: Path) -> None:
        cfg_file = folder / "model" / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"{folder} is not a complete checkpoint (model/config.json missing)")
        saved = json.loads(cfg_file.read_text())
        current = self.policy.hf_config.to_dict()
        diff = [
            f"{k}: checkpoint {saved.get(k)} vs model {current.get(k)}"
            for k in _SHAPE_KEYS
            if saved.get(k) != current.get(k)
        ]
        if diff:
            raise CheckpointError(
                f"checkpoint {folder} was written for another model shape ({'; '.join(diff)})"
            )

    def _load_warmup_reference(self) -> str:
        """``algorithm.kl.reference=warmup``: the KL reference is the policy as the warm-up left it.
        Written once to ``<output_dir>/kl_reference`` (a resume reads it back: the policy has moved
        on by then); at step 0 the policy still holds the warm-up's weights, so a missing folder is
        written from it."""
        folder = self.output_dir / KL_REFERENCE_DIR
        if not (folder / "COMPLETE").is_file():
            if self.state.step > 0:
                raise CheckpointError(
                    f"algorithm.kl.reference=warmup: {folder} is missing, and the policy of step "
                    f"{self.state.step} is no longer the warmed-up one; start over (trainer.resume=never) "
                    "or set algorithm.kl.reference=initial"
                )
            tmp = folder.with_name(folder.name + ".tmp")
            if is_main_process():
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            if dist.is_initialized():
                dist.barrier()
            self.policy.save(tmp, tokenizer=None)
            if dist.is_initialized():
                dist.barrier()
            if is_main_process():
                (tmp / "optimizer.pt").unlink(missing_ok=True)  # the reference needs weights only
                (tmp / "COMPLETE").write_text("")
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
            if dist.is_initialized():
                dist.barrier()
        self.ref.load(folder)
        return f"KL reference: the warmed-up policy ({folder})"


#: Free space below which a failed save is put down to a full file system: torch's zip writer and
#: safetensors report ENOSPC as a RuntimeError with no errno ("unexpected pos ...").
NEARLY_FULL_BYTES = 64 * 2**20


def storage_full(exc: BaseException, root: Path, step: int) -> StorageFullError | None:
    """The one-line error for a save that failed on a full (or over-quota) file system, else None."""
    reason = storage_full_reason(exc)
    if reason is None:
        try:
            free = shutil.disk_usage(root).free
        except OSError:
            return None
        if free >= NEARLY_FULL_BYTES:
            return None
        reason = f"no space left on device ({free // 2**20} MiB free)"
    return StorageFullError(
        f"checkpoint step_{step} could not be written to {root}: {reason}. The checkpoints before it "
        "are intact and no partial folder is left; free space there (or lower trainer.keep_last) and "
        "rerun the same command to resume from the newest one"
    )


def read_checkpoint_file(folder: Path, name: str, read):
    """``read(folder / name)``, with any error turned into one line naming the file."""
    try:
        return read(folder / name)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.load / json raise many types for a damaged file
        text = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointDamagedError(
            f"checkpoint {folder}: {name} is unreadable ({type(exc).__name__}: {text})"
        ) from None
