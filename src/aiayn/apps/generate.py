"""Continue text with a decoder-only language model: tokenizer + checkpoint + sampling.

    generator = Generator.load("runs/gpt")              # or Generator.from_hf("gpt2/")
    generator.generate("In the beginning", max_new_tokens=20, greedy=True)
    for piece in generator.stream("In the beginning", temperature=0.8, top_p=0.9, seed=1):
        print(piece, end="", flush=True)                 # text as the tokens come

The prompt fills the model's key/value cache once (`aiayn.inference.decoding.start`); every
step then runs one new token through the frozen model (`aiayn.inference.frozen.freeze`;
with `use_static_step`, a step of fixed shapes, compiled or not, `aiayn.inference.static_step`)
and picks the next one with the search's own pickers (`aiayn.inference.search.greedy_pick`,
`sampling_picker`: temperature, top-k, top-p, seeded), after the same rules as
every search (`aiayn.inference.scoring.next_log_probs`: pad and bos are never generated).
Generation stops at eos, after `max_new_tokens`, or when the sequence but its last
token fills the model's `max_len` positions. A prompt longer than `max_len` is
refused (`PromptError`), not cut.

Text is streamed by decoding the whole sequence after each token and giving out
what is new, held back while it ends inside a character: a word of several
pieces, or a character of several byte-level tokens (GPT-2), prints correctly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch

from aiayn.apps.model_use import DECODER_ONLY, ModelUser, check_shape, check_tokenizer_fits
from aiayn.config import ModelConfig, check_seed
from aiayn.data.tokenizer import Tokenizer
from aiayn.inference.decoding import start as start_decoding
from aiayn.inference.frozen import freeze
from aiayn.inference.search import Picker, TokenRules, greedy_pick, next_log_probs, sampling_picker
from aiayn.inference.static_step import StaticDecoder
from aiayn.models import add_to_shape

log = logging.getLogger(__name__)

_INCOMPLETE = "\ufffd"  # what decoding gives for a character cut in the middle


class PromptError(ValueError):
    """A prompt the model cannot continue (empty, or too long)."""


class Generator(ModelUser):
    """A decoder-only model and its tokenizer, ready to continue prompts.

    `model` is kept (eval mode, on `device`) for what needs the literal model (attention
    maps); generating runs `engine`, its `aiayn.inference.frozen.freeze` copy.

    Args:
        model: a decoder-only model (`aiayn.models.decoder_only.DecoderOnly`).
        tokenizer: the tokenizer it was trained with.
        device: where to run.
        dtype: the model's floating-point type there (e.g. torch.bfloat16).

    Raises:
        ValueError: the model is of another shape, or the tokenizer does not fit it.
    """

    SHAPE = DECODER_ONLY
    HF_LOADER = "load_gpt2"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> None:
        cfg = model.cfg
        check_shape(cfg, DECODER_ONLY, "the model")
        _check_tokenizer(tokenizer, cfg)
        self.device = torch.device(device)
        self.model = model.to(self.device, dtype=dtype).eval()
        self.engine = freeze(self.model)
        self.tokenizer = tokenizer
        self.static: StaticDecoder | None = None  # `use_static_step`

    def use_static_step(self, compile: bool = False) -> None:
        """Decode on a step of fixed shapes from now on (`aiayn.inference.static_step`):
        one slot holding `max_len` positions, the same tokens as before.

        Args:
            compile: compile the step now (`torch.compile`, once per process).

        Raises:
            ValueError: a model the static step does not cover (naming what).
        """
        max_len = self.engine.cfg.max_len
        self.static = StaticDecoder(self.engine, slots=1, max_target=max_len, compile=compile)

    # ----- generating ---------------------------------------------------------

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 50,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        greedy: bool = False,
    ) -> str:
        """The text that follows `prompt` (without the prompt itself); see `stream`."""
        return "".join(self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, greedy))

    def stream(
        self,
        prompt: str,
        max_new_tokens: int = 50,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        greedy: bool = False,
    ) -> Iterator[str]:
        """Yield the continuation of `prompt` piece by piece, as its tokens are generated.

        Args:
            prompt: the text to continue (not empty).
            max_new_tokens: generate at most this many tokens (fewer if the sequence
                would outgrow the model's max_len: a warning says so).
            temperature, top_k, top_p: sampling options (`aiayn.inference.search.filter_logits`).
            seed: fixes the samples (default: a fresh random seed).
            greedy: take the most probable token at every step (sampling options are
                then ignored); the same as `aiayn.inference.search.greedy_search`.

        Raises (at once, before the first piece):
            PromptError: an empty prompt, or one longer than max_len (than max_len - 1
                on the static step).
            ValueError: a sampling option or max_new_tokens out of range.
        """
        prompt_ids = self.encode_prompt(prompt)
        pick = self.picker(temperature, top_k, top_p, seed, greedy)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        return self._pieces(prompt_ids, self.generate_ids(prompt_ids, max_new_tokens, pick))

    def _pieces(self, prompt_ids: list[int], new_tokens: Iterator[int]) -> Iterator[str]:
        """The text of `new_tokens` after the prompt's, as it grows (see the module)."""
        context = self.tokenizer.decode(prompt_ids)
        new_ids: list[int] = []
        given = 0  # characters of the continuation given out so far
        for token in new_tokens:
            new_ids.append(token)
            text = self.tokenizer.decode(prompt_ids + new_ids)[len(context) :]
            if not text.endswith(_INCOMPLETE) and len(text) > given:
                yield text[given:]
                given = len(text)
        text = self.tokenizer.decode(prompt_ids + new_ids)[len(context) :]
        if len(text) > given:
            yield text[given:]

    def encode_prompt(self, prompt: str) -> list[int]:
        """The prompt's ids, refused if empty or too long for the model's max_len.

        A prompt is refused rather than cut: which end to keep is the caller's choice.
        The static step (`use_static_step`) holds the prompt and the token fed after it
        in max_len positions, so there the prompt must be one token shorter.
        """
        ids = self.tokenizer.encode(prompt) if prompt.strip() else []
        if not ids:
            raise PromptError("the prompt is empty: give some text to continue")
        max_len = self.model.cfg.max_len
        if len(ids) > max_len:
            raise PromptError(
                f"the prompt has {len(ids)} tokens, more than the model's max_len={max_len}: "
                f"shorten it to at most {max_len} tokens"
            )
        if self.static is not None and len(ids) >= max_len:
            raise PromptError(
                f"the prompt has {len(ids)} tokens and the static step (--static, --compile) "
                f"holds at most max_len - 1 = {max_len - 1}: shorten it, or decode without "
                "--static"
            )
        return ids

    def picker(
        self,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        greedy: bool = False,
    ) -> Picker:
        """The search's picker for these options (sampling options are checked even
        when `greedy`, so that a typo is not silently ignored)."""
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            check_seed(seed, "seed")
            generator.manual_seed(seed)
        sampler = sampling_picker(temperature, top_k, top_p, generator)
        return greedy_pick if greedy else sampler

    @torch.no_grad()
    def generate_ids(
        self, prompt_ids: Sequence[int], max_new_tokens: int, pick: Picker
    ) -> Iterator[int]:
        """Yield the ids that follow `prompt_ids`, one per step, until eos (not yielded).

        The steps are those of `aiayn.inference.search`'s one-path search: the first is fed
        bos (`DecoderOnlyDecoding` continues the prompt from there), and each picks from
        `next_log_probs`.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        cfg = self.engine.cfg
        room = cfg.max_len - len(prompt_ids) + 1  # the last token is never fed back
        if max_new_tokens > room:
            log.warning(
                "the prompt has %d tokens and the model's max_len is %d: generating at "
                "most %d new tokens, not %d",
                len(prompt_ids),
                cfg.max_len,
                room,
                max_new_tokens,
            )
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        decoding = start_decoding(self.engine if self.static is None else self.static, prompt)
        last = torch.tensor([cfg.bos_id], device=self.device)
        rules = TokenRules()
        for _ in range(min(max_new_tokens, room)):
            last = pick(next_log_probs(cfg, decoding, last, rules))  # (1,)
            token = int(last)
            if token == cfg.eos_id:
                return
            yield token


def _check_tokenizer(tokenizer: Tokenizer, cfg: ModelConfig) -> None:
    """Refuse a tokenizer whose ids the model cannot read, or whose eos it does not end with."""
    check_tokenizer_fits(tokenizer, cfg)
    source = f" ({tokenizer.path})" if tokenizer.path else ""
    if tokenizer.eos_id is not None and tokenizer.eos_id != cfg.eos_id:
        raise ValueError(
            f"the tokenizer{source} ends text with id {tokenizer.eos_id} but the model "
            f"with {cfg.eos_id}"
        )


# the shape's user and verb, from the apps layer (aiayn.models.add_to_shape)
add_to_shape("decoder_only", user=Generator, verb="generate")
