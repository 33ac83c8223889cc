"""Metadata churn for bench/metadata_churn.sh: create a topic, alter its config, delete
it, in a loop, through the Kafka admin API (confluent-kafka), for SECONDS seconds.
Prints the operations done as its last line.

Usage: admin_churn.py BOOTSTRAP SECONDS
"""
import sys
import time

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

bootstrap, seconds = sys.argv[1], float(sys.argv[2])
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
