"""The broker's Prometheus endpoint, as tests read it."""

import urllib.request


def scrape(port):
    """The /metrics text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_sum(text, prefix):
    """The sum of every sample whose line starts with `prefix` (a name, or a name with
    the start of its labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))
