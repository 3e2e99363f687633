"""``megatron`` generation backend: samples from the training weights in place.

On CUDA (``generation.decode=auto``), a model in one pipeline stage decodes through
:mod:`.megatron_static_decode` (its own static cache around megatron's modules, the step a replayed
CUDA graph). Otherwise (``decode=dynamic``, CPU, or a layout that path does not serve), the
megatron policy's own model chunk runs the decode, wrapped in megatron-core's
``GPTInferenceWrapper`` with a ``StaticInferenceContext`` (its KV cache): no HF copy, no refit, so
``sync_weights`` only bumps the version. Decoding follows megatron's static batching: prompts are
right-padded, the loop starts at the shortest prompt, and a row whose prompt is longer keeps its
prompt token at each column until its prompt ends (megatron's RoPE uses positions 0..S-1, so each
row's real tokens must start at column 0). Sampling, stop rules and sampled-token log-probs (under
the temperature-scaled policy) are the ``hf`` backend's helpers, so both backends give the same
tokens for the same logits and random stream.

Tensor parallelism: every TP rank runs the same loop on the all-gathered logits with the same random
stream (the trainer seeds every rank alike), so all ranks sample the same tokens. Pipeline
parallelism: megatron's wrapper passes activations stage to stage; the last stage's last-token
logits are broadcast to the other stages, which then sample the same tokens. Not with virtual
pipeline stages or sequence parallelism (one-line ConfigError).
"""

from __future__ import annotations

import torch

from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, Sample, SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.registry import GENERATION_BACKENDS
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.rollout.hf_backend import _sample, finish_rows, stop_rows_checker
from nemo_azr.rollout.static_decode import DECODE_MODES

__all__ = ["MegatronGenerationBackend"]


