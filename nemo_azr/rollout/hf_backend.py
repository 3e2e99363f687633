"""``hf`` generation backend: batched sampling with a transformers causal LM and a KV cache.

Written as a small decode loop instead of ``model.generate`` because RL needs the log-prob of each
sampled token under the temperature-scaled policy; ``generate(output_logits=True)`` would keep a
``[B, steps, V]`` tensor (hundreds of MB at a 150k vocabulary) just to read one column per step.
"""

from __future__ import annotations

import copy

import torch

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, Sample, SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.training.shared_prefix import cache_keyword, common_start, distinct_rows, own_columns
from nemo_azr.registry import GENERATION_BACKENDS
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.rollout.static_decode import DECODE_MODES, StaticDecoder, static_decode_unsupported
from nemo_azr.utils.precision import resolve_low_precision


def _sample(
    logits: torch.Tensor, sp: SamplingParams, u: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from logits[B, V] and its log-prob under the temperature-scaled policy;
    ``u`` ``[B, 1]`` in (0, 1]: the rows' uniforms (drawn here when not given)."""
    if sp.greedy:
        all_logp = logits.log_softmax(-1)
        tok = logits.argmax(-1)
    else:
        all_logp = (logits if sp.temperature == 1.0 else logits / sp.temperature).log_softmax(-1)
        if sp.top_k > 0 or sp.top_p < 1.0:
            probs = _filter_logits(all_logp, sp.top_k, sp.top_p).softmax(-1)
        else:
            probs = all_logp.exp()
        tok = _inverse_cdf_sample(probs, u)
    return tok, all_logp.gather(-1, tok[:, None])[:, 0]


def _uniforms(rows: int, device: torch.device) -> torch.Tensor:
    """``[rows, 1]`` uniforms in (0, 1], one per row: what :func:`_inverse_cdf_sample` draws."""
    return 1.0 - torch.rand((rows, 1), device=device, dtype=torch.float32)


def _inverse_cdf_sample(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """Sample index per row of probs[B, V] with one uniform per row (cumsum + searchsorted).

    ``torch.multinomial`` draws an exponential variate per vocabulary entry, which dominated
    generation time at a 150k vocabulary. ``u`` lies in (0, 1], so the left-side search never
    lands on a zero-probability entry.
    """
    cdf = probs.cumsum(-1)
    u = (_uniforms(probs.shape[0], probs.device) if u is None else u).to(cdf.dtype)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], side="left")[:, 0]
    return idx.clamp(max=probs.shape[-1] - 1)


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits[B, V] outside the top-k / nucleus set with -inf (sampling only)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before it already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


#: What one scoring forward (``continuation_logprobs``) may hold in copied KV cache and logits when
#: ``generation.max_batch_size`` is 0: large enough that a step's candidates of a 135M model go in a
#: few forwards, small enough for a 2-core, 24 GiB machine.
SCORING_BUDGET_BYTES = 2 * 1024**3

#: What one ``generate`` call may hold in KV cache and per-token logits when
#: ``generation.max_batch_size`` is 0 (on CUDA, at least half the device's free memory): a
#: six-proposals-a-goal self-play eval, every solver episode in one call, took 16.5 GB of a 24 GiB
#: machine; a training step's rows stay in one call.
GENERATION_BUDGET_BYTES = 4 * 1024**3


