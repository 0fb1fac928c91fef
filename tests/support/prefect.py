"""Read a flow's runs back from the session's Prefect server: task runs of a flow run and its subflows,
and the events the health watch emitted."""
from __future__ import annotations

import asyncio
import time

import prefect.main  # noqa: F401 - Prefect sets up its logging on this import: here, at collection, its console
# handler writes to the session's stderr; set up later inside a test, it would write to that test's capture,
# closed once the test ends (every later flow then fails with "I/O operation on closed file")
from prefect.client.orchestration import get_client


def task_runs_of(flow_run_id) -> list:
    """Every task run of a flow run and its subflows, read back from the Prefect API."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            ids, frontier = [flow_run_id], [flow_run_id]
            while frontier:
                children = await client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(parent_flow_run_id={"any_": frontier}))
                frontier = [c.id for c in children]
                ids += frontier
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))

    return asyncio.run(read())


def read_events(name: str, resource_name: str, timeout: float = 60.0, until=bool) -> list[dict]:
    """Events of that name about that run, read back from the server's API (the server stores events
    a moment after it received them: wait until `until(events)` holds, by default until some are there;
    other tests' runs in the same session may share the resource name)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            response = client._client.post("/events/filter", json={"filter": {"event": {"name": [name]}},
                                                                   "limit": 50})
            response.raise_for_status()
            events = [e for e in response.json()["events"]
                      if e["resource"].get("prefect.resource.name") == resource_name]
            if until(events) or time.monotonic() > deadline:
                return events
            time.sleep(0.5)
