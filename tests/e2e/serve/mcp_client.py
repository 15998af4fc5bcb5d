"""The independent MCP client of tests/e2e/serve/mcp.rs: PyPI's `mcp`
package (the official Python SDK, pinned in .ci/run) over streamable HTTP
with a bearer token, as an agent would use `nyann-bench serve`.

One argument, a JSON object: url (the /mcp endpoint), submit and read (two
tokens), revision (`2025-11-25`: the initialize handshake; `2026-07-28`:
stateless, server/discover), target, scenario (an until_congested sweep
that stops at its third stage), label. It plans, submits, polls until the
run ends, reads its report and artifacts, checks what a read-only token is
refused, and prints one JSON line of what it saw for the Rust test.
Any failed check raises (a non-zero exit with the reason on stderr).
"""

import asyncio
import contextlib
import json
import sys
import time

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

TOOLS = {
    "plan_run",
    "submit_run",
    "list_runs",
    "get_run",
    "cancel_run",
    "list_artifacts",
    "get_report",
}
READ_ONLY = {"plan_run", "list_runs", "get_run", "list_artifacts", "get_report"}


def check(condition, what):
    if not condition:
        raise AssertionError(what)


class Connection:
    """A session of the SDK's client over its streamable HTTP transport."""

    def __init__(self, session):
        self.session = session

    async def call(self, tool, arguments=None):
        result = await self.session.call_tool(tool, arguments or {})
        text = " ".join(c.text for c in result.content if getattr(c, "text", None))
        return result.is_error, result.structured_content, text

    async def ok(self, tool, arguments=None):
        failed, data, text = await self.call(tool, arguments)
        check(not failed, f"{tool} failed: {text}")
        check(isinstance(data, dict), f"{tool} gave no structured content: {text}")
        return data

    async def refused(self, tool, arguments, reason):
        failed, _, text = await self.call(tool, arguments)
        check(failed, f"{tool} should be a tool error: {text}")
        check(reason in text, f"{tool}'s error should say {reason!r}: {text}")
        return text


@contextlib.asynccontextmanager
async def connect(url, token, revision):
    """Connects with `token` at `revision`: the initialize handshake for
    2025-11-25, server/discover (no handshake, no session) for 2026-07-28."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                if revision == "2026-07-28":
                    await session.discover()
                else:
                    await session.initialize()
                check(
                    session.protocol_version == revision,
                    f"negotiated {session.protocol_version}, wanted {revision}",
                )
                yield Connection(session)


async def main(args):
    url, revision = args["url"], args["revision"]
    request = {
        "target": args["target"],
        "scenario": args["scenario"],
        "label": args["label"],
    }
    seen = {"revision": revision}
    async with connect(url, args["submit"], revision) as mcp:
        listed = await mcp.session.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        check(set(tools) == TOOLS, f"tools: {sorted(tools)}")
        for name, tool in tools.items():
            hints = tool.annotations
            check(hints is not None, f"{name} has no annotations")
            check(
                hints.read_only_hint == (name in READ_ONLY),
                f"{name}: read_only_hint {hints.read_only_hint}",
            )
            check(hints.destructive_hint == (name == "cancel_run"), f"{name}: destructive")
            check(hints.idempotent_hint is not None, f"{name}: idempotent_hint")
            check(tool.output_schema is not None, f"{name} has no output schema")
            check(tool.description, f"{name} has no description")
        seen["tools"] = sorted(tools)

        plan = await mcp.ok("plan_run", request)
        check(plan["until_congested"], f"plan: {plan}")
        seen["planned_stages"] = len(plan["stages"])
        text = await mcp.refused(
            "plan_run", dict(request, target="nowhere"), "unknown target"
        )
        check(args["target"] in text, f"the error should name the targets: {text}")
        await mcp.refused("get_run", {"id": "r-0000000000000000"}, "list the runs")

        run = await mcp.ok("submit_run", request)
        check(run["created"] and run["submitted_by"] == "ci", f"submit: {run}")
        run_id = run["id"]
        again = await mcp.ok("submit_run", request)
        check(again["id"] == run_id and not again["created"], f"again: {again}")

        deadline = time.monotonic() + 150
        while True:
            got = await mcp.ok("get_run", {"id": run_id})
            if got["status"] not in ("queued", "running"):
                break
            check(time.monotonic() < deadline, f"the run did not end: {got}")
            await asyncio.sleep(0.5)
        seen["status"] = got["status"]
        check(got["summary"] is not None, f"get gives the summary: {got}")

        report = await mcp.ok("get_report", {"id": run_id})
        seen["report"] = report
        artifacts = await mcp.ok("list_artifacts", {"id": run_id})
        seen["artifacts"] = artifacts["artifacts"]
        runs = await mcp.ok("list_runs")
        check(any(r["id"] == run_id for r in runs["runs"]), f"list: {runs}")
        check("127.0.0.1" not in json.dumps(runs["targets"]), "targets never show their URL")
        seen["run"] = run_id

    async with connect(url, args["read"], revision) as viewer:
        await viewer.refused("submit_run", dict(request, label="viewer"), "needs scope submit")
        await viewer.refused("cancel_run", {"id": run_id}, "needs scope submit")
        got = await viewer.ok("get_run", {"id": run_id})
        check(got["id"] == run_id, f"read token gets: {got}")
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
