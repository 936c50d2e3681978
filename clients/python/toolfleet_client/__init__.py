"""The Python client of toolfleet's gRPC API (toolfleet.v1.AgentService).

    from toolfleet_client import Client

    with Client("127.0.0.1:50051") as toolfleet:
        job_id = toolfleet.submit("What did AMD launch between 2016 and 2020?").job_id
        for event in toolfleet.watch(job_id):
            print(event.offset, event.kind, event.data)
        print(toolfleet.get(job_id).output_text)

The request and response types are the generated protobuf messages
(`toolfleet_client.pb`); `Event` adds the parsed JSON of an event's data.
"""

from ._client import Client, Event, JobFailed, Submitted
from ._generated import agent_pb2 as pb

__all__ = ["Client", "Event", "JobFailed", "Submitted", "pb"]