@GENERATION_BACKENDS.register("megatron")
class MegatronGenerationBackend(GenerationEngineBase):
    """Reads the policy's live weights; built by the trainer from the policy itself."""

    #: The trainer passes the policy (not an HF model copy) to the constructor.
    reads_policy_in_place = True

    def __init__(
        self, policy, tokenizer, *, max_batch_size: int = 0, decode: str = "auto", cuda_graphs: bool = True
    ) -> None:
        from megatron.core import parallel_state as ps

        from nemo_azr.models.megatron.logprobs import unwrap_gpt_model
        from nemo_azr.models.megatron.policy import MegatronPolicy
        from nemo_azr.rollout.megatron_static_decode import megatron_static_decode_unsupported

        super().__init__()
        if not isinstance(policy, MegatronPolicy):
            raise ConfigError("generation.backend=megatron needs model.backend=megatron")
        # Sequence parallelism and virtual pipeline stages are refused at start (nemo_azr/preflight.py).
        self.pipelined = ps.get_pipeline_model_parallel_world_size() > 1
        self.policy = policy
        self.model = policy.chunks[0]
        self.device = next(self.model.parameters()).device
        self.vocab_size = policy.hf_config.vocab_size
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.max_batch_size = max_batch_size
        # generation.decode: static (this module's own cache and step, a CUDA graph on CUDA), dynamic
        # (megatron's static inference loop), auto (static on CUDA where the model allows it)
        if decode not in DECODE_MODES:
            raise ConfigError(f"generation.decode={decode!r}: expected one of {', '.join(DECODE_MODES)}")
        why_not = (
            megatron_static_decode_unsupported(unwrap_gpt_model(self.model)) if decode != "dynamic" else None
        )
        if decode == "static" and why_not:
            raise ConfigError(
                f"generation.decode=static cannot decode this model: {why_not}; use decode=dynamic"
            )
        self.decode = "dynamic" if why_not else decode
        self.cuda_graphs = cuda_graphs
        self._static = None  # a MegatronStaticDecoder once the static path first runs

    # --- capabilities ---------------------------------------------------------------------------
    def sync_weights(self, policy) -> None:
        """Nothing to copy: the next ``generate`` reads the policy's current parameters."""
        self.version += 1

    def release(self) -> None:
        """Free the static path's caches and captured graphs (megatron's own cache lives in one call)."""
        if self._static is not None:
            self._static.release()

    def flush_cache(self) -> None:
        """The KV cache lives only inside one ``generate`` call."""

    # --- generation -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        was_training = self.model.training
        try:
            return self.generate_in_chunks(requests, sampling, self._generate_chunk, self.max_batch_size)
        finally:
            self.model.train(was_training)  # the wrapper switches the training model to eval

    def _wrapper(self, batch: int, length: int):
        from megatron.core.inference.contexts import StaticInferenceContext
        from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import (
            GPTInferenceWrapper,
        )
        from megatron.core.inference.model_inference_wrappers.inference_wrapper_config import (
            InferenceWrapperConfig,
        )

        config = InferenceWrapperConfig(
            hidden_size=self.model.config.hidden_size,
            params_dtype=self.model.config.params_dtype,
            inference_batch_times_seqlen_threshold=-1,
            padded_vocab_size=self.model.padded_vocab_size,
            inference_max_requests=batch,
            inference_max_seq_length=length,
        )
        wrapper = GPTInferenceWrapper(self.model, config, StaticInferenceContext(batch, length))
        wrapper.prep_model_for_inference()
        return wrapper

    def _last_logits(self, logits: torch.Tensor | None, rows: int) -> torch.Tensor:
        """float32 ``[rows, V]`` logits of the window's last position, on every pipeline stage."""
        if not self.pipelined:
            return logits[:, -1, : self.vocab_size].float()
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        # Only the last stage has logits: broadcast them (real vocabulary only) to the other stages.
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            last = logits[:, -1, : self.vocab_size].float().contiguous()
        else:
            last = torch.empty((rows, self.vocab_size), dtype=torch.float32, device=self.device)
        dist.broadcast(
            last, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return last

    def _uses_static_decode(self, device: torch.device) -> bool:
        """``decode=static`` always; ``auto`` on CUDA (where the per-token host work bounds megatron's loop)."""
        if self.decode == "dynamic" or (self.decode == "auto" and device.type != "cuda"):
            return False
        if self._static is None:
            from nemo_azr.models.megatron.logprobs import unwrap_gpt_model
            from nemo_azr.rollout.megatron_static_decode import MegatronStaticDecoder

            self._static = MegatronStaticDecoder(
                unwrap_gpt_model(self.model), self.vocab_size, _sample, cuda_graphs=self.cuda_graphs
            )
        return True

    def _generate_chunk(self, prompts: list[list[int]], sp: SamplingParams) -> list[Sample]:
        device = next(self.model.parameters()).device
        if self._uses_static_decode(device):
            self.model.eval()  # generate() restores the training mode
            logits, past, attn, next_pos = self._static.encode(prompts, self.pad_id)
            tokens, logps, _ = self._static.decode(
                logits,
                past,
                attn,
                next_pos,
                sp,
                eos_id=self.eos_id,
                pad_id=self.pad_id,
                stop_rows=stop_rows_checker(self.tokenizer, sp),
            )
            return finish_rows(self.tokenizer, self.eos_id, tokens.tolist(), logps.tolist(), sp)
        b = len(prompts)
        lens = torch.tensor([len(p) for p in prompts], device=device)
        length = int(lens.max()) + sp.max_new_tokens
        tokens = torch.full((b, length), self.pad_id, dtype=torch.long, device=device)
        for i, p in enumerate(prompts):  # right padding: every row's real tokens start at column 0
            tokens[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        wrapper = self._wrapper(b, length)
        inputs = wrapper.prep_inference_input(tokens)

        out_tokens = torch.full((b, sp.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros((b, sp.max_new_tokens), dtype=torch.float32, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        reason = ["length"] * b
        lengths = [sp.max_new_tokens] * b
        prev = 0
        for cur in range(int(lens.min()), length):
            window = wrapper.get_batch_for_context_window(inputs, prev, cur)
            logits = self._last_logits(wrapper.run_one_forward_step(window), b)
            prev = cur
            tok, logp = _sample(logits, sp)
            step = cur - lens  # this column's index among each row's generated tokens
            live = (step >= 0) & ~done
            tokens[:, cur] = torch.where(live, tok, tokens[:, cur])
            for i in live.nonzero(as_tuple=True)[0].tolist():
                t = int(step[i])
                out_tokens[i, t], logps[i, t] = tok[i], logp[i]
                if int(tok[i]) == self.eos_id:
                    reason[i], lengths[i] = "eos", t + 1
                    done[i] = True
                elif sp.stop_strings and any(
                    s in self.tokenizer.decode(out_tokens[i, : t + 1].tolist(), skip_special_tokens=True)
                    for s in sp.stop_strings
                ):
                    reason[i], lengths[i] = "stop", t + 1
                    done[i] = True
                elif t + 1 == sp.max_new_tokens:
                    done[i] = True
            if bool(done.all()):
                break

        samples = []
        for i in range(b):
            n = lengths[i]
            ids = out_tokens[i, :n].tolist()
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            samples.append(
                Sample(token_ids=ids, logprobs=logps[i, :n].tolist(), text=text, finish_reason=reason[i])
            )
        return samples
