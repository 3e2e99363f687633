"""Per-token log-probs of a megatron ``GPTModel`` with the project's vocab-parallel kernel.

Convention (as the ``hf`` backend): column ``t`` of the ``[B, T]`` result is
``log p(input_ids[t] | real tokens before t)``; column 0, padding columns and the first real token of
each row are 0.

Padding. The project's rows are ``[left-padded prompt | right-padded response]`` with
``position_ids`` counting real tokens from 0. Megatron's RoPE always uses positions ``0..S-1`` and
its causal mask, so each row's real tokens are first moved to the front (a stable per-row
permutation): they then sit at exactly their HF positions, and the trailing padding cannot be
attended by them under the causal mask. No padding mask is needed and the result is exact, not
just shift-invariant up to rounding. Output values are permuted back to the original columns.

Logits are never gathered: the final hidden states and this rank's shard of the output weight
(its real-vocabulary rows only, so megatron's zero padding rows never enter the softmax) go to
:func:`nemo_azr.kernels.linear_token_logprobs`, which all-reduces partial log-sum-exps over the
tensor-parallel group. With pipeline parallelism the forward runs through megatron's schedule
(forward only, no grad) and the result is broadcast from the last stage to every stage.

Micro-batches through the pipeline schedule are row groups of the compacted batch: consecutive
pieces of ``micro_batch_size`` rows, all of one shape (megatron's fixed p2p shape), or with
``max_tokens > 0`` token-budget groups (``models/training/microbatch.py``), each trimmed to its longest row;
micro-batches of different shapes turn on megatron's ``variable_seq_lengths`` (each send is
preceded by its shape).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nemo_azr.kernels import linear_token_logprobs
from nemo_azr.models.training.microbatch import row_groups

__all__ = [
    "VALUE_HEAD",
    "CompactBatch",
    "PipelineLossFn",
    "compact_rows",
    "megatron_token_logprobs",
    "megatron_token_values",
    "output_weight_shard",
    "unwrap_gpt_model",
    "value_head_outputs",
    "pad_columns",
    "pad_rows",
    "pipeline_micro_batches",
    "run_pipeline",
]


@dataclass
class CompactBatch:
    """Rows with their real tokens moved to the front; see :func:`compact_rows`."""

    input_ids: torch.Tensor  # [B, S]: real tokens first, then pad_id; S = longest row
    order: torch.Tensor  # [B, T]: original column of each compacted column
    targets: torch.Tensor  # [B, S-1] bool: compacted column j+1 has a prediction from column j
    width: int  # T, the original number of columns

    def position_ids(self) -> torch.Tensor:
        b, s = self.input_ids.shape
        return torch.arange(s, device=self.input_ids.device).expand(b, s)

    def restore(self, values: torch.Tensor) -> torch.Tensor:
        """``[N]`` values of the target positions -> ``[B, T]`` in the original columns (0 elsewhere)."""
        b, s = self.input_ids.shape
        compact = torch.zeros((b, s - 1), dtype=values.dtype, device=values.device)
        compact = torch.nn.functional.pad(compact.masked_scatter(self.targets, values), (1, 0))
        # Columns past the original width (sequence-parallel padding) hold no targets: crop them.
        compact = (
            torch.nn.functional.pad(compact, (0, self.width - s))
            if s < self.width
            else compact[:, : self.width]
        )
        return torch.zeros_like(compact).scatter(1, self.order, compact)


def compact_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    pad_id: int = 0,
    target_mask: torch.Tensor | None = None,
) -> CompactBatch:
    """Move each row's real tokens (``attention_mask`` 1) to the front, keeping their order.

    ``position_ids`` (if given) must count each row's real tokens from 0, which is what the model
    then uses; anything else raises ValueError. ``target_mask`` ``[B, T]`` (if given) keeps only the
    targets whose column is 1 in it (e.g. the response tokens): the output head and the log-prob
    kernel then run on those positions only, as the ``hf`` backend's do.
    """
    real = attention_mask.bool()
    order = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices
    lengths = real.sum(dim=1)
    width = max(int(lengths.max()), 1) if real.numel() else 1
    cols = torch.arange(input_ids.shape[1], device=input_ids.device)
    in_row = cols.unsqueeze(0) < lengths.unsqueeze(1)
    if position_ids is not None:
        pos = position_ids.gather(1, order)
        if not torch.equal(pos[in_row], cols.expand_as(pos)[in_row]):
            raise ValueError(
                "position_ids must count each row's real tokens from 0 (position_ids_from_mask): "
                "megatron's RoPE uses positions 0..n-1"
            )
    ids = input_ids.gather(1, order).masked_fill(~in_row, pad_id)[:, :width]
    targets = in_row[:, 1:width]
    if target_mask is not None:
        targets = targets & (target_mask.to(ids.device).gather(1, order)[:, 1:width] > 0)
    return CompactBatch(input_ids=ids, order=order, targets=targets, width=input_ids.shape[1])


def unwrap_gpt_model(model: torch.nn.Module) -> torch.nn.Module:
    """The ``GPTModel`` inside DDP / Float16Module wrappers. It is called directly: Float16Module would
    upcast the last stage's hidden states to fp32 while the output weight stays bf16/fp16 (DDP's
    gradient hooks sit on the parameters, so they still fire)."""
    while hasattr(model, "module"):
        model = model.module
    return model


@contextlib.contextmanager
def _hidden_states_output(model: torch.nn.Module) -> Iterator[None]:
    """Make ``GPTModel.forward`` return the final-normed hidden states ``[S, B, H]`` (no output layer).

    ``GPTModel._postprocess`` returns its input when ``post_process`` is False; the final layer norm
    belongs to the decoder and still runs.
    """
    saved = model.post_process
    model.post_process = False
    try:
        yield
    finally:
        model.post_process = saved


def output_weight_shard(model: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """This TP rank's output-weight rows of the real vocabulary, and the global id of the first."""
    from megatron.core import parallel_state as ps

    if model.share_embeddings_and_output_weights:
        weight = model.shared_embedding_or_output_weight()
    else:
        weight = model.output_layer.weight
    per_rank = weight.shape[0]
    start = ps.get_tensor_model_parallel_rank() * per_rank
    real = getattr(model, "real_vocab_size", per_rank * ps.get_tensor_model_parallel_world_size())
    return weight[: max(0, min(per_rank, real - start))], start


