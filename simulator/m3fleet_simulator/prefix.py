"""Prefix caching: which prompt blocks an engine (or the endpoint picker's index of it) holds. Pure.

A prompt is a chain of segments, each a run of tokens with one identity: an application's shared system prompt and
tool definitions, then one session's history (its first message, then every turn's output and tool results). Blocks
are `BLOCK_TOKENS` (the M3 recipes run vLLM with `--block-size 128`) and a block's identity is its chain up to
it, as vLLM hashes a block with its parent's hash: a session's blocks are reusable only behind its whole shared
prefix, only full blocks are cached, and a block belongs to the segment its last token is in.

The cache holds, per segment, how many of its leading blocks are resident. That is exact for vLLM's eviction order:
blocks freed together are evicted last-used first and, within one request, tail first ("free in reverse order so
the tail is evicted first", vLLM's KVCacheManager), so what survives of a segment is always a prefix of it.
Capacity is in blocks; a segment in use by a running request is pinned (its blocks are referenced, not free).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final

from m3fleet_simulator.scenarios import Request

BLOCK_TOKENS: Final = 128

Segment = tuple[Hashable, int]  # (identity, tokens)


@dataclass(frozen=True)
class ChainRequest(Request):
    """A request whose prompt is `segments` (their tokens sum to `prompt`); its output extends the last one."""

    segments: tuple[Segment, ...] = ()


def segments_of(request: Request) -> tuple[Segment, ...]:
    """A plain request's prompt shares nothing: one segment of its own."""
    if isinstance(request, ChainRequest) and request.segments:
        return request.segments
    return ((("request", request.rid), request.prompt),)


class PrefixCache:
    """LRU over segments, each holding its leading `blocks`; at most `capacity_blocks` in all."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(0, capacity_blocks)
        self.blocks: OrderedDict[Hashable, int] = OrderedDict()  # least recently used first
        self.total = 0
        self.pins: Counter[Hashable] = Counter()
        self.evicted = 0

    def match(self, segments: Sequence[Segment], limit: int | None = None) -> int:
        """Tokens of the chain's longest cached prefix (whole blocks), at most `limit` tokens."""
        start = blocks = 0
        for key, tokens in segments:
            end = start + tokens
            owned = end // BLOCK_TOKENS - start // BLOCK_TOKENS
            held = min(self.blocks.get(key, 0), owned)
            blocks = start // BLOCK_TOKENS + held
            if held < owned:
                break
            start = end
        matched = blocks * BLOCK_TOKENS
        return matched if limit is None else min(matched, limit)

    def insert(self, segments: Sequence[Segment], limit: int | None = None) -> None:
        """The chain's full blocks (up to `limit` tokens) become resident and most recently used."""
        start = 0
        for key, tokens in segments:
            end = start + tokens if limit is None else min(start + tokens, limit)
            owned = max(0, end // BLOCK_TOKENS - start // BLOCK_TOKENS)
            held = self.blocks.pop(key, 0)
            self.blocks[key] = max(held, owned)
            self.total += self.blocks[key] - held
            if end < start + tokens:
                break
            start = end
        self._evict()

    def pin(self, segments: Sequence[Segment]) -> None:
        for key, _ in segments:
            self.pins[key] += 1

    def unpin(self, segments: Sequence[Segment]) -> None:
        for key, _ in segments:
            self.pins[key] -= 1
            if self.pins[key] <= 0:
                del self.pins[key]
        self._evict()

    def _evict(self) -> None:
        """Trim least recently used unpinned segments from their tail until the cache fits."""
        if self.total <= self.capacity:
            return
        for key in list(self.blocks):
            if self.total <= self.capacity:
                return
            if key in self.pins:
                continue
            drop = min(self.blocks[key], self.total - self.capacity)
            self.blocks[key] -= drop
            self.total -= drop
            self.evicted += drop
            if self.blocks[key] == 0:
                del self.blocks[key]
