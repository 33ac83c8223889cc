"""Kafka's placement of a group or transactional id in its internal topic."""


def java_hash_partition(key, partitions=50):
    """Kafka's partitionFor: abs(String.hashCode) % partitions (the hash over UTF-16
    code units, as Java's), for `__consumer_offsets` and `__transaction_state`."""
    utf16 = key.encode("utf-16-be")
    h = 0
    for i in range(0, len(utf16), 2):
        h = (h * 31 + int.from_bytes(utf16[i:i + 2], "big")) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    h = 0 if h == -(1 << 31) else abs(h)
    return h % partitions