def _hidden_to_logprobs(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    batch: CompactBatch,
    temperature: float,
    chunk_size: int,
    backend: str,
    return_entropy: bool = False,
) -> torch.Tensor:
    """Log-probs ``[N]`` of the target positions of ``batch`` from hidden states ``[S, B, H]``; with
    ``return_entropy``, ``[2, N]``: the log-probs and the entropies of the (temperature-scaled)
    distributions that predict them (vocab-parallel, like the log-probs)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    reduce_hidden_grad = True
    if model.config.sequence_parallel:
        # The gather's backward reduce-scatters (sums) the per-shard hidden gradients itself.
        hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden)
        reduce_hidden_grad = False
    hidden = hidden[: batch.input_ids.shape[1]].transpose(0, 1)
    weight, start = output_weight_shard(model)
    group = ps.get_tensor_model_parallel_group() if ps.get_tensor_model_parallel_world_size() > 1 else None
    out = linear_token_logprobs(
        hidden[:, :-1][batch.targets],
        weight,
        batch.input_ids[:, 1:][batch.targets],
        temperature=temperature,
        backend=backend,
        chunk_size=chunk_size,
        return_entropy=return_entropy,
        process_group=group,
        vocab_start=start,
        reduce_hidden_grad=reduce_hidden_grad,
    )
    return torch.stack(out) if return_entropy else out


#: ``head(model, hidden, batch) -> values``: what the last stage computes from its final hidden states
#: ``[S, B, H]`` for the target positions of ``batch``: ``[N]`` or ``[k, N]`` (k values per position).
#: None everywhere below means the log-prob head (:func:`_hidden_to_logprobs`).
HeadFn = Callable[[torch.nn.Module, torch.Tensor, CompactBatch], torch.Tensor]

#: Attribute of the last stage's ``GPTModel`` that holds a critic's value head (``[H] -> [roles]``).
VALUE_HEAD = "value_head"


def value_head_outputs(model: torch.nn.Module, hidden: torch.Tensor, batch: CompactBatch) -> torch.Tensor:
    """A critic's values ``[roles, N]`` (float32) at the positions that predict the targets of ``batch``.

    The head is replicated over the tensor-parallel ranks (every rank holds the full hidden states
    after the decoder), so each rank computes the same values and the same gradients: no reduction.
    With sequence parallelism the hidden states are gathered with a split (not a reduce-scatter) as
    backward, since every rank's gradient is already the full one.
    """
    from megatron.core import tensor_parallel

    if model.config.sequence_parallel:
        hidden = tensor_parallel.gather_from_sequence_parallel_region(
            hidden, tensor_parallel_output_grad=False
        )
    hidden = hidden[: batch.input_ids.shape[1]].transpose(0, 1)
    head = getattr(model, VALUE_HEAD)
    return head(hidden[:, :-1][batch.targets]).float().t()


def pad_columns(batch: CompactBatch, multiple: int) -> CompactBatch:
    """Right-pad the compacted columns so sequence parallelism can split them evenly."""
    extra = -batch.input_ids.shape[1] % multiple
    if not extra:
        return batch
    ids = torch.nn.functional.pad(batch.input_ids, (0, extra))
    targets = torch.nn.functional.pad(batch.targets, (0, extra))
    return CompactBatch(input_ids=ids, order=batch.order, targets=targets, width=batch.width)


def _forward_stage_local(
    model: torch.nn.Module,
    batch: CompactBatch,
    temperature: float,
    chunk_size: int,
    backend: str,
    return_entropy: bool = False,
    head: HeadFn | None = None,
) -> torch.Tensor:
    with _hidden_states_output(model):
        hidden = model(batch.input_ids, batch.position_ids(), None)
    if head is not None:
        return head(model, hidden, batch)
    return _hidden_to_logprobs(model, hidden, batch, temperature, chunk_size, backend, return_entropy)


#: ``loss_fn(index, micro, values)`` of :func:`run_pipeline`: micro-batch ``index`` of the compacted
#: batch and the log-probs ``[N]`` of its target positions (``[2, N]`` log-probs and entropies with
#: ``return_entropy``) -> (scalar loss, metrics dict).
PipelineLossFn = Callable[[int, CompactBatch, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]


def pad_rows(batch: CompactBatch, multiple: int) -> CompactBatch:
    """Append empty rows (no real tokens, no targets) up to a multiple of ``multiple`` rows: the
    pipeline schedule sends tensors of one fixed ``[S, micro_batch_size, H]`` shape."""
    extra = -batch.input_ids.shape[0] % multiple
    if not extra:
        return batch
    return CompactBatch(
        input_ids=torch.nn.functional.pad(batch.input_ids, (0, 0, 0, extra)),
        order=torch.cat([batch.order, batch.order[:1].expand(extra, -1)]),
        targets=torch.nn.functional.pad(batch.targets, (0, 0, 0, extra)),
        width=batch.width,
    )


def take_rows(batch: CompactBatch, rows: torch.Tensor, *, trim: bool, multiple: int = 1) -> CompactBatch:
    """Rows ``rows`` of ``batch``; with ``trim`` only the columns up to their last target (the
    longest row when every real token is a target), right-padded to a multiple of ``multiple``
    (sequence parallelism splits the columns evenly)."""
    ids, targets = batch.input_ids[rows], batch.targets[rows]
    if trim:  # up to the last target of any row: the columns after it change no wanted value
        wanted = targets.any(dim=0).nonzero()
        width = int(wanted.max()) + 2 if len(wanted) else 1
        ids, targets = ids[:, :width], targets[:, : width - 1]
    return pad_columns(CompactBatch(ids, batch.order[rows], targets, batch.width), multiple)


def pipeline_micro_batches(
    batch: CompactBatch, groups: list[list[int]], *, trim: bool, multiple: int = 1
) -> list[CompactBatch]:
    """The micro-batches of ``batch`` for :func:`run_pipeline`, one per row group: each trimmed to
    its own width (``trim``: token-budget groups, so the shapes vary), or all of the first group's
    shape (fixed row counts: every micro-batch padded to its rows, one p2p shape)."""
    micros = [take_rows(batch, torch.as_tensor(g), trim=trim, multiple=multiple) for g in groups]
    return micros if trim else [pad_rows(m, len(groups[0])) for m in micros]


def _filler_count(count: int, chunks: int) -> int:
    """Zero-weight micro-batches to append: megatron's interleaved schedule needs a multiple of
    ``pp`` micro-batches, which token-budget groups need not be."""
    from megatron.core import parallel_state as ps

    pp = ps.get_pipeline_model_parallel_world_size()
    return -count % pp if chunks > 1 else 0


@contextlib.contextmanager
def _variable_shapes(chunks: list[torch.nn.Module], on: bool) -> Iterator[None]:
    """megatron's ``variable_seq_lengths`` while ``on``: every p2p send is preceded by its shape
    ``[s, b, h]``, so micro-batches may differ in rows and in columns (an extra small exchange)."""
    from megatron.core.utils import get_model_config

    config = get_model_config(chunks[0])
    saved = config.variable_seq_lengths
    config.variable_seq_lengths = saved or on
    try:
        yield
    finally:
        config.variable_seq_lengths = saved


def run_pipeline(
    chunks: list[torch.nn.Module],
    micros: list[CompactBatch],
    loss_fn: PipelineLossFn,
    *,
    forward_only: bool,
    temperature: float,
    chunk_size: int,
    backend: str,
    return_entropy: bool = False,
    head: HeadFn | None = None,
) -> list[dict[str, Any]]:
    """``micros`` (:func:`pipeline_micro_batches`; every stage the same list) through megatron's
    pipeline schedule (1F1B, or interleaved with virtual stages); with ``forward_only=False``
    gradients accumulate in the parameters.

    The last stage applies ``head`` (default: the log-prob head) and ``loss_fn``. Returns the
    metrics dicts of ``loss_fn`` on the last pipeline stage (an empty list on the other stages).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    count = len(micros)
    # Fillers (interleaved schedule): the smallest micro-batch's first row again, with a zero loss.
    smallest = min(micros, key=lambda m: m.input_ids.numel())
    micros = micros + [take_rows(smallest, torch.tensor([0]), trim=False)] * _filler_count(count, len(chunks))
    position = iter(range(len(micros)))
    data = iter(micros)
    if len(chunks) > 1:  # interleaved schedule: one iterator per chunk over the same micro-batches
        data = [iter(micros) for _ in chunks]

    def forward_step(data_iterator, chunk):
        micro = next(data_iterator)
        stage = unwrap_gpt_model(chunk)
        with _hidden_states_output(stage):
            hidden = stage(micro.input_ids, micro.position_ids(), None)

        def loss_func(output: torch.Tensor):
            if head is not None:
                values = head(stage, output, micro)
            else:
                values = _hidden_to_logprobs(
                    stage, output, micro, temperature, chunk_size, backend, return_entropy
                )
            index = next(position)
            if index >= count:  # a filler: no loss, no gradient
                return values.sum() * 0.0, torch.ones((), dtype=torch.int), {}
            loss, metrics = loss_fn(index, micro, values)
            # Three outputs + config.calculate_per_token_loss: the loss is used as given.
            return loss, torch.ones((), dtype=torch.int), metrics

        return hidden, loss_func

    rows, columns = micros[0].input_ids.shape
    with _variable_shapes(chunks, len({m.input_ids.shape for m in micros}) > 1):
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=data,
            model=chunks,
            num_microbatches=len(micros),
            seq_length=columns,  # the shapes megatron sends unless variable_seq_lengths
            micro_batch_size=rows,
            forward_only=forward_only,
        )
    return outputs[:count]  # the last stage's, in micro-batch order: the fillers come last


