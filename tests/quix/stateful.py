"""A stateful quixstreams Application with its defaults against the broker, run by
tests/test_quixstreams.py with the interpreter of .venv-quix.

    stateful.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC COUNT STATE_DIR START

Produces COUNT JSON records {"n": START + i} to INPUT_TOPIC (keys k0..k6 in turn) with
the Application's producer, then runs a StreamingDataFrame that counts records per key
in its state store (RocksDB under STATE_DIR, backed by the changelog topic quixstreams
creates, compacted) and writes {"n", "count"} to OUTPUT_TOPIC, until it has processed
COUNT records. Prints one JSON line: the version and the records the dataframe
emitted."""

import json
import sys

import quixstreams
from quixstreams import Application

RUN_TIMEOUT_S = 60.0
KEYS = 7


def main():
    bootstrap, input_name, output_name = sys.argv[1], sys.argv[2], sys.argv[3]
    count, state_dir, start = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    # Defaults, but for the start position of a new group and the state directory.
    app = Application(broker_address=bootstrap, consumer_group="spate-quix-state", auto_offset_reset="earliest",
                      state_dir=state_dir)
    source = app.topic(input_name, value_deserializer="json", key_deserializer="str")
    sink = app.topic(output_name, value_serializer="json", key_serializer="str")

    with app.get_producer() as producer:
        for n in range(start, start + count):
            msg = source.serialize(key=f"k{n % KEYS}", value={"n": n})
            producer.produce(topic=source.name, key=msg.key, value=msg.value)

    def counted(value, state):
        c = state.get("count", 0) + 1
        state.set("count", c)
        return {"n": value["n"], "count": c}

    sdf = app.dataframe(source)
    sdf = sdf.apply(counted, stateful=True)
    sdf = sdf.to_topic(sink)
    seen = app.run(count=count, timeout=RUN_TIMEOUT_S)
    print(json.dumps({"quixstreams": quixstreams.__version__, "seen": seen}))


if __name__ == "__main__":
    main()
