"""A consume-transform-produce processor with exactly-once semantics, as the
confluent-kafka docs write one (the defaults otherwise): a read_committed consumer in a
group, a transactional producer; each poll's records are transformed (b"out-" + value)
and produced, and the consumer's positions sent, in one transaction. Any error ends the
process (the test restarts it, as a crashed processor would be), so a transaction it
leaves open is aborted by the next incarnation's init_transactions (fenced) or by the
coordinator's timeout.

Usage: eos_processor.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID
Prints "committed N" after each commit."""

import faulthandler
import signal
import sys
import time

from confluent_kafka import Consumer, Producer


def main():
    # SIGUSR1 prints where the process is (the test sends it before giving up on a stall).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    bootstrap, in_topic, out_topic, group, txn_id = sys.argv[1:6]
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    })
    # debug=eos only logs (librdkafka's transaction state changes), for the test's failure
    # report; it changes no behaviour.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "debug": "eos"})
    producer.init_transactions(60)
    consumer.subscribe([in_topic])
    done = 0
    while True:
        msgs = [m for m in consumer.consume(50, 1.0) if not m.error()]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(out_topic, b"out-" + m.value(), key=m.key())
            # Slow enough that a kill lands inside a transaction.
            time.sleep(0.002)
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60)
        producer.commit_transaction(60)
        done += len(msgs)
        print(f"committed {done}", flush=True)


if __name__ == "__main__":
    main()