@torch.no_grad()
def _forward_pipelined(
    chunks: list[torch.nn.Module],
    batch: CompactBatch,
    temperature: float,
    chunk_size: int,
    backend: str,
    groups: list[list[int]],
    trim: bool,
    head: HeadFn | None = None,
    width: int = 1,
) -> torch.Tensor:
    """Forward-only pipeline schedule over the row ``groups`` of ``batch`` (``trim``: each to its
    own width, see :func:`pipeline_micro_batches`); ``[N]`` log-probs (or ``[width, N]`` values of
    ``head``) of the target positions on every stage."""
    from megatron.core import parallel_state as ps

    multiple = (
        ps.get_tensor_model_parallel_world_size()
        if unwrap_gpt_model(chunks[0]).config.sequence_parallel
        else 1
    )
    micros = pipeline_micro_batches(batch, groups, trim=trim, multiple=multiple)

    def keep_logprobs(_index: int, micro: CompactBatch, values: torch.Tensor):
        values = values.float().reshape(width, -1)
        dense = torch.zeros((width, *micro.targets.shape), dtype=torch.float32, device=values.device)
        dense = torch.stack([d.masked_scatter(micro.targets, v) for d, v in zip(dense, values)])
        return values.new_zeros(()), {"logprobs": dense}

    outputs = run_pipeline(
        chunks,
        micros,
        keep_logprobs,
        forward_only=True,
        temperature=temperature,
        chunk_size=chunk_size,
        backend=backend,
        head=head,
    )
    result = torch.zeros((width, *batch.targets.shape), dtype=torch.float32, device=batch.input_ids.device)
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        for group, out in zip(groups, outputs):  # each micro-batch's rows and (trimmed) columns
            dense = out["logprobs"][:, : len(group), : result.shape[-1]]
            result[:, torch.as_tensor(group), : dense.shape[-1]] = dense
    dist.broadcast(
        result, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
    )
    picked = torch.stack([r[batch.targets] for r in result])
    return picked[0] if head is None else picked


