"""Metadata churn for bench/metadata_churn.sh: create a topic, alter its config, delete
it, in a loop, through the Kafka admin API (confluent-kafka), for SECONDS seconds.
Prints the operations done as its last line.

With --read-only, the same loop of three admin calls changes nothing (Metadata for the
topic, DescribeConfigs, Metadata again): the admin client's and the broker's request
work without any metadata change, to tell the cost of the changes from the cost of
sharing the CPU.

Usage: admin_churn.py BOOTSTRAP SECONDS [--read-only]
"""
import sys
import time

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

def _done(value):
    """A finished future holding `value` (list_topics answers directly)."""
    from concurrent.futures import Future
    f = Future()
    f.set_result(value)
    return f


bootstrap, seconds = sys.argv[1], float(sys.argv[2])
read_only = "--read-only" in sys.argv[3:]
admin = AdminClient({"bootstrap.servers": bootstrap})
deadline = time.monotonic() + seconds
done = {"create": 0, "alter": 0, "delete": 0, "failed": 0}
i = 0
while time.monotonic() < deadline:
    name = f"churn-{i}"
    i += 1
    retention = ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
    steps = [
        ("create", lambda: admin.create_topics([NewTopic(name, 4, 1)])),
        ("alter", lambda: admin.incremental_alter_configs([ConfigResource("topic", name,
                                                                         incremental_configs=[retention])])),
        ("delete", lambda: admin.delete_topics([name])),
    ]
    if read_only:
        steps = [
            ("create", lambda: {0: _done(admin.list_topics("load", timeout=30))}),
            ("alter", lambda: admin.describe_configs([ConfigResource("topic", "load")])),
            ("delete", lambda: {0: _done(admin.list_topics(timeout=30))}),
        ]
    for op, start in steps:
        try:
            # Keep the dict of futures alive until each one is done.
            futures = start()
            for f in futures.values():
                f.result(timeout=30)
            done[op] += 1
        except Exception as e:  # noqa: BLE001 - counted, and the loop goes on
            done["failed"] += 1
            print(f"{op} {name}: {e}", file=sys.stderr)
print(" ".join(f"{k}={v}" for k, v in done.items()))
