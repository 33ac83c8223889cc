"""Create or delete a topic on a broker, for the bench scripts.

    python bench/topic.py create PORT NAME PARTITIONS   # retried up to 60 s, then every leader known
    python bench/topic.py delete PORT NAME              # and wait until it is no longer listed
"""
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic


def main(what, port, name, partitions=None):
    a = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
    deadline = time.time() + 60
    if what == "delete":
        for f in a.delete_topics([name], operation_timeout=60).values():
            f.result()
        while name in a.list_topics(timeout=10).topics:
            if time.time() > deadline:
                raise SystemExit(f"{name} still listed after 60 s")
            time.sleep(0.2)
        return
    while True:
        try:
            a.create_topics([NewTopic(name, int(partitions), 1)], operation_timeout=60)[name].result()
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    while not all(p.leader >= 0 for p in a.list_topics(topic=name, timeout=5).topics[name].partitions.values()):
        time.sleep(0.1)


if __name__ == "__main__":
    main(*sys.argv[1:])
