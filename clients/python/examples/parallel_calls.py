"""Submits an agent job whose model makes two tool calls at once, prints its
events as they happen, then its answer.

    python examples/parallel_calls.py --addr 127.0.0.1:50051

The scripted model plays the turns below, so no API key is needed; the calls
run on real workers (get_current_weather and calculate are built in). Exits 0
when the job succeeds, 1 when it fails.
"""

import argparse
import sys

from toolfleet_client import Client, pb

SCRIPT = [
    {
        "tool_calls": [
            {"name": "get_current_weather", "arguments": {"location": "Boston, MA", "unit": "celsius"}},
            {"name": "calculate", "arguments": {"expression": "23 * 19"}},
        ]
    },
    {
        "message": "In Boston it is {{call_0_0.data.temperature}} °C, "
        "and 23 * 19 = {{call_0_1.data.result}}."
    },
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051", help="the orchestrator: host:port, or https://host:port for TLS (TOOLFLEET_TLS_* name the CA and a client certificate)")
    args = parser.parse_args()

    with Client(args.addr) as toolfleet:
        submitted = toolfleet.submit(
            "What's the weather in Boston in celsius, and what is 23*19?",
            script=SCRIPT,
            metadata={"example": "parallel_calls"},
        )
        print(f"job {submitted.job_id}")
        start = None
        for event in toolfleet.watch(submitted.job_id):
            start = start or event.timestamp_ms
            seconds = (event.timestamp_ms - start) / 1000
            detail = event.data.get("name", "") if isinstance(event.data, dict) else ""
            print(f"#{event.offset:<3} {seconds:7.3f}s  {event.kind:<22} {detail}".rstrip())
        job = toolfleet.get(submitted.job_id)
        if job.status != pb.JOB_STATUS_SUCCEEDED:
            print(f"failed: {job.error.code} {job.error.message}", file=sys.stderr)
            return 1
        print(f"answer: {job.output_text}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
