"""Run in a new process: resume an AgentContextSession from a SQLite file and go on."""

from __future__ import annotations

import asyncio
import json
import sys

from agents import Runner

from agentcontext import SqlContextStore
from agentcontext.integrations.openai_agents import AgentContextSession
from tests.integrations.agents_helpers import ScriptedModel, build_agent, turn


async def main(url: str) -> None:
    async with SqlContextStore(url) as store:
        session = AgentContextSession("trip", store=store, user_id="u1")
        model = ScriptedModel(turn(3, "Tokyo"))
        result = await Runner.run(build_agent(model), "And Tokyo?", session=session)
        print(
            json.dumps(
                {
                    "output": result.final_output,
                    "first_input": model.inputs[0],
                    "items": await session.get_items(),
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