@GENERATION_BACKENDS.register("hf")
class HFGenerationBackend(GenerationEngineBase):
    """Owns its own copy of the model (like a separate inference engine); ``sync_weights`` refreshes it."""

    # the dynamic loop drops ended rows once they are this share of the rows it decodes (above 1: never)
    prune_ended_share: float = 0.25

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        max_batch_size: int = 0,
        dtype: torch.dtype | None = None,
        decode: str = "auto",
        cuda_graphs: bool = True,
        grouped_attention: bool | None = None,
    ) -> None:
        super().__init__()
        # Its own copy, optionally in another dtype (``generation.dtype``): bf16 decodes about twice as
        # fast on CPUs with AMX; ``sync_weights`` casts the policy's weights into it.
        self.model = copy.deepcopy(model).eval()
        if dtype is not None:
            self.model.to(dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.max_batch_size = max_batch_size
        self._cache_kw = cache_keyword(getattr(self.model, self.model.base_model_prefix))
        # generation.decode: static (pre-allocated cache, CUDA graphs on CUDA), dynamic, or auto
        # (static on CUDA). A model the static path cannot serve is refused when asked for by name.
        if decode not in DECODE_MODES:
            raise ConfigError(f"generation.decode={decode!r}: expected one of {', '.join(DECODE_MODES)}")
        why_not = static_decode_unsupported(self.model) if decode != "dynamic" else None
        if decode == "static" and why_not:
            raise ConfigError(
                f"generation.decode=static cannot decode this model: {why_not}; use decode=dynamic"
            )
        self.decode = "dynamic" if why_not else decode
        self.cuda_graphs = cuda_graphs
        # generation.decode_attention: None (auto) = grouped on CUDA, where it measured 2.6x the model's
        # own attention inside the graph (results/decode_gpu.md); the model's own on the CPU
        self.grouped_attention = grouped_attention
        self._static: StaticDecoder | None = None

    # --- capabilities ---------------------------------------------------------------------------
    @torch.no_grad()
    def sync_weights(self, policy) -> None:
        """Copy the trainable policy's weights in place and bump ``version``.

        A policy whose training model is not a transformers model (e.g. Megatron shards) exposes
        ``export_hf_state_dict()``: the refit gathers its weights into HF layout first.
        """
        state = policy.state_dict() if isinstance(policy, torch.nn.Module) else policy.export_hf_state_dict()
        self.model.load_state_dict(state)
        self.version += 1

    def release(self) -> None:
        """Free the static decode path's caches and captured graphs (rebuilt on the next call)."""
        if self._static is not None:
            self._static.release()

    def flush_cache(self) -> None:
        """The KV cache lives only inside one ``generate`` call."""

    # --- generation -----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        rows = self.max_batch_size
        if not rows and requests:
            rows = self.generation_rows_per_chunk(
                max(len(r.prompt_ids) for r in requests), sampling.max_new_tokens
            )
        return self.generate_in_chunks(requests, sampling, self._generate_chunk, rows)

    @torch.inference_mode()
    def continuation_logprobs(
        self,
        prompts: list[list[int]],
        continuations: list[list[list[int]]],
        *,
        temperature: float = 1.0,
    ) -> list[list[list[float]]]:
        """Log-probs of each prompt's given continuations (``contracts.ScoresContinuations``).

        Each distinct prompt is encoded once (``_encode_prompts``); its KV cache is copied to its
        continuations, which run right-padded in one more forward: the few candidate tokens of an
        RLCR confidence cost little next to its long context.
        """
        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuation lists")
        rows = [(i, list(c)) for i, cs in enumerate(continuations) for c in cs]
        if any(not c for _, c in rows):
            raise ValueError("continuation_logprobs: every continuation needs at least one token")
        scored: list[list[float]] = []
        step = self.max_batch_size or self.scoring_rows_per_chunk(
            max(len(p) for p in prompts), max(len(c) for _, c in rows)
        )
        for start in range(0, len(rows), step):
            chunk = rows[start : start + step]
            scored.extend(
                self._score_chunk([prompts[i] for i, _ in chunk], [c for _, c in chunk], temperature)
            )
        out: list[list[list[float]]] = [[] for _ in prompts]
        for (i, _), values in zip(rows, scored):
            out[i].append(values)
        return out

    def scoring_rows_per_chunk(self, context_len: int, span: int) -> int:
        """Rows one :meth:`continuation_logprobs` forward takes when ``generation.max_batch_size`` is
        0: as many as keep their copied KV cache and their logits under ``SCORING_BUDGET_BYTES``.
        Every row holds its own copy of its context's cache: 1,100 RLCR candidate rows after a
        500-token context are about 25 GB in fp32 for SmolLM2-135M, which is what one forward
        used to take."""
        kv = self.kv_bytes_per_token() * (context_len + span)
        logits = span * self.model.config.vocab_size * 4 * 2  # float32 logits and their log-softmax
        return max(1, SCORING_BUDGET_BYTES // (kv + logits))

    def generation_rows_per_chunk(self, context_len: int, max_new_tokens: int) -> int:
        """Rows one :meth:`generate` call decodes when ``generation.max_batch_size`` is 0: as many as
        keep their KV cache (prompt and ``max_new_tokens``) and a step's float32 logits with their
        sampling copies under ``GENERATION_BUDGET_BYTES``, or half the free memory of a CUDA device
        where that is more. The estimate is a fixed function of the shapes on the CPU, so a run
        chunks (and so samples) the same way on every machine."""
        per_row = self.kv_bytes_per_token() * (context_len + max_new_tokens)
        per_row += self.model.config.vocab_size * 4 * 3
        budget = GENERATION_BUDGET_BYTES
        device = next(self.model.parameters()).device
        if device.type == "cuda":
            budget = max(budget, torch.cuda.mem_get_info(device)[0] // 2)
        return max(1, budget // per_row)

    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one token holds over all layers, in the weight copy's dtype."""
        cfg = self.model.config
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        itemsize = next(self.model.parameters()).element_size()
        return 2 * cfg.num_hidden_layers * kv_heads * head_dim * itemsize

    def _score_chunk(
        self, prompts: list[list[int]], conts: list[list[int]], temperature: float
    ) -> list[list[float]]:
        device = next(self.model.parameters()).device
        b, span = len(prompts), max(len(c) for c in conts)
        ids, attn, pos = self._left_padded(prompts, device)
        first_logits, past, attn = self._encode_prompts(ids, attn, pos)
        cont = torch.full((b, span), self.pad_id, dtype=torch.long, device=device)
        for i, c in enumerate(conts):  # right padding: a padded column follows every real one
            cont[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        logits = first_logits[:, None]
        if span > 1:  # the logits of continuation tokens 2.. come from the tokens before them
            decoder = getattr(self.model, self.model.base_model_prefix)
            out = decoder(
                input_ids=cont[:, :-1],
                attention_mask=torch.cat([attn, torch.ones_like(cont[:, :-1])], dim=1),
                position_ids=pos[:, -1:] + 1 + torch.arange(span - 1, device=device),
                use_cache=True,
                **{self._cache_kw: past},
            )
            rest = self.model.get_output_embeddings()(out.last_hidden_state).float()
            logits = torch.cat([logits, rest], dim=1)
        logp = (logits / temperature).log_softmax(-1).gather(-1, cont[..., None])[..., 0]
        return [logp[i, : len(c)].tolist() for i, c in enumerate(conts)]

    def _left_padded(
        self, prompts: list[list[int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids, attention mask and positions ``[B, W]`` of the prompts, left-padded so that every
        prompt ends at the same column (where decoding or scoring continues)."""
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long, device=device)
        attn = torch.zeros((b, width), dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)

    def _next_logits(self, ids, attn, pos, past) -> tuple[torch.Tensor, object]:
        """float32 logits[B, V] of the last position, and the updated KV cache.

        The output layer is applied to a contiguous ``[B, H]`` slice: the model's own
        ``logits_to_keep=1`` path multiplies a strided ``[B, 1, H]`` view, which torch turns into a
        batched matmul against an expanded weight (about 9x slower at a 150k vocabulary).
        """
        decoder = getattr(self.model, self.model.base_model_prefix)
        out = decoder(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, **{self._cache_kw: past}
        )
        last = out.last_hidden_state[:, -1].contiguous()
        return self.model.get_output_embeddings()(last).float(), getattr(out, self._cache_kw)

    def _encode_prompts(self, ids, attn, pos) -> tuple[torch.Tensor, object, torch.Tensor]:
        """Logits of each prompt's last position, the KV cache and its attention mask, every distinct
        prompt encoded once and the opening all distinct prompts share encoded once.

        The ``n`` samples of a request (and the confidences of one RLCR answer) share their prompt:
        it runs through the model once and its keys and values are copied to its rows, instead of
        encoding hundreds of identical tokens ``n`` times (the prompt dominates short replies).
        Distinct prompts that open alike for ``MIN_COMMON_START`` tokens or more (self-play's system
        prompt and demonstration before each question) share that opening the same way
        (``_encode_distinct``). The cache's columns may then be in another order than ``attn``'s: the
        mask returned is the one decoding continues with.
        """
        groups = distinct_rows(ids, attn)  # left-padded to one width: same prompt, same row
        if groups is None:
            return self._encode_distinct(ids, attn, pos)
        first, inverse = groups
        logits, past, layout = self._encode_distinct(ids[first], attn[first], pos[first])
        past.batch_select_indices(inverse)
        return logits[inverse], past, layout[inverse]

    def _encode_distinct(self, ids, attn, pos) -> tuple[torch.Tensor, object, torch.Tensor]:
        """:meth:`_encode_prompts` for prompts that differ: the leading tokens they all share
        (``common_start``) run once and their cache is copied to every row; each row's other columns
        (left padding, then the rest of its prompt) run on it. The cache holds the shared columns
        first, so the mask returned is ``[ones(c), each row's own columns' mask]``; positions are
        the prompt's, so what decoding computes is unchanged (the order of keys does not enter
        attention, only the mask and the positions do)."""
        start = common_start(ids, attn) if ids.shape[0] > 1 else None
        if start is None:
            return (*self._next_logits(ids, attn, pos, None), attn)
        starts, c = start
        s0 = int(starts[0])
        _, past = self._next_logits(ids[:1, s0 : s0 + c], attn[:1, s0 : s0 + c], pos[:1, s0 : s0 + c], None)
        past.batch_select_indices(torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device))
        own = own_columns(starts, c, ids.shape[1])
        layout = torch.cat([attn.new_ones(ids.shape[0], c), attn.gather(1, own)], dim=1)
        logits, past = self._next_logits(ids.gather(1, own), layout, pos.gather(1, own), past)
        return logits, past, layout

    def _uses_static_decode(self, device: torch.device) -> bool:
        """``decode=static`` always; ``auto`` on CUDA (where launch overhead bounds the dynamic loop)."""
        if self.decode == "dynamic" or (self.decode == "auto" and device.type != "cuda"):
            return False
        if self._static is None:
            self._static = StaticDecoder(
                self.model,
                self._cache_kw,
                _sample,
                cuda_graphs=self.cuda_graphs,
                grouped_attention=(
                    device.type == "cuda" if self.grouped_attention is None else self.grouped_attention
                ),
            )
        return True

    def _generate_chunk(self, prompts: list[list[int]], sp: SamplingParams) -> list[Sample]:
        device = next(self.model.parameters()).device
        ids, attn, pos = self._left_padded(prompts, device)
        logits, past, attn = self._encode_prompts(ids, attn, pos)
        next_pos = pos[:, -1:] + 1
        if self._uses_static_decode(device):
            tokens, logps, _ = self._static.decode(
                logits,
                past,
                attn,
                next_pos,
                sp,
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                stop_rows=self._stop_rows(sp),
            )
        else:
            tokens, logps = self._decode_dynamic(logits, past, attn, next_pos, sp)
        return self._finish_rows(tokens.tolist(), logps.tolist(), sp)

    def _decode_dynamic(
        self, logits, past, attn, next_pos, sp: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The plain loop: the cache grows by one column per token, the host checks every token.

        Rows that have ended leave the batch once they are ``prune_ended_share`` of it (their cache
        rows are dropped), so short replies stop paying for the longest one's steps. Every step still draws
        one uniform per row of the whole batch and hands each decoded row its own, so the tokens are
        the ones the full batch would sample under the same seed.
        """
        b, device = attn.shape[0], attn.device
        tokens = torch.full((b, sp.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((b, sp.max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        rows = torch.arange(b, device=device)  # the batch row of each row still decoded
        stop_rows = self._stop_rows(sp)
        for t in range(sp.max_new_tokens):
            u = None if sp.greedy else _uniforms(b, device)[rows]
            tok, logp = _sample(logits, sp, u)
            ended = done[rows]
            tok = tok.masked_fill(ended, self.pad_id)
            tokens[rows, t] = tok
            logps[rows, t] = logp.masked_fill(ended, 0.0)
            done[rows] = ended | (tok == self.eos_id)
            if stop_rows is not None:
                stopped = stop_rows(tokens[:, : t + 1], done)
                if stopped:
                    done[torch.tensor(stopped, device=device)] = True
            if bool(done.all()) or t + 1 == sp.max_new_tokens:
                break
            going = ~done[rows]
            if int((~going).sum()) >= self.prune_ended_share * len(rows):  # drop the ended rows
                keep = going.nonzero(as_tuple=True)[0]
                past.batch_select_indices(keep)
                rows, attn, next_pos, tok = rows[keep], attn[keep], next_pos[keep], tok[keep]
            attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype, device=device)], dim=1)
            logits, past = self._next_logits(tok[:, None], attn, next_pos, past)
            next_pos = next_pos + 1
        return tokens, logps

    def _stop_rows(self, sp: SamplingParams):
        return stop_rows_checker(self.tokenizer, sp)

    def _finish_rows(
        self, tokens: list[list[int]], logps: list[list[float]], sp: SamplingParams
    ) -> list[Sample]:
        return finish_rows(self.tokenizer, self.eos_id, tokens, logps, sp)


def stop_rows_checker(tokenizer, sp: SamplingParams):
    """``(tokens, done) -> rows whose text so far holds a stop string``; None without stop strings."""
    if not sp.stop_strings:
        return None

    def stop_rows(tokens: torch.Tensor, done: torch.Tensor) -> list[int]:
        rows = (~done).nonzero(as_tuple=True)[0].tolist()
        texts = tokenizer.batch_decode(tokens[rows].tolist(), skip_special_tokens=True)
        return [i for i, text in zip(rows, texts) if any(s in text for s in sp.stop_strings)]

    return stop_rows


def finish_rows(
    tokenizer, eos_id: int, tokens: list[list[int]], logps: list[list[float]], sp: SamplingParams
) -> list[Sample]:
    """Cut each row at its end: the first eos, else the first token whose text completes a stop
    string, else ``max_new_tokens``; the same rule whichever loop (or backend) produced the tokens."""
    samples = []
    for row, row_logps in zip(tokens, logps):
        n, reason = len(row), "length"
        if eos_id in row:
            n, reason = row.index(eos_id) + 1, "eos"
        if sp.stop_strings:
            stop_at = _first_stop(tokenizer, row[:n], sp.stop_strings)
            if stop_at is not None and (reason != "eos" or stop_at < n):
                n, reason = stop_at, "stop"
        ids_i = row[:n]
        text = tokenizer.decode(ids_i, skip_special_tokens=True)
        samples.append(Sample(token_ids=ids_i, logprobs=row_logps[:n], text=text, finish_reason=reason))
    return samples


def _first_stop(tokenizer, row: list[int], stop_strings) -> int | None:
    """Length of the shortest prefix of ``row`` whose text holds a stop string (None: none does)."""
    if not any(s in tokenizer.decode(row, skip_special_tokens=True) for s in stop_strings):
        return None
    for t in range(1, len(row) + 1):
        if any(s in tokenizer.decode(row[:t], skip_special_tokens=True) for s in stop_strings):
            return t
    return None


def backend_kwargs(gen_cfg, device: torch.device | str = "cpu") -> dict:
    """Constructor keyword arguments of a generation backend from ``cfg.generation``; ``device`` is
    where its weight copy lives (``generation.dtype=auto`` is bf16 where that device has it natively)."""
    if gen_cfg.backend == "trtllm":  # the engine's keys live under generation.trtllm
        return {"cfg": gen_cfg}
    kwargs: dict = {"max_batch_size": gen_cfg.max_batch_size}
    if gen_cfg.backend in ("hf", "megatron"):  # their decode loops: static or dynamic
        kwargs["decode"] = gen_cfg.decode
    if gen_cfg.backend == "hf":
        kwargs["grouped_attention"] = {"auto": None, "model": False, "grouped": True}[
            gen_cfg.decode_attention
        ]
    dtype = resolve_low_precision(gen_cfg.dtype, device, "generation.dtype")
    if dtype is not None:
        kwargs["dtype"] = dtype
    return kwargs


def sampling_from_config(gen_cfg, *, n: int | None = None, greedy: bool = False) -> SamplingParams:
    return SamplingParams(
        n=gen_cfg.n_samples if n is None else n,
        temperature=gen_cfg.temperature,
        top_p=gen_cfg.top_p,
        top_k=gen_cfg.top_k,
        max_new_tokens=gen_cfg.max_new_tokens,
        stop_strings=tuple(gen_cfg.stop_strings),
        greedy=greedy,
    )


__all__ = [
    "HFGenerationBackend",
    "backend_kwargs",
    "finish_rows",
    "sampling_from_config",
    "stop_rows_checker",
]