def _compact_input(
    model: torch.nn.Module | list[torch.nn.Module],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    target_mask: torch.Tensor | None = None,
) -> tuple[list[torch.nn.Module], torch.nn.Module, CompactBatch]:
    """(the chunks, the first unwrapped stage, the compacted rows on its device, padded for
    sequence parallelism)."""
    from megatron.core import parallel_state as ps

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    first = unwrap_gpt_model(chunks[0])
    device = next(first.parameters()).device
    batch = compact_rows(
        input_ids.to(device),
        attention_mask.to(device),
        None if position_ids is None else position_ids.to(device),
        target_mask=target_mask,
    )
    if first.config.sequence_parallel:
        batch = pad_columns(batch, ps.get_tensor_model_parallel_world_size())
    return chunks, first, batch


def _row_groups(
    attention_mask: torch.Tensor, micro_batch_size: int | None, max_tokens: int
) -> list[list[int]]:
    """Row indices of the pipelined micro-batches (default: the whole batch in one)."""
    lengths = attention_mask.sum(dim=1).tolist()
    return row_groups(lengths, rows=micro_batch_size or len(lengths), max_tokens=max_tokens)


def megatron_token_logprobs(
    model: torch.nn.Module | list[torch.nn.Module],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    backend: str = "auto",
    micro_batch_size: int | None = None,
    max_tokens: int = 0,
    return_entropy: bool = False,
    target_mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """float32 ``logprobs[B, T]`` of ``input_ids`` under this rank's megatron model (see module doc);
    with ``return_entropy`` also the entropies ``[B, T]`` in the same columns (one stage only: the
    pipelined training path gets them through :func:`run_pipeline`).

    Every rank of the tensor/pipeline group must call it with the same batch. Without pipeline
    parallelism the result is differentiable; with it the forward runs in ``micro_batch_size``-row
    micro-batches (default: the whole batch), or token-budget ones of at most ``max_tokens``
    (rows x width, when > 0), through megatron's schedule, without gradients.
    ``target_mask`` ``[B, T]``: compute only the columns where it is 1 (the others are 0).
    """
    from megatron.core import parallel_state as ps

    chunks, first, batch = _compact_input(model, input_ids, attention_mask, position_ids, target_mask)
    width = input_ids.shape[1]
    if ps.get_pipeline_model_parallel_world_size() == 1 and len(chunks) == 1:
        values = _forward_stage_local(first, batch, temperature, chunk_size, backend, return_entropy)
        if return_entropy:
            return batch.restore(values[0])[:, :width], batch.restore(values[1])[:, :width]
    elif return_entropy:
        raise ValueError("megatron_token_logprobs: return_entropy needs one pipeline stage")
    else:
        groups = _row_groups(attention_mask, micro_batch_size, max_tokens)
        values = _forward_pipelined(chunks, batch, temperature, chunk_size, backend, groups, max_tokens > 0)
    return batch.restore(values)[:, :width]


def megatron_token_values(
    model: torch.nn.Module | list[torch.nn.Module],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    num_heads: int = 1,
    micro_batch_size: int | None = None,
    max_tokens: int = 0,
) -> torch.Tensor:
    """float32 ``values[num_heads, B, T]`` of a critic's value head (``GPTModel.value_head`` on the
    last stage): column ``t`` is the head at the position that predicts token ``t``, aligned like
    :func:`megatron_token_logprobs` (0 at column 0 and on padding). Differentiable without pipeline
    parallelism; with it a no-grad forward (micro-batched like :func:`megatron_token_logprobs`)
    whose result every stage receives."""
    from megatron.core import parallel_state as ps

    chunks, first, batch = _compact_input(model, input_ids, attention_mask, position_ids)
    width = input_ids.shape[1]
    if ps.get_pipeline_model_parallel_world_size() == 1 and len(chunks) == 1:
        values = _forward_stage_local(first, batch, 1.0, 1, "torch", head=value_head_outputs)
    else:
        groups = _row_groups(attention_mask, micro_batch_size, max_tokens)
        values = _forward_pipelined(
            chunks, batch, 1.0, 1, "torch", groups, max_tokens > 0, head=value_head_outputs, width=num_heads
        )
    return torch.stack([batch.restore(v)[:, :width] for v in values.reshape(num_heads, -1)])
