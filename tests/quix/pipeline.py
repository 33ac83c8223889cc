"""A quixstreams Application with its defaults against the broker, run by
tests/test_quixstreams.py with the interpreter of .venv-quix (quixstreams pins an older
confluent-kafka than the rest of the suite uses).

    pipeline.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC COUNT STATE_DIR

Produces COUNT JSON records to INPUT_TOPIC with the Application's producer, then runs a
stateless StreamingDataFrame (INPUT_TOPIC -> apply -> OUTPUT_TOPIC) until it has
processed COUNT records, and prints one JSON line: what it sent, what the dataframe
saw, and the librdkafka settings its producer ran with."""

import json
import sys

import quixstreams
from quixstreams import Application

RUN_TIMEOUT_S = 60.0


def main():
    bootstrap, input_name, output_name = sys.argv[1], sys.argv[2], sys.argv[3]
    count, state_dir = int(sys.argv[4]), sys.argv[5]
    # Defaults, but for the start position (a new group begins at "latest" by default,
    # and the records are produced before the dataframe's consumer joins) and the state
    # directory (by default ./state, which a stateless app creates but leaves empty).
    app = Application(broker_address=bootstrap, consumer_group="spate-quix", auto_offset_reset="earliest",
                      state_dir=state_dir)
    source = app.topic(input_name, value_deserializer="json", key_deserializer="str")
    sink = app.topic(output_name, value_serializer="json", key_serializer="str")

    sent = []
    with app.get_producer() as producer:
        producer_config = {k: v for k, v in producer._producer_config.items() if isinstance(v, (str, int, bool))}
        for n in range(count):
            msg = source.serialize(key=f"k{n % 7}", value={"n": n})
            producer.produce(topic=source.name, key=msg.key, value=msg.value)
            sent.append(n)
    # Leaving the `with` flushed the producer: every record was acknowledged.

    sdf = app.dataframe(source)
    sdf = sdf.apply(lambda v: {"n": v["n"], "square": v["n"] * v["n"]})
    sdf = sdf.to_topic(sink)
    seen = app.run(count=count, timeout=RUN_TIMEOUT_S)
    print(json.dumps({
        "quixstreams": quixstreams.__version__,
        "producer_config": producer_config,
        "sent": sent,
        "seen": sorted(r["n"] for r in seen),
    }))


if __name__ == "__main__":
    main()
