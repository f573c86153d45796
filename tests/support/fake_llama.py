"""A stand-in for a llama.cpp context that follows its KV rules strictly, for fast tests of the
engine's tree batches and KV bookkeeping without a model.

Cells hold (position, token, set of sequence ids). A token attends to the cells that carry its
*first* sequence id — chosen at random here, as llama.cpp's unordered set makes it arbitrary — and
are not after it. Its logits are a deterministic function of the tokens it sees, so any mistake in
masks or bookkeeping changes the output. The batch checks of ``llama_batch_allocr::init`` are
enforced: positions continue each sequence, coupled sequences share their cached range.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from time import perf_counter
from typing import cast

import numpy as np

from edgespec.engine._context import Context, ContextSettings
from edgespec.engine.draft import look_ahead_during
from edgespec.engine.ports import Pending, Verified
from edgespec.engine.rows import RowsVerified

VOCAB = 48
EOS = 0


class FakeModel:
    """Vocabulary of VOCAB tokens; token t's text is a letter (multi-byte for some, to test UTF-8)."""

    def __init__(self, noise: float = 0.0, seed: int = 0, n_vocab: int = VOCAB):
        self.noise = noise  # the draft: the target's logits plus this much deterministic noise
        self.seed = seed
        self.n_vocab = n_vocab
        self.path = f"fake-{seed}-{noise}"

    def piece(self, token: int, special: bool = False) -> bytes:
        if token == EOS:
            return b""
        if token % 11 == 0:
            return "é".encode()  # two bytes
        return chr(ord("a") + token % 26).encode()

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def turn_tokens(self) -> frozenset[int]:
        return frozenset({EOS})

    def logits(self, seen: tuple[int, ...]) -> np.ndarray:
        """A small 'language model': depends on the last three tokens and the length."""
        key = (seen[-3:], len(seen) % 5)
        rng = np.random.default_rng(abs(hash(key)) % (2**32))
        base = rng.normal(0.0, 2.0, self.n_vocab).astype(np.float32)
        base[EOS] = -8.0  # rarely ends
        if self.noise:
            noise_rng = np.random.default_rng((abs(hash(key)) + self.seed + 1) % (2**32))
            base += noise_rng.normal(0.0, self.noise, self.n_vocab).astype(np.float32)
        return base


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int]


class FakeContext:
    def __init__(self, model: FakeModel, settings: ContextSettings, rng_seed: int = 1):
        self.model = model
        self.settings = settings
        self.n_ctx = settings.n_ctx
        self.n_vocab = model.n_vocab
        self.cells: list[Cell] = []
        self.decodes = 0
        self.decode_seconds = 0.0  # as the real Context: time in the (fake) model's forward pass
        self.batch_sizes: list[int] = []
        self._rows = np.zeros((0, model.n_vocab), dtype=np.float32)
        self._rng = random.Random(rng_seed)

    # -- decode -----------------------------------------------------------------------------------
    remote = False  # a model on RPC servers: work may overlap its decodes (``start_decode``)
    ahead_polls: tuple[int, ...] = (3,)  # how often the work meanwhile may ask "done?" and hear no (cycled)

    def start_decode(self, tokens, positions, seq_ids, want_logits, overlap: bool = True) -> Pending[None]:
        """As the real one: over "RPC" (``remote``) the decode is pending while the caller works — here it
        is over at once, and its ``done`` says no ``ahead_polls`` times (the order does not matter: the
        work meanwhile is another context's)."""
        polls = self.ahead_polls[self.decodes % len(self.ahead_polls)]
        self.decode(tokens, positions, seq_ids, want_logits)
        if overlap and self.remote:
            return Pending(_Countdown(polls), lambda: None)
        return Pending.ready(None)

    def decode(self, tokens, positions, seq_ids, want_logits) -> None:
        start = perf_counter()
        tokens, positions = [int(t) for t in tokens], [int(p) for p in positions]
        seq_ids = [tuple(int(s) for s in ids) for ids in seq_ids]
        self._check_batch(positions, seq_ids)
        new_cells = [Cell(p, t, set(ids)) for t, p, ids in zip(tokens, positions, seq_ids)]
        self.cells.extend(new_cells)
        if len(self.cells) > self.n_ctx:
            raise AssertionError("KV cache overflow")
        rows = []
        for cell, want in zip(new_cells, want_logits):
            if want:
                rows.append(self.model.logits(self._visible(cell)))
        self._rows = np.stack(rows) if rows else np.zeros((0, self.n_vocab), dtype=np.float32)
        self.decodes += 1
        self.batch_sizes.append(len(tokens))
        self.last_decode = perf_counter() - start
        self.decode_seconds += self.last_decode
        if self.remote:
            self.last_decode = 60.0  # as over a slow link: a look-ahead is never cut short by the clock

    def _visible(self, cell: Cell) -> tuple[int, ...]:
        seq = self._rng.choice(sorted(cell.seqs))  # which id counts as "first" is arbitrary
        seen = sorted((c for c in self.cells if seq in c.seqs and c.pos <= cell.pos), key=lambda c: c.pos)
        positions = [c.pos for c in seen]
        if positions != list(range(cell.pos + 1)):
            raise AssertionError(
                f"token at {cell.pos} (seq {seq}) sees positions {positions}: holes or duplicates"
            )
        return tuple(c.token for c in seen)

    def _check_batch(self, positions, seq_ids) -> None:
        first_pos: dict[int, int] = {}
        last_pos: dict[int, int] = {}
        for pos, ids in zip(positions, seq_ids):
            for s in ids:
                if not 0 <= s < self.settings.n_seq_max:
                    raise AssertionError(f"sequence id {s} out of range")
                if s in last_pos and pos < last_pos[s]:
                    raise AssertionError(f"positions of sequence {s} go backwards in the batch")
                first_pos.setdefault(s, pos)
                last_pos[s] = pos
        for s, pos in first_pos.items():
            if pos != self.seq_pos_max(s) + 1:
                raise AssertionError(
                    f"sequence {s} starts at {pos} but its cache ends at {self.seq_pos_max(s)}"
                )
        for ids in seq_ids:
            ranges = {(self.seq_pos_min(s), self.seq_pos_max(s)) for s in ids}
            if len(ranges) > 1:
                raise AssertionError(f"coupled sequences {ids} have different cached ranges {ranges}")

    def logits_rows(self, n_rows: int) -> np.ndarray:
        assert n_rows == self._rows.shape[0], (n_rows, self._rows.shape)
        return self._rows

    reductions = "numpy"  # whole rows, as a real context with numpy reductions
    kept = None  # (what backend samplers keep of each row)

    def keep(self, keep) -> None:
        pass

    def verified(self, n_rows: int) -> Verified:
        return RowsVerified(self.logits_rows(n_rows))

    # -- memory -----------------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        end = p1 if p1 >= 0 else 1 << 30
        for cell in self.cells:
            if p0 <= cell.pos < end:
                if seq < 0:
                    cell.seqs.clear()
                else:
                    cell.seqs.discard(seq)
        self.cells = [c for c in self.cells if c.seqs]

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for cell in self.cells:
            if p0 <= cell.pos < p1 and src in cell.seqs:
                cell.seqs.add(dst)

    def seq_pos_max(self, seq: int) -> int:
        return max((c.pos for c in self.cells if seq in c.seqs), default=-1)

    def seq_pos_min(self, seq: int) -> int:
        return min((c.pos for c in self.cells if seq in c.seqs), default=-1)

    def committed_view(self) -> list[tuple[int, int, frozenset]]:
        return sorted((c.pos, c.token, frozenset(c.seqs)) for c in self.cells)


