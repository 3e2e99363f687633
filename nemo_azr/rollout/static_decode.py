"""The hf backend's fast decode path: a pre-allocated KV cache and, on CUDA, the one-token step in a CUDA graph.

The dynamic path (``hf_backend``) grows a ``DynamicCache`` by concatenation, builds a fresh attention
mask and syncs with the host on every token; a small model at a large batch is then bound by kernel
launches and Python, not by memory bandwidth. Here every tensor the step touches lives at a fixed
address: transformers' ``StaticCache`` holds keys and values for ``max_cache_len`` positions, the
attention mask is a ``[B, 1, 1, L]`` buffer whose columns are switched on as tokens are fed, and the
step (forward, sampling, bookkeeping) is recorded once per shape as a CUDA graph and replayed per
token. The host looks at the results only every ``sync_every`` tokens (all rows done? stop strings?).

Why by hand: transformers' ``generate(cache_implementation="static")`` + ``torch.compile`` captures
graphs too, but returns no per-token log-probs of the tempered policy without keeping ``[B, T, V]``
scores, and compiling costs minutes per shape; a plain ``torch.cuda.CUDAGraph`` around the eager step
needs neither.

The prompts are encoded by the dynamic path (each distinct prompt once) and their keys and values
copied into the static cache, so the first token is the dynamic path's first token exactly.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.cache_utils import StaticCache, StaticLayer

from nemo_azr.contracts.generation import SamplingParams

log = logging.getLogger(__name__)

#: Cache lengths are rounded up to this, so prompts of nearby widths reuse one captured graph.
CACHE_LEN_STEP = 64
#: Smallest batch bucket; buckets are powers of two from here.
MIN_BUCKET = 8
#: Captured shapes kept alive at once (each holds a KV cache of bucket x cache length).
MAX_GRAPHS = 2

DECODE_MODES = ("auto", "dynamic", "static")
#: The attention the decode step runs under (registered with transformers below).
DECODE_ATTENTION = "nemo_azr_gqa_decode"


def gqa_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of a few new query tokens against a static cache, grouped-query heads read in place.

    Why by hand: with a mask (a left-padded static cache always has one) transformers' sdpa path first
    copies every key/value head once per query head it serves (``repeat_kv``): at decode, with one
    query per row, those copies move several times the bytes the attention itself reads (on an H200,
    SmolLM2 shape, 512 rows: 31% of the eager step's GPU time in one copy kernel, 21% in cuDNN's
    attention; this function made the graph-replayed step 2.6x faster, results/decode_gpu.md). Here
    the query heads of one KV head are stacked as rows of one matmul against that head's keys (read
    once, in the cache's dtype); scores and softmax are float32. ``query [B, H, q, d]``, ``key/value [B, Hkv, L,
    d]``, ``attention_mask [B, 1, q, L]`` (bool: visible, or additive); returns ``[B, q, H, d]``.
    """
    del module, dropout, kwargs  # inference only
    b, h, q, d = query.shape
    kv_heads = key.shape[1]
    groups = h // kv_heads
    scale = d**-0.5 if scaling is None else scaling
    rows = (query * scale).reshape(b, kv_heads, groups * q, d)  # row j * q + i: head group j, token i
    scores = torch.matmul(rows, key.transpose(-1, -2)).float()  # [B, Hkv, groups * q, L]
    if attention_mask is not None:
        mask = attention_mask if q == 1 else attention_mask.repeat(1, 1, groups, 1)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    out = torch.matmul(scores.softmax(-1).to(value.dtype), value)  # [B, Hkv, groups * q, d]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, gqa_decode_attention)


def batch_bucket(rows: int) -> int:
    """The captured batch size for ``rows`` rows: the next power of two, at least ``MIN_BUCKET``."""
    bucket = MIN_BUCKET
    while bucket < rows:
        bucket *= 2
    return bucket


