"""Sampling the next token in llama.cpp, with a grammar checked on the chosen token first.

A grammar sampler applied to every candidate walks the grammar for each of the vocabulary's tokens (49,152
for SmolLM2) at every step: llama-cpp-python's own generation does that, and constrained generation runs
many times slower than free generation. llama.cpp's own common sampler does better: it samples from the
model's distribution first and asks the grammar about that one token. :class:`Sampler` does the same, and
when the grammar refuses the token it goes on asking about one token at a time before it falls back to the
whole vocabulary:

- greedy decoding: the tokens in order of their logits (the best ones first, ties to the lower id, as
  llama.cpp's greedy sampler breaks them); the first the grammar allows is the constrained argmax;
- sampling with a temperature: another token drawn from the same distribution without the refused ones,
  until one is allowed. Removing refused tokens does not change the distribution conditioned on the allowed
  ones, so the token is drawn from the constrained distribution ``p(t) / Z``, ``Z`` the mass the grammar allows.

Only after :data:`TRIES` refusals is the grammar applied to every candidate, as llama-cpp-python does. With
``top_p`` below 1 truncation does not commute with masking (the nucleus of the allowed tokens is not the
allowed part of the nucleus), so then the grammar is applied to every candidate first, as there.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

__all__ = ["TRIES", "Sampler"]

#: how many tokens are checked one at a time before the grammar is applied to the whole vocabulary
TRIES = 64


class Sampler:
    """Chooses tokens for one generation: greedy when ``temperature`` is 0, else temperature (and ``top_p``)
    sampling seeded by ``seed``; ``grammar`` is a pristine grammar sampler to clone, or None.

    Counts of constrained steps: ``checked``, the model's own choice was allowed; ``rescued``, it was refused
    and a token checked one at a time was allowed; ``full``, the grammar went over the whole vocabulary.
    """

    def __init__(
        self,
        cpp: Any,
        n_vocab: int,
        *,
        temperature: float,
        top_p: float,
        seed: int | None,
        grammar: Any = None,
    ) -> None:
        self._cpp = cpp
        self._n_vocab = n_vocab
        self._temperature = temperature
        self._seed = seed
        self.chain = cpp.llama_sampler_chain_init(cpp.llama_sampler_chain_default_params())
        if temperature <= 0:
            cpp.llama_sampler_chain_add(self.chain, cpp.llama_sampler_init_greedy())
            commutes = True
        else:
            commutes = top_p >= 1.0
            if top_p < 1.0:
                cpp.llama_sampler_chain_add(self.chain, cpp.llama_sampler_init_top_p(top_p, 1))
            cpp.llama_sampler_chain_add(self.chain, cpp.llama_sampler_init_temp(temperature))
            cpp.llama_sampler_chain_add(
                self.chain, cpp.llama_sampler_init_dist(cpp.LLAMA_DEFAULT_SEED if seed is None else seed & 0xFFFFFFFF)
            )
        self.grammar = cpp.llama_sampler_clone(grammar) if grammar is not None else None
        self._check_first = commutes
        self.checked = self.rescued = self.full = 0
        self._one = cpp.llama_token_data(0, 1.0, 0.0)
        self._one_array = cpp.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)
        self._candidates: Any = None
        self._rng: Any = None

    def sample(self, ctx: Any) -> int:
        """The next token, from the logits of the last token the context evaluated."""
        cpp = self._cpp
        if self.grammar is None:
            token: int = cpp.llama_sampler_sample(self.chain, ctx, -1)
            return token
        if self._check_first:
            token = cpp.llama_sampler_sample(self.chain, ctx, -1)
            if self._allows(token):
                self.checked += 1
                cpp.llama_sampler_accept(self.grammar, token)
                return token
            found = self._one_by_one(ctx, token)
            if found is not None:
                self.rescued += 1
                cpp.llama_sampler_accept(self.grammar, found)
                return found
        self.full += 1
        candidates = self._fill(ctx)
        cpp.llama_sampler_apply(self.grammar, ctypes.byref(candidates))
        cpp.llama_sampler_apply(self.chain, ctypes.byref(candidates))
        token = candidates.data[candidates.selected].id
        cpp.llama_sampler_accept(self.grammar, token)
        if not self._check_first:
            cpp.llama_sampler_accept(self.chain, token)
        return token

    def _allows(self, token: int) -> bool:
        """Whether the grammar, in its present state, allows ``token`` next."""
        one, array = self._one, self._one_array
        one.id, one.logit, one.p = token, 1.0, 0.0
        array.data, array.size, array.selected, array.sorted = ctypes.pointer(one), 1, -1, False
        self._cpp.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return not math.isinf(array.data[0].logit)

    def _one_by_one(self, ctx: Any, refused: int) -> int | None:
        """After the grammar refused ``refused``: the token the constrained chain would choose, found by
        checking one token at a time (see the module docstring), or None after :data:`TRIES` refusals."""
        import numpy as np

        logits = np.ctypeslib.as_array(self._cpp.llama_get_logits_ith(ctx, -1), shape=(self._n_vocab,))
        if self._temperature <= 0:
            count = min(TRIES, self._n_vocab - 1)
            top = np.argpartition(-logits, count)[: count + 1]
            for token in top[np.lexsort((top, -logits[top]))].tolist():
                if token != refused and self._allows(token):
                    return int(token)
            return None
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        weights = np.exp((logits - logits.max()) / self._temperature, dtype=np.float64)
        weights[refused] = 0.0
        for _ in range(TRIES):
            cumulative = np.cumsum(weights)
            total = cumulative[-1]
            if not total > 0:
                return None
            token = min(int(np.searchsorted(cumulative, self._rng.random() * total, side="right")), self._n_vocab - 1)
            if self._allows(token):
                return token
            weights[token] = 0.0
        return None

    def _fill(self, ctx: Any) -> Any:
        """Every token of the vocabulary with its logit, as the array samplers work on."""
        import numpy as np

        cpp = self._cpp
        n = self._n_vocab
        if self._candidates is None:
            dtype = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
            self._buffer = np.zeros(n, dtype=dtype)
            self._candidates = cpp.llama_token_data_array()
        buffer = self._buffer
        buffer["id"] = np.arange(n, dtype=np.intc)
        buffer["logit"] = np.ctypeslib.as_array(cpp.llama_get_logits_ith(ctx, -1), shape=(n,))
        buffer["p"] = 0.0
        candidates = self._candidates
        candidates.data = buffer.ctypes.data_as(ctypes.POINTER(cpp.llama_token_data))
        candidates.size = n
        candidates.selected = -1
        candidates.sorted = False
        return candidates

    def close(self) -> None:
        cpp = self._cpp
        if self.chain is not None:
            cpp.llama_sampler_free(self.chain)
            self.chain = None
        if self.grammar is not None:
            cpp.llama_sampler_free(self.grammar)
            self.grammar = None