class _Countdown:
    """A ``threading.Event`` that is set once it has been asked ``polls`` times."""

    def __init__(self, polls: int):
        self.polls = polls

    def is_set(self) -> bool:
        self.polls -= 1
        return self.polls < 0


class FakePair:
    """A pair of the engine's own Target and Draft over fake contexts."""

    reductions = "numpy"  # as ``ModelPair.reductions``

    def __init__(self, n_seq: int = 65, n_ctx: int = 4096, draft_noise: float = 1.0, top_k: int = 8):
        from edgespec.engine.draft import Draft
        from edgespec.engine.pair import EngineSettings
        from edgespec.engine.runners import Target

        settings = ContextSettings(n_ctx=n_ctx, n_batch=512, n_seq_max=n_seq)
        # the fake contexts stand in for llama.cpp's (``engine._context.Context``)
        self.target = Target(cast(Context, FakeContext(FakeModel(), settings, rng_seed=1)))
        draft_context = FakeContext(FakeModel(noise=draft_noise), settings, rng_seed=2)
        self.draft = Draft(cast(Context, draft_context), top_k=top_k)
        # as a loaded ModelPair's: the offload resolved (no GPU here)
        self.settings = EngineSettings(
            n_ctx=n_ctx, max_tree_nodes=n_seq - 1, target_gpu_layers=0, draft_gpu_layers=0
        )

    @property
    def max_nodes(self) -> int:
        return self.target.n_seq

    def runs_on_json(self) -> dict[str, dict]:
        """As ``ModelPair.runs_on_json``: both models on the CPU."""
        return {name: {"device": "CPU", "gpu_layers": 0, "layers": 3} for name in ("target", "draft")}

    def set_up_draft(self, setup) -> None:
        """As ``ModelPair.set_up_draft``: untrained masks are the vocabulary's last ids (no adapters)."""
        assert not setup.adapter, "the fake pair has no LoRA adapters"
        self.draft.mask_ids = tuple(range(VOCAB - 4, VOCAB))[: setup.masks]

    def overlap(self, tree, pending) -> None:
        look_ahead_during(self.target, self.draft, tree, pending)

    def context_used(self) -> int:
        return len(self.target.committed)

    def forget(self) -> None:
        """As ``ModelPair.forget``: both caches emptied."""
        from edgespec.engine.runners import CachedModel

        for runner in (self.target, self.draft):
            CachedModel.sync(runner, [])

    def close(self) -> None:
        pass


class ChatFakePair(FakePair):
    """FakePair with what `stream_reply` needs: a chat template, a tokenizer, and `with`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        model = self.target.model
        model.apply_chat_template = lambda messages: "|".join(m["content"] for m in messages)
        model.tokenize = lambda text, add_special=True, parse_special=True: [
            1 + ord(c) % (VOCAB - 1) for c in text[:12]
        ]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
