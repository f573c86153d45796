"""The prompt cache across conversations: the KV of recent conversations kept in host memory.

The contexts themselves hold one conversation (``CachedModel.sync`` keeps the longest common prefix
of what they hold and the next prompt, so a client that sends its whole conversation again decodes
only the new part). Clients that take turns — two editors, an agent and a chat — would evict each
other every turn; llama-server keeps their slots' KV in host RAM (``--cache-ram``), and so does
``PromptCache``:

- before a prompt is decoded, ``prepare`` compares it with what the target holds and with every saved
  conversation; when a saved one shares a longer prefix, the one in the contexts is saved (if the
  prompt would throw away at least ``min_save`` of its tokens) and the better one is put back;
- a conversation is saved per model with ``llama_state_seq_get_data`` of sequence 0 (every committed
  cell carries it: ``runners``) and put back with ``llama_state_seq_set_data`` into an emptied
  context: the cells come back bit for bit, so a restored prefix decodes as if it had never left;
- saved conversations live within a byte budget, the least recently used dropped first; one whose
  tokens are a prefix of another's is dropped too (the longer one serves every prompt it would).

Both models' caches travel together: the draft's KV is saved with the target's (its committed tokens
may lag the target's by a few; ``Draft.sync`` catches up).

**Scopes.** Each prompt comes with a scope (``edgespec serve``: the API key it was sent with and the
client's ``prompt_cache_key`` or ``user``). A prompt reuses cells of its own scope only: the live
conversation of another scope is saved and the contexts emptied before the prompt decodes, and saved
conversations of other scopes are never compared with it. So neither the cached-token counts a client
is told nor the time its prompt takes depend on another scope's text (docs/security.md).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from .runners import CachedModel, common_prefix

MIB = 1024 * 1024


@dataclass
class _Saved:
    """One model's cache: its committed tokens and its sequence-0 state."""

    tokens: tuple[int, ...]
    state: ctypes.Array

    @property
    def size(self) -> int:
        return len(self.state)


@dataclass
class _Conversation:
    scope: tuple  # whose conversation it is: only prompts of the same scope reuse it
    target: _Saved
    draft: _Saved | None
    draft_weights: object  # the draft's adapter when saved: KV computed with other weights is useless

    @property
    def size(self) -> int:
        return self.target.size + (self.draft.size if self.draft is not None else 0)


def _save(runner: CachedModel) -> _Saved:
    runner.ctx.seq_rm(-1, len(runner.committed))  # no speculative cell a failed step may have left
    return _Saved(tuple(runner.committed), runner.ctx.seq_state(0))


def _restore(runner: CachedModel, saved: _Saved | None) -> None:
    """``runner`` holds ``saved`` (None or refused: nothing)."""
    runner.ctx.clear()
    if saved is None or not runner.ctx.set_seq_state(saved.state, 0):
        runner.ctx.clear()
        runner.committed = []
    else:
        runner.committed = list(saved.tokens)
    runner.tagged_seqs = (0,)  # restored cells carry sequence 0 only; other ids are tagged on demand


class PromptCache:
    """Saved conversations of one ``ModelPair`` within ``budget`` bytes of host memory (0: none; the
    contexts still keep the live one). Driven by the thread that drives the pair."""

    def __init__(self, pair, budget: int, min_save: int = 16):
        self.pair = pair
        self.budget = budget
        self.min_save = min_save  # tokens a prompt must throw away before the live conversation is saved
        self._saved: OrderedDict[int, _Conversation] = OrderedDict()  # oldest first
        self._next = 0
        self.saves = self.restores = 0
        self.live_scope: tuple = ()  # the scope of the conversation the contexts hold

    @property
    def size(self) -> int:
        """Bytes of host memory the saved conversations take (a snapshot: /health reads it from
        another thread while the worker may change it)."""
        return sum(c.size for c in tuple(self._saved.values()))

    def __len__(self) -> int:
        return len(self._saved)

    def info(self) -> dict:
        return {
            "conversations": len(self._saved),
            "bytes": self.size,
            "budget_bytes": self.budget,
            "saves": self.saves,
            "restores": self.restores,
        }

    def prepare(self, prompt: Sequence[int], scope: tuple = ()) -> None:
        """Before ``prompt`` (of ``scope``) is decoded: put back the saved conversation of the same
        scope that shares the longest prefix with it, if that is longer than what the contexts hold
        (saving theirs first); the contexts keep nothing of another scope's conversation."""
        target = self.pair.target
        own = scope == self.live_scope
        live = common_prefix(target.committed, prompt) if own else 0
        best, best_n = None, live
        for key, conversation in self._saved.items() if self.budget > 0 else ():
            n = common_prefix(conversation.target.tokens, prompt) if conversation.scope == scope else 0
            if n > best_n and self._usable(conversation):
                best, best_n = key, n
        chosen = self._saved.pop(best) if best is not None else None  # before saving: not evicted
        if self.budget > 0 and len(target.committed) - live >= self.min_save:
            self._save_live(chosen)
        if chosen is not None:
            self._put_back(chosen)
        elif not own:
            self.pair.forget()  # another scope's prompt comes next: the contexts hold nothing
        self.live_scope = scope

    def clear(self) -> None:
        self._saved.clear()

    def _usable(self, conversation: _Conversation) -> bool:
        return conversation.draft is None or conversation.draft_weights == self._draft_weights()

    def _draft_weights(self) -> object:
        return self.pair.draft_adapter

    def _save_live(self, chosen: _Conversation | None) -> None:
        target, draft = self.pair.target, self.pair.draft
        tokens, scope = tuple(target.committed), self.live_scope
        others = [*self._saved.values(), *([chosen] if chosen is not None else [])]
        if any(c.scope == scope and c.target.tokens[: len(tokens)] == tokens for c in others):
            return  # a saved conversation continues this one: it serves every prompt this one would
        for key, c in list(self._saved.items()):
            if c.scope == scope and tokens[: len(c.target.tokens)] == c.target.tokens:
                del self._saved[key]  # a prefix of the live conversation: it serves no prompt better
        saved_target = _save(target)
        saved_draft = _save(draft) if draft is not None and draft.committed else None
        conversation = _Conversation(scope, saved_target, saved_draft, self._draft_weights())
        if conversation.size > self.budget:
            return
        while self._saved and self.size + conversation.size > self.budget:
            self._saved.popitem(last=False)  # the least recently used
        self._saved[self._next] = conversation
        self._next += 1
        self.saves += 1

    def _put_back(self, conversation: _Conversation) -> None:
        _restore(self.pair.target, conversation.target)
        if self.pair.draft is not None:
            _restore(self.pair.draft, conversation.draft)
        self.restores += 1
