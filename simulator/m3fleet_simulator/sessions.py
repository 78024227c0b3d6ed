"""Seeded multi-turn workloads for the routing benchmark: agentic sessions and a mixed short/long chat. Pure.

Every draw is from `random.Random` seeded by the seed and a stream name, so every router in one run sees the same
sessions. The shapes are physical, not fitted to any router:

* **agentic**: coding agents. Each of three agent applications has one system prompt with its tool definitions
  (8k-24k tokens, as coding agents' prompts and tool schemas run). A session sends a task, then loops: the model
  answers with a tool call or an edit, the tool runs (a think time of seconds), its result is appended, and the whole
  history is sent again. It ends when its history reaches a drawn size of 100k-600k tokens: every turn resends
  everything before it, so a session's prompts grow turn after turn to hundreds of thousands of tokens.
* **mixed**: short chat sessions (1-4 turns behind one of four applications' system prompts, a person's think time
  of tens of seconds) and, one session in thirty, questions on a long document (30k-500k tokens, 1-4 questions).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from m3fleet_simulator.routing import Session, Turn
from m3fleet_simulator.scenarios import MINUTE, LogNormal, LogUniform

WORKLOADS: Final = ("agentic", "mixed")


@dataclass(frozen=True)
class AgenticShape:
    sessions_per_minute: float = 2.0
    minutes: float = 30.0
    apps: int = 3
    system_prompt: ClassVar[LogUniform] = LogUniform(8_000, 24_000)
    task: ClassVar[LogNormal] = LogNormal(2_000, 1.0, 200, 30_000)
    output: ClassVar[LogNormal] = LogNormal(400, 1.0, 20, 8_000)
    tool_result: ClassVar[LogNormal] = LogNormal(1_500, 1.2, 50, 40_000)
    tool_seconds: ClassVar[LogNormal] = LogNormal(3, 1.0, 0, 120)
    final_history: ClassVar[LogUniform] = LogUniform(100_000, 600_000)

    def describe(self) -> dict[str, Any]:
        return {
            "sessionsPerMinute": self.sessions_per_minute,
            "sessionsStartWithinMinutes": self.minutes,
            "agentApps": self.apps,
            "systemPromptTokens": self.system_prompt.describe(),
            "taskTokens": self.task.describe(),
            "outputTokensPerTurn": self.output.describe(),
            "toolResultTokensPerTurn": self.tool_result.describe(),
            "toolSecondsPerTurn": self.tool_seconds.describe(),
            "sessionEndsAtHistoryTokens": self.final_history.describe(),
        }


@dataclass(frozen=True)
class MixedShape:
    sessions_per_second: float = 2.0
    minutes: float = 30.0
    apps: int = 4
    long_share: float = 1 / 30
    system_prompt: ClassVar[LogUniform] = LogUniform(500, 4_000)
    message: ClassVar[LogNormal] = LogNormal(300, 1.0, 10, 8_000)
    output: ClassVar[LogNormal] = LogNormal(350, 0.9, 10, 4_000)
    human_seconds: ClassVar[LogNormal] = LogNormal(20, 0.8, 2, 300)
    document: ClassVar[LogUniform] = LogUniform(30_000, 500_000)
    question: ClassVar[LogNormal] = LogNormal(150, 0.8, 10, 2_000)
    max_turns: int = 4

    def describe(self) -> dict[str, Any]:
        return {
            "sessionsPerSecond": self.sessions_per_second,
            "sessionsStartWithinMinutes": self.minutes,
            "chatApps": self.apps,
            "systemPromptTokens": self.system_prompt.describe(),
            "longDocumentShare": round(self.long_share, 4),
            "documentTokens": self.document.describe(),
            "messageTokens": self.message.describe(),
            "questionTokens": self.question.describe(),
            "outputTokens": self.output.describe(),
            "thinkSeconds": self.human_seconds.describe(),
            "turns": f"1-{self.max_turns}, each further turn with probability 1/2",
        }


def agentic(seed: int, shape: AgenticShape = AgenticShape(), max_tokens: int = 1_048_576) -> list[Session]:
    rng = random.Random(f"{seed}:agentic")
    prompts = [shape.system_prompt.draw(rng) for _ in range(shape.apps)]
    sessions: list[Session] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.sessions_per_minute / MINUTE)
        if t >= shape.minutes * MINUTE:
            return sessions
        app = rng.randrange(shape.apps)
        key = ("agent-session", seed, len(sessions))
        history = shape.task.draw(rng)
        target = shape.final_history.draw(rng)
        turns: list[Turn] = []
        while True:
            output = shape.output.draw(rng)
            think = 0.0 if not turns else shape.tool_seconds.draw(rng) + rng.random()
            segments = (("agent-app", app, prompts[app]), prompts[app]), (key, history)
            turns.append(Turn(think, _merge(segments), output))
            history += output + shape.tool_result.draw(rng)
            if prompts[app] + history >= min(target, max_tokens - shape.output.high):
                break
        sessions.append(Session(t, tuple(turns), "agentic"))


def mixed(seed: int, shape: MixedShape = MixedShape(), max_tokens: int = 1_048_576) -> list[Session]:
    rng = random.Random(f"{seed}:mixed")
    prompts = [shape.system_prompt.draw(rng) for _ in range(shape.apps)]
    sessions: list[Session] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.sessions_per_second)
        if t >= shape.minutes * MINUTE:
            return sessions
        app = rng.randrange(shape.apps)
        key = ("chat-session", seed, len(sessions))
        long = rng.random() < shape.long_share
        history = (
            min(shape.document.draw(rng), max_tokens // 2) + shape.question.draw(rng)
            if long
            else shape.message.draw(rng)
        )
        turns: list[Turn] = []
        while True:
            output = shape.output.draw(rng)
            think = 0.0 if not turns else shape.human_seconds.draw(rng)
            segments = (("chat-app", app, prompts[app]), prompts[app]), (key, history)
            turns.append(Turn(think, _merge(segments), output))
            history += output + (shape.question if long else shape.message).draw(rng)
            if len(turns) >= shape.max_turns or rng.random() < 0.5 or prompts[app] + history >= max_tokens // 2:
                break
        sessions.append(Session(t, tuple(turns), "long" if long else "short"))


def _merge(segments: tuple[tuple[Any, int], ...]) -> tuple[tuple[Any, int], ...]:
    return tuple((key, tokens) for key, tokens in segments if tokens > 0)


def sessions_for(workload: str, seed: int, max_tokens: int) -> list[Session]:
    return agentic(seed, max_tokens=max_tokens) if workload == "agentic" else mixed(seed, max_tokens=max_tokens)


def describe(workload: str) -> dict[str, Any]:
    return AgenticShape().describe() if workload == "agentic" else MixedShape().describe()


def summary(sessions: list[Session]) -> dict[str, Any]:
    turns = [t for s in sessions for t in s.turns]
    prompts = sorted(t.prompt for t in turns)
    return {
        "sessions": len(sessions),
        "requests": len(turns),
        "promptTokens": sum(prompts),
        "promptP50": prompts[len(prompts) // 2] if prompts else 0,
        "promptMax": prompts[-1] if prompts else 0,
        "outputTokens": sum(t.output for t in turns),
        "longestSessionTurns": max((len(s.turns) for s in sessions), default=0),
        "meanTurns": round(len(turns) / len(sessions), 1) if sessions else 0.0,
    }