def cache_length(prompt_width: int, max_new_tokens: int) -> int:
    """Positions the static cache holds: prompt + new tokens, rounded up to ``CACHE_LEN_STEP``."""
    need = prompt_width + max_new_tokens
    return -(-need // CACHE_LEN_STEP) * CACHE_LEN_STEP


def static_decode_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot use the static path (``None`` when it can)."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        return f"attention implementation {impl!r} (static decoding needs 'sdpa' or 'eager')"
    probe = StaticCache(config=model.config, max_cache_len=CACHE_LEN_STEP)
    if not all(type(layer) is StaticLayer for layer in probe.layers):
        return "its cache has sliding-window or other non-full-attention layers"
    return None


@dataclass(frozen=True)
class _ShapeKey:
    bucket: int
    cache_len: int
    greedy: bool
    temperature: float
    top_k: int
    top_p: float


class _StepBuffers:
    """The step buffers every static decoder's captured step reads and writes (not its cache)."""

    def __init__(self, b: int, dev: torch.device) -> None:
        self.tok = torch.zeros((b, 1), dtype=torch.long, device=dev)  # the token fed next
        self.pos = torch.zeros((b, 1), dtype=torch.long, device=dev)  # its position id per row
        self.t = torch.zeros((1,), dtype=torch.long, device=dev)  # the output column it samples into
        self.done = torch.zeros((b,), dtype=torch.bool, device=dev)
        self.tokens: torch.Tensor | None = None
        self.logps: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None


class _DecodeState(_StepBuffers):
    """The fixed-address buffers one captured step of the hf model reads and writes."""

    def __init__(self, model: torch.nn.Module, key: _ShapeKey, vocab_device: torch.device) -> None:
        b, length = key.bucket, key.cache_len
        dev = vocab_device
        super().__init__(b, dev)
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        bool_mask = model.config._attn_implementation == "sdpa"
        self.mask_dtype = torch.bool if bool_mask else next(model.parameters()).dtype
        self.hidden_value = False if bool_mask else torch.finfo(self.mask_dtype).min
        self.visible_value = True if bool_mask else 0.0
        self.mask = torch.full((b, 1, 1, length), self.hidden_value, dtype=self.mask_dtype, device=dev)
        self.cur = torch.zeros((1,), dtype=torch.long, device=dev)  # the fed token's cache column


class StaticDecoder:
    """Decodes batches of left-padded prompts with a static KV cache (CUDA graphs on CUDA)."""

    def __init__(
        self,
        model: torch.nn.Module,
        cache_kw: str,
        sample: Callable[[torch.Tensor, SamplingParams], tuple[torch.Tensor, torch.Tensor]],
        *,
        cuda_graphs: bool = True,
        grouped_attention: bool = False,
        sync_every: int = 16,
    ) -> None:
        self._init_loop(model, sample, cuda_graphs, sync_every)
        self.decoder = getattr(model, model.base_model_prefix)
        self.head = model.get_output_embeddings()
        self.cache_kw = cache_kw
        # The step's attention: the model's own (sdpa/eager) or gqa_decode_attention (keys/values read
        # once per KV head; 2.6x the model's own in the graph on an H200: results/decode_gpu.md)
        self.grouped_attention = grouped_attention

    def _init_loop(self, model: torch.nn.Module, sample, cuda_graphs: bool, sync_every: int) -> None:
        """What the loop, the shape buckets and the graph recording keep (every static decoder)."""
        self.model = model
        self.sample = sample
        self.cuda_graphs = cuda_graphs
        self.sync_every = max(1, sync_every)
        self._states: OrderedDict[_ShapeKey, _StepBuffers] = OrderedDict()
        self.graphs_captured = 0  # for tests and benchmarks: how many shapes were recorded

    # --- the step --------------------------------------------------------------------------------
    def _step(self, st: _DecodeState, sp: SamplingParams, eos_id: int, pad_id: int) -> None:
        """Feed ``st.tok`` at cache column ``st.cur``, sample the next token into column ``st.t``."""
        st.mask.index_fill_(-1, st.cur, st.visible_value)
        config = self.model.config
        prompt_attention = config._attn_implementation
        if self.grouped_attention:  # the step only; prompts are encoded with sdpa/eager
            config._attn_implementation = DECODE_ATTENTION
        try:
            out = self.decoder(
                input_ids=st.tok,
                attention_mask=st.mask,
                position_ids=st.pos,
                use_cache=True,
                **{self.cache_kw: st.cache},
            )
        finally:
            config._attn_implementation = prompt_attention
        logits = self.head(out.last_hidden_state[:, -1].contiguous()).float()
        self._sample_into(st, logits, sp, eos_id, pad_id)
        st.cur.add_(1)

    def _sample_into(self, st, logits: torch.Tensor, sp: SamplingParams, eos_id: int, pad_id: int) -> None:
        """Sample the next token of every row from ``logits [B, V]`` into output column ``st.t`` (pad
        after a row's eos), feed it next, and advance ``st.pos`` and ``st.t``."""
        tok, logp = self.sample(logits, sp)
        tok = tok.masked_fill(st.done, pad_id)
        st.tokens.index_copy_(1, st.t, tok[:, None])
        st.logps.index_copy_(1, st.t, logp.masked_fill(st.done, 0.0)[:, None])
        st.done |= tok == eos_id
        st.tok.copy_(tok[:, None])
        st.pos.add_(1)
        st.t.add_(1)

    def _state_for(self, key: _ShapeKey, device: torch.device) -> _DecodeState:
        st = self._states.pop(key, None)
        if st is None:
            while len(self._states) >= MAX_GRAPHS:
                self._states.popitem(last=False)  # oldest shape: its cache and graph are freed
            st = self._new_state(key, device)
        self._states[key] = st  # most recently used last
        return st

    def _new_state(self, key: _ShapeKey, device: torch.device) -> _StepBuffers:
        """The buffers of a new captured shape (a subclass with another cache overrides this)."""
        return _DecodeState(self.model, key, device)

    def release(self) -> None:
        """Drop every cache and captured graph (weights stay)."""
        self._states.clear()

    # --- one batch -------------------------------------------------------------------------------
    def decode(
        self,
        logits: torch.Tensor,
        past,
        attn: torch.Tensor,
        next_pos: torch.Tensor,
        sp: SamplingParams,
        *,
        eos_id: int,
        pad_id: int,
        stop_rows: Callable[[torch.Tensor, torch.Tensor], list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Sample ``sp.max_new_tokens`` tokens after an encoded batch.

        ``logits [B, V]`` and ``past`` (a ``DynamicCache`` over ``attn [B, W]``) come from the prompt
        encoding; ``next_pos [B, 1]`` is each row's next position id. Returns ``tokens [B, T]`` (pad
        after a row's eos), their log-probs and the number of columns produced. ``stop_rows(tokens,
        done)`` is asked at every host sync for rows to end (stop strings).
        """
        b, width = attn.shape
        steps = sp.max_new_tokens
        key = _ShapeKey(
            batch_bucket(b), cache_length(width, steps), sp.greedy, sp.temperature, sp.top_k, sp.top_p
        )
        st = self._state_for(key, attn.device)
        self._load_prompt(st, past, attn, next_pos, b, width)
        if st.tokens is None or st.tokens.shape[1] < steps:
            st.graph = None  # the output buffers the graph wrote into are gone
            st.tokens = torch.full((key.bucket, steps), pad_id, dtype=torch.long, device=attn.device)
            st.logps = torch.zeros((key.bucket, steps), dtype=torch.float32, device=attn.device)
        else:
            st.tokens.fill_(pad_id)
            st.logps.zero_()

        # token 0 from the prompt's logits, as the dynamic path does
        first, first_logp = self.sample(logits, sp)
        st.done.zero_()
        st.tokens[:b, 0] = first
        st.logps[:b, 0] = first_logp
        st.done[:b] = first == eos_id
        st.done[b:] = True  # bucket padding rows never count
        st.tok[:b, 0] = first
        st.t.fill_(1)

        produced = 1
        while produced < steps:
            self._advance(st, sp, eos_id, pad_id)
            produced += 1
            if produced % self.sync_every == 0 or produced == steps:
                if stop_rows is not None:
                    ended = stop_rows(st.tokens[:b, :produced], st.done[:b])
                    if ended:
                        st.done[torch.tensor(ended, device=st.done.device)] = True
                if bool(st.done.all()):
                    break
        return st.tokens[:b, :steps], st.logps[:b, :steps], produced

    def _load_prompt(self, st: _DecodeState, past, attn, next_pos, b: int, width: int) -> None:
        """Copy the encoded prompts' keys/values into the static cache; reset the step buffers."""
        for layer_static, layer_dyn in zip(st.cache.layers, past.layers, strict=True):
            k, v = layer_dyn.keys, layer_dyn.values
            if not layer_static.is_initialized:
                pad_k = k.new_zeros((st.tok.shape[0], *k.shape[1:]))
                pad_v = v.new_zeros((st.tok.shape[0], *v.shape[1:]))
                layer_static.lazy_initialization(pad_k, pad_v)
            layer_static.keys[:b, :, :width].copy_(k)
            layer_static.values[:b, :, :width].copy_(v)
            layer_static.cumulative_length.fill_(width)
        st.mask.fill_(st.hidden_value)
        visible = attn.bool()[:, None, None, :]
        st.mask[:b, :, :, :width].masked_fill_(visible, st.visible_value)
        st.mask[b:, :, :, 0] = st.visible_value  # padding rows see one column: no all-masked softmax
        st.pos.zero_()
        st.pos[:b] = next_pos
        st.tok.zero_()
        st.cur.fill_(width)

    def _advance(self, st: _DecodeState, sp: SamplingParams, eos_id: int, pad_id: int) -> None:
        """One decode step: replayed from the CUDA graph, recorded on first use of a shape."""
        use_graph = self.cuda_graphs and st.tok.is_cuda
        if not use_graph:
            self._step(st, sp, eos_id, pad_id)
            return
        if st.graph is None:
            # The first step of a shape runs eagerly on a side stream (library warm-up: cuBLAS
            # workspaces, lazy inits cannot be captured), then the same step is recorded; recording
            # executes nothing, so the following replay is the next real step.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(st, sp, eos_id, pad_id)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self._step(st, sp, eos_id, pad_id)
            except RuntimeError as exc:  # an op that cannot be recorded: this model decodes eagerly
                # the warm-up above already made this call's step: no second one
                log.warning("static decode: CUDA graph recording failed (%s); stepping eagerly", exc)
                self.cuda_graphs = False
                return
            st.graph = graph
            self.graphs_captured += 1
            return
        st.graph.replay()


__all__ = [
    "DECODE_MODES",
    "StaticDecoder",
    "batch_bucket",
    "cache_length",
    "static_decode_unsupported",
]
